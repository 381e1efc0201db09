"""Engine assembly: every default, the shared model cache, and (store, model, config, decoding)
-> a ready ``NestEngine``.

Every entry point builds its engine here (``nest ask``/``ingest``/``info``, ``from_defaults``,
LangChain's ``ChatNest``/``NestLLM``, LlamaIndex's ``NestLLM``/``NestQueryEngine``, the server
and the evaluation), so each default is decided once:

- the defaults (``DEFAULT_COLLECTION``, ``DEFAULT_MAX_NEW_TOKENS``, ``DEFAULT_DECODING``,
  ``DEFAULT_PRESET``) are written in ``nest_integrations.defaults`` and re-exported here;
  ``NestEngine`` defaults nothing, and this module supplies its config, the preset's policy and
  a key store (in memory when no persist dir is used);
- a corpus is opened only when asked for: a ready ``retriever``, or any of ``collection`` /
  ``persist_dir`` / ``chroma_url`` (``EngineSpec.opens_store``); a bare ``ChatNest()`` decodes
  with the plain LM. Token keys live in the persist dir's key store; hybrid retrieval fuses the
  store's dense scores with BM25 (``retrieval.hybrid``);
- models are loaded once per process per ``(backend, model, device, key_source, dtype)``
  (``shared_model``), and every engine's model calls are serialised (``lm.serialized``). On
  llama.cpp the default key source becomes ``"final_norm"`` (``lm.backend.backend_config``).

The settings (``EngineSpec`` and what it resolves) live in ``assembly_settings``, opening the
stores in ``assembly_stores`` (both re-exported here).

Usage::

    from nest_integrations import assembly

    engine = assembly.build_engine(assembly.EngineSpec.for_store(config="paper-ra"))
    engine = assembly.build_engine(assembly.EngineSpec(decoding="prompt-lookup"))  # no corpus
    engine = assembly.build_engine(assembly.EngineSpec(), retriever=my_passage_retriever)
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from nest_integrations.config import NestConfig
from nest_integrations.defaults import (
    DEFAULT_COLLECTION,
    DEFAULT_DECODING,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PRESET,
)
from nest_integrations.assembly_settings import (
    EngineSpec,
    backend_name,
    check_dtype,
    engine_config,
    lm_backend,
    resolve_config,
    resolve_max_new_tokens,
    resolve_policy,
)
from nest_integrations.assembly_stores import (
    hybrid_retriever,
    load_embedders,
    memory_key_store,
    open_key_store,
    open_store,
)
from nest_integrations.decoding import engine as decoding_engine
from nest_integrations.lm.backend import backend_config, check_backend
from nest_integrations.lm.serialized import SerializedLM, serialized, unwrap
from nest_integrations.paths import persist_root
from nest_integrations.policy import AnswerPolicy

LOG = logging.getLogger(__name__)


class NestEngine(decoding_engine.NestEngine):
    """The public ``NestEngine`` (``nest_integrations.NestEngine``): the decoding engine plus its
    assembly constructor, ``NestEngine.from_defaults(...)`` == ``from_defaults(...)``.

    A subclass here, so the engine module never imports the assembly (no upward import, no
    attribute attached at import time); every engine this module builds is one."""

    @classmethod
    def from_defaults(cls, *args: Any, **kwargs: Any) -> NestEngine:
        """See ``assembly.from_defaults``."""
        return from_defaults(*args, **kwargs)

    def preset_config(self, name: str) -> NestConfig:
        """The preset's config adapted to this engine's backend (``engine_config``): a
        per-call ``config="paper"`` works on llama.cpp too."""
        return engine_config(self, name)


# --------------------------------------------------------------------------------- models

_MODELS: dict[tuple[str, str | None, str | None, str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def load_model(
    model: str | None = None, device: str | None = None, key_source: Any = None,
    dtype: Any = None, backend: str | None = None,
) -> Any:
    """Load a language model (uncached). On torch, None is the embedded default and anything
    else goes to ``HFLanguageModel.from_pretrained`` (a local folder, or a Hub id in the HF
    cache); on llama.cpp, ``model`` is a GGUF path, a quantisation of the embedded model
    (``"Q4_1"``: the shipped file) or None (the embedded model requantised once to
    ``lm.llama_cpp.DEFAULT_QUANT``, Q8_0; ``lm.llama_cpp.resolve_gguf``)."""
    from nest_integrations.lm.auto_backend import resolve_backend
    from nest_integrations.lm.hf import HFLanguageModel

    backend = resolve_backend(backend, model=model, device=device, dtype=dtype,
                              key_source=key_source)
    # None: the backend's key source; an explicit one is kept (or refused where it cannot run)
    key_source = backend_config(NestConfig(key_source=key_source), backend).key_source
    if backend == "llama.cpp":
        return _load_llama_cpp(model, device, key_source, dtype)
    if model is None:
        return HFLanguageModel.from_default(device=device, dtype=dtype, key_source=key_source)
    return HFLanguageModel.from_pretrained(
        model, device=device, dtype=dtype, key_source=key_source
    )


def _load_llama_cpp(model: str | None, device: Any, key_source: Any, dtype: Any) -> Any:
    from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel, resolve_gguf

    check_backend("llama.cpp", dtype, device)
    key_source = backend_config(NestConfig(key_source=key_source), "llama.cpp").key_source
    path, name = resolve_gguf(model)
    return LlamaCppLanguageModel.from_gguf(path, name=name, key_source=key_source)


def shared_model(
    model: str | None = None, device: str | None = None, key_source: Any = None,
    dtype: Any = None, backend: str | None = None,
) -> Any:
    """The process-wide model for ``(backend, model, device, key_source, dtype)``, loaded once
    (thread-safe). The key holds the resolved backend and dtype (``backend.dtype_label``), so a
    bf16 and an fp32 model, or a torch and a llama.cpp one, are never shared by mistake.

    ``model=None`` or the default's name is the embedded SmolLM2-135M-Instruct (on llama.cpp:
    its GGUF as ``DEFAULT_QUANT``, Q8_0, the same model as ``model="Q8_0"``); ``backend=None``
    is the process default (``--backend``, else ``$NEST_BACKEND``, else auto).
    """
    from nest_integrations.lm.auto_backend import resolve_backend
    from nest_integrations.lm.backend import dtype_label
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME
    from nest_integrations.lm.hf import resolve_device

    backend = resolve_backend(backend, model=model, device=device, dtype=dtype,
                              key_source=key_source)
    name = None if model in (None, DEFAULT_MODEL_NAME) else model
    # None: the backend's key source, so an unset and an explicit default share one model
    key_source = backend_config(NestConfig(key_source=key_source), backend).key_source
    if backend == "llama.cpp":  # one model per GGUF and key source, its dtype its own
        check_backend(backend, dtype, device)
        from nest_integrations.lm.llama_cpp import DEFAULT_QUANT, quant_type

        if isinstance(name, str) and quant_type(name) == DEFAULT_QUANT:
            name = None  # the default's file: one model, not two
        key = (backend, name, None, str(key_source), "gguf")
    else:
        key = (backend, name, device, str(key_source),
               dtype_label(dtype, resolve_device(device)))
    with _MODELS_LOCK:  # one load at a time: a second caller waits for the first's model
        if key not in _MODELS:
            extra = () if dtype is None else (dtype,)  # None: the process default, at load
            _MODELS[key] = load_model(name, device, key_source, *extra, backend=backend)
        return _MODELS[key]


def spec_model(spec: EngineSpec) -> Any:
    """The shared model of ``spec`` (its backend, model, device, dtype and config's key
    source): what ``build_engine`` decodes with and what the DReSD and KNN-SSD CLIs build their
    datastores and profiles with (``backend="auto"`` decided here: ``EngineSpec.resolved``)."""
    spec = spec.resolved()
    return shared_model(spec.model, spec.device, spec.config.key_source, spec.dtype,
                        backend=spec.backend)


def model_name(model: str | None = None) -> str:
    """The name of ``model`` for metadata (no load): the embedded default's name for None."""
    if model:
        return model
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME

    return DEFAULT_MODEL_NAME


