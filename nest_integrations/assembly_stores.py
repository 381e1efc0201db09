"""The stores an engine reads, opened: the Chroma passage store, the persist dir's token key
store (eager or the lazy cache) or one in memory, hybrid BM25 over a dense store, and the
policy's embedders. Every name here is re-exported by ``nest_integrations.assembly``."""

from __future__ import annotations

import logging
import os
from typing import Any

from nest_integrations.defaults import DEFAULT_COLLECTION
from nest_integrations.lm.serialized import unwrap
from nest_integrations.paths import persist_root

LOG = logging.getLogger("nest_integrations.assembly")  # its messages stay the assembly's


# --------------------------------------------------------------------------------- stores


def open_store(
    collection: str | None = None,
    persist_dir: str | os.PathLike[str] | None = None,
    chroma_url: str | None = None,
) -> Any:
    """The read-only ``ChromaPassageStore`` for ``collection`` (default ``DEFAULT_COLLECTION``):
    embedded in ``persist_dir`` (default ``$NEST_HOME/store``), or on the server at
    ``chroma_url`` with token keys in ``persist_dir``. No I/O beyond connecting."""
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    name = collection or DEFAULT_COLLECTION
    root = persist_root(persist_dir)
    if chroma_url:
        return ChromaPassageStore.from_url(chroma_url, name, persist_dir=root)
    return ChromaPassageStore.from_persist_dir(root, name)


def open_key_store(persist_dir: str | os.PathLike[str] | None, lm: Any) -> Any:
    """The on-disk key store of ``persist_dir`` (default ``$NEST_HOME/store``) for ``lm``: the
    lazy LRU key cache when the dir is in lazy mode (``nest ingest --keys lazy``), else the
    eager ``DiskKeyStore``."""
    from nest_integrations import paths
    from nest_integrations.index.lazy_cache import LazyKeyCache
    from nest_integrations.index.lazy_mode import read_mode
    from nest_integrations.index.store import DiskKeyStore

    keys = paths.keys_dir(persist_root(persist_dir))
    if read_mode(keys) is not None:
        return LazyKeyCache.open(keys, unwrap(lm))
    return DiskKeyStore.open(keys, unwrap(lm))


def memory_key_store() -> Any:
    """A fresh ``InMemoryKeyStore``: the key store of an engine without a persist dir (keys are
    encoded once per engine and kept for its lifetime)."""
    from nest_integrations.index.in_memory_store import InMemoryKeyStore

    return InMemoryKeyStore()


def hybrid_retriever(dense: Any) -> Any:
    """``dense`` fused with BM25 over every passage it holds (needs ``iter_passages``)."""
    from nest_integrations.retrieval.hybrid import HybridRetriever

    if not callable(getattr(dense, "iter_passages", None)):
        raise ValueError(
            f"hybrid retrieval needs the whole corpus for BM25, and {type(dense).__name__} "
            "cannot list its passages: use the Chroma store (collection=...) or drop hybrid"
        )
    passages = list(dense.iter_passages())
    LOG.info("hybrid retrieval: BM25 over %d passages", len(passages))
    return HybridRetriever(dense, passages)


def load_embedders(retriever: Any, policy: Any, config: Any) -> None:
    """Load now the sentence embedders a first answer uses: the retriever's own, and the
    packaged MiniLM where the evidence scorer (``AnswerPolicy.evidence``) or the support
    citations (``NestConfig.attribute_scorer``) embed with it. A first answer's time is then
    its own, not a model's load, as the language model is loaded before it too. Nothing
    without a retriever (passages given per call load it on first use)."""
    from nest_integrations.retrieval.relevance import embedder_of

    if retriever is None:
        return
    embedding = ("embedding", "combined")
    own = embedder_of(retriever)
    wanted = [own] if own is not None else []
    if ((own is None and policy.evidence in embedding)
            or (config.attribute and config.attribute_scorer in embedding)):
        from nest_integrations.embedders.minilm import shared_embedder

        wanted.append(shared_embedder())
    for embedder in wanted:
        if callable(getattr(embedder, "load", None)):
            embedder.load()
