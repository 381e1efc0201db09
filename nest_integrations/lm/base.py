"""The language-model port: what the NEST engine needs from an LM, and nothing more.

Conventions:
- Token ids are plain ``list[int]``; ``forward`` takes and returns torch tensors on the
  model's device, and returns fp32 logits and fp32 key vectors.
- The KV cache is an opaque object owned by the adapter; the engine only asks for its length
  and crops it.
- Methods that draft token trees (DReSD, REST with ``shape="tree"``) also need
  ``forward_tree(ids, parents, cache)`` and ``select_cache(cache, start, keep)``; KNN-SSD needs
  ``forward_skip(ids, cache, skip)`` (``HFLanguageModel`` has all three).
- Optional: ``forward_argmax(ids, cache, *, last=None, keys=False)``, ``forward`` returning each
  row's argmax (a list of ints, the first maximum) in place of its logits; the loop's lossless
  greedy verification then reads that alone (``LlamaCppLanguageModel``: no logits copied out).
- Passages are encoded on their own, after ``passage_prefix`` (``[BOS, "\n"]`` for the HF
  adapter: the attention-sink position is not a key), never with the chat template (NEST
  spec §5, C12).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class LanguageModel(Protocol):
    #: Human-readable model name (id or path).
    name: str
    #: Identifies the weights and tokenizer that produced keys: name + hash.
    fingerprint: str
    #: Which vector keys/queries come from (see NestConfig.key_source).
    key_source: str | int
    #: Key dimension d.
    key_dim: int
    vocab_size: int
    #: Token ids that end generation.
    eos_token_ids: frozenset[int]
    #: Context window in tokens.
    max_context: int
    #: Tokens fed before a passage's first token when its keys are computed (e.g. [BOS, "\n"]).
    passage_prefix: list[int]
    device: torch.device

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Token ids and an ``(m, 2)`` int32 array of each token's char range in ``text``.

        Ranges tile the text: ``text[off[i,0]:off[i,1]]`` is what token i decodes to, leading
        spaces included, so a run of tokens maps to one exact slice of ``text``.
        """

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens skipped)."""

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt ids for chat ``messages`` (``{"role", "content"}``) with the chat template and
        the generation prompt; plain concatenation when the model has no template."""

    def new_cache(self) -> Any:
        """An empty KV cache."""

    def cache_length(self, cache: Any) -> int:
        """Number of positions the cache holds."""

    def crop_cache(self, cache: Any, length: int) -> None:
        """Keep only the first ``length`` positions of the cache (in place)."""

    def forward(
        self, ids: Sequence[int], cache: Any, *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` after the cached positions; append them to the cache (all of them,
        whatever ``last``).

        Returns ``(logits, keys)``: ``(T, vocab)`` fp32 logits and ``(T, key_dim)`` fp32 key
        vectors, one row per input token; with ``last=k`` only the last k rows (an adapter may
        then skip the LM head on the others).
        """

    def encode_passages(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Key vectors of passages encoded on their own.

        For passage tokens ``d[0..m-1]`` the model reads ``passage_prefix + d[0..m-2]`` and
        returns ``(m, key_dim)`` fp32 keys; key ``j`` predicts value ``d[j]``.
        """
