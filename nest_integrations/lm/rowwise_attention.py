"""Row-wise attention: a verify forward computes each new token's attention exactly as a
one-token decode step would (one SDPA call per query row, with that row's keys: a causal prefix,
or the rows a tree mask allows), so with ``lm.row_exact``'s linears a verify row equals a step
bit for bit. ``F.scaled_dot_product_attention`` over T queries rounds differently from T one-query
calls; on SmolLM2 in bf16 that alone flipped near-ties in 12-20 of 30 lossless outputs.

A prefill (as many queries as keys), forwards of more than ``MAX_ROWS`` queries and forwards
inside ``inexact_rows()`` (NEST's relaxed decoding) take one SDPA call. The cost is one small
attention call per row and layer. ``HFLanguageModel.from_pretrained`` selects it for CPU models
whose linears it made row-exact and whose implementation is ``"sdpa"``, unless
``NEST_ROWWISE_ATTENTION=0`` or the caller chose an implementation. Registered with
transformers as ``"nest_rowwise"`` (with SDPA's mask function).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from nest_integrations.lm.row_exact import EXACT_ROWS, exact_wanted, inexact_rows

#: The name under which transformers knows this attention.
NAME = "nest_rowwise"
#: Environment switch: ``0``/``false``/``no``/``off`` keeps transformers' SDPA.
ENV = "NEST_ROWWISE_ATTENTION"
#: Forwards with more new tokens than this take one SDPA call (a prefill-sized chunk): the
#: bound up to which ``lm.row_exact`` keeps the linear layers row-exact too.
MAX_ROWS = EXACT_ROWS
_OFF = {"0", "false", "no", "off"}
_registered = False


def _allowed(mask: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor | None:
    """(q_len, k_len) bool: which keys each query row may read, from a 4D bool or additive
    mask (batch 1, shared by heads); None means causal with the queries at the end."""
    if mask is None:
        return None
    m = mask[0, 0] if mask.dim() == 4 else mask
    m = m[-q_len:, -k_len:]
    return m if m.dtype == torch.bool else m == 0


def rowwise_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` (B, H, q, d), ``key``/``value``
    (B, H_kv, k, d); returns ((B, q, H, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, k_len = query.shape[2], key.shape[2]
    if q_len >= k_len or q_len > MAX_ROWS or query.shape[0] != 1 or not exact_wanted():
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    allowed = _allowed(attention_mask, q_len, k_len)
    kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
    rows = []
    for i in range(q_len):
        if allowed is None:
            n = k_len - q_len + i + 1
            k_i, v_i = key[:, :, :n], value[:, :, :n]
        else:
            keep = allowed[i]
            n = int(keep.sum())
            if bool(keep[:n].all()):  # a prefix: a view, like the one-token step's cache
                k_i, v_i = key[:, :, :n], value[:, :, :n]
            else:  # a tree row: its ancestors, in order
                idx = keep.nonzero().squeeze(1)
                k_i, v_i = key.index_select(2, idx), value.index_select(2, idx)
        out, _ = sdpa_attention_forward(module, query[:, :, i : i + 1], k_i, v_i, None,
                                        is_causal=False, **kwargs)
        rows.append(out)
    return torch.cat(rows, dim=1), None


def register() -> None:
    """Make ``"nest_rowwise"`` known to transformers (attention and mask functions); once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, rowwise_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


def wanted(model: Any, user_chose: bool) -> bool:
    """Whether the loader switches a model it prepacked (``lm.packing``: bf16 on CPU) to
    row-wise attention: it runs transformers' SDPA, the caller chose no implementation, and
    ``$NEST_ROWWISE_ATTENTION`` is not off."""
    if user_chose or os.environ.get(ENV, "").strip().lower() in _OFF:
        return False
    return getattr(model.config, "_attn_implementation", None) == "sdpa" and hasattr(
        model, "set_attn_implementation")


def use_rowwise(model: Any) -> bool:
    """Switch ``model`` to row-wise attention; False (and unchanged) if transformers refuses."""
    register()
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, TypeError, AttributeError, ImportError):
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME


__all__ = ["ENV", "MAX_ROWS", "NAME", "inexact_rows", "register", "rowwise_sdpa_forward", "use_rowwise",
           "wanted"]
