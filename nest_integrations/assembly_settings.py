"""The settings an engine is built from, resolved: ``EngineSpec`` (everything that decides an
engine, as plain data), a config, preset or mapping -> ``NestConfig``, the answer policy, the
dtype and token budget checks, the backend's name and a per-call config for it. Every name here
is re-exported by ``nest_integrations.assembly``, the module to import."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any, Mapping

from nest_integrations.config import Guards, NestConfig
from nest_integrations.defaults import (
    DEFAULT_COLLECTION,
    DEFAULT_DECODING,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PRESET,
)
from nest_integrations.lm.backend import backend_config, check_backend
from nest_integrations.lm.port import port_of
from nest_integrations.policy import AnswerPolicy


@dataclass(frozen=True)
class EngineSpec:
    """Everything that decides an engine, as plain data (equal specs build equal engines).

    Args:
        collection, persist_dir, chroma_url: the Chroma store; any of them opens it (see
            ``opens_store``), the collection defaulting to ``DEFAULT_COLLECTION``.
        model: a Hugging Face id or folder; None = the embedded SmolLM2-135M-Instruct.
        device: torch device (None = CPU).
        dtype: model weights (``lm.backend.DTYPE_CHOICES``: ``"auto"``, ``"fp32"``, ``"bf16"``,
            ...); None = the process default (``"auto"`` unless
            ``backend.set_default_dtype`` or ``--dtype`` set it). Validated here.
        config: a ``NestConfig``, preset name or None (``DEFAULT_PRESET``); resolved here.
        policy: an ``AnswerPolicy``, preset name or None: the policy of the preset ``config``
            names, else of ``DEFAULT_PRESET``; resolved here.
        decoding: a ``drafters.METHODS`` name (None = the policy's); the engine validates it.
        drafter_options: options for the method's drafter (e.g. a datastore path).
        hybrid: fuse BM25 with the store's dense scores; None = ``config.hybrid_retrieval``.
        backend: what runs the model (``lm.backend.BACKEND_CHOICES``): ``"torch"``,
            ``"llama.cpp"`` or ``"auto"`` (the faster exact engine here, ``lm.auto_backend``);
            None = the process default (``--backend``), else ``$NEST_BACKEND``, else auto.
            Resolved here, and the config adapted to it (``backend_config``), unless ``"auto"``
            can only be decided by measuring the engines (``lm.auto_backend``): the spec then
            keeps ``"auto"`` and ``resolved()``, called where the engine is built, measures.
        calibrated: use the kNN temperature and RRC offset/scale that ``nest calibrate`` stored
            for this model and collection. None (default) = when one is stored and the config
            leaves those three at their defaults and puts no passages in the prompt (the
            completion use that calibration fits: p_M perplexity); True = whenever one is
            stored; False = never (not for RA configs by default: ``docs/decisions.md``).
    """

    collection: str | None = None
    persist_dir: str | None = None
    chroma_url: str | None = None
    model: str | None = None
    device: str | None = None
    config: Any = None
    decoding: str | None = None
    drafter_options: Any = None
    hybrid: bool | None = None
    calibrated: bool | None = None
    dtype: str | None = None
    backend: str | None = None
    policy: Any = None

    def __post_init__(self) -> None:
        from nest_integrations.lm.auto_backend import decide
        from nest_integrations.lm.backend import parse_dtype, requested_backend

        object.__setattr__(self, "policy", resolve_policy(self.policy, self.config))
        cfg = resolve_config(self.config)
        if self.hybrid is not None and self.hybrid != cfg.hybrid_retrieval:
            cfg = cfg.replace(hybrid_retrieval=bool(self.hybrid))
        set_ = functools.partial(object.__setattr__, self)
        backend = requested_backend(self.backend)
        if backend == "auto":  # decided here only where no model has to be measured
            decision = decide(self.model, self.device, self.dtype, self.decoding,
                              cfg.key_source, measure=False)
            backend = "auto" if decision.pending else decision.backend
        set_("backend", backend)
        if backend != "auto":
            check_backend(backend, self.dtype, self.device, self.decoding)
            cfg = backend_config(cfg, backend)
        set_("config", cfg)
        set_("hybrid", cfg.hybrid_retrieval)
        set_("decoding", self.decoding or DEFAULT_DECODING)
        if self.persist_dir is not None:
            set_("persist_dir", os.fspath(self.persist_dir))
        if self.dtype is not None:  # a torch dtype or any spelling -> its canonical name
            value = parse_dtype(self.dtype)
            set_("dtype", value if isinstance(value, str) else str(value).removeprefix("torch."))
        if self.drafter_options is not None:
            set_("drafter_options", tuple(sorted(dict(self.drafter_options).items())))

    def resolved(self) -> "EngineSpec":
        """This spec with ``backend="auto"`` decided (measuring the engines once per machine
        where nothing cached decides it: ``lm.auto_backend.decide``), its config adapted."""
        if self.backend != "auto":
            return self
        from nest_integrations.lm.auto_backend import resolve_backend

        backend = resolve_backend("auto", model=self.model, device=self.device, dtype=self.dtype,
                                  decoding=self.decoding, key_source=self.config.key_source)
        return dataclasses.replace(self, backend=backend)

    @classmethod
    def from_fields(cls, source: Any, **overrides: Any) -> "EngineSpec":
        """A spec from ``source``'s attributes of the same names (an adapter's fields), with
        ``overrides``; missing attributes are None."""
        values = {f.name: getattr(source, f.name, None) for f in dataclasses.fields(cls)}
        return cls(**{**values, **overrides})

    @classmethod
    def for_store(cls, collection: str | None = None, **kwargs: Any) -> "EngineSpec":
        """A spec that always opens the Chroma store (``DEFAULT_COLLECTION`` unless named):
        what ``nest ask`` and ``NestEngine.from_defaults`` build."""
        return cls(collection=collection or DEFAULT_COLLECTION, **kwargs)

    @property
    def opens_store(self) -> bool:
        """Whether the engine reads passages from the Chroma store."""
        return any(v is not None for v in (self.collection, self.persist_dir, self.chroma_url))

    @property
    def store_collection(self) -> str:
        return self.collection or DEFAULT_COLLECTION

    @property
    def options(self) -> dict[str, Any] | None:
        """``drafter_options`` as a dict (None when not given)."""
        return dict(self.drafter_options) if self.drafter_options is not None else None


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
