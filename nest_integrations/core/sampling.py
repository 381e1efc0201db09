"""Choosing a token from a probability vector: greedy, or temperature + top-p sampling."""

from __future__ import annotations

import torch


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
    q = p.double().clamp_min(0) ** (1.0 / temperature)
    q = q / q.sum()
    if top_p < 1.0:
        sorted_q, order = torch.sort(q, descending=True)
        keep = torch.cumsum(sorted_q, 0) - sorted_q < top_p  # keep the token that crosses top_p
        q = torch.zeros_like(q).scatter_(0, order[keep], sorted_q[keep])
        q = q / q.sum()
    return int(torch.multinomial(q.float().cpu(), 1, generator=generator))
