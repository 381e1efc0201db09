"""REST-style drafting (He et al. 2023, "REST: Retrieval-Based Speculative Decoding"): exact
suffix matching over the DReSD datastore's token array, a peer baseline for DReSD.

The longest suffix of the context (``max_suffix`` tokens down to ``min_suffix``) is looked up
in a suffix array over the corpus tokens (sorted on their first ``max_suffix + draft_len``
tokens, never across a passage end); the continuations of up to ``max_matches`` occurrences
are counted and the ``num_drafts`` most frequent become a token tree (or the most frequent a
chain). Verified exactly, so lossless; accepted tokens carry their corpus position.

Options: ``RestOptions`` (``max_suffix``, ``min_suffix``, ``max_matches`` and the
``CorpusOptions``: ``datastore``, ``num_drafts``, ``draft_len``, ``shape``, ``max_nodes``).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from nest_integrations.core.tokens import cut_at_eos
from nest_integrations.drafters import corpus
from nest_integrations.drafters.base import LOSSLESS, DecodeState, Draft, DrafterContext, Method

_SA: "weakref.WeakKeyDictionary[Any, SuffixArray]" = weakref.WeakKeyDictionary()
_SA_LOCK = threading.Lock()


class SuffixArray:
    """Corpus positions sorted by the ``width`` tokens that start there (a passage end pads
    with -1), with binary search for a pattern's range."""

    def __init__(self, tokens: np.ndarray, bounds: np.ndarray, width: int) -> None:
        n = len(tokens)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.width = width
        passage = np.searchsorted(bounds, np.arange(n), side="right") - 1
        self.end = np.asarray(bounds, dtype=np.int64)[passage + 1]  # (n,) passage end per row
        cols = []
        for j in range(width):
            idx = np.arange(n) + j
            col = np.full(n, -1, dtype=np.int64)
            ok = idx < self.end
            col[ok] = self.tokens[idx[ok]]
            cols.append(col)
        # lexsort sorts by the last key first: pass columns in reverse
        self.order = np.lexsort(cols[::-1]) if n else np.zeros(0, np.int64)
        self.matrix = np.stack(cols, axis=1)[self.order] if n else np.zeros((0, width), np.int64)

    def find(self, pattern: list[int]) -> np.ndarray:
        """Corpus positions where ``pattern`` (len <= width) starts."""
        m = len(pattern)
        if m == 0 or m > self.width or len(self.order) == 0:
            return np.zeros(0, np.int64)
        pat = np.asarray(pattern, dtype=np.int64)
        lo, hi = 0, len(self.order)
        rows = self.matrix[:, :m]
        # lower bound
        a, b = lo, hi
        while a < b:
            mid = (a + b) // 2
            if tuple(rows[mid]) < tuple(pat):
                a = mid + 1
            else:
                b = mid
        start = a
        a, b = start, hi
        while a < b:
            mid = (a + b) // 2
            if tuple(rows[mid]) <= tuple(pat):
                a = mid + 1
            else:
                b = mid
        return self.order[start:a]


def suffix_array(ds: Any, width: int) -> SuffixArray:
    with _SA_LOCK:
        sa = _SA.get(ds)
        if sa is None or sa.width < width:
            sa = SuffixArray(np.asarray(ds.tokens), ds.bounds, width)
            _SA[ds] = sa
        return sa


@dataclass
class RestOptions(corpus.CorpusOptions):
    """``drafter_options`` of ``decoding="rest"`` (and the ``CorpusOptions``).

    Attributes:
        max_suffix: longest context suffix looked up (also the suffix array's sort width).
        min_suffix: shortest one.
        max_matches: occurrences whose continuations are counted.
    """

    max_suffix: int = 8
    min_suffix: int = 2
    max_matches: int = 64

    def __post_init__(self) -> None:
        self.check("rest")
        corpus.check_at_least("rest", self, ("max_suffix", "min_suffix", "max_matches"))


class RestDrafter:
    """Exact-suffix drafts from the corpus token array for one generation
    (``RestDrafter(ds, max_suffix=..., ...)`` or ``RestDrafter(ds, options)``)."""

    wants_hidden = False  # drafts from text, not from the hidden state

    def __init__(self, datastore: Any, options: RestOptions | None = None, **kwargs: Any) -> None:
        self.datastore = datastore
        self.options = options if options is not None else RestOptions(**kwargs)
        self._registered: dict[int, int] = {}
        self.sa = suffix_array(self.datastore, self.options.max_suffix)

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "RestDrafter":
        opts = corpus.parse_options(RestOptions, ctx.options, "rest")
        return cls(corpus.datastore_of(ctx, opts), opts)

    def propose(self, state: DecodeState) -> Draft | None:
        length = min(self.options.draft_len, state.budget)  # the loop left room for its token
        ctx = state.context_ids
        if length < 1 or not ctx:
            return None
        cands = self.candidates(ctx, length, state.eos)
        return corpus.corpus_draft(state, cands, self.datastore, self._registered, self.options)

    def candidates(
        self, ctx: list[int], length: int, eos: frozenset[int]
    ) -> list[tuple[int, list[int]]]:
        """``(row before the draft, tokens)`` of the most frequent continuations of the
        longest matching context suffix."""
        tokens, sa, opts = self.sa.tokens, self.sa, self.options
        for m in range(min(opts.max_suffix, len(ctx)), opts.min_suffix - 1, -1):
            hits = sa.find(ctx[-m:])
            if len(hits) == 0:
                continue
            counts: Counter[tuple[int, ...]] = Counter()
            first: dict[tuple[int, ...], int] = {}
            for s in hits[: opts.max_matches]:
                g = int(s) + m - 1  # the row of the context's last token
                seq = cut_at_eos(tokens[g + 1 : min(g + 1 + length, int(sa.end[s]))], eos)
                if seq:
                    counts[tuple(seq)] += 1
                    first.setdefault(tuple(seq), g)
            if counts:
                return [(first[s], list(s)) for s, _ in counts.most_common(opts.num_drafts)]
        return []

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        return None


#: ``decoding="rest"`` (registered in ``drafters/__init__.py``).
METHOD = Method(
    "rest", RestDrafter.from_context, verifier=LOSSLESS,
    description="lossless REST-style drafts: exact suffix match over the DReSD token array",
)  # fmt: skip
