"""Key vectors of the Hugging Face adapter (``lm.hf``): which module's vector is the key
(``key_source``), its capture by a forward hook during the pass that gives the logits, and the
keys of passages encoded on their own.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from nest_integrations.config import KEY_SOURCES

if TYPE_CHECKING:
    from nest_integrations.lm.hf import HFLanguageModel

#: Name of the pre-FFN norm inside the decoder layer, per ``config.model_type``. Only listed
#: architectures are trusted: in e.g. OLMo-2 a module called ``post_attention_layernorm`` is a
#: post-norm of the attention output, not the FFN input, so guessing by name would be wrong.
PRE_FFN_NORM: dict[str, str] = {
    **dict.fromkeys(
        (
            "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
            "gemma", "granite", "granitemoe", "smollm3", "starcoder2", "gpt_neox", "olmo",
            "deepseek_v3",
        ),
        "post_attention_layernorm",
    ),
    "gemma2": "pre_feedforward_layernorm",
    "gemma3_text": "pre_feedforward_layernorm",
    "gpt2": "ln_2",
    "gpt_bigcode": "ln_2",
    "phi": "input_layernorm",  # parallel attention/FFN: the FFN reads the input norm
}


def check_key_source(key_source: str | int) -> str | int:
    """``key_source`` if it names a key (``KEY_SOURCES`` or an int), else a ``ValueError``."""
    if isinstance(key_source, bool) or not (
        key_source in KEY_SOURCES or isinstance(key_source, int)
    ):
        raise ValueError(
            f"key_source={key_source!r} is invalid: use one of {KEY_SOURCES} or an int index "
            "into hidden_states"
        )
    return key_source


class KeyHook:
    """Where ``model``'s key vector comes from: a module's input or output, hooked for one
    call at a time (``capture``), or ``hidden_states[hidden_index]`` when no module is found."""

    def __init__(self, model: Any, key_source: str | int, lock: threading.RLock) -> None:
        self.module, self.port, self.hidden_index = _locate_key(model, key_source)
        self.lock = lock

    @contextmanager
    def capture(self) -> Iterator[list[torch.Tensor]]:
        """Hook the key module for one call; the list receives its (B, T, d) tensor."""
        slot: list[torch.Tensor] = []
        with self.lock:  # hooks live on a shared module: one model call at a time
            if self.module is None:
                yield slot
                return
            if self.port == "output":
                handle = self.module.register_forward_hook(
                    lambda _m, _args, output: slot.append(
                        output[0] if isinstance(output, tuple) else output
                    )
                )
            else:
                handle = self.module.register_forward_pre_hook(
                    lambda _m, args, kwargs: slot.append(
                        args[0] if args else kwargs["hidden_states"]
                    ),
                    with_kwargs=True,
                )
            try:
                yield slot
            finally:
                handle.remove()


def encode_passages(
    lm: HFLanguageModel, token_ids: Sequence[Sequence[int]], batch_size: int
) -> list[np.ndarray]:
    """Keys of passages read on their own (``HFLanguageModel.encode_passages``): sorted by
    length, in right-padded batches without a KV cache or an attention mask (with causal
    attention a real token never sees the padding after it, and SDPA keeps its fast path)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    prefix = list(lm.passage_prefix)
    seqs = [prefix + list(d)[:-1] for d in token_ids]
    too_long = [i for i, seq in enumerate(seqs) if len(seq) > lm.max_context]
    if too_long:
        raise ValueError(
            f"passage(s) {too_long[:5]} exceed the model's context of {lm.max_context} "
            "tokens: split passages before encoding them"
        )
    result: list[np.ndarray] = [np.zeros((0, lm.key_dim), dtype=np.float32) for _ in token_ids]
    order = sorted((i for i, d in enumerate(token_ids) if len(d)), key=lambda i: len(seqs[i]))
    pad = prefix[0]  # any valid id: padding is never attended to by real tokens
    start = len(prefix) - 1  # the key predicting d[0] sits at the last prefix position
    base = lm.model.base_model  # skips the LM head: passages need no logits
    hidden_index = lm._keys.hidden_index
    for b in range(0, len(order), batch_size):
        rows = order[b : b + batch_size]
        width = len(seqs[rows[-1]])
        batch = np.full((len(rows), width), pad, dtype=np.int64)  # (B, L)
        for r, i in enumerate(rows):
            batch[r, : len(seqs[i])] = seqs[i]
        input_ids = torch.from_numpy(batch).to(lm.device)
        with torch.inference_mode(), lm._keys.capture() as slot:
            out = base(
                input_ids=input_ids, use_cache=False,
                output_hidden_states=hidden_index is not None,
            )  # fmt: skip
            keys = slot[0] if slot else out.hidden_states[hidden_index]
        keys_np = keys.float().cpu().numpy()  # (B, L, d)
        for r, i in enumerate(rows):
            result[i] = keys_np[r, start : start + len(token_ids[i])].copy()
    return result


def _decoder_parts(model: Any) -> tuple[Any, Any]:
    """The decoder-layer list and the final norm of ``model`` (each ``None`` if not found)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    base = model.base_model
    layers = next(
        (
            getattr(base, a)
            for a in ("layers", "h", "blocks")
            if isinstance(getattr(base, a, None), torch.nn.ModuleList)
            and len(getattr(base, a)) == n_layers
        ),
        None,
    )
    norm = next(
        (
            getattr(base, a)
            for a in ("norm", "ln_f", "final_layer_norm", "final_layernorm")
            if isinstance(getattr(base, a, None), torch.nn.Module)
        ),
        None,
    )
    return layers, norm


def _locate_key(model: Any, key_source: str | int) -> tuple[Any, str, int | None]:
    """``(module, "input"|"output", None)`` for a hook, or ``(None, "", i)`` to read
    ``hidden_states[i]`` (hidden_states[i] is the input of layer i, the last one the output of
    the final norm)."""
    layers, norm = _decoder_parts(model)
    model_type = getattr(model.config.get_text_config(), "model_type", "")
    if key_source == "ffn_input":
        attr = PRE_FFN_NORM.get(model_type)
        module = getattr(layers[-1], attr, None) if layers is not None and attr else None
        if module is None:
            raise ValueError(
                f"key_source='ffn_input' is not supported for {type(model).__name__} "
                f"(model_type={model_type!r}): its pre-FFN norm is unknown. Use "
                "key_source='block_input' (hidden_states[-2], the official NEST code's key) or "
                "an int index into hidden_states"
            )
        return module, "output", None
    n_states = model.config.get_text_config().num_hidden_layers + 1
    named = {"block_input": -2, "final_norm": -1}
    index = named[key_source] if isinstance(key_source, str) else key_source
    if not -n_states <= index < n_states:
        raise ValueError(
            f"key_source={key_source!r} is out of range: {type(model).__name__} has "
            f"{n_states} hidden states"
        )
    index %= n_states
    if layers is not None and index < n_states - 1:
        return layers[index], "input", None
    if norm is not None and index == n_states - 1:
        return norm, "output", None
    return None, "", index
