"""nest-integrations: Nearest Neighbor Speculative Decoding (NEST) with span citations.

Public API (re-exports only; importing the package stays cheap: torch and the frameworks load
when first used).
"""

from __future__ import annotations

from typing import Any

from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.types import Citation, NestResult, NestStats, Passage, StreamChunk

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "Citation",
    "NestConfig",
    "NestEngine",
    "NestResult",
    "NestStats",
    "Passage",
    "StreamChunk",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # the assembly's subclass, which adds ``NestEngine.from_defaults``
    if name == "NestEngine":
        from nest_integrations.assembly import NestEngine

        return NestEngine
    if name == "from_defaults":  # the assembly's defaults (not in __all__: it is pinned)
        from nest_integrations.assembly import from_defaults

        return from_defaults
    raise AttributeError(f"module 'nest_integrations' has no attribute {name!r}")
