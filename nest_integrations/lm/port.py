"""The LM port, typed: each optional capability of a ``LanguageModel`` is a small ``Protocol``,
and ``LMPort`` holds the LM once under each of those it declares (None where it declares
nothing), so callers read typed attributes and never probe the LM.

- ``port_of(lm)`` resolves the port from the LM's explicit declarations: its ``capabilities``
  record (``lm.base.Capabilities``), its ``build()`` (``Build``: what its numbers depend on
  beyond its fingerprint, read by ``lm.cache_key``) and its ``regime`` (``Regime``: which
  threads its steps run on, and the context of inexact rows). An LM that declares none of them
  (a test double) gets the defaults: plain ``forward`` for every pass, ``Build()``, and torch's
  thread count.
- The assembly resolves the port when it builds an engine (``lm.serialized.SerializedLM``
  carries it); ``port_of`` of a wrapper returns that one.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol, Sequence, cast, runtime_checkable

import torch

from nest_integrations.lm.base import Capabilities, LanguageModel, capabilities_of
from nest_integrations.lm.threads import TORCH_THREADS

#: ``(logits, keys)`` rows of a pass: ``(T, V)`` and ``(T, d)``; with argmax rows the first is
#: a list of T ints.
Rows = tuple[Any, torch.Tensor]


# ----------------------------------------------------------------------------- capabilities


class LogitsOnly(Protocol):
    def forward_logits(self, ids: Sequence[int], cache: Any, *, last: int | None = None
                       ) -> Rows: ...  # fmt: skip


class ArgmaxRows(Protocol):
    def forward_argmax(self, ids: Sequence[int], cache: Any, *, last: int | None = None,
                       keys: bool = False, until_rejected: bool = False) -> Rows: ...  # fmt: skip


class PromptVector(Protocol):
    def capture_prompt_vector(self) -> ContextManager[list[torch.Tensor]]: ...


class ReleasesCache(Protocol):
    def release_cache(self, cache: Any) -> None: ...


class InexactRows(Protocol):
    def inexact_rows(self) -> ContextManager[Any]: ...


class StepsOnly(Protocol):
    def steps_only(self) -> ContextManager[Any]: ...


class DecodingSession(Protocol):
    def decoding_session(self) -> ContextManager[Any]: ...


class RowsSplit(Protocol):
    @property
    def rows_split_now(self) -> bool: ...


class TreePasses(Protocol):
    def forward_tree(self, ids: Sequence[int], parents: Sequence[int], cache: Any) -> Rows: ...

    def select_cache(self, cache: Any, start: int, keep: Sequence[int]) -> None: ...


class LayerSkip(Protocol):
    #: the torch module whose decoder layers a draft skips
    model: Any

    def forward_skip(self, ids: Sequence[int], cache: Any, skip: Any) -> torch.Tensor: ...


class ExactRows(Protocol):
    @property
    def exact_rows(self) -> bool: ...


# ----------------------------------------------------------------------------- build, regime


@dataclass(frozen=True)
class Build:
    """What an LM's numbers (cost curves, exactness verdicts) depend on beyond its fingerprint,
    as the LM declares it in ``build()``: ``lm.cache_key`` builds every cache key from it."""

    #: the runtime (``lm.backend.BACKENDS``)
    backend: str = "torch"
    #: the weights: a torch dtype's name (``"float32"``) or ``"gguf-<quantisation>"``
    weights: str = "unknown"
    #: kernels that round otherwise, fixed at load: ``"packed"``, ``"rowwise"`` (torch),
    #: ``"kvBF16"``, ``"repack"`` (llama.cpp)
    kernels: tuple[str, ...] = ()
    #: linears that run verify passes by a probed row plan (``lm.row_exact``; torch)
    row_exact_linears: int = 0
    #: how ``dtype="auto"`` chose the dtype, when it did
    dtype_choice: str | None = None

    @property
    def label(self) -> str:
        """``weights`` and its kernels: ``"float32+packed+rowwise"``, ``"gguf-Q8_0+kvBF16"``."""
        return "+".join((self.weights, *self.kernels))

    @property
    def row_exact(self) -> bool:
        """Whether the torch verdict applies: row-exact linears and row-wise attention."""
        return bool(self.row_exact_linears) and "rowwise" in self.kernels


class Regime(Protocol):
    """Which threads an LM's passes run on: ``lm.llama_cpp.regime.ThreadRegime`` (its own
    pool, whose exact steps may change threads with the cache's length) or ``lm.threads``'s
    ``TorchThreads``."""

    @property
    def threads(self) -> int: ...

    @property
    def split_steps(self) -> bool:
        """Whether one-token steps now run on every thread where an exact one would not."""

    @property
    def step_regimes(self) -> bool:
        """Whether exact steps change threads with the cache's length."""

    @property
    def exact_curve_context(self) -> int:
        """Cached positions the curve of exact steps is measured after."""

    def steps_on_every_thread(self) -> bool:
        """Whether the next exact step runs on every thread."""


