"""Layer-skipping forward passes for self-speculative decoding (KNN-SSD, Draft & Verify).

A *skip set* names attention and MLP sublayers of the decoder to leave out of a draft forward.
A skipped sublayer passes its input through: its module returns zeros, which the decoder
layer's residual connection turns into the identity (``h = h + 0``). That holds for every
pre-norm residual layout with ``layers[i].self_attn`` and ``layers[i].mlp`` (Llama, Mistral,
Qwen2/3, Gemma, Phi, SmolLM...), including sandwich norms (an RMS/LayerNorm of zeros is zero
for the bias-free norms these models use).

KV cache: a skipped attention sublayer computes no keys or values, but every layer's cache must
keep the same length (HF derives positions and mask sizes from layer 0's length). So the patched
attention appends *zero* KV rows for the draft positions. They are never read — the layer is
skipped for the whole draft — and the caller crops every layer back to the committed length
after drafting (``HFLanguageModel.crop_cache``), so verification sees only full-model KV.

Usage::

    skip = SkipSet.from_lists(n_layers=30, attn=[3, 5], mlp=[7])
    logits = forward_skip(lm, ids, cache, skip)        # (T, V) fp32; cache grows by T
    lm.crop_cache(cache, committed)                     # the caller restores the cache
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

LOG = logging.getLogger(__name__)


class LayerSkipError(ValueError):
    """The model's decoder layers cannot be skipped sublayer by sublayer."""


