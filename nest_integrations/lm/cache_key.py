"""One cache key per model and machine: what a measurement cached under ``$NEST_HOME`` (a cost
curve, ``lm.cost``; an exactness verdict, ``lm.exactness``; the ``backend="auto"`` choice,
``lm.auto_backend``) is valid for.

A ``CacheKey`` names the model (its fingerprint, or the engines' model name before any is
loaded), its build (``lm.port.Build.label``: weights and kernels), the device, the thread
count, the machine (``lm.backend.machine_name``) and torch's version. ``key_of(lm)`` reads them
from the LM's port (``lm.port``), never by probing the LM; ``now=True`` adds how its rows run
at this moment (llama.cpp's regime: ``+inexact``, ``+rows1``), which a cost curve depends on.

Keys written before this module (an older release) are not found, so those measurements are
taken again once; their entries stay in the files, unread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from nest_integrations.lm.backend import configured_threads, machine_name
from nest_integrations.lm.port import port_of


@dataclass(frozen=True)
class CacheKey:
    """What a cached measurement is valid for (module docstring)."""

    model: str
    build: str
    device: str
    threads: int
    machine: str
    torch: str = torch.__version__

    def text(self) -> str:
        """The key as one string: ``model|build|device|t<threads>|torch<version>`` (the machine
        names the file it is kept in)."""
        return (f"{self.model}|{self.build}|{self.device}|t{self.threads}"
                f"|torch{self.torch}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def key_of(lm: Any, *, now: bool = False) -> CacheKey:
    """The key of a loaded LM; ``now``: its build label also says how rows run now."""
    port = port_of(lm)
    label = port.build().label
    if now:
        label += "+inexact" if port.regime.split_steps else ""
        label += "+rows1" if port.rows_split is not None and port.rows_split.rows_split_now \
            else ""
    return CacheKey(str(lm.fingerprint), label, str(lm.device), int(port.regime.threads),
                    machine_name())


def engines_key(model: str, build: str) -> CacheKey:
    """The key of a measurement of engines not loaded yet (``backend="auto"``): ``model``'s
    name, ``build`` the engines' settings, on the CPU at the configured threads."""
    return CacheKey(model, build, "cpu", configured_threads(), machine_name())


__all__ = ["CacheKey", "engines_key", "key_of"]
