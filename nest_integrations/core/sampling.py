"""Choosing a token from a probability vector: greedy, or temperature + top-p sampling."""

from __future__ import annotations

import torch


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
        return int(p.argmax())
    return sample(warp(p, temperature, top_p), generator)


def sample(q: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token from the ``(V,)`` distribution ``q`` (on the CPU, with ``generator``)."""
    return int(torch.multinomial(q.float().cpu(), 1, generator=generator))
