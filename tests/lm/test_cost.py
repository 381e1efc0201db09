"""The engine's cost model (``nest_integrations.lm.cost``): the c(T) curve, its cache under
$NEST_HOME/cost/, and the draft-length rule. Explicit curves only: no decision here depends on
timing (the one measurement test checks the shape of what is measured, not its values)."""

from __future__ import annotations

import json

import pytest

from nest_integrations.lm import cost
from nest_integrations.lm.cost import CostCurve, DraftPlanner, best_length, expected_tokens

#: fp32 SmolLM2 on this CPU (issue 21): c(2)/c(1) 1.71, c(9)/c(1) 1.92, c(17)/c(1) 2.36.
FP32 = CostCurve((1, 2, 9, 17), (0.060, 0.1026, 0.1152, 0.1416))
#: bf16 weights: c(2)/c(1) 0.95 (noise), c(9)/c(1) 1.19, c(17)/c(1) 1.63.
BF16 = CostCurve((1, 2, 9, 17), (0.058, 0.0551, 0.0690, 0.0945))


def test_curve_interpolates_extrapolates_and_round_trips():
    c = CostCurve.from_ratios([1.0, 2.0, 2.5])
    assert c.cost(1) == 1.0 and c.cost(2) == 2.0 and c.ratio(3) == 2.5
    assert c.cost(5) == pytest.approx(3.5)  # the last slope (0.5 per token) carries on
    assert FP32.cost(5) == pytest.approx(0.1026 + 3 / 7 * (0.1152 - 0.1026))
    back = CostCurve.from_json(json.loads(json.dumps(FP32.to_json())))
    assert back == FP32


@pytest.mark.parametrize("bad", [((2, 3), (1.0, 2.0)), ((1, 1), (1.0, 1.0)), ((1,), (0.0,)),
                                 ((1, 2), (1.0,))])
def test_bad_curves_are_refused(bad):
    with pytest.raises(ValueError, match="cost curve"):
        CostCurve(*bad)
    with pytest.raises(ValueError, match="start with"):
        CostCurve.from_ratios([2.0, 3.0])
    with pytest.raises(ValueError, match="not a cost curve"):
        CostCurve.from_json({"tokens": [1]})


def test_the_draft_length_follows_cost_and_acceptance():
    """Oracle by hand: drafting k pays when (1 + a + ... + a^k) / c(k+1) beats 1 / c(1)."""
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # fp32's steep first step: a 1-token draft needs a > 0.71; a low rate drafts nothing.
    assert best_length(FP32, 0.3, 10) == 0
    # The same rate on the flat bf16 curve pays for a draft.
    assert best_length(BF16, 0.3, 10) >= 1
    # High acceptance: the longest draft allowed, on both.
    assert best_length(FP32, 0.95, 10) == 10 and best_length(BF16, 0.95, 10) == 10
    # Monotone in the acceptance rate.
    ks = [best_length(FP32, a / 20, 16) for a in range(20)]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] == 16
    # A per-token draft cost (KNN-SSD's skip passes) shortens the draft.
    assert best_length(BF16, 0.8, 12, draft_cost=0.04) < best_length(BF16, 0.8, 12)
    # Brute force agrees on a grid.
    for a in (0.2, 0.5, 0.7, 0.9):
        rates = [expected_tokens(a, k) / FP32.cost(k + 1) for k in range(13)]
        assert best_length(FP32, a, 12) == max(range(13), key=lambda k: (rates[k], -k))


def test_the_planner_learns_the_generation_s_acceptance():
    p = DraftPlanner(FP32, max_len=10)
    start = p.length()
    for _ in range(6):
        p.observe(drafted=8, accepted=8)  # every draft taken in full
    assert p.alpha > 0.9 and p.length() == 10
    q = DraftPlanner(FP32, max_len=10)
    for _ in range(6):
        q.observe(drafted=4, accepted=0)  # every draft rejected at once
    assert q.alpha < 0.2 and q.length() == 0
    assert 0 <= start <= 10
    assert q.length(max_len=3) == 0 and p.length(max_len=3) == 3
    with pytest.raises(ValueError, match="max_len"):
        DraftPlanner(FP32, max_len=0)


def test_the_planner_takes_the_curve_of_the_step_it_runs_next():
    """With a second curve (llama.cpp over an F16 cache at 2+ threads: exact steps on every
    thread while the cache is short, on one past it), the planner plans each draft with the
    curve ``fast_now`` names at that moment."""
    flat, steep = CostCurve.from_ratios([1.0, 1.2, 1.4, 1.6]), CostCurve.from_ratios(
        [1.0, 3.0, 5.0, 7.0])
    short = [True]
    planner = DraftPlanner(flat, max_len=3, fast=steep, fast_now=lambda: short[0])
    planner.observe(40, 40)
    assert planner.length() == 0  # the steep curve: no draft pays
    short[0] = False
    assert planner.length() == 3
    alone = DraftPlanner(flat, max_len=3)  # one curve: used whatever the cache
    alone.observe(40, 40)
    assert alone.length() == 3


