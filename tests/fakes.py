"""Small deterministic fakes for fast tests (no model weights, no network)."""

from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

_TOKEN = re.compile(r"\s*\S+|\s+")  # each token keeps its leading whitespace: ranges tile text


class FakeLM:
    """A deterministic stand-in for ``LanguageModel``: whitespace tokens, prefix-dependent keys.

    - Tokens are whitespace-separated words with their leading whitespace; the id of a token is
      ``2 + crc32(token) % (vocab_size - 2)`` (0 is BOS, 1 is EOS). Same in every process.
    - The key after reading ``s[0..i]`` is ``h_i = 0.5 * h_{i-1} + E[s[i]]`` (``E`` a fixed
      random table), so a key depends on the whole token prefix, and ``forward`` and
      ``encode_passages`` agree exactly, as the real adapter must.
    - Logits are ``h @ W`` for a fixed random ``W``.
    - Counters ``encode_calls``, ``encoded_passages`` and ``tokenize_calls`` let tests check that
      work is not repeated.
    """

    def __init__(
        self,
        key_dim: int = 16,
        *,
        vocab_size: int = 4096,
        seed: int = 0,
        key_source: str | int = "ffn_input",
        name: str = "fake-lm",
    ) -> None:
        self.name = name
        self.fingerprint = f"{name}-d{key_dim}-v{vocab_size}-s{seed}"
        self.key_source = key_source
        self.key_dim = key_dim
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset({1})
        self.max_context = 4096
        self.passage_prefix = [0]
        rng = np.random.default_rng(seed)
        self._emb = rng.standard_normal((vocab_size, key_dim)).astype(np.float32)  # E
        self._out = rng.standard_normal((key_dim, vocab_size)).astype(np.float32)  # W
        self._words: dict[int, str] = {}
        self.encode_calls = 0
        self.encoded_passages = 0
        self.tokenize_calls = 0

    @property
    def device(self) -> torch.device:
        import torch  # lazily: subprocess tests stay fast

        return torch.device("cpu")

    # -- tokenizer --------------------------------------------------------------------------

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        self.tokenize_calls += 1
        ids, offsets = [], []
        for m in _TOKEN.finditer(text):
            ids.append(self._token_id(m.group()))
            offsets.append(m.span())
        return ids, np.asarray(offsets, dtype=np.int32).reshape(-1, 2)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenize_with_offsets(text)[0]

    def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(self._words.get(int(i), "") for i in ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.tokenize("\n".join(m["content"] for m in messages))

    def _token_id(self, word: str) -> int:
        i = 2 + zlib.crc32(word.encode("utf-8")) % (self.vocab_size - 2)
        self._words.setdefault(i, word)
        return i

    # -- model ------------------------------------------------------------------------------

    def new_cache(self) -> dict[str, Any]:
        return {"ids": [], "h": np.zeros(self.key_dim, np.float32)}

    def cache_length(self, cache: dict[str, Any]) -> int:
        return len(cache["ids"])

    def crop_cache(self, cache: dict[str, Any], length: int) -> None:
        ids = cache["ids"][:length]
        cache.clear()
        cache.update(self.new_cache())
        self.forward(ids, cache)

    def forward(
        self, ids: Sequence[int], cache: dict[str, Any], *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        keys = self._states(ids, cache["h"])  # (T, d)
        if len(ids):
            cache["h"] = keys[-1]
        cache["ids"] = cache["ids"] + [int(i) for i in ids]
        if last:
            keys = keys[-last:]
        return torch.from_numpy(keys @ self._out), torch.from_numpy(keys)

    def encode_passages(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        self.encode_calls += 1
        self.encoded_passages += len(token_ids)
        out = []
        start = len(self.passage_prefix) - 1
        for d in token_ids:
            # read prefix + d[0..m-2]: m keys, key j predicts d[j]
            seq = list(self.passage_prefix) + [int(t) for t in d][:-1]
            h0 = np.zeros(self.key_dim, np.float32)
            out.append(self._states(seq, h0)[start:] if len(d) else np.zeros((0, self.key_dim)))
        return out

    def _states(self, ids: Sequence[int], h: np.ndarray) -> np.ndarray:
        """(T, d) running states h_i = 0.5 h_{i-1} + E[ids[i]]."""
        out = np.empty((len(ids), self.key_dim), np.float32)
        for i, t in enumerate(ids):
            h = 0.5 * h + self._emb[t]
            out[i] = h
        return out
