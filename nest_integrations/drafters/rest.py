"""REST-style drafting (He et al. 2023, "REST: Retrieval-Based Speculative Decoding"): exact
suffix matching over the DReSD datastore's token array, a peer baseline for DReSD.

The longest suffix of the context (``max_suffix`` tokens down to ``min_suffix``) is looked up
in a suffix array over the corpus tokens (sorted on their first ``max_suffix + draft_len``
tokens, never across a passage end); the continuations of up to ``max_matches`` occurrences
are counted and the ``num_drafts`` most frequent become a token tree (or the most frequent a
chain). Verified exactly, so lossless; accepted tokens carry their corpus position.

Options: ``datastore`` (as for ``dresd``), ``max_suffix`` (8), ``min_suffix`` (2),
``max_matches`` (64), ``num_drafts``, ``draft_len``, ``shape``, ``max_nodes``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Method, Source
from nest_integrations.drafters.dresd import (
    DEFAULTS,
    SHAPES,
    DraftStats,
    corpus_draft,
    default_datastore_for,
    open_datastore,
)

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
class RestDrafter:
    """Exact-suffix drafts from the corpus token array for one generation."""

    datastore: Any
    max_suffix: int = 8
    min_suffix: int = 2
    max_matches: int = 64
    num_drafts: int = DEFAULTS["num_drafts"]
    draft_len: int = DEFAULTS["draft_len"]
    shape: str = DEFAULTS["shape"]
    max_nodes: int = DEFAULTS["max_nodes"]
    stats: DraftStats = field(default_factory=DraftStats)
    _registered: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"rest shape={self.shape!r} is invalid: allowed one of {SHAPES}")
        self.sa = suffix_array(self.datastore, self.max_suffix)

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "RestDrafter":
        opts = {**DEFAULTS, "max_suffix": 8, "min_suffix": 2, "max_matches": 64,
                **(ctx.options or {})}  # fmt: skip
        ds = open_datastore(opts.get("datastore") or default_datastore_for(ctx), ctx.lm)
        return cls(
            ds, max_suffix=int(opts["max_suffix"]), min_suffix=int(opts["min_suffix"]),
            max_matches=int(opts["max_matches"]), num_drafts=int(opts["num_drafts"]),
            draft_len=int(opts["draft_len"]), shape=str(opts["shape"]),
            max_nodes=int(opts["max_nodes"]), stats=REST_STATS,
        )  # fmt: skip

    def propose(self, state: DecodeState) -> Draft | None:
        length = min(self.draft_len, state.budget)  # the loop already left room for its token
        ctx = state.context_ids
        if length < 1 or not ctx:
            return None
        t0 = time.perf_counter()
        cands = self.candidates(ctx, length, state.eos)
        if self.shape == "chain" or state.generator is not None:  # sampling: one chain
            cands = cands[:1]
        self.stats.search_seconds += time.perf_counter() - t0
        self.stats.proposals += 1
        return corpus_draft(state, cands, self.datastore, self._registered, self.stats,
                            self.max_nodes)

    def candidates(
        self, ctx: list[int], length: int, eos: frozenset[int]
    ) -> list[tuple[int, list[int]]]:
        """``(row before the draft, tokens)`` of the most frequent continuations of the
        longest matching context suffix."""
        tokens, sa = self.sa.tokens, self.sa
        for m in range(min(self.max_suffix, len(ctx)), self.min_suffix - 1, -1):
            hits = sa.find(ctx[-m:])
            if len(hits) == 0:
                continue
            counts: Counter[tuple[int, ...]] = Counter()
            first: dict[tuple[int, ...], int] = {}
            for s in hits[: self.max_matches]:
                g = int(s) + m - 1  # the row of the context's last token
                seq = [int(t) for t in tokens[g + 1 : min(g + 1 + length, int(sa.end[s]))]]
                for i, t in enumerate(seq):
                    if t in eos:
                        seq = seq[:i]
                        break
                if seq:
                    counts[tuple(seq)] += 1
                    first.setdefault(tuple(seq), g)
            if counts:
                return [(first[s], list(s)) for s, _ in counts.most_common(self.num_drafts)]
        return []

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        return None


#: Process-wide counters of every REST drafter.
REST_STATS = DraftStats()


def _make(ctx: DrafterContext) -> RestDrafter:
    return RestDrafter.from_context(ctx)


#: ``decoding="rest"`` (registered in ``drafters/__init__.py``).
METHOD = Method(
    "rest", _make,
    description="lossless REST-style drafts: exact suffix match over the DReSD token array",
)  # fmt: skip