def test_option_values(tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    assert cost.curve_from(None, tiny_lm) is None and cost.curve_from("off", tiny_lm) is None
    assert cost.curve_from([1.0, 1.5], tiny_lm).ratio(2) == 1.5
    assert cost.curve_from(FP32.to_json(), tiny_lm) == FP32
    with pytest.raises(ValueError, match="cost_model="):
        cost.curve_from(3, tiny_lm)
    p = cost.planner_for([1.0, 1.5], tiny_lm, 8, draft_cost=0.25)
    assert p.max_len == 8 and p.draft_cost == pytest.approx(0.25)


def test_the_curve_is_cached_per_model_dtype_threads_and_machine(tiny_lm, tmp_path, monkeypatch):
    """load_or_measure measures once, then reloads the JSON; refresh measures again; the file
    name carries the dtype, device, threads and machine, the folder the fingerprint."""
    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    calls = []

    def fake_measure(lm, **kw):
        calls.append(1)
        return CostCurve.from_ratios([1.0, 1.2 + len(calls) / 10], cost.curve_key(lm))

    monkeypatch.setattr(cost, "measure_curve", fake_measure)
    first = cost.load_or_measure(tiny_lm)
    again = cost.load_or_measure(tiny_lm)
    # the kernels are part of the key: fp32 CPU models run row-exact verify passes (lm.row_exact)
    # through prepacked linears where this torch has them (lm.packing)
    kernels = "float32+packed+rowwise" if tiny_lm.packed_linears else "float32+rowwise"
    assert calls == [1] and again == first and again.meta["dtype"] == kernels
    path = cost.curve_path(tiny_lm)
    assert path.is_file() and path.parent == tmp_path / "cost" / tiny_lm.fingerprint
    import re

    import torch

    from nest_integrations.lm.backend import machine_name

    slug = re.sub(r"[^A-Za-z0-9]+", "-", machine_name()).strip("-")[:60]
    assert path.name == f"{kernels.replace('+', '-')}-cpu-t{torch.get_num_threads()}-{slug}.json"
    fresh = cost.load_or_measure(tiny_lm, refresh=True)
    assert calls == [1, 1] and fresh.ratio(2) == pytest.approx(1.4)
    path.write_text("{broken")
    cost.load_or_measure(tiny_lm)
    assert len(calls) == 3


def test_measure_curve_shape(tiny_lm):
    curve = cost.measure_curve(tiny_lm, tokens=(1, 3), repeats=1, context=16)
    assert curve.tokens == (1, 3) and all(s > 0 for s in curve.seconds)
    assert curve.meta["model"] == tiny_lm.fingerprint and curve.meta["context"] == 16


def test_plain_steps_feed_the_planner_so_copying_resumes_drafts():
    """A copy drafter whose planner skipped drafting still learns from plain steps: each
    committed token that equals the draft it would have made counts as accepted, a different
    one as a rejection, so a long verbatim copy turns drafting back on and a miss turns it off."""
    from nest_integrations.config import NestConfig
    from nest_integrations.drafters.base import DecodeState
    from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter

    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1, num_tokens=8)
    steep = CostCurve.from_ratios([1.0, 2.7, 3.0, 3.4, 3.9, 4.3, 4.7, 5.1, 5.5, 5.9])
    drafter.planner = DraftPlanner(steep, max_len=8)
    drafter.num_tokens = drafter.planner.length()
    assert drafter.num_tokens == 0  # the prior's acceptance does not pay on this curve
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    state = DecodeState(prompt_ids=text + [99], out_ids=[5], budget=50, config=NestConfig(),
                        eos=frozenset(), passages=[], offsets=[], choose_token=lambda row: 0)
    plain = 0
    for tok in text[1:]:  # the output copies the prompt's text token by token
        if drafter.num_tokens > 0:
            break
        assert drafter.propose(state) is None  # no draft: a plain step
        assert drafter.cite(state, tok) is None  # prompt lookup has no passage to cite
        state.out_ids.append(tok)
        plain += 1
    assert 1 < plain < len(text) - 1 and drafter.num_tokens > 0, plain
    assert drafter.propose(state).tokens[0] == text[plain + 1]  # drafting the copy again
    before = drafter.planner.alpha
    drafter.cite(state, 1234)  # the model leaves the copy
    assert drafter.planner.alpha < before


