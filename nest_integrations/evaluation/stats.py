"""Paired significance for small evaluations: McNemar's exact test and bootstrap intervals.

With a few dozen questions, +-3 correct answers is noise: compare two systems on the SAME
questions with McNemar's exact test (only discordant pairs count), and report means with
percentile bootstrap intervals (resampling questions, seeded, so reports are reproducible).
"""

from __future__ import annotations

import math
import random
from typing import Sequence


def binom_two_sided(k: int, n: int) -> float:
    """Exact two-sided binomial p-value of ``k`` successes in ``n`` at p = 1/2
    (twice the smaller tail, capped at 1)."""
    if n == 0:
        return 1.0
    k = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float | int]:
    """McNemar's exact test of paired binary outcomes ``a`` and ``b`` (same questions).

    Returns ``{"n", "a_only", "b_only", "both", "neither", "p"}``: ``a_only`` counts questions
    ``a`` got right and ``b`` wrong; ``p`` is the exact binomial p-value over discordant pairs.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    both = sum(1 for x, y in zip(a, b) if x and y)
    return {
        "n": len(a),
        "a_only": a_only,
        "b_only": b_only,
        "both": both,
        "neither": len(a) - a_only - b_only - both,
        "p": binom_two_sided(a_only, a_only + b_only),
    }


def wilson_ci(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% for the default ``z``); ``(nan, nan)`` for
    ``n == 0``."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _percentile(sorted_vals: Sequence[float], q: float) -> float:
    if not sorted_vals:
        return math.nan
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def bootstrap_ci(
    values: Sequence[float], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and its percentile bootstrap interval (NaNs for no
    values)."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    n = len(vals)
    means = sorted(sum(vals[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    a = (1.0 - level) / 2.0
    return sum(vals) / n, _percentile(means, a), _percentile(means, 1.0 - a)


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = 2000, level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired items with its bootstrap interval."""
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} vs {len(b)}")
    return bootstrap_ci([float(x) - float(y) for x, y in zip(a, b)], n_boot=n_boot,
                        level=level, seed=seed)


def win_rate(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int]:
    """Paired wins/ties/losses of ``a`` over ``b`` (higher is better) and the win rate
    ``(wins + ties / 2) / n``."""
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} vs {len(b)}")
    wins = sum(1 for x, y in zip(a, b) if x > y)
    losses = sum(1 for x, y in zip(a, b) if x < y)
    ties = len(a) - wins - losses
    return {"wins": wins, "ties": ties, "losses": losses,
            "win_rate": (wins + ties / 2) / len(a) if a else math.nan}


__all__ = ["binom_two_sided", "bootstrap_ci", "mcnemar", "paired_bootstrap_diff", "wilson_ci",
           "win_rate"]