def clear_model_cache() -> None:
    """Forget the shared models (tests; freeing memory)."""
    with _MODELS_LOCK:
        _MODELS.clear()


# --------------------------------------------------------------------------------- engines


def check_sources(retriever: Any, collection: str | None, chroma_url: str | None) -> None:
    """Raise ``ValueError`` when both a retriever and a Chroma collection/URL are given."""
    if retriever is not None and (collection or chroma_url):
        raise ValueError(
            "pass either retriever= or collection=/chroma_url=, not both "
            "(persist_dir= may accompany retriever=: it keeps the token keys)"
        )


def build_engine(
    spec: EngineSpec | None = None, *, retriever: Any = None, lm: Any = None, key_store: Any = None
) -> Any:
    """A ready ``NestEngine`` for ``spec``.

    Args:
        spec: what to build (default ``EngineSpec()``: the default model, no corpus).
        retriever: a ready ``PassageRetriever`` (framework adapters convert theirs first);
            excludes ``spec.collection``/``chroma_url``. With ``spec.persist_dir`` its keys
            persist there.
        lm: a ready ``LanguageModel`` instead of ``spec.model``/``device``.
        key_store: a ready ``KeyStore`` (e.g. the evaluation's cache) instead of the persist
            dir's.
    """
    spec = (spec or EngineSpec()).resolved()  # auto is measured here, not in the spec
    cfg = spec.config
    check_sources(retriever, spec.collection, spec.chroma_url)
    if retriever is None and spec.opens_store:
        retriever = open_store(spec.store_collection, spec.persist_dir, spec.chroma_url)
        retriever.count()  # a missing collection fails here, with the existing ones listed
    if spec.hybrid:
        if retriever is None:
            raise ValueError("hybrid retrieval needs a corpus: give a collection or retriever")
        retriever = hybrid_retriever(retriever)
    model = serialized(lm if lm is not None else spec_model(spec))  # its port resolved once
    if spec.opens_store and spec.calibrated is not False:
        cfg = calibrated_config(cfg, spec, model)
    if key_store is None:
        key_store = (open_key_store(spec.persist_dir, model)
                     if spec.persist_dir is not None or spec.opens_store else memory_key_store())
    LOG.debug("building NestEngine(%s, retriever=%r)", spec, retriever)
    engine = NestEngine(
        model,
        retriever,
        key_store,
        cfg,
        policy=spec.policy,
        decoding=spec.decoding,
        drafter_options=spec.options,
    )
    load_embedders(engine.retriever, engine.policy, engine.config)
    return engine


