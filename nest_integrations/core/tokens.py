"""Token-id sequence helpers shared by the drafters and the evaluation."""

from __future__ import annotations

from typing import Iterable, Sequence


def cut_at_eos(tokens: Sequence[int], eos: Iterable[int]) -> list[int]:
    """``tokens`` up to (not including) the first end token: drafts never carry EOS (the
    verify step's own token ends the text), and scored outputs stop where the model stopped."""
    ends = eos if isinstance(eos, (set, frozenset)) else set(eos)
    out = []
    for t in tokens:
        if t in ends:
            break
        out.append(int(t))
    return out


__all__ = ["cut_at_eos"]
