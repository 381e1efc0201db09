"""Hybrid dense + BM25 passage retrieval with the NEST paper's score fusion (spec §4.1).

Per query, each list (dense, sparse) returns its top ``n_candidates`` passages with raw scores.

- Sharpness of a list: ``eta_x = max(0, 1 - s_x[rank 100] / max s_x)`` (0-based index 100, the
  101st score as in the official code; the last score when the list is shorter).
- Weight: ``eta = 0.7 * (1 - eta_sparse) + 0.3 * eta_dense``.
- Fused score: ``s = eta * s_dense + (1 - eta) * s_sparse``; a passage missing from one list takes
  that list's lowest returned score.

Usage::

    dense = ChromaPassageStore.from_persist_dir(None, "docs")   # $NEST_HOME/store
    hybrid = HybridRetriever(dense, list(dense.iter_passages()))

The default assembly builds this when ``NestConfig.hybrid_retrieval`` is set (``nest ask
--hybrid``, ``hybrid=True`` on the adapters): ``assembly.hybrid_retriever(store)``.
    hybrid.retrieve("what does the with statement do?", k=40)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from nest_integrations._optional import require
from nest_integrations.retrieval.base import PassageRetriever
from nest_integrations.types import Passage

#: Rank whose score measures a list's sharpness (0-based; the paper's "rank 100").
SHARPNESS_RANK = 100


def sharpness(scores: Sequence[float], rank: int = SHARPNESS_RANK) -> float:
    """``eta_x = max(0, 1 - s[rank] / max s)`` for scores sorted best first (0 if max <= 0)."""
    if len(scores) == 0:
        return 0.0
    top = float(scores[0])
    if top <= 0:
        return 0.0
    ref = float(scores[min(rank, len(scores) - 1)])
    return min(1.0, max(0.0, 1.0 - ref / top))


def fuse(
    dense: Sequence[tuple[str, float]], sparse: Sequence[tuple[str, float]]
) -> list[tuple[str, float, float, float]]:
    """Fuse two ranked ``(id, score)`` lists (best first) with the NEST formula.

    Returns ``(id, fused, dense_score, sparse_score)`` sorted by fused score, best first; ties
    keep dense order, then sparse order.
    """
    eta = 0.7 * (1.0 - sharpness([s for _, s in sparse])) + 0.3 * sharpness([s for _, s in dense])
    d, s = dict(dense), dict(sparse)
    d_low = min(d.values()) if d else 0.0
    s_low = min(s.values()) if s else 0.0
    ids = list(dict.fromkeys([i for i, _ in dense] + [i for i, _ in sparse]))
    rows = []
    for pid in ids:
        sd, ss = d.get(pid, d_low), s.get(pid, s_low)
        rows.append((pid, eta * sd + (1.0 - eta) * ss, sd, ss))
    return sorted(rows, key=lambda r: -r[1])


class BM25Index:
    """BM25 (``bm25s``) over a fixed list of passages."""

    def __init__(self, passages: Sequence[Passage], stopwords: str | None = "en") -> None:
        bm25s = require("bm25s")
        self.passages = list(passages)
        self.stopwords = stopwords
        self._bm25 = bm25s.BM25()
        tokens = bm25s.tokenize(
            [p.text for p in self.passages], stopwords=stopwords, show_progress=False
        )
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """Top ``k`` passages with a positive BM25 score, best first."""
        bm25s = require("bm25s")
        k = min(k, len(self.passages))
        if k <= 0:
            return []
        q = bm25s.tokenize([query], stopwords=self.stopwords, return_ids=False, show_progress=False)
        if not q or not q[0]:
            return []
        docs, scores = self._bm25.retrieve(q, k=k, show_progress=False)
        return [
            (self.passages[int(i)], float(sc))
            for i, sc in zip(np.asarray(docs)[0], np.asarray(scores)[0], strict=True)
            if sc > 0
        ]


class HybridRetriever:
    """``PassageRetriever`` fusing a dense retriever with BM25 (NEST spec §4.1).

    Args:
        dense: any ``PassageRetriever`` whose scores are similarities (higher is better).
        sparse: the corpus passages (a BM25 index is built over them) or a ready ``BM25Index``.
        n_candidates: passages taken from each list per query (paper: b*l = 4000); at least
            101 so that the rank-100 sharpness is defined.
    """

    def __init__(
        self,
        dense: PassageRetriever,
        sparse: Sequence[Passage] | BM25Index,
        n_candidates: int = 200,
    ) -> None:
        if n_candidates < 1:
            raise ValueError(f"n_candidates must be >= 1, got {n_candidates}")
        self.dense = dense
        self.sparse = sparse if isinstance(sparse, BM25Index) else BM25Index(sparse)
        self.n_candidates = n_candidates

    def passages_titled(self, titles: Sequence[str], limit: int = 32) -> list[Passage]:
        """The dense retriever's title lookup (the answer policy's title match), if it has one."""
        fn = getattr(self.dense, "passages_titled", None)
        return list(fn(titles, limit)) if callable(fn) else []

    def title_index(self) -> Any:
        """The dense retriever's title index (the answer policy's title match), if it has one."""
        fn = getattr(self.dense, "title_index", None)
        return fn() if callable(fn) else None

    def retrieve(self, query: str, k: int) -> list[Passage]:
        """Top ``k`` passages by fused score; ``metadata`` gains ``dense_score`` and
        ``sparse_score`` (the per-list scores used in the fusion)."""
        dense = self.dense.retrieve(query, self.n_candidates)
        sparse = self.sparse.search(query, self.n_candidates)
        by_id: dict[str, Passage] = {p.id: p for p, _ in sparse}
        by_id.update({p.id: p for p in dense})
        rows = fuse([(p.id, float(p.score or 0.0)) for p in dense], [(p.id, s) for p, s in sparse])
        return [
            dataclasses.replace(
                by_id[pid],
                score=fused,
                metadata={**by_id[pid].metadata, "dense_score": sd, "sparse_score": ss},
            )
            for pid, fused, sd, ss in rows[:k]
        ]


__all__ = ["BM25Index", "HybridRetriever", "fuse", "sharpness"]
