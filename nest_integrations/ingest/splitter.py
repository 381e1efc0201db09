"""Splitting documents into NEST passages of at most ~200 LM tokens, with exact char offsets.

A passage is a *trimmed slice* of its document: ``doc.text[char_start:char_end] == passage.text``
always holds; the whitespace between passages belongs to no passage. Splitting prefers the
coarsest boundary that fits: paragraphs (blank lines), then sentences, then lines, then words,
and as a last resort characters (a single "word" longer than the budget). Consecutive units are
packed greedily while the packed slice still fits the token budget, measured with the LM
tokenizer on the exact slice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from typing import Any, Callable, Iterable

from nest_integrations.core.citations import trim_span
from nest_integrations.core.sentences import CHUNK_SENTENCE_GAP
from nest_integrations.ingest.documents import SourceDocument
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

TokenCounter = Callable[[str], int]

#: NEST's passage size (paper: passages "under 200 tokens").
MAX_PASSAGE_TOKENS = 200

# Separators per level; the text between two separators is a unit. Words are the last level
# before characters.
_SEPARATORS = [
    re.compile(r"\n[ \t\r\f\v]*\n\s*"),  # paragraphs: blank lines
    CHUNK_SENTENCE_GAP,  # sentences (core.sentences: the package's sentence rules)
    re.compile(r"\n\s*"),  # lines
    re.compile(r"\s+"),  # words
]

#: Metadata keys written by ingest. A user key with one of these names is kept as ``user_<key>``.
RESERVED_KEYS = frozenset(
    {"doc_id", "passage_id", "chunk_index", "char_start", "char_end", "n_tokens", "nest_scope"}
)


def passage_id(doc_id: str, char_start: int, text: str) -> str:
    """Content-derived passage id: hash of (doc id, start offset, text)."""
    h = hashlib.sha1(f"{doc_id}\x00{char_start}\x00{text}".encode("utf-8"))
    return h.hexdigest()[:32]


def _units(text: str, lo: int, hi: int, level: int) -> list[tuple[int, int]]:
    """Trimmed, non-empty spans of ``text[lo:hi]`` between separators of ``level``."""
    spans, start = [], lo
    for m in _SEPARATORS[level].finditer(text, lo, hi):
        spans.append(trim_span(text, start, m.start()))
        start = m.end()
    spans.append(trim_span(text, start, hi))
    return [s for s in spans if s[0] < s[1]]


def _hard_split(
    text: str, lo: int, hi: int, count: TokenCounter, budget: int
) -> list[tuple[int, int]]:
    """Character-level split of one oversized word: the longest prefixes that fit."""
    out = []
    while lo < hi:
        good, bad = lo + 1, hi + 1  # text[lo:good] is assumed to fit (one char always kept)
        while bad - good > 1:
            mid = (good + bad) // 2
            if count(text[lo:mid]) <= budget:
                good = mid
            else:
                bad = mid
        out.append((lo, good))
        lo = good
    return out


def _split(
    text: str, lo: int, hi: int, level: int, count: TokenCounter, budget: int
) -> list[tuple[int, int]]:
    if level == len(_SEPARATORS):
        return _hard_split(text, lo, hi, count, budget)
    out: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for u in _units(text, lo, hi, level):
        if cur is not None and count(text[cur[0] : u[1]]) <= budget:
            cur = (cur[0], u[1])  # pack the unit into the current passage
            continue
        if cur is not None:
            out.append(cur)
            cur = None
        if count(text[u[0] : u[1]]) <= budget:
            cur = u
        else:  # too big on its own: split it at the next finer level
            out.extend(_split(text, u[0], u[1], level + 1, count, budget))
    if cur is not None:
        out.append(cur)
    return out


def split_text(
    text: str, token_count: TokenCounter, max_tokens: int = MAX_PASSAGE_TOKENS
) -> list[tuple[int, int]]:
    """``(char_start, char_end)`` spans of ``text``: ordered, disjoint, trimmed, each with at most
    ``max_tokens`` tokens by ``token_count``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    return _split(text, 0, len(text), 0, token_count, max_tokens)


# ----------------------------------------------------------------------------- metadata


