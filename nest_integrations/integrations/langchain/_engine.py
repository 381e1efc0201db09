"""What ``ChatNest`` and ``NestLLM`` share: their parameters and the lazily built ``NestEngine``.

Constructing a LangChain model is cheap (no model load, no I/O). On first use the parameters
become an ``assembly.EngineSpec`` and ``assembly.build_engine`` builds the engine: the defaults
(collection, max tokens, decoding), the shared model cache and the serialised model calls that
make LangChain's thread-based ``batch``/``astream`` safe all live there. This module only
converts LangChain sources (retrievers, vector stores, Documents) into NEST passages.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from nest_integrations import assembly
from nest_integrations.config import NestConfig
from nest_integrations.integrations._common import (
    LANGCHAIN_TOKEN_NAMES,
    canonical_names,
    engine_kwargs,
    grounding,
    stats_payload,
    warn_ungrounded,
)
from nest_integrations.integrations.langchain.passages import (
    LangChainPassageRetriever,
    as_passages,
    is_langchain_source,
)
from nest_integrations.types import NestResult, StreamChunk

LOG = logging.getLogger(__name__)

#: Call arguments understood by ``invoke``/``stream`` (others are ignored, logged at debug);
#: the token limit under any of its names (``LANGCHAIN_TOKEN_NAMES``, docs/parameters.md).
CALL_KWARGS = (*LANGCHAIN_TOKEN_NAMES, "temperature", "passages", "query", "decoding",
               "drafter_options")
#: Constructor names that are aliases of a field (docs/parameters.md): canonical name first.
FIELD_ALIASES = (LANGCHAIN_TOKEN_NAMES, ("stop", "stop_sequences"), ("model", "model_name"))


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
    """Chroma collection filled by ``nest ingest``. Without ``collection``, ``persist_dir``,
    ``chroma_url`` and ``retriever`` there is no corpus (plain decoding); with ``persist_dir`` or
    ``chroma_url`` alone it is ``assembly.DEFAULT_COLLECTION``."""
    persist_dir: str | None = None
    """Store folder: Chroma data in ``chroma/``, token keys in ``keys/``. With ``retriever``
    only the keys live here."""
    chroma_url: str | None = None
    """URL of a ``chroma run`` server holding ``collection``."""
    config: NestConfig | str | None = None
    """A ``NestConfig`` or a preset name (``"grounded"``, ``"copy"``, ``"paper"``, ...)."""
    policy: Any = None
    """An ``AnswerPolicy`` or a preset name; None = the policy of the preset ``config`` names,
    else of ``assembly.DEFAULT_PRESET``."""
    device: str | None = None
    """Torch device for the model (``"cpu"`` by default, ``"cuda"``, ``"auto"``)."""
    backend: str | None = None
    """What runs the model: ``"torch"`` (transformers) or ``"llama.cpp"`` (a GGUF file:
    ``model`` is its path, a quantisation of the embedded model such as ``"Q4_1"`` (the shipped
    file), or None for the embedded model as Q8_0; needs the ``llamacpp`` extra); default: the process default (torch).
    Ignored when ``engine`` is given."""
    dtype: str | None = None
    """Model weights: ``"auto"`` (bf16 where the CPU multiplies bf16 natively, and on CUDA),
    ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"checkpoint"``; default ``"auto"``
    (``nest_integrations.lm.backend``). Ignored when ``engine`` is given."""
    decoding: str | None = None
    """Decoding method (``nest_integrations.drafters.METHODS``); None = the policy's
    (``"rag-copy"`` under ``grounded``: lossless, verbatim provenance citations,
    ``extras["kind"] == "verbatim"``; ``"nest"`` under ``copy`` and ``paper``). Ignored when
    ``engine`` is given."""
    drafter_options: dict[str, Any] | None = None
    """Options for the decoding method's drafter (e.g. a datastore path)."""
    hybrid: bool | None = None
    """Fuse BM25 with the Chroma store's dense scores (default: ``config.hybrid_retrieval``)."""
    temperature: float | None = None
    """Sampling temperature on NEST's mixture p_M; 0 is greedy (the default)."""
    max_tokens: int | None = None
    """Maximum new tokens per generation (default ``assembly.DEFAULT_MAX_NEW_TOKENS``); also
    accepted as ``max_completion_tokens`` (``ChatOpenAI``'s alias) or ``max_new_tokens`` (the
    Hugging Face / LlamaIndex name), here and per call (docs/parameters.md)."""
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Stop strings; the output is cut before the first one."""
    timeout: float | None = None
    """Accepted for compatibility with hosted models; local decoding has no request to time out."""
    max_retries: int | None = None
    """Accepted for compatibility with hosted models; local decoding is not retried."""

    _engine: Any = PrivateAttr(default=None)
    _engine_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _warned_ungrounded: bool = PrivateAttr(default=False)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """Aliases become their field's name (two names with different values fail, naming
        both); a preset name in ``config`` names the policy too; both resolved here."""
        if isinstance(data, dict):
            for names in FIELD_ALIASES:
                data = canonical_names(data, names, cls.__name__)
            data["policy"] = assembly.resolve_policy(data.get("policy"), data.get("config"))
            if isinstance(data.get("config"), str):
                data["config"] = assembly.resolve_config(data["config"])
        return data

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str | None) -> str | None:
        return assembly.check_dtype(value)  # a bad value fails here, naming the accepted ones

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        return assembly.backend_name(value)  # a bad value fails here, naming the accepted ones

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
                n
                for n in ("retriever", "collection", "persist_dir", "chroma_url", "device",
                          "dtype", "backend", "decoding", "drafter_options", "hybrid")
                if getattr(self, n) is not None
            ]
            if given:
                raise ValueError(f"engine= already holds its parts: drop {', '.join(given)}")
        assembly.check_sources(self.retriever, self.collection, self.chroma_url)
        return self

    # ------------------------------------------------------------------ the engine
    @property
    def resolved_model_name(self) -> str:
        """The model's name for metadata and tracing (no model is loaded to find it)."""
        if self.model_name:
            return self.model_name
        if self.engine is not None:
            return str(self.engine.lm.name)
        return assembly.model_name(None)

    @property
    def nest_config(self) -> NestConfig:
        """The NEST config in effect (``config``, else the engine's, else the default), for
        the model's backend (``assembly.backend_config``)."""
        if self.engine is not None:
            return assembly.engine_config(self.engine, self.config)
        return self.engine_spec().config

    def _nest_params(self) -> dict[str, Any]:
        """The identifying parameters both models report."""
        return {
            "model_name": self.resolved_model_name,
            "collection": self.collection,
            "config": self.nest_config.to_dict(),
            "decoding": self.decoding,
            "max_tokens": self.max_tokens,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        """LangSmith's tracing parameters (provider ``nest``, the model, temperature, stop)."""
        params = super()._get_ls_params(stop=stop, **kwargs)  # type: ignore[misc]
        params["ls_provider"] = "nest"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.resolved_model_name
        params.setdefault("ls_temperature", self._call_config(kwargs).temperature)
        if "ls_stop" not in params and self.stop:
            params["ls_stop"] = self.stop
        return params

    def engine_spec(self) -> assembly.EngineSpec:
        """What the engine is built from (no I/O)."""
        return assembly.EngineSpec.from_fields(self, model=self.model_name)

    def get_engine(self) -> Any:
        """The ``NestEngine`` in use, built on first call (loads the model, opens the stores).

        With ``engine=`` this is ``assembly.share_engine(engine)``: a shallow copy whose model
        calls are serialised; the given engine is left as it is.
        """
        with self._engine_lock:
            if self._engine is None:
                if self.engine is not None:
                    self._engine = assembly.share_engine(self.engine)
                else:
                    retriever = self.retriever
                    if retriever is not None and is_langchain_source(retriever):
                        retriever = LangChainPassageRetriever(retriever)
                    self._engine = assembly.build_engine(self.engine_spec(), retriever=retriever)
            return self._engine

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

        Call arguments: ``max_tokens``, ``temperature``, ``query`` (the retrieval query),
        ``passages`` (NEST ``Passage``s or LangChain ``Document``s: skips retrieval),
        ``decoding`` and ``drafter_options`` (this call only).
        """
        unknown = set(kwargs) - set(CALL_KWARGS)
        if unknown:
            LOG.debug("ignoring unsupported call arguments %s", sorted(unknown))
        kwargs = canonical_names(kwargs, LANGCHAIN_TOKEN_NAMES, f"{type(self).__name__} call")
        passages = kwargs.get("passages")
        return engine_kwargs(
            kwargs,
            max_new_tokens=assembly.resolve_max_new_tokens(kwargs.get("max_tokens"),
                                                           self.max_tokens),
            stop=list(stop) if stop is not None else self.stop,
            config=self._call_config(kwargs),
            passages=as_passages(passages) if passages is not None else None,
        )

    def nest_metadata(self, result: NestResult) -> dict[str, Any]:
        """NEST's statistics of one answer plus ``grounded`` (whether any passage was used) and
        ``grounded_reason`` (why not, and what to do; None when grounded). The first answer
        without passages warns once per model (``UngroundedWarning``, a ``UserWarning``)."""
        retrieves = self.get_engine().retriever is not None
        ground = grounding(result, retrieves, type(self).__name__)
        warn_ungrounded(self, ground)
        return {**stats_payload(result), "grounded": ground["grounded"],
                "grounded_reason": ground["reason"]}

    def _nest_generate(
        self, prompt: Any, stop: Sequence[str] | None, kwargs: dict[str, Any]
    ) -> NestResult:
        return self.get_engine().generate(prompt, **self._engine_kwargs(stop, kwargs))

    def _nest_stream(
        self, prompt: Any, stop: Sequence[str] | None, kwargs: dict[str, Any]
    ) -> Iterator[StreamChunk]:
        return self.get_engine().stream(prompt, **self._engine_kwargs(stop, kwargs))
