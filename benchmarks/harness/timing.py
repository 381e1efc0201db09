"""Side-by-side timing: every system on each prompt back to back, in an order that rotates per
prompt, so load from other jobs falls on all alike; speeds pooled over a set, and ratios."""

from __future__ import annotations

import math
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], i: int) -> list[T]:
    """``items`` rotated left by ``i`` (the order for the ``i``-th prompt)."""
    if not items:
        return []
    k = i % len(items)
    return list(items[k:]) + list(items[:k])


def rate(x: dict[str, Any] | None) -> float | None:
    """Tokens per second of one run (``{"tokens", "seconds"}``), None when empty."""
    return x["tokens"] / x["seconds"] if x and x.get("tokens") and x.get("seconds") else None


def pooled(rows: Sequence[dict[str, Any]], name: str) -> float | None:
    """Total tokens over total seconds of system ``name`` across ``rows``."""
    res = [r[name] for r in rows if r.get(name)]
    tokens, seconds = sum(x["tokens"] for x in res), sum(x["seconds"] for x in res)
    return tokens / seconds if res and seconds else None


def decode_timed(record: dict[str, Any], name: str) -> bool:
    """Whether system ``name``'s run in ``record`` times a decode: ``first_s`` set and at
    least two tokens (``pooled_decode`` counts the tokens after the first)."""
    run = record.get(name)
    return bool(run) and run.get("first_s") is not None and run["tokens"] > 1


def pooled_decode(rows: Sequence[dict[str, Any]], name: str) -> float | None:
    """The decode's own rate of system ``name`` across ``rows``: tokens after the first over
    the seconds after the first token, pooled. A run says when its first token was ready in
    ``first_s`` (the work before the decode: retrieval, keys, the prompt's forward); runs
    without it, or with fewer than two tokens, are left out. Unlike ``pooled`` this rate does
    not move when a row prefills the same prompt and stops earlier (a repeat guard): it
    compares the steps."""
    res = [r[name] for r in rows if decode_timed(r, name)]
    tokens = sum(x["tokens"] - 1 for x in res)
    seconds = sum(x["seconds"] - x["first_s"] for x in res)
    return tokens / seconds if res and seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or zero."""
    return a / b if a and b else None


def fastest(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of one row's runs on one prompt (repeated rounds), with ``rounds`` (how
    many), ``spread`` (slowest / fastest seconds) and ``same_output`` (every round gave the
    same ids: a deterministic row must): keeping the fastest drops the rounds a neighbour's
    load slowed, which the rotation alone only spreads over every row."""
    if not runs:
        raise ValueError("fastest() needs at least one run")
    best = min(runs, key=lambda x: x["seconds"])
    slowest = max(x["seconds"] for x in runs)
    return {**best, "rounds": len(runs),
            "spread": slowest / best["seconds"] if best["seconds"] else None,
            "same_output": all(x.get("ids") == best.get("ids") for x in runs)}


def geomean(values: Sequence[float]) -> float | None:
    """The geometric mean of positive ``values``, None for none."""
    logs = [math.log(v) for v in values if v and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None
