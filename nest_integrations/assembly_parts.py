"""The parts ``assembly`` builds an engine from: settings resolved (a config, preset or mapping
-> ``NestConfig``; the answer policy; the dtype and token budget checks; the backend's name and
its per-call config) and the stores opened (passages, token keys, hybrid BM25). Every name here
is re-exported by ``nest_integrations.assembly``, the module to import."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from nest_integrations.config import Guards, NestConfig
from nest_integrations.defaults import DEFAULT_COLLECTION, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PRESET
from nest_integrations.lm.backend import backend_config
from nest_integrations.lm.port import port_of
from nest_integrations.lm.serialized import unwrap
from nest_integrations.paths import persist_root
from nest_integrations.policy import AnswerPolicy

LOG = logging.getLogger("nest_integrations.assembly")  # its messages stay the assembly's


# --------------------------------------------------------------------------------- resolution


def resolve_config(config: NestConfig | str | Mapping[str, Any] | None) -> NestConfig:
    """A ``NestConfig`` from a config, a preset name, a ``to_dict()`` mapping or None (the
    ``DEFAULT_PRESET``)."""
    if config is None:
        return NestConfig.from_preset(DEFAULT_PRESET)
    if isinstance(config, NestConfig):
        return config
    if isinstance(config, str):
        return NestConfig.from_preset(config)
    if isinstance(config, Mapping):
        return NestConfig(**config)
    raise TypeError(f"config must be a NestConfig, a preset name or None, not {type(config)}")


def resolve_policy(policy: AnswerPolicy | str | None, config: Any = None) -> AnswerPolicy:
    """An ``AnswerPolicy`` from a policy, a preset name or None: the policy of the preset that
    ``config`` names when it is a name, else of the ``DEFAULT_PRESET``."""
    if isinstance(policy, AnswerPolicy):
        return policy
    if isinstance(policy, str):
        return AnswerPolicy.from_preset(policy)
    if isinstance(policy, Mapping):  # a dict of its fields (a serialised adapter, say)
        fields = dict(policy)
        if isinstance(fields.get("guards"), Mapping):
            fields["guards"] = Guards(**fields["guards"])
        return AnswerPolicy(**fields)
    if policy is not None:
        raise TypeError(f"policy must be an AnswerPolicy, a preset name or None, not "
                        f"{type(policy)}")
    return AnswerPolicy.from_preset(config if isinstance(config, str) else DEFAULT_PRESET)


def check_dtype(dtype: Any) -> Any:
    """``dtype`` if ``lm.backend`` accepts it (None, ``"auto"``, ``"fp32"``, ``"bf16"``, ...),
    else ``ValueError`` naming the accepted values: the adapters' check at construction."""
    from nest_integrations.lm.backend import parse_dtype

    parse_dtype(dtype)
    return dtype


def resolve_max_new_tokens(*budgets: int | None) -> int:
    """The first budget given (per call, then per model), else ``DEFAULT_MAX_NEW_TOKENS``."""
    for budget in budgets:
        if budget is not None:
            if int(budget) < 1:
                raise ValueError(f"max new tokens must be >= 1, got {budget!r}")
            return int(budget)
    return DEFAULT_MAX_NEW_TOKENS


# --------------------------------------------------------------------------------- backends


def backend_name(backend: str | None) -> str | None:
    """``backend``'s canonical name (``"torch"``, ``"llama.cpp"``; None stays None), else a
    ``ValueError`` naming the accepted ones: the adapters' check at construction."""
    from nest_integrations.lm.backend import parse_backend

    return parse_backend(backend)


def lm_backend(lm: Any) -> str:
    """The backend a loaded model runs on (``"torch"`` unless it says otherwise)."""
    return port_of(lm).build().backend


def engine_config(engine: Any, config: NestConfig | str | Mapping[str, Any] | None) -> NestConfig:
    """A per-call ``config`` (a ``NestConfig``, preset name or mapping; None = the engine's)
    for ``engine``'s model: on llama.cpp the default key source becomes ``"final_norm"``
    (``backend_config``), so presets work on either backend."""
    if config is None:
        return engine.config
    return backend_config(resolve_config(config), lm_backend(engine.lm))


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
        from nest_integrations.embeddings import shared_embedder

        wanted.append(shared_embedder())
    for embedder in wanted:
        if callable(getattr(embedder, "load", None)):
            embedder.load()
