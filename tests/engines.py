"""``make_engine``: a ``NestEngine`` over ready parts with the tests' defaults.

``NestEngine`` requires its config and key store (the assembly supplies them for users); the
tests that exercise the engine directly use the ``paper`` preset (``NestConfig()``), no corpus and
keys in memory unless they pass their own.
"""

from __future__ import annotations

from typing import Any

from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore


def make_engine(
    lm: Any,
    retriever: Any = None,
    key_store: Any = None,
    config: NestConfig | None = None,
    **kwargs: Any,
) -> NestEngine:
    """``NestEngine(lm, retriever, key_store or InMemoryKeyStore(), config or NestConfig(),
    **kwargs)``."""
    return NestEngine(
        lm,
        retriever,
        key_store if key_store is not None else InMemoryKeyStore(),
        config if config is not None else NestConfig(),
        **kwargs,
    )
