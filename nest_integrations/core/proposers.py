"""Span proposal (NEST Eqs. 5-6): when to copy, and where the copied span starts."""

from __future__ import annotations

import torch

from nest_integrations.core.token_memory import Hits, TokenMemory


def use_span(lam: float, span_threshold: float) -> bool:
    """Eq. 6: propose a span iff lambda <= delta (else emit one token)."""
    return lam <= span_threshold


def span_start(
    hits: Hits,
    memory: TokenMemory,
    token: int,
    row: int = 0,
    max_passage: int | None = None,
    allowed: torch.Tensor | None = None,
) -> int | None:
    """Eq. 5: the memory row of the nearest neighbour (of query ``row``) whose value is
    ``token``; None when no retrieved neighbour carries it (then there is no span).
    ``max_passage`` keeps only neighbours in the first that-many passages (stage-1 order);
    ``allowed`` (a bool per passage index) only neighbours in the passages it marks."""
    if hits.empty:
        return None
    if hits.rows.device.type == "cpu":  # host arrays: a handful of numpy ops, no torch dispatch
        rows = hits.rows[row].numpy()
        ok = memory.values_host[rows] == token
        if max_passage is not None or allowed is not None:
            passage = memory.passage_host[rows]
            if max_passage is not None:
                ok &= passage < max_passage
            if allowed is not None:
                ok &= allowed.cpu().numpy()[passage]
        first = int(ok.argmax())
        return int(rows[first]) if ok[first] else None
    return _span_start_device(hits, memory, token, row, max_passage, allowed)


def _span_start_device(hits: Hits, memory: TokenMemory, token: int, row: int,
                       max_passage: int | None, allowed: torch.Tensor | None) -> int | None:
    """``span_start`` in torch ops, on the hits' device (a GPU)."""
    cand = hits.rows[row]
    ok = memory.values[cand] == token
    if max_passage is not None:
        ok &= memory.passage_of[cand] < max_passage
    if allowed is not None:
        ok &= allowed.to(cand.device)[memory.passage_of[cand]]
    match = ok.nonzero()
    return int(cand[match[0, 0]]) if match.numel() else None


def span_draft(memory: TokenMemory, start: int, n: int, stop_ids: frozenset[int]) -> list[int]:
    """Rows of the draft: up to n corpus tokens from ``start``, cut at the passage end and
    before EOS; keys already used are not proposed again."""
    rows = memory.span(start, n, stop_ids)
    for i, r in enumerate(rows):
        if memory.is_used(r):
            return rows[:i]
    return rows