def from_defaults(
    collection: str | None = None,
    persist_dir: str | None = None,
    chroma_url: str | None = None,
    config: NestConfig | str | None = None,
    model: str | None = None,
    device: str | None = None,
    *,
    decoding: str | None = None,
    drafter_options: dict[str, Any] | None = None,
    hybrid: bool | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    policy: AnswerPolicy | str | None = None,
) -> NestEngine:
    """The embedded default engine: SmolLM2-135M-Instruct + the Chroma store + its key store.

    ``collection`` defaults to ``DEFAULT_COLLECTION`` in ``persist_dir`` (default
    ``$NEST_HOME/store``, filled by ``nest ingest``); with ``chroma_url`` passages come from a
    Chroma server and keys stay in ``persist_dir``. ``config`` is a ``NestConfig`` or a preset
    name (default ``DEFAULT_PRESET``), ``policy`` an ``AnswerPolicy`` or preset name (default:
    the preset's); ``dtype`` and ``backend`` as in ``EngineSpec``. Also reachable as
    ``nest_integrations.from_defaults`` and ``NestEngine.from_defaults``.
    """
    spec = EngineSpec.for_store(
        collection, persist_dir=persist_dir, chroma_url=chroma_url, config=config,
        model=model, device=device, decoding=decoding, drafter_options=drafter_options,
        hybrid=hybrid, dtype=dtype, backend=backend, policy=policy,
    )
    return build_engine(spec)


