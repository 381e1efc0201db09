"""Prepacked CPU weights: every ``nn.Linear`` of a bf16 model multiplies through oneDNN with its
weight reordered once, at load, into oneDNN's blocked layout.

Why: a plain bf16 ``F.linear`` re-lays the weight out on every call, so a bf16 step on CPU was
no faster than fp32; prepacked, it is (``docs/decisions.md``). This is what ``torch.compile``'s
CPU freezing does for linears, without the compile.

Row-exact: a ``PackedLinear`` is a ``lm.row_exact.RowExactLinear`` whose kernel is the prepacked
oneDNN call, so a verify pass runs its rows by the row plan probed for that kernel on this CPU,
and (with ``lm.rowwise_attention``) a verify row equals a one-token step bit for bit.

What it changes: the kernel, not the model. Each ``PackedLinear`` keeps the original
``weight``/``bias`` parameters (state dicts, tied embeddings and ``HFLanguageModel.fingerprint``
see the same tensors), so the packed copy costs one more copy of the linear weights in memory.
Outputs are bf16 matmuls either way; they can differ from ``F.linear``'s in the last bf16 bit.

When: ``HFLanguageModel.from_pretrained`` packs a model loaded on CPU in bf16 (``"auto"`` on an
AVX512-BF16 CPU, or ``"bf16"``) unless ``pack_weights=False`` or ``NEST_PACK_WEIGHTS=0``.
An fp32 model on CPU is packed too, by the same switches: where fp32 ``F.linear`` gives a
one-row call other bits than a multi-row call, the row plan pads every step to two rows, while
the packed kernel's one-row calls agree with its multi-row calls, so its exact steps are the
faster ones (``benchmarks/torch_overhead.py`` measures both; ``docs/decisions.md``).

Usage::

    from nest_integrations.lm.packing import pack_linear_weights, packing_available

    if packing_available(torch.bfloat16):
        n = pack_linear_weights(model)   # the number of linears packed
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
import torch.nn.functional as F

from nest_integrations.lm.row_exact import RowExactLinear, make_row_exact

LOG = logging.getLogger(__name__)

#: Environment switch: ``0``/``false``/``no``/``off`` keeps plain ``nn.Linear`` layers.
PACK_ENV = "NEST_PACK_WEIGHTS"
_OFF = {"0", "false", "no", "off"}


def _ops() -> Any:
    """``(reorder, linear)``: oneDNN's weight-prepack and prepacked-linear ops, or None."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    try:
        return mkldnn._reorder_linear_weight, mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=None)
def packing_available(dtype: torch.dtype) -> bool:
    """Whether prepacked oneDNN linears work for ``dtype`` in this torch build: only bf16, with
    oneDNN's bf16 support, checked once on a small matrix against ``F.linear``."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = _ops()
    try:
        if ops is None or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(24, 32, generator=gen).to(dtype)
        x = torch.randn(3, 32, generator=gen).to(dtype)
        got = ops[1](x, ops[0](w, None), None, "none", [], "")
        want = F.linear(x, w)
        return bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
    except Exception as exc:  # noqa: BLE001 - any failure means: don't pack
        LOG.info("prepacked bf16 linears unavailable: %s", exc)
        return False


@functools.lru_cache(maxsize=None)
def fp32_packing_available() -> bool:
    """Whether prepacked oneDNN linears work for fp32 in this torch build (checked once on a
    small matrix against ``F.linear``)."""
    ops = _ops()
    if ops is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 32, generator=gen), torch.randn(3, 32, generator=gen)
        got = ops[1](x, ops[0](w, None), None, "none", [], "")
        return bool(torch.allclose(got, F.linear(x, w), rtol=1e-4, atol=1e-4))
    except Exception as exc:  # noqa: BLE001 - any failure means: don't pack
        LOG.info("prepacked fp32 linears unavailable: %s", exc)
        return False


def packing_wanted(pack_weights: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """The loader's decision: ``pack_weights`` if given, else ``$NEST_PACK_WEIGHTS`` (off when
    ``0``/``false``), else on; and only on CPU where the dtype's prepacked kernel works
    (``packing_available``; fp32: ``fp32_packing_available``). fp32 is packed by default too:
    its prepacked rows equal its one-row calls, so steps need no padding and a 9-row verify
    pass is one call (``docs/decisions.md``, 'The torch path's own overhead')."""
    if pack_weights is None:
        pack_weights = os.environ.get(PACK_ENV, "").strip().lower() not in _OFF
    if not pack_weights or device.type != "cpu":
        return False
    return fp32_packing_available() if dtype == torch.float32 else packing_available(dtype)


class PackedLinear(RowExactLinear):
    """An ``nn.Linear`` whose forward uses a oneDNN-prepacked copy of its weight, row-exact by
    its probed row plan (``lm.row_exact``).

    ``weight`` and ``bias`` are the original parameters (shared, not copied). An input in
    another dtype or on another device than the packed weight takes plain ``F.linear``.
    """

    kind = "onednn-packed"

    @staticmethod
    def make_kernel(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
        reorder, linear = _ops()
        packed = reorder(weight.detach(), None)
        bias = None if bias is None else bias.detach()
        return lambda x: linear(x, packed, bias, "none", [], "")


def pack_linear_weights(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a ``PackedLinear``; returns how
    many. Call it after the model is on its device and in its dtype."""
    return make_row_exact(model, PackedLinear)


__all__ = ["PACK_ENV", "PackedLinear", "fp32_packing_available", "pack_linear_weights",
           "packing_available", "packing_wanted"]