#: llama.cpp's Q8_0 curve on the AMD EPYC (docs/llama_cpp.md): a 2-row pass costs 2.7 steps.
STEEP = CostCurve.from_ratios([1.0, 2.68, 3.15, 3.8, 4.45, 4.8, 5.1, 5.45, 5.78])


def test_a_draft_shorter_than_planned_is_verified_only_where_its_length_pays():
    """``pays(k)``: a draft of exactly k tokens beats a plain step (best_length's test for each
    k). Where acceptance is high the planner sizes long drafts, but 1 or 2 tokens never pay on
    llama.cpp's steep first step."""
    p = DraftPlanner(STEEP, max_len=8)
    for _ in range(8):
        p.observe(drafted=8, accepted=8)
    assert p.length() == 8 and p.pays(8)
    assert not p.pays(1) and not p.pays(2) and not p.pays(0)
    for a in (0.3, 0.8, 0.9, 0.97):
        rates = [expected_tokens(a, k) / STEEP.cost(k + 1) for k in range(9)]
        assert [cost.pays(STEEP, a, k) for k in range(9)] == [
            k > 0 and rates[k] > rates[0] * (1 + 1e-9) for k in range(9)]
    assert all(cost.pays(BF16, 0.9, k) for k in range(1, 9))  # a flat curve: any draft pays


def _span_drafter(curve):
    """NEST's drafter over one 10-token passage, its planner on ``curve`` and sure of copies."""
    import numpy as np

    from nest_integrations.config import NestConfig
    from nest_integrations.core.token_memory import TokenMemory
    from nest_integrations.drafters.base import DecodeState, DrafterContext
    from nest_integrations.drafters.nest import NestDrafter
    from nest_integrations.types import Passage, PassageKeys

    ids = np.arange(100, 110)
    keys = PassageKeys("p0", np.zeros((10, 4), np.float16), ids, np.zeros((10, 2), np.int32))
    memory = TokenMemory([keys])
    cfg = NestConfig(max_span=8)
    ctx = DrafterContext(None, cfg, [], [Passage("p0", "x", "d0")], memory=memory,
                         options={"cost_model": curve})
    drafter = NestDrafter(ctx)
    for _ in range(8):
        drafter.planner.observe(8, 8)
    state = DecodeState(prompt_ids=[1], out_ids=[], budget=50, config=cfg, eos=frozenset(),
                        passages=[], offsets=[], choose_token=lambda r: 0)
    return drafter, state


@pytest.mark.parametrize("row, expected", [(2, 8), (8, 1), (7, 1), (5, 5)])
def test_nest_copies_a_span_too_short_to_pay_row_by_row(row, expected):
    """A copy that goes on from row ``row`` of a 10-row passage has 10 - row rows left (at most
    the planned 8). On the steep curve a 2- or 3-row verify pass costs more steps than it saves:
    the drafter then proposes only the next row (checked against p_M before any pass), and the
    copy goes on row by row. On a flat curve the short span is verified as it is."""
    drafter, state = _span_drafter(list(STEEP.ratio(t) for t in range(1, 10)))
    drafter._stream_row = row  # a fully accepted span ended at row - 1
    draft = drafter.propose(state)
    assert draft.tokens == list(range(100 + row, 100 + row + expected))
    assert not draft.chosen_first
    flat, state = _span_drafter([1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4])
    flat._stream_row = row
    assert len(flat.propose(state)) == min(8, 10 - row)


def test_a_short_ngram_match_is_a_plain_step_that_still_feeds_the_planner():
    """Prompt lookup planned 8 tokens but the match near the prompt's end offers one: on the
    steep curve a 1-token draft loses, so ``propose`` gives none, and the plain step's token is
    still checked against that match (``cite``), which feeds the acceptance estimate."""
    from nest_integrations.config import NestConfig
    from nest_integrations.drafters.base import DecodeState
    from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter

    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1, num_tokens=8)
    drafter.planner = DraftPlanner(STEEP, max_len=8)
    for _ in range(8):
        drafter.planner.observe(8, 8)
    drafter.num_tokens = drafter.planner.length()
    assert drafter.num_tokens == 8
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    state = DecodeState(prompt_ids=prompt + [40, 40], out_ids=[], budget=50,
                        config=NestConfig(), eos=frozenset(), passages=[], offsets=[],
                        choose_token=lambda row: 0)
    assert drafter.continuation(state, 8).tokens == [40]  # "40" matches one token from the end
    assert drafter.propose(state) is None
    before = drafter.planner.accepted
    drafter.cite(state, 40)
    assert drafter.planner.accepted == before + 1
    state.prompt_ids = prompt + [40, 8]  # "8" matches with 8 tokens to copy: drafted
    assert drafter.propose(state).tokens == list(range(9, 17))