def attributor_from_defaults(
    collection: str | None = None,
    *,
    persist_dir: str | None = None,
    config: Any = None,
    retriever: Any = None,
    embedder: Any = None,
    lm: Any = None,
    **spec: Any,
) -> Any:
    """An ``attribution.Attributor`` over the same parts the engine uses: the Chroma store of
    ``collection`` (default ``DEFAULT_COLLECTION`` in ``persist_dir``; or a ready
    ``retriever``, with ``hybrid`` fusion as the engine's), the shared MiniLM embedder, and,
    for the ``"keys"``/``"combined"`` scorers (or ``tokenizer="lm"``), the shared model of the
    spec with the persist dir's key store.

    Args:
        config: an ``AttributionConfig`` (default: its defaults).
        **spec: other ``EngineSpec`` fields (``chroma_url``, ``model``, ``device``, ``dtype``,
            ``hybrid``, ``config`` is the attribution's, so the engine config is
            ``engine_config=``).
    """
    from nest_integrations.attribution import AttributionConfig, Attributor

    acfg = config if config is not None else AttributionConfig()
    if not isinstance(acfg, AttributionConfig):
        raise TypeError(f"config must be an AttributionConfig, not {type(acfg).__name__}")
    engine_config = spec.pop("engine_config", None)
    check_sources(retriever, collection, spec.get("chroma_url"))
    es = (EngineSpec(persist_dir=persist_dir, config=engine_config, **spec) if retriever is not None
          else EngineSpec.for_store(collection, persist_dir=persist_dir, config=engine_config,
                                    **spec))
    if retriever is None:
        retriever = open_store(es.store_collection, es.persist_dir, es.chroma_url)
        retriever.count()  # a missing collection fails here, with the existing ones listed
    if es.hybrid:
        retriever = hybrid_retriever(retriever)
    key_store = None
    if lm is None and (acfg.scorer in ("keys", "combined") or acfg.tokenizer == "lm"):
        lm = spec_model(es)
    if lm is not None:
        lm = serialized(lm)
        if acfg.scorer in ("keys", "combined"):
            key_store = (open_key_store(es.persist_dir, lm) if es.opens_store
                         or es.persist_dir is not None else memory_key_store())
    if embedder is None and acfg.scorer in ("embedding", "combined"):
        from nest_integrations.embedders.minilm import shared_embedder

        embedder = shared_embedder()
    return Attributor(acfg, embedder=embedder, lm=lm, key_store=key_store, retriever=retriever)


_CALIBRATED_FIELDS = ("knn_temperature", "rrc_offset", "rrc_scale")


def calibrated_config(cfg: NestConfig, spec: EngineSpec, lm: Any) -> NestConfig:
    """``cfg`` with the stored calibration of ``spec``'s collection applied (see
    ``EngineSpec.calibrated``); ``cfg`` itself when none applies."""
    from nest_integrations.calibration_store import load_calibration

    if spec.calibrated is None:
        base = NestConfig()
        untouched = all(getattr(cfg, f) == getattr(base, f) for f in _CALIBRATED_FIELDS)
        if not untouched or cfg.ra_passages > 0:
            return cfg
    found = load_calibration(persist_root(spec.persist_dir), spec.store_collection, unwrap(lm))
    if not found:
        return cfg
    LOG.info("using the stored calibration of %r: %s", spec.store_collection, found)
    return cfg.replace(**{k: v for k, v in found.items() if k in _CALIBRATED_FIELDS})


def share_engine(engine: Any) -> Any:
    """A shallow copy of a user's ``engine`` whose model calls are serialised (the adapters'
    policy); the given engine is left as it is."""
    import copy

    shared = copy.copy(engine)
    shared.lm = serialized(engine.lm)
    return shared


__all__ = [
    "DEFAULT_COLLECTION",
    "DEFAULT_DECODING",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_PRESET",
    "EngineSpec",
    "NestEngine",
    "attributor_from_defaults",
    "SerializedLM",
    "backend_config",
    "backend_name",
    "build_engine",
    "calibrated_config",
    "check_backend",
    "check_dtype",
    "check_sources",
    "clear_model_cache",
    "engine_config",
    "from_defaults",
    "hybrid_retriever",
    "lm_backend",
    "load_model",
    "memory_key_store",
    "model_name",
    "open_key_store",
    "open_store",
    "persist_root",
    "resolve_config",
    "resolve_policy",
    "resolve_max_new_tokens",
    "serialized",
    "share_engine",
    "shared_model",
    "spec_model",
    "unwrap",
]
