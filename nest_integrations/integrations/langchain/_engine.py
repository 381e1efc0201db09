"""What ``ChatNest`` and ``NestLLM`` share: their parameters and the lazily built ``NestEngine``.

Constructing a LangChain model is cheap (no model load, no I/O); the engine is assembled on first
use from the parameters: the language model (shared per process, see ``shared_lm``), a passage
retriever (a LangChain retriever or vector store, a Chroma store filled by ``nest ingest``, or
none) and a key store (on disk under ``persist_dir``, else in memory). The engine's model is
wrapped in ``SerializedLM`` so LangChain's thread-based ``batch``/``astream`` stay correct.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import threading
import weakref
from typing import Any, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from nest_integrations.config import NestConfig
from nest_integrations.types import NestResult, StreamChunk

LOG = logging.getLogger(__name__)

#: Used when neither ``max_tokens`` nor a per-call ``max_tokens`` is given.
DEFAULT_MAX_TOKENS = 256

_LMS: dict[tuple[str | None, str | None, str | int], Any] = {}
_LMS_LOCK = threading.Lock()
_CALL_LOCKS: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_CALL_LOCKS_LOCK = threading.Lock()


def shared_lm(model: str | None, device: str | None, key_source: str | int) -> Any:
    """The process-wide ``HFLanguageModel`` for ``(model, device, key_source)``, loaded once.

    ``model=None`` (or the default's name) is the embedded SmolLM2-135M-Instruct; anything else
    goes to ``HFLanguageModel.from_pretrained`` (a local folder, or a Hub id in the HF cache).
    """
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME
    from nest_integrations.lm.hf import HFLanguageModel

    name = None if model in (None, DEFAULT_MODEL_NAME) else model
    key = (name, device, key_source)
    with _LMS_LOCK:
        if key not in _LMS:
            if name is None:
                _LMS[key] = HFLanguageModel.from_default(device=device, key_source=key_source)
            else:
                _LMS[key] = HFLanguageModel.from_pretrained(
                    name, device=device, key_source=key_source
                )
        return _LMS[key]


class SerializedLM:
    """A language model whose method calls run one at a time, process-wide per model.

    ``HFLanguageModel`` captures keys with forward hooks on a module shared by every caller, so
    two threads decoding with one model at once (LangChain's ``batch``/``abatch``/``astream``
    use threads) would read each other's keys. Serialising each call (not each generation)
    lets concurrent generations interleave, and an abandoned stream blocks nobody.
    Attributes pass through unchanged.
    """

    def __init__(self, lm: Any) -> None:
        self._lm = lm
        with _CALL_LOCKS_LOCK:
            try:
                self._lock = _CALL_LOCKS.setdefault(lm, threading.RLock())
            except TypeError:  # not weak-referenceable: one lock per class
                self._lock = _CALL_LOCKS.setdefault(type(lm), threading.RLock())

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lm, name)
        if not inspect.ismethod(value):
            return value
        lock = self._lock

        @functools.wraps(value)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return locked

    def __repr__(self) -> str:
        return f"SerializedLM({self._lm!r})"


def is_langchain_source(obj: Any) -> bool:
    """A LangChain ``BaseRetriever`` or ``VectorStore``."""
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore

    return isinstance(obj, (BaseRetriever, VectorStore))


class NestModelParams(BaseModel):
    """The NEST fields of ``ChatNest`` and ``NestLLM`` (a pydantic mixin)."""

    model_config = ConfigDict(
        populate_by_name=True, arbitrary_types_allowed=True, protected_namespaces=()
    )

    model_name: str | None = Field(default=None, alias="model")
    """Local folder or Hub id (in the HF cache) of a causal LM; default: the embedded
    SmolLM2-135M-Instruct. Ignored when ``engine`` is given."""
    engine: Any = Field(default=None, exclude=True)
    """A ready ``NestEngine``; replaces every other source parameter."""
    retriever: Any = Field(default=None, exclude=True)
    """Passage source: a LangChain ``BaseRetriever``, a ``VectorStore`` (searched with
    ``k = n_passages``) or a NEST ``PassageRetriever``."""
    collection: str | None = None
    """Chroma collection filled by ``nest ingest`` (default ``"nest"`` when ``persist_dir`` or
    ``chroma_url`` is given)."""
    persist_dir: str | None = None
    """Store folder: Chroma data in ``chroma/``, token keys in ``keys/``. With ``retriever``
    only the keys live here."""
    chroma_url: str | None = None
    """URL of a ``chroma run`` server holding ``collection``."""
    config: NestConfig | str | None = None
    """A ``NestConfig`` or a preset name (``"paper"``, ``"lossless"``, ...)."""
    device: str | None = None
    """Torch device for the model (``"cpu"`` by default, ``"cuda"``, ``"auto"``)."""
    temperature: float | None = None
    """Sampling temperature on NEST's mixture p_M; 0 is greedy (the default)."""
    max_tokens: int | None = None
    """Maximum new tokens per generation (default 256)."""
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Stop strings; the output is cut before the first one."""
    timeout: float | None = None
    """Accepted for compatibility with hosted models; local decoding has no request to time out."""
    max_retries: int | None = None
    """Accepted for compatibility with hosted models; local decoding is not retried."""

    _engine: Any = PrivateAttr(default=None)
    _engine_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @field_validator("config")
    @classmethod
    def _preset(cls, value: NestConfig | str | None) -> NestConfig | None:
        return NestConfig.from_preset(value) if isinstance(value, str) else value

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"temperature={value!r} is invalid: use a float >= 0 (0 = greedy)")
        return value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_tokens={value!r} is invalid: use an integer >= 1")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "NestModelParams":
        if self.engine is not None:
            given = [
                n for n in ("retriever", "collection", "persist_dir", "chroma_url", "device")
                if getattr(self, n) is not None
            ]
            if given:
                raise ValueError(f"engine= already holds its parts: drop {', '.join(given)}")
        if self.retriever is not None and (self.collection or self.chroma_url):
            raise ValueError(
                "pass either retriever= or collection=/chroma_url=, not both "
                "(persist_dir= may accompany retriever=: it keeps the token keys)"
            )
        return self

    # ------------------------------------------------------------------ the engine
    @property
    def resolved_model_name(self) -> str:
        """The model's name for metadata and tracing (no model is loaded to find it)."""
        if self.model_name:
            return self.model_name
        if self.engine is not None:
            return str(getattr(self.engine.lm, "name", "nest"))
        from nest_integrations.lm.default import DEFAULT_MODEL_NAME

        return DEFAULT_MODEL_NAME

    @property
    def nest_config(self) -> NestConfig:
        """The NEST config in effect (``config``, else the engine's, else the default)."""
        if isinstance(self.config, NestConfig):
            return self.config
        if self.engine is not None:
            return self.engine.config
        return NestConfig()

    def get_engine(self) -> Any:
        """The ``NestEngine`` in use, built on first call (loads the model, opens the stores).

        With ``engine=`` this is a shallow copy of it whose model calls are serialised (see
        ``SerializedLM``); the given engine is left as it is.
        """
        with self._engine_lock:
            if self._engine is None:
                if self.engine is not None:
                    self._engine = copy.copy(self.engine)
                    self._engine.lm = SerializedLM(self.engine.lm)
                else:
                    self._engine = self._build_engine()
            return self._engine

    def _build_engine(self) -> Any:
        from nest_integrations import paths
        from nest_integrations.engine import NestEngine

        cfg = self.nest_config
        lm = SerializedLM(shared_lm(self.model_name, self.device, cfg.key_source))
        key_store = None  # the engine keeps keys in memory
        if self.persist_dir is not None:
            from nest_integrations.index.store import DiskKeyStore

            key_store = DiskKeyStore.open(paths.keys_dir(self.persist_dir), lm)
        retriever = self.retriever
        if retriever is not None and is_langchain_source(retriever):
            from nest_integrations.integrations.langchain.retrievers import (
                LangChainPassageRetriever,
            )

            retriever = LangChainPassageRetriever(retriever)
        elif retriever is None and (self.collection or self.persist_dir or self.chroma_url):
            from nest_integrations.index.store import DiskKeyStore
            from nest_integrations.retrieval.chroma import ChromaPassageStore

            collection = self.collection or "nest"
            if self.chroma_url:
                retriever = ChromaPassageStore.from_url(
                    self.chroma_url, collection, persist_dir=self.persist_dir, lm=lm
                )
            else:
                retriever = ChromaPassageStore.from_persist_dir(self.persist_dir, collection, lm=lm)
            if key_store is None:
                root = self.persist_dir or paths.default_persist_dir()
                key_store = DiskKeyStore.open(paths.keys_dir(root), lm)
        LOG.debug("built NestEngine(lm=%r, retriever=%r)", lm, retriever)
        return NestEngine(lm, retriever, key_store, cfg)

    # ------------------------------------------------------------------ calling it
    def _call_config(self, kwargs: dict[str, Any]) -> NestConfig:
        """The config of one call: ``nest_config`` with the call's (or the model's) temperature."""
        temperature = kwargs.get("temperature", self.temperature)
        base = self.nest_config
        if temperature is None or float(temperature) == base.temperature:
            return base
        return base.replace(temperature=float(temperature))

    def _engine_kwargs(self, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``NestEngine.generate`` arguments for one call.

        Call arguments: ``max_tokens``, ``temperature``, ``query`` (the retrieval query) and
        ``passages`` (NEST ``Passage``s or LangChain ``Document``s: skips retrieval).
        """
        unknown = set(kwargs) - {"max_tokens", "temperature", "passages", "query"}
        if unknown:
            LOG.debug("ignoring unsupported call arguments %s", sorted(unknown))
        passages = kwargs.get("passages")
        if passages is not None:
            from nest_integrations.integrations.langchain.retrievers import as_passages

            passages = as_passages(passages)
        return {
            "max_new_tokens": int(
                kwargs.get("max_tokens") or self.max_tokens or DEFAULT_MAX_TOKENS
            ),
            "stop": list(stop) if stop is not None else self.stop,
            "config": self._call_config(kwargs),
            "passages": passages,
            "query": kwargs.get("query"),
        }

    def _nest_generate(
        self, prompt: Any, stop: Sequence[str] | None, kwargs: dict[str, Any]
    ) -> NestResult:
        return self.get_engine().generate(prompt, **self._engine_kwargs(stop, kwargs))

    def _nest_stream(
        self, prompt: Any, stop: Sequence[str] | None, kwargs: dict[str, Any]
    ) -> Iterator[StreamChunk]:
        return self.get_engine().stream(prompt, **self._engine_kwargs(stop, kwargs))
