"""Stage-1 retrievers for the evaluation: BM25, dense MiniLM, or the paper's hybrid fusion.

All three rank a fixed list of passages in memory. Dense passage embeddings are cached on disk
(``$NEST_HOME/eval/embeddings/<hash>.npy``, keyed by the passage texts), so only the first run
over a corpus pays for them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

RETRIEVERS = ("hybrid", "bm25", "dense")


class BM25Retriever:
    """``PassageRetriever`` over a ``bm25s`` index (the sparse half of the hybrid)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        from nest_integrations.retrieval.hybrid import BM25Index

        self.index = BM25Index(passages)

    def retrieve(self, query: str, k: int) -> list[Passage]:
        import dataclasses

        return [dataclasses.replace(p, score=s) for p, s in self.index.search(query, k)]


class CachedEmbedder:
    """Wraps an embedder (``embed_documents``/``embed_query``); document embeddings of a whole
    text list are stored once as ``<cache_dir>/<sha256 of the texts>.npy``."""

    def __init__(self, embedder: Any, cache_dir: str | Path) -> None:
        self.embedder = embedder
        self.cache_dir = Path(cache_dir)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        h = hashlib.sha256()
        for t in texts:
            h.update(t.encode("utf-8"))
            h.update(b"\x00")
        f = self.cache_dir / f"{h.hexdigest()[:24]}.npy"
        if f.is_file():
            return np.load(f)
        start = time.perf_counter()
        out = np.asarray(self.embedder.embed_documents(list(texts)), dtype=np.float32)
        LOG.info("embedded %d passages in %.1f s", len(texts), time.perf_counter() - start)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp.npy")
        np.save(tmp, out)
        tmp.replace(f)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.embed_query(text)


def build_retriever(
    passages: Sequence[Passage], kind: str = "hybrid", cache_dir: str | Path | None = None
) -> Any:
    """A retriever over ``passages``: ``"bm25"``, ``"dense"`` (MiniLM cosine) or ``"hybrid"``
    (dense + BM25 with the paper's sharpness-weighted fusion, 200 candidates per list)."""
    if kind not in RETRIEVERS:
        raise ValueError(f"retriever={kind!r} is invalid: choose one of {RETRIEVERS}")
    if kind == "bm25":
        return BM25Retriever(passages)
    from nest_integrations.embedders.minilm import MiniLMEmbedder
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    if cache_dir is None:
        from nest_integrations.paths import nest_home

        cache_dir = nest_home() / "eval" / "embeddings"
    dense = InMemoryRetriever(list(passages), embedder=CachedEmbedder(MiniLMEmbedder(), cache_dir))
    if kind == "dense":
        return dense
    from nest_integrations.retrieval.hybrid import HybridRetriever

    return HybridRetriever(dense, BM25Retriever(passages).index)


__all__ = ["RETRIEVERS", "BM25Retriever", "CachedEmbedder", "build_retriever"]
