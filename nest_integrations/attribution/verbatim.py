"""Verbatim runs: the longest runs of answer tokens that occur in a passage, cited exactly
(``text[c.start:c.end] == c.text == passage.text[c.passage_start:c.passage_end]``)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from nest_integrations.attribution.splitting import split_sentences
from nest_integrations.core.citations import exact_pieces, make_citation
from nest_integrations.types import Citation, Passage


def verbatim_runs(text: str, passages: Sequence[Passage], tokenize: Any,
                  min_len: int) -> list[Citation]:
    """Greedy left-to-right longest runs of at least ``min_len`` answer tokens found in a
    passage, as exact ``kind="verbatim"`` citations (``tokenize(text) -> (tokens, offsets)``)."""
    if not passages:
        return []
    a_tok, a_off = tokenize(text)
    # a run stays inside one sentence, so a sentence's verdict never depends on the text
    # after it (what lets the engine judge each streamed sentence as soon as it ends)
    ends = np.array([e for _, e in split_sentences(text)], dtype=np.int64)
    sid = np.searchsorted(ends, a_off[:, 1], side="left") if len(a_off) else a_off[:, 0]
    p_tok, p_off = zip(*(tokenize(p.text) for p in passages))
    where: dict[Any, list[tuple[int, int]]] = {}
    for pi, toks in enumerate(p_tok):
        for j, t in enumerate(toks):
            where.setdefault(t, []).append((pi, j))
    n = len(a_tok)
    cites: list[Citation] = []
    i = 0
    while i < n:
        best = (0, -1, -1)
        for pi, j in where.get(a_tok[i], ()):
            toks, length = p_tok[pi], 1
            while (i + length < n and j + length < len(toks)
                   and toks[j + length] == a_tok[i + length]
                   and sid[i + length] == sid[i]):
                length += 1
            if length > best[0]:
                best = (length, pi, j)
        length, pi, j = best
        if length < min_len:
            i += 1
            continue
        s, e = int(a_off[i, 0]), int(a_off[i + length - 1, 1])
        ps, pe = int(p_off[pi][j, 0]), int(p_off[pi][j + length - 1, 1])
        for s2, e2, ps2, pe2 in exact_pieces(text, s, e, passages[pi].text, ps, pe):
            n_tok = int(((a_off[:, 1] > s2) & (a_off[:, 0] < e2)).sum())
            cites.append(make_citation(passages[pi], s2, e2, ps2, pe2, max(n_tok, 1),
                                       "verbatim"))
        i += length
    return cites


def coverage(text: str, s: int, e: int, cites: Iterable[Citation]) -> float:
    """Share of the non-space characters of ``text[s:e]`` inside a citation."""
    covered = np.zeros(e - s, dtype=bool)
    for c in cites:
        a, b = max(c.start, s), min(c.end, e)
        if a < b:
            covered[a - s : b - s] = True
    chars = np.array([not ch.isspace() for ch in text[s:e]], dtype=bool)
    return float((covered & chars).sum() / max(chars.sum(), 1))


def main_passage(s: int, e: int, cites: Iterable[Citation]) -> str | None:
    """The passage id whose citations cover most of ``[s, e)``, or None."""
    share: dict[str, int] = {}
    for c in cites:
        overlap = min(c.end, e) - max(c.start, s)
        if overlap > 0:
            share[c.passage_id] = share.get(c.passage_id, 0) + overlap
    return max(share, key=share.__getitem__) if share else None