@dataclass(frozen=True)
class SkipSet:
    """Sublayers skipped in the draft forward: indices of attention and MLP sublayers.

    Attributes:
        n_layers: number of decoder layers of the model the set is for.
        attn: skipped attention sublayers (layer indices).
        mlp: skipped MLP sublayers (layer indices).
    """

    n_layers: int
    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        for name, idx in (("attn", self.attn), ("mlp", self.mlp)):
            bad = sorted(i for i in idx if not 0 <= i < self.n_layers)
            if bad:
                raise ValueError(
                    f"skip set {name} indices {bad} are out of range for {self.n_layers} layers"
                )

    @classmethod
    def from_lists(
        cls, n_layers: int, attn: Iterable[int] = (), mlp: Iterable[int] = ()
    ) -> "SkipSet":
        return cls(int(n_layers), frozenset(int(i) for i in attn), frozenset(int(i) for i in mlp))

    @classmethod
    def from_switches(cls, switches: Sequence[bool]) -> "SkipSet":
        """The paper's 2L vector: the first L switches are attention, the next L the MLPs."""
        if len(switches) % 2:
            raise ValueError(f"need 2L switches, got {len(switches)}")
        n = len(switches) // 2
        return cls.from_lists(
            n, [i for i in range(n) if switches[i]], [i for i in range(n) if switches[n + i]]
        )

    @property
    def size(self) -> int:
        """Number of skipped sublayers (out of 2L)."""
        return len(self.attn) + len(self.mlp)

    def to_dict(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "attn": sorted(self.attn), "mlp": sorted(self.mlp)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SkipSet":
        return cls.from_lists(int(d["n_layers"]), d.get("attn", ()), d.get("mlp", ()))

    def __str__(self) -> str:
        return (
            f"SkipSet({self.size}/{2 * self.n_layers}: attn={sorted(self.attn)}, "
            f"mlp={sorted(self.mlp)})"
        )


def decoder_layers(model: Any) -> Any:
    """The decoder layers of ``model`` (``model.model.layers`` or the base model's ``layers``),
    each with ``self_attn`` and ``mlp``; a ``LayerSkipError`` names what is missing."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        base = getattr(model, "base_model", None)
        layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise LayerSkipError(
            f"{type(model).__name__} has no `model.layers` list of decoder layers: layer "
            "skipping supports HF decoder-only models laid out like Llama "
            "(model.model.layers[i].self_attn / .mlp)"
        )
    for i, layer in enumerate(layers):
        missing = [a for a in ("self_attn", "mlp") if not isinstance(
            getattr(layer, a, None), torch.nn.Module)]
        if missing:
            raise LayerSkipError(
                f"{type(model).__name__} decoder layer {i} ({type(layer).__name__}) has no "
                f"{' / '.join(missing)} submodule: its sublayers cannot be skipped"
            )
        if getattr(layer.self_attn, "layer_idx", i) != i:
            raise LayerSkipError(
                f"{type(model).__name__} layer {i}'s attention caches as layer "
                f"{layer.self_attn.layer_idx}: shared or reordered KV layers are not supported"
            )
    return layers


def _cache_arg(kwargs: dict[str, Any]) -> Any:
    for name in ("cache", "past_key_values", "past_key_value"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def _skipped_attention(attn: torch.nn.Module, layer_idx: int) -> Any:
    """A forward for ``attn`` that outputs zeros and appends zero KV rows for its positions."""

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        cache = _cache_arg(kwargs)
        bsz, t = hidden_states.shape[:2]
        if cache is not None:
            # Zero KV rows keep every layer's cache the same length; see the module docstring.
            layer = cache.layers[layer_idx] if hasattr(cache, "layers") else None
            keys = getattr(layer, "keys", None)
            if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.numel():
                shape = (bsz, keys.shape[1], t, keys.shape[3])
                dtype = keys.dtype
            else:
                cfg = attn.config
                n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
                head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // (
                    cfg.num_attention_heads
                )
                shape, dtype = (bsz, n_kv, t, head_dim), hidden_states.dtype
            zeros = torch.zeros(shape, dtype=dtype, device=hidden_states.device)
            cache.update(zeros, zeros.clone(), layer_idx)
        return torch.zeros_like(hidden_states), None

    return forward


def _skipped_mlp(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.zeros_like(hidden_states)


@contextmanager
def skipping(model: Any, skip: SkipSet) -> Iterator[None]:
    """Within the block, the sublayers in ``skip`` of ``model`` pass their input through.

    Not thread-safe on its own: the caller holds the model's lock (``HFLanguageModel._lock``).
    """
    layers = decoder_layers(model)
    if skip.n_layers != len(layers):
        raise LayerSkipError(
            f"the skip set is for {skip.n_layers} layers but the model has {len(layers)}"
        )
    patched: list[torch.nn.Module] = []
    try:
        for i in sorted(skip.attn):
            layers[i].self_attn.forward = _skipped_attention(layers[i].self_attn, i)
            patched.append(layers[i].self_attn)
        for i in sorted(skip.mlp):
            layers[i].mlp.forward = _skipped_mlp
            patched.append(layers[i].mlp)
        yield
    finally:
        for module in patched:  # drop the instance attribute: the class's forward is back
            del module.forward


def forward_skip(lm: Any, ids: Sequence[int], cache: Any, skip: SkipSet) -> torch.Tensor:
    """Run ``ids`` after the cached positions with ``skip``'s sublayers skipped.

    Returns fp32 ``(T, vocab)`` logits. The cache grows by ``len(ids)`` in every layer (zero
    rows in skipped attention layers); crop it back before a full-model forward reads it.
    """
    n = len(ids)
    if n == 0:
        return torch.empty(0, lm.vocab_size, device=lm.device)
    past = cache.get_seq_length()
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)  # (1, T)
    positions = torch.arange(past, past + n, device=lm.device).unsqueeze(0)  # (1, T)
    with lm._lock, torch.inference_mode(), skipping(lm.model, skip):
        out = lm.model(
            input_ids=input_ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=0,
            **{lm._cache_kwarg: cache},
        )
    return out.logits[0].float()


def final_hidden_mean(lm: Any, ids: Sequence[int], max_tokens: int = 256) -> torch.Tensor:
    """KNN-SSD's domain vector: the mean over tokens of the final-layer hidden state (after the
    final norm, ``hidden_states[-1]``) of ``ids`` read on their own (the last ``max_tokens``).

    Returns a fp32 ``(d,)`` CPU tensor. Runs the base model only (no LM head, no cache).
    """
    ids = list(ids)[-max_tokens:]
    if not ids:
        raise ValueError("cannot embed an empty prompt")
    input_ids = torch.tensor([ids], dtype=torch.long, device=lm.device)
    with lm._lock, torch.inference_mode():
        out = lm.model.base_model(input_ids=input_ids, use_cache=False)
    return out.last_hidden_state[0].float().mean(0).cpu()


@contextmanager
def capture_hidden_means(lm: Any, max_tokens: int = 256) -> Iterator[list[torch.Tensor]]:
    """``HFLanguageModel.capture_prompt_vector``: within the block, every base-model call of
    ``lm`` appends the mean over its last ``max_tokens`` positions of the final-layer hidden
    state (after the final norm) to the yielded list, a fp32 ``(d,)`` CPU tensor."""
    slot: list[torch.Tensor] = []

    def hook(_module: Any, _args: Any, output: Any) -> None:
        h = output[0] if isinstance(output, tuple) else output.last_hidden_state
        slot.append(h[0, -max_tokens:].float().mean(0).cpu())

    with lm._lock:  # hooks live on a shared module: one model call at a time
        handle = lm.model.base_model.register_forward_hook(hook)
        try:
            yield slot
        finally:
            handle.remove()
