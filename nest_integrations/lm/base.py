"""The language-model port: what the NEST engine needs from an LM, and nothing more.

Conventions:
- Token ids are plain ``list[int]``; ``forward`` takes and returns torch tensors on the
  model's device, and returns fp32 logits and fp32 key vectors.
- The KV cache is an opaque object owned by the adapter; the engine only asks for its length
  and crops it.
- Everything else an LM can do beyond these members it declares once, in ``capabilities``
  (a ``Capabilities`` record; ``capabilities_of(lm)`` gives an LM that declares nothing the
  defaults: plain ``forward`` for every pass), among them token trees (DReSD, REST with
  ``shape="tree"``: ``forward_tree``, ``select_cache``) and layer skipping (KNN-SSD:
  ``forward_skip``). ``lm.port`` turns the record into typed interfaces (``LMPort``); nothing
  probes an LM.
- Passages are encoded on their own, after ``passage_prefix`` (``[BOS, "\n"]`` for the HF
  adapter: the attention-sink position is not a key), never with the chat template (NEST
  spec §5, C12).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Capabilities:
    """What an LM can do beyond the port's required members: each field names the optional
    member it vouches for. The defaults are an LM that declares nothing: every pass is a plain
    ``forward``, nothing is claimed exact, string prompts get no BOS and no chat template.

    An LM declares its record as ``capabilities`` (a class attribute or a property);
    ``capabilities_of`` reads it. A wrapper that changes what the LM does (``lm.uncached``)
    declares its own.
    """

    #: ``forward_logits(ids, cache, *, last=None)``: ``forward`` without key rows, returned as a
    #: ``(0, key_dim)`` tensor (for an LM where keys cost a pass of their own: llama.cpp)
    logits_only: bool = False
    #: ``forward_argmax(ids, cache, *, last=None, keys=False, until_rejected=False)``: each
    #: row's argmax (a list of ints, the first maximum) in place of its logits; what lossless
    #: greedy verification reads (llama.cpp: no logits row copied out per token).
    #: ``until_rejected`` (a verify pass) may stop at the first row that rejects the next id
    argmax_rows: bool = False
    #: ``capture_prompt_vector()``: a context whose forward passes leave the prompt's mean
    #: final-layer hidden state in the list it yields (KNN-SSD's route, from the prefill)
    prompt_vector: bool = False
    #: ``release_cache(cache)``: give a cache's resources back now (the loop calls it when a
    #: generation ends)
    release_cache: bool = False
    #: ``inexact_rows()``: a context in which passes may round rows differently from one-token
    #: steps (faster): relaxed decoding (NEST) runs in it
    inexact_rows: bool = False
    #: ``steps_only()``: the context of a decoding with no verify pass (greedy, no drafter)
    steps_only: bool = False
    #: ``decoding_session()``: the context of one generation (the engine enters it around
    #: retrieval and decoding)
    decoding_session: bool = False
    #: ``rows_split_now``: whether exact verify rows are now decoded one at a time (a token
    #: tree is then verified as its first branch)
    rows_split: bool = False
    #: ``exact_rows``: the LM's checked verdict on whether a verify pass gives every row the
    #: bits of a one-token step (False: the LM does not say, so it is not claimed)
    exact_rows_checked: bool = False
    #: whether ``chat_prompt`` applies a chat template (string prompts may then be sent as
    #: one user message: ``decoding.prompts``)
    chat_template: bool = False
    #: ids put before a string prompt's tokens (``[BOS]`` when the tokenizer adds one by
    #: default, as ``tokenizer(text)`` would)
    string_prefix: tuple[int, ...] = ()
    #: ``forward_tree(ids, parents, cache)`` and ``select_cache(cache, start, keep)``: token
    #: trees in one pass (DReSD-tree, REST)
    trees: bool = False
    #: ``forward_skip(ids, cache, skip)`` over ``model``'s decoder layers (KNN-SSD)
    layer_skip: bool = False
    #: why the LM cannot skip layers, where it says (the llama.cpp backend's)
    layer_skip_unsupported: str | None = None


#: The record of an LM that declares nothing.
NO_CAPABILITIES = Capabilities()


@runtime_checkable
class Declares(Protocol):
    """An LM that declares its ``Capabilities``."""

    capabilities: Capabilities


def capabilities_of(lm: Any) -> Capabilities:
    """``lm.capabilities``, or ``NO_CAPABILITIES`` for an LM that declares none: the one place
    an LM's optional members are looked up."""
    if isinstance(lm, Declares) and isinstance(lm.capabilities, Capabilities):
        return lm.capabilities
    return NO_CAPABILITIES
