"""A LanguageModel wrapper that recomputes every forward from scratch, with no KV cache.

Its "cache" is just the list of token ids seen so far, so cropping can never go wrong. It is
the oracle for the KV-cache invariant: the loop over this wrapper must give exactly the tokens
it gives over the cached model (``tests/drafters/test_drafters.py``). Chains only: no token trees,
no layer skipping.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import torch

from nest_integrations.lm.base import Capabilities, capabilities_of

if TYPE_CHECKING:
    from nest_integrations.lm.port import LMPort


class UncachedLM:
    def __init__(self, lm: Any):
        self._lm = lm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lm, name)

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped LM's, less the passes and cache calls this wrapper does not run
        through its own ``forward`` and list cache."""
        return replace(capabilities_of(self._lm), logits_only=False, argmax_rows=False,
                       release_cache=False, rows_split=False, trees=False, layer_skip=False)

    @property
    def port(self) -> "LMPort":
        """This wrapper's own port (not the wrapped model's)."""
        from nest_integrations.lm.port import resolve_port

        return resolve_port(self)

    def new_cache(self) -> list[int]:
        return []

    def cache_length(self, cache: list[int]) -> int:
        return len(cache)

    def crop_cache(self, cache: list[int], length: int) -> None:
        del cache[length:]

    def forward(
        self, ids: Sequence[int], cache: list[int], *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        full = list(cache) + list(ids)
        logits, keys = self._lm.forward(full, self._lm.new_cache())
        cache.extend(ids)
        rows = last or len(ids)
        return logits[-rows:], keys[-rows:]