@runtime_checkable
class Builds(Protocol):
    def build(self) -> Build: ...


@runtime_checkable
class HasRegime(Protocol):
    regime: Regime


@runtime_checkable
class CarriesPort(Protocol):
    port: "LMPort"


# ----------------------------------------------------------------------------- the port


@dataclass(frozen=True)
class LMPort:
    """An LM under each capability it declares (None: not declared). See the module docstring."""

    lm: LanguageModel
    caps: Capabilities
    regime: Regime
    logits_only: LogitsOnly | None = None
    argmax: ArgmaxRows | None = None
    prompt_vector: PromptVector | None = None
    release: ReleasesCache | None = None
    inexact: InexactRows | None = None
    steps_only: StepsOnly | None = None
    session: DecodingSession | None = None
    rows_split: RowsSplit | None = None
    exact: ExactRows | None = None
    trees: TreePasses | None = None
    layer_skip: LayerSkip | None = None
    builds: Builds | None = None

    def build(self) -> Build:
        """The LM's ``Build`` now (``Build()`` where it declares none)."""
        return self.builds.build() if self.builds is not None else Build()

    def inexact_context(self) -> ContextManager[Any]:
        """The LM's ``inexact_rows()`` where it has one, else nothing."""
        return self.inexact.inexact_rows() if self.inexact is not None else nullcontext()

    def exact_rows(self) -> bool:
        """The LM's checked verdict on exact verify rows (False where it does not say)."""
        return self.exact is not None and bool(self.exact.exact_rows)


def resolve_port(lm: Any, calls: Any = None) -> LMPort:
    """The port of ``lm`` from its declarations now (``port_of`` reuses a carried one), its
    calls made through ``calls`` when given (a wrapper of ``lm``: ``SerializedLM``)."""
    caps = capabilities_of(lm)
    it = cast(Any, lm if calls is None else calls)

    def when(flag: bool) -> Any:
        return it if flag else None

    return LMPort(
        lm=it, caps=caps,
        regime=lm.regime if isinstance(lm, HasRegime) else TORCH_THREADS,
        logits_only=when(caps.logits_only), argmax=when(caps.argmax_rows),
        prompt_vector=when(caps.prompt_vector), release=when(caps.release_cache),
        inexact=when(caps.inexact_rows), steps_only=when(caps.steps_only),
        session=when(caps.decoding_session), rows_split=when(caps.rows_split),
        exact=when(caps.exact_rows_checked), trees=when(caps.trees),
        layer_skip=when(caps.layer_skip), builds=it if isinstance(lm, Builds) else None,
    )  # fmt: skip


def port_of(lm: Any) -> LMPort:
    """The port the assembly resolved for ``lm`` (a ``SerializedLM`` carries it), else the one
    its declarations give now."""
    if isinstance(lm, CarriesPort):
        return lm.port
    return resolve_port(lm)


__all__ = [
    "ArgmaxRows", "Build", "Rows", "DecodingSession", "ExactRows", "InexactRows", "LMPort", "LayerSkip",
    "LogitsOnly", "PromptVector", "Regime", "ReleasesCache", "RowsSplit", "StepsOnly",
    "TORCH_THREADS", "TreePasses", "capabilities_of", "port_of", "resolve_port",
]
