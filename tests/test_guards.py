"""NEST's quality knobs: passage-restricted span starts, the LM guards, minimum citation length.

Each knob defaults to the paper's behaviour (off); these tests pin what each one does when on.
"""

from __future__ import annotations

import pytest
import torch

from nest_integrations.config import NestConfig
from nest_integrations.core.token_memory import Hits
from nest_integrations.core.proposers import span_start
from nest_integrations.core.verification import (
    confident_lm_veto,
    eos_veto,
    guard_veto,
    guarded_token,
    relaxed_accept_count,
)
from tests.engines import make_engine
from nest_integrations.types import Passage
from tests.fakes import FakeLM


class _Mem:
    def __init__(self, values, passage_of):
        self.values = torch.tensor(values)
        self.passage_of = torch.tensor(passage_of)


def test_span_start_can_be_restricted_to_top_passages():
    """The nearest neighbour carrying the token wins, unless its passage ranks too low."""
    mem = _Mem([7, 7, 3], [2, 0, 1])  # row 0 in passage 2 (nearest), row 1 in passage 0
    hits = Hits(torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[0, 1, 2]]))
    assert span_start(hits, mem, 7) == 0
    assert span_start(hits, mem, 7, max_passage=1) == 1
    assert span_start(hits, mem, 3, max_passage=1) is None


def test_confident_lm_veto_and_eos_veto():
    p_lm = torch.tensor([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3], [0.2, 0.3, 0.5]])
    draft = torch.tensor([1, 1, 1])
    assert confident_lm_veto(p_lm, draft, 0.5).tolist() == [True, False, False]
    # eos id 2: top token in row 2; mass 0.3 > 0.25 in row 1
    assert eos_veto(p_lm, [2], 0.25).tolist() == [False, True, True]
    assert eos_veto(p_lm, [2], 0.6).tolist() == [False, False, True]


def test_veto_cuts_relaxed_acceptance():
    p = torch.tensor([[0.5, 0.5, 0.0]] * 3)
    draft = torch.tensor([0, 1, 0])
    assert relaxed_accept_count(p, draft, 0.1) == 3
    veto = torch.tensor([False, True, False])
    assert relaxed_accept_count(p, draft, 0.1, veto) == 1


def test_guard_knobs_are_validated():
    for field, bad in [("span_passages", 0), ("confidence_guard", 1.5), ("eos_guard", 0.0),
                       ("min_citation_tokens", 0)]:
        with pytest.raises(ValueError, match=field):
            NestConfig(**{field: bad})


def _passage(text, pid):
    return Passage(pid, text, doc_id=pid, char_start=0, char_end=len(text))


class _EndingLM(FakeLM):
    """FakeLM whose own top token is always EOS (id 1)."""

    def forward(self, ids, cache, *, last=None):
        logits, keys = super().forward(ids, cache, last=last)
        logits[:, 1] = logits.max() + 5.0
        return logits, keys


def test_eos_guard_ends_where_the_lm_ends_and_min_citation_filters():
    """With an LM whose top token is always EOS, the guarded engine emits nothing at all
    (the copy never overrules the end), while the paper setting copies the passage."""
    lm = _EndingLM(key_dim=8, vocab_size=64, seed=1)
    text = "alpha beta gamma delta epsilon zeta eta theta"
    engine = make_engine(lm)
    passages = [_passage(text, "a")]
    paper = engine.generate(" alpha", max_new_tokens=8, passages=passages,
                            config=NestConfig(rrc_offset=10.0))  # lambda ~ 0: p_M ~ p_kNN
    guarded = engine.generate(" alpha", max_new_tokens=8, passages=passages,
                              config=NestConfig(rrc_offset=10.0, eos_guard=0.5))
    assert paper.token_ids and paper.stats.attributed_tokens > 0
    assert guarded.token_ids == [] and guarded.stats.finish_reason == "stop"
    few = engine.generate(" alpha", max_new_tokens=8, passages=passages,
                          config=NestConfig(rrc_offset=10.0, min_citation_tokens=100))
    assert few.citations == [] and few.token_sources == paper.token_sources


