"""A key store that lives in memory only (the engine's default when none is given)."""

from __future__ import annotations

from typing import Sequence

from nest_integrations.index.keys import content_hash
from nest_integrations.types import Passage, PassageKeys


class InMemoryKeyStore:
    """Keys by passage content hash, for one process. Nothing is persisted."""

    def __init__(self) -> None:
        self._keys: dict[str, PassageKeys] = {}

    def get_keys(self, passages: Sequence[Passage]) -> list[PassageKeys | None]:
        out = []
        for p in passages:
            pk = self._keys.get(content_hash(p.text))
            out.append(
                None if pk is None else PassageKeys(p.id, pk.keys, pk.token_ids, pk.offsets)
            )
        return out

    def put_keys(self, passages: Sequence[Passage], keys: Sequence[PassageKeys]) -> None:
        for p, pk in zip(passages, keys):
            self._keys.setdefault(content_hash(p.text), pk)

    def __len__(self) -> int:
        return len(self._keys)
