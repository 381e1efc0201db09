"""Calibration texts: held-out and in-corpus documents, each cut into a prefix and the tokens
after it (``split_corpus``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["CalibrationText", "split_corpus"]


@dataclass(frozen=True)
class CalibrationText:
    """One text to score: the retrieval query / prompt ``prefix`` and the scored ``rest``."""

    doc_id: str
    prefix: str
    rest: str
    in_corpus: bool


def _cut(lm: Any, text: str, prefix_tokens: int, score_tokens: int) -> tuple[str, str] | None:
    """Prefix (at most ``prefix_tokens``, at most a third of the text) and the next at most
    ``score_tokens`` tokens, cut on token boundaries."""
    ids, off = lm.tokenize_with_offsets(text)
    n = len(ids)
    p = min(prefix_tokens, n // 3)
    if p < 2 or n - p < 4:
        return None
    cut = int(off[p, 0])
    end_tok = min(n, p + score_tokens)
    end = int(off[end_tok - 1, 1]) if end_tok < n else len(text)
    prefix, rest = text[:cut], text[cut:end]
    stripped = prefix.rstrip()
    rest = prefix[len(stripped):] + rest
    if not stripped.strip() or not rest.strip():
        return None
    return stripped, rest


def split_corpus(
    passages: Sequence[Any],
    lm: Any,
    *,
    n_texts: int = 24,
    prefix_tokens: int = 32,
    score_tokens: int = 64,
    seed: int = 0,
) -> tuple[list[CalibrationText], list[CalibrationText], set[str]]:
    """Hold out ``n_texts`` documents (never more than half) and pick ``n_texts`` others:
    ``(in_texts, out_texts, held_out_doc_ids)``. A document's text is its first passage."""
    by_doc: dict[str, list[Any]] = {}
    for p in passages:
        by_doc.setdefault(p.doc_id or p.id, []).append(p)
    docs = sorted(by_doc)
    if len(docs) < 2:
        raise ValueError(
            f"calibration needs at least 2 documents (one held out, one in), found {len(docs)}"
        )
    rng = random.Random(f"calibrate:{seed}")
    rng.shuffle(docs)
    n_out = max(1, min(n_texts, len(docs) // 2))
    out_docs, in_docs = docs[:n_out], docs[n_out:]

    def first(doc: str) -> Any:
        ps = by_doc[doc]
        return min(ps, key=lambda p: (p.metadata.get("chunk_index", 0) or 0, p.char_start or 0))

    def texts(pool: list[str], in_corpus: bool, n: int) -> list[CalibrationText]:
        out = []
        for d in pool:
            if len(out) >= n:
                break
            cut = _cut(lm, first(d).text, prefix_tokens, score_tokens)
            if cut is not None:
                out.append(CalibrationText(d, cut[0], cut[1], in_corpus))
        return out

    in_texts = texts(in_docs, True, n_texts)
    out_texts = texts(out_docs, False, n_out)
    if not in_texts or not out_texts:
        raise ValueError(
            "no usable calibration text: documents are too short (need at least 12 tokens)"
        )
    return in_texts, out_texts, set(out_docs)