def test_guards_as_pure_functions():
    """``guarded_token``: a confident LM overrules the chosen token, an LM that would end the
    text ends it; ``guard_veto``: the or of both vetoes, None when no guard is on."""
    eos = [1]
    sure = torch.tensor([0.02, 0.03, 0.9, 0.05])  # the LM is sure of token 2
    ending = torch.tensor([0.1, 0.6, 0.2, 0.1])  # the LM would end here
    unsure = torch.tensor([0.3, 0.1, 0.3, 0.3])
    assert guarded_token(3, sure, eos, 0.8, None) == 2
    assert guarded_token(3, sure, eos, 0.95, None) == 3  # not confident enough
    assert guarded_token(3, ending, eos, None, 0.5) == 1
    assert guarded_token(3, unsure, eos, 0.8, 0.5) == 3
    assert guarded_token(3, ending, [], None, 0.5) == 3  # no end tokens: nothing to end with
    p_lm = torch.stack([sure, ending, unsure])
    draft = torch.tensor([3, 3, 3])
    assert guard_veto(p_lm, draft, eos, None, None) is None
    assert guard_veto(p_lm, draft, eos, 0.8, None).tolist() == [True, False, False]
    assert guard_veto(p_lm, draft, eos, None, 0.5).tolist() == [False, True, False]
    assert guard_veto(p_lm, draft, eos, 0.8, 0.5).tolist() == [True, True, False]


def test_lm_agreement_keeps_only_tokens_the_lm_also_accepts():
    """``lm_agreement_veto``: Eq. 7 on p_LM alone; ``guarded_token`` swaps a token the LM
    rejects for the LM's top one; ``guard_veto`` ors it in."""
    from nest_integrations.core.verification import lm_agreement_veto

    p_lm = torch.tensor([[0.5, 0.3, 0.01, 0.19], [0.97, 0.01, 0.01, 0.01]])
    draft = torch.tensor([2, 1])
    # gamma 0.1: threshold 0.025 in row 0 (0.01 fails), 0.0485 in row 1 (0.01 fails)
    assert lm_agreement_veto(p_lm, draft, 0.1).tolist() == [True, True]
    assert lm_agreement_veto(p_lm, torch.tensor([1, 0]), 0.1).tolist() == [False, False]
    assert guarded_token(2, p_lm[0], [], None, None, 0.1) == 0
    assert guarded_token(1, p_lm[0], [], None, None, 0.1) == 1
    assert guard_veto(p_lm, draft, [], None, None, 0.1).tolist() == [True, True]
    with pytest.raises(ValueError, match="lm_agreement"):
        NestConfig(lm_agreement=0.0)


def test_pick_agreement_restricts_the_mixtures_choice_to_lm_plausible_tokens():
    """``pick_agreement``: a token the relaxed verifier chooses (token mode, a span's first
    token, a correction) is the mixture's best among the tokens the LM alone accepts by Eq. 7
    (not the LM's own top token, which ``lm_agreement`` falls back to); draft tokens are
    accepted as without it."""
    from nest_integrations.core.mixture import StepDistribution
    from nest_integrations.core.verification import plausible_choice
    from nest_integrations.decoding.loop import RelaxedVerifier

    # p_M prefers token 2 (a frequent passage token); the LM finds it implausible (0.001) and
    # wants 0; among the tokens the LM accepts, the mixture prefers 1
    p_m = torch.tensor([[0.1, 0.2, 0.6, 0.1]])
    p_lm = torch.tensor([[0.6, 0.3, 0.001, 0.099]])
    empty = torch.zeros((1, 0))
    dist = StepDistribution(p_m, torch.tensor([0.1]), Hits(empty, empty.long()), p_lm)

    def verifier(**kw):
        return RelaxedVerifier(NestConfig(relaxation=0.05, **kw), None)

    assert verifier().pick(dist) == 2  # the paper: the mixture's top token
    assert verifier(pick_agreement=0.05).pick(dist) == 1  # the mixture's best plausible one
    assert verifier(lm_agreement=0.05).pick(dist) == 0  # lm_agreement: the LM's top token
    assert verifier(pick_agreement=0.001).pick(dist) == 2  # 0.001 > 0.0005 * 0.6 passes
    q = plausible_choice(p_m, p_lm, 0.05)
    assert q[0, 2] == 0 and float(q.sum()) == pytest.approx(1.0)
    p_m0 = torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # no mass on the LM's head set {2}: unchanged
    assert torch.equal(plausible_choice(p_m0, torch.tensor([[0.0, 0.0, 1.0, 0.0]]), 0.05), p_m0)
    draft = torch.tensor([2])
    assert verifier(pick_agreement=0.05).accept(dist, draft) == 1  # drafts: unchanged
    assert verifier(lm_agreement=0.05).accept(dist, draft) == 0
    for bad in (0.0, 1.5, True):
        with pytest.raises(ValueError, match="pick_agreement"):
            NestConfig(pick_agreement=bad)
    assert NestConfig().pick_agreement is None
    assert NestConfig.from_preset("grounded").pick_agreement is None  # an option (docs/methods.md)
