"""The tokenizer side of the Hugging Face adapter (``lm.hf``): token offsets that tile the text,
the end tokens, the context length and the passage prefix, read from a tokenizer and config.
"""

from __future__ import annotations

import logging
import os.path
from typing import Any, Callable, Sequence

import numpy as np

LOG = logging.getLogger(__name__)

#: Special tokens that end a turn or a document in common chat models; added to the EOS set
#: when the tokenizer has them as special tokens.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")


def encode(tokenizer: Any, text: str, **kwargs: Any) -> Any:
    """``tokenizer(text)`` with no special tokens added and none parsed."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True, **kwargs)


def offsets_from_tokenizer(tokenizer: Any, text: str) -> tuple[list[int], np.ndarray]:
    """Token ids and ``(m, 2)`` int32 ranges that tile ``text``, from a fast tokenizer's offsets.

    The offsets are repaired into a tiling (``tile``): whitespace a tokenizer trims is given to
    the token after it, and a character split over several tokens (they all get its range)
    belongs to the LAST of them, the one that completes it (the others get an empty range).
    """
    enc = encode(tokenizer, text, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    off = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    ends = off[:, 1].copy()
    if len(off) > 1:  # tokens sharing a non-empty range with the next: end at its start
        shared = (off[:-1] == off[1:]).all(axis=1) & (off[:-1, 1] > off[:-1, 0])
        ends[:-1][shared] = off[:-1, 0][shared]
    return ids, tile(ends, len(text))


def offsets_by_decoding(
    ids: Sequence[int], detokenize: Callable[[Sequence[int]], str], text: str
) -> np.ndarray:
    """Tiling ranges from decoding every prefix of ``ids`` (O(m^2)): for tokenizers without
    offsets."""
    ends = np.array(  # how much of the text the first k + 1 tokens determine
        [len(os.path.commonprefix([detokenize(ids[: k + 1]), text])) for k in range(len(ids))],
        dtype=np.int64,
    )
    return tile(ends, len(text))


def tile(ends: np.ndarray, n_chars: int) -> np.ndarray:
    """``(m, 2)`` int32 ranges that tile ``[0, n_chars)`` from per-token end offsets."""
    off = np.zeros((len(ends), 2), dtype=np.int32)
    if len(ends) == 0:
        return off
    ends = np.maximum.accumulate(np.clip(ends, 0, n_chars))
    ends[-1] = n_chars
    off[:, 1] = ends
    off[1:, 0] = ends[:-1]
    return off


def max_context(config: Any, tokenizer: Any) -> int:
    """The model's context in tokens (its config, else the tokenizer's, else 2048)."""
    text = config.get_text_config()
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if isinstance(value, int) and 0 < value < 10**7 else 2048


def _as_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS of the tokenizer, config and generation config, plus common end-of-turn and
    end-of-text special tokens the tokenizer has (e.g. SmolLM2: <|im_end|> and <|endoftext|>)."""
    ids = _as_set(tokenizer.eos_token_id) | _as_set(getattr(model.config, "eos_token_id", None))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids |= _as_set(gen.eos_token_id)
    added = getattr(tokenizer, "added_tokens_encoder", {}) or {}
    ids |= {added[t] for t in END_TOKENS if t in added}
    return frozenset(ids)


def string_prefix(tokenizer: Any) -> tuple[int, ...]:
    """``(BOS,)`` when the tokenizer adds a BOS token by default (Llama, Mistral: as
    ``tokenizer(text)`` would; SmolLM2/GPT-2 add none), else ``()``: what a string prompt's
    tokens follow (``lm.base.Capabilities.string_prefix``)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if not isinstance(bos, int):
        return ()
    try:
        ids = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    except Exception:  # a tokenizer without the call API: no BOS to add
        return ()
    return (bos,) if ids and ids[0] == bos else ()


def passage_prefix(tokenizer: Any, config: Any) -> list[int]:
    """``[BOS, "\n"]`` (EOS when there is no BOS).

    Two tokens, not one: the state at position 0 is an attention sink whose vector is an
    outlier, so as key 0 it would be the farthest key of every query and collapse RRC's lambda
    (``docs/decisions.md``). After a second token the key is an ordinary vector.
    """
    start = None
    for value in (tokenizer.bos_token_id, getattr(config, "bos_token_id", None)):
        if isinstance(value, int):
            start = value
            break
    if start is None:
        for value in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
            if isinstance(value, int):
                start = value
                break
            if isinstance(value, list) and value:
                start = int(value[0])
                break
    if start is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token to start passages with")
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    return [start] + list(newline[-1:])