def flatten_metadata(meta: dict[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """Chroma-safe metadata: scalars kept, dicts flattened to dotted keys, ``None`` dropped,
    everything else (lists, dates, ...) JSON-encoded as a string."""
    flat: dict[str, str | int | float | bool] = {}
    for key, value in meta.items():
        name = f"{prefix}{key}"
        if value is None:
            continue
        if isinstance(value, (str, bool, int, float)):
            flat[name] = value
        elif isinstance(value, dict):
            flat.update(flatten_metadata(value, prefix=f"{name}."))
        else:
            flat[name] = json.dumps(value, default=str, ensure_ascii=False)
    return flat


def passage_metadata(
    doc: SourceDocument, index: int, start: int, end: int, n_tokens: int, pid: str
) -> dict[str, Any]:
    """Stored metadata of one passage: the user's keys plus ours (the user's never overwritten,
    except ``page``/``page_end``/``page_count`` of a PDF, which come from the passage's offsets).

    Ours: ``source``, ``title``, ``source_format``, ``encoding`` (text files), ``page``,
    ``page_end`` (only for a span across pages, which ``split_document`` never makes) and
    ``page_count`` (PDFs), and the reserved ``RESERVED_KEYS``."""
    meta: dict[str, Any] = {}
    for key, value in flatten_metadata(doc.metadata).items():
        meta[f"user_{key}" if key in RESERVED_KEYS else key] = value
    meta.setdefault("source", doc.source)
    meta.setdefault("title", doc.title)
    meta.setdefault("source_format", doc.source_format)
    if doc.encoding is not None:
        meta.setdefault("encoding", doc.encoding)
    if doc.page_starts:  # PDF: the page(s) this passage spans, 1-based, from its offsets
        from nest_integrations.ingest.pdf import pages_of_span

        first, last = pages_of_span(doc.page_starts, start, end)
        meta["page_count"] = len(doc.page_starts)
        meta["page"] = first
        meta.pop("page_end", None)
        if last != first:
            meta["page_end"] = last
    meta.update(
        doc_id=doc.doc_id,
        passage_id=pid,
        chunk_index=index,
        char_start=start,
        char_end=end,
        n_tokens=n_tokens,
        nest_scope=doc.scope or f"doc:{doc.doc_id}",
    )
    return meta


def split_document(
    doc: SourceDocument, token_count: TokenCounter, max_tokens: int = MAX_PASSAGE_TOKENS
) -> list[Passage]:
    """The passages of ``doc``, with ids, offsets and metadata.

    A PDF (``doc.page_starts`` set) is split page by page: no passage crosses a page break, so
    every passage, and every citation of it, lies on exactly one page (``metadata["page"]``).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if doc.page_starts:
        bounds = [*doc.page_starts[1:], len(doc.text)]
        spans = [
            span
            for lo, hi in zip(doc.page_starts, bounds, strict=True)
            for span in _split(doc.text, lo, hi, 0, token_count, max_tokens)
        ]
    else:
        spans = split_text(doc.text, token_count, max_tokens)
    passages = []
    for i, (start, end) in enumerate(spans):
        text = doc.text[start:end]
        pid = passage_id(doc.doc_id, start, text)
        meta = passage_metadata(doc, i, start, end, token_count(text), pid)
        passages.append(Passage(pid, text, doc.doc_id, None, start, end, meta))
    return passages


def split_documents(
    docs: Iterable[SourceDocument],
    token_count: TokenCounter,
    max_tokens: int = MAX_PASSAGE_TOKENS,
    progress: bool = False,
) -> list[Passage]:
    """Passages of every document, in document order."""
    from tqdm.auto import tqdm

    docs = list(docs)
    out: list[Passage] = []
    for doc in tqdm(docs, desc="splitting", unit="doc", disable=not progress or len(docs) < 2):
        out.extend(split_document(doc, token_count, max_tokens))
    return out


# ----------------------------------------------------------------------------- token counting


@functools.lru_cache(maxsize=1)
def default_token_counter() -> TokenCounter:
    """Token count with the default LM's (SmolLM2) tokenizer; loads only the tokenizer."""
    from transformers import AutoTokenizer

    from nest_integrations.lm.default import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def token_counter_for(lm: Any) -> TokenCounter:
    """Token count with ``lm.tokenize`` (a ``LanguageModel``)."""
    return lambda text: len(lm.tokenize(text))
