"""The passage-retrieval port (NEST stage 1)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from nest_integrations.types import Passage


@runtime_checkable
class PassageRetriever(Protocol):
    def retrieve(self, query: str, k: int) -> list[Passage]:
        """The top ``k`` passages for ``query``, best first, with stable ids and offsets."""
