"""A LanguageModel wrapper that recomputes every forward from scratch, with no KV cache.

Its "cache" is just the list of token ids seen so far, so cropping can never go wrong. It is
the oracle for the KV-cache invariant: the loop over this wrapper must give exactly the tokens
it gives over the cached model (``tests/drafters/test_drafters.py``). Chains only: no token trees,
no layer skipping.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any, ContextManager, Sequence

import numpy as np
import torch

from nest_integrations.lm.base import Capabilities, capabilities_of
from nest_integrations.lm.port import Build, LMPort, port_of, resolve_port


class UncachedLM:
    """``lm`` with no KV cache (module docstring): the port's members are ``lm``'s, its
    passes a full forward each; what it declares beyond them is ``lm``'s, less what it does not
    run through its own ``forward`` and list cache."""

    def __init__(self, lm: Any):
        self._lm = lm
        self._port = port_of(lm)
        self.name, self.fingerprint, self.key_source = lm.name, lm.fingerprint, lm.key_source
        self.key_dim, self.vocab_size, self.max_context = lm.key_dim, lm.vocab_size, lm.max_context
        self.eos_token_ids, self.passage_prefix = lm.eos_token_ids, lm.passage_prefix
        self.device = lm.device
        #: the wrapped LM's thread regime
        self.regime = self._port.regime

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped LM's, less the passes and cache calls this wrapper does not run
        through its own ``forward`` and list cache."""
        return replace(capabilities_of(self._lm), logits_only=False, argmax_rows=False,
                       release_cache=False, rows_split=False, trees=False, layer_skip=False)

    @property
    def port(self) -> LMPort:
        """This wrapper's own port (not the wrapped model's)."""
        return resolve_port(self)

    def build(self) -> Build:
        return self._port.build()

    @property
    def exact_rows(self) -> bool:
        return self._port.exact_rows()

    def tokenize(self, text: str) -> list[int]:
        return self._lm.tokenize(text)

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        return self._lm.tokenize_with_offsets(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._lm.detokenize(ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self._lm.chat_prompt(messages)

    def encode_passages(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        return self._lm.encode_passages(token_ids)

    def inexact_rows(self) -> ContextManager[Any]:
        return self._port.inexact_context()

    def steps_only(self) -> ContextManager[Any]:
        only = self._port.steps_only
        return only.steps_only() if only is not None else nullcontext()

    def decoding_session(self) -> ContextManager[Any]:
        session = self._port.session
        return session.decoding_session() if session is not None else nullcontext()

    def capture_prompt_vector(self) -> ContextManager[list[torch.Tensor]]:
        if self._port.prompt_vector is None:
            raise ValueError(f"{self.name!r} declares no prompt vector")
        return self._port.prompt_vector.capture_prompt_vector()

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
