"""Time to first token (issue 63): ``NestStats.time_to_first_token`` runs from the start of the
call (the engine built) to the first committed token, so it holds retrieval and the plan, and
ends before the call does; ``nest ask`` prints it next to tok/s and ``--json`` carries it."""

from __future__ import annotations

import time

from nest_integrations.cli.formatting import render
from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore

PROMPT = "one two three four one two three four one two three four one two"


def test_first_token_is_timed_from_the_call_to_the_first_commit(tiny_lm) -> None:
    engine = NestEngine(tiny_lm, None, InMemoryKeyStore(), NestConfig())
    first_steps: list[float] = []
    real_forward = tiny_lm.forward

    def forward(*args, **kwargs):  # the real pass; the clock reading after the prefill's
        out = real_forward(*args, **kwargs)
        first_steps.append(time.perf_counter())
        return out

    tiny_lm.forward = forward
    try:
        start = time.perf_counter()
        result = engine.generate(PROMPT, max_new_tokens=24, decoding="greedy")
    finally:
        del tiny_lm.forward
    s = result.stats
    assert s.new_tokens == 24 and s.forward_passes >= 24
    assert s.timing.retrieval <= s.time_to_first_token < s.time_total
    # at or after the prefill's pass, and before the second step's pass ended
    assert first_steps[0] - start <= s.time_to_first_token + 1e-3
    assert s.time_to_first_token <= first_steps[1] - start
    assert result.to_dict()["stats"]["time_to_first_token"] == s.time_to_first_token
    assert f"first token {s.time_to_first_token:.2f}s" in render(result)

