"""Token-tree verification for Hugging Face causal LMs: one forward pass over a draft tree.

A token tree (REST, SpecInfer, DReSD's merged drafts) is a list of ``T`` nodes in topological
order with ``parents[i] < i`` (``-1``: a child of the current position). ``forward_tree`` runs
all nodes after the cached positions in ONE forward pass:

- node ``i`` attends to every cached position, its ancestors and itself (a 4D additive mask
  of shape ``(1, 1, T, past + T)``, returned as-is by ``transformers.masking_utils``);
- its position id is ``past + depth(i)`` (depth 0 for a root), so each root-to-leaf path is
  computed exactly as if it had been fed alone;
- all ``T`` nodes are appended to the KV cache; ``select_cache`` then keeps the accepted path.

``select_cache(cache, start, keep)`` keeps positions ``[0, start)`` followed by
``start + keep[j]`` in the order given and drops the rest, on every layer of a
``DynamicCache`` (full-attention layers only).

Used through ``HFLanguageModel.forward_tree`` / ``HFLanguageModel.select_cache``.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

LOG = logging.getLogger(__name__)

__all__ = ["tree_depths", "tree_mask", "forward_tree", "select_cache", "check_parents"]


def check_parents(parents: Sequence[int], n: int) -> list[int]:
    """``parents`` as a list, or a ValueError when it is not a topological tree of ``n`` nodes."""
    p = [int(x) for x in parents]
    if len(p) != n:
        raise ValueError(f"tree has {n} tokens but {len(p)} parents")
    bad = [i for i, x in enumerate(p) if not -1 <= x < i]
    if bad:
        raise ValueError(f"tree parents must satisfy -1 <= parents[i] < i; bad nodes {bad[:5]}")
    return p


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node (0 for a child of the current position)."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """``(T, T)`` bool: ``A[i, j]`` is True when node j is node i or one of its ancestors."""
    t = len(parents)
    a = torch.zeros((t, t), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            a[i] = a[p]
        a[i, i] = True
    return a


def tree_mask(parents: Sequence[int], past: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The ``(1, 1, T, past + T)`` additive mask: 0 where attention is allowed, the dtype's
    minimum elsewhere (works with the eager and SDPA attention implementations)."""
    t = len(parents)
    allowed = torch.ones((t, past + t), dtype=torch.bool)
    allowed[:, past:] = ancestor_matrix(parents)
    mask = torch.zeros((t, past + t), dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.to(device)[None, None]


def forward_tree(
    lm: Any, ids: Sequence[int], parents: Sequence[int], cache: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a token tree after the cached positions of ``lm`` (an ``HFLanguageModel``).

    Returns fp32 ``(T, vocab)`` logits and ``(T, key_dim)`` keys; row i is what a sequential
    forward over node i's root-to-node path would give at node i. Appends all T nodes to
    ``cache`` (in node order); follow with ``select_cache``.
    """
    n = len(ids)
    par = check_parents(parents, n)
    if n == 0:
        return (
            torch.empty(0, lm.vocab_size, device=lm.device),
            torch.empty(0, lm.key_dim, device=lm.device),
        )
    past = int(cache.get_seq_length())
    depth = tree_depths(par)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    positions = torch.tensor([[past + d for d in depth]], dtype=torch.long, device=lm.device)
    mask = tree_mask(par, past, lm.model.dtype, lm.device)
    with torch.inference_mode(), lm._capture() as slot:
        out = lm.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=lm._hidden_index is not None,
            **{lm._cache_kwarg: cache},
        )
        keys = slot[0] if slot else out.hidden_states[lm._hidden_index]
    return out.logits[0].float(), keys[0].float()


def select_cache(cache: Any, start: int, keep: Sequence[int]) -> None:
    """Keep cache positions ``[0, start)`` then ``start + keep[j]`` (in that order), in place."""
    length = int(cache.get_seq_length())
    keep = [int(k) for k in keep]
    if not 0 <= start <= length:
        raise ValueError(f"start={start} is outside a cache of {length} positions")
    if any(not 0 <= start + k < length for k in keep):
        raise ValueError(f"keep={keep} points outside the {length - start} positions after start")
    if keep == list(range(len(keep))):  # a prefix: a plain crop is enough
        remove = length - start - len(keep)
        if remove:
            with torch.inference_mode():
                cache.crop(-remove)
        return
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise NotImplementedError(f"select_cache needs a transformers DynamicCache, got {cache!r}")
    with torch.inference_mode():
        for layer in layers:
            if type(layer).__name__ != "DynamicLayer":
                raise NotImplementedError(
                    f"select_cache supports full-attention DynamicLayer caches, not "
                    f"{type(layer).__name__}"
                )
            if not getattr(layer, "is_initialized", True) or layer.keys is None:
                continue
            index = torch.tensor(
                list(range(start)) + [start + k for k in keep], device=layer.keys.device
            )
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
