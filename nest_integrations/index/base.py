"""The token-key store port (NEST stage 2 memory, persisted per passage)."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from nest_integrations.types import Passage, PassageKeys


class KeyStoreMismatchError(ValueError):
    """The key store was built by another model, key layer or tokenizer."""


class KeyStoreCorruptError(RuntimeError):
    """A key-store manifest or shard is missing, unreadable or inconsistent with the index."""


@runtime_checkable
class KeyStore(Protocol):
    def get_keys(self, passages: Sequence[Passage]) -> list[PassageKeys | None]:
        """Stored keys of each passage (looked up by content hash), or None when absent."""

    def put_keys(self, passages: Sequence[Passage], keys: Sequence[PassageKeys]) -> None:
        """Persist keys; entries already present are left untouched."""
