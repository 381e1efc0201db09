"""Choosing a token from a probability vector: greedy, or temperature + top-p sampling."""

from __future__ import annotations

import numpy as np
import torch


def host_row(p: torch.Tensor) -> np.ndarray | None:
    """A CPU float row without grad as a numpy view (no copy), else None.

    Single-row reductions read through it: right after a small model's decode (a llama.cpp
    step is about 10 ms, and it evicts the caches) each ``torch.argmax`` or ``torch.max`` of a
    49k-vocabulary row costs about 80 us in dispatch and result tensors, numpy's about 25 us."""
    if p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) \
            and not p.requires_grad:
        return p.numpy()
    return None


def top_of(p: torch.Tensor) -> tuple[int, float]:
    """``(argmax, max)`` of a ``(V,)`` row: the first maximal index, as ``torch.argmax``."""
    a = host_row(p)
    if a is not None:
        i = int(a.argmax())
        return i, float(a[i])
    i = int(p.argmax())
    return i, float(p[i])


def warp(p: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution tokens are drawn from: ``p ** (1 / temperature)`` renormalised, cut to
    the top-p nucleus (the token that crosses ``top_p`` is kept). Works on ``(V,)`` or ``(T, V)``
    rows; returns fp32. ``temperature == 0`` is not a distribution: use argmax."""
    q = p.double().clamp_min(0) ** (1.0 / temperature)
    q = q / q.sum(-1, keepdim=True)
    if top_p < 1.0:
        sorted_q, order = torch.sort(q, dim=-1, descending=True)
        keep = torch.cumsum(sorted_q, -1) - sorted_q < top_p
        q = torch.zeros_like(q).scatter_(-1, order, sorted_q * keep)
        q = q / q.sum(-1, keepdim=True)
    return q.float()


def choose_token(
    p: torch.Tensor,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> int:
    """Pick a token from ``p`` (V,): argmax when ``temperature == 0``, else sample from
    ``p ** (1 / temperature)`` renormalised and cut to the top-p nucleus."""
    if temperature == 0.0:
        return top_of(p)[0]
    return sample(warp(p, temperature, top_p), generator)


def sample(q: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token from the ``(V,)`` distribution ``q`` (on the CPU, with ``generator``)."""
    return int(torch.multinomial(q.float().cpu(), 1, generator=generator))
