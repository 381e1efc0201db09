"""NEST's quality knobs: passage-restricted span starts (``NestConfig``), and the answer policy's
LM guards and minimum citation length (``config.Guards``).

Each knob defaults to the paper's behaviour (off); these tests pin what each one does when on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core.sampling import choose_token, top_of
from nest_integrations.core.token_memory import Hits
from nest_integrations.core.proposers import span_start
from nest_integrations.core.verification import (
    confident_lm_veto,
    eos_veto,
    guard_veto,
    guarded_accept_count,
    guarded_token,
    relaxed_accept_count,
)
from nest_integrations.policy import AnswerPolicy
from tests.engines import make_engine
from nest_integrations.types import Passage
from tests.fakes import FakeLM


class _Mem:
    def __init__(self, values, passage_of):
        self.values = torch.tensor(values)
        self.passage_of = torch.tensor(passage_of)
        self.values_host, self.passage_host = self.values.numpy(), self.passage_of.numpy()


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
    for field, bad in [("span_passages", 0), ("min_citation_tokens", 0)]:
        with pytest.raises(ValueError, match=field):
            NestConfig(**{field: bad})
    for field, bad in [("confidence_guard", 1.5), ("eos_guard", 0.0), ("min_citation_words", 0),
                       ("stop_on_repeat", None), ("lock_document", 1)]:
        with pytest.raises(ValueError, match=field):
            Guards(**{field: bad})
    with pytest.raises(TypeError):  # the guards are the policy's, not the algorithm's
        NestConfig(confidence_guard=0.3)


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
                              config=NestConfig(rrc_offset=10.0),
                              policy=AnswerPolicy(guards=Guards(eos_guard=0.5)))
    assert paper.token_ids and paper.stats.attributed_tokens > 0
    assert guarded.token_ids == [] and guarded.stats.finish_reason == "stop"
    few = engine.generate(" alpha", max_new_tokens=8, passages=passages,
                          config=NestConfig(rrc_offset=10.0, min_citation_tokens=100))
    assert few.citations == [] and few.token_sources == paper.token_sources


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), vocab=st.sampled_from([3, 6, 49_152]),
       ends=st.sampled_from([[0], [0, 2], [0, 1, 2]]), token=st.integers(0, 2),
       conf=st.sampled_from([None, 0.3, 0.9]), eos_guard=st.sampled_from([None, 0.2, 0.6]),
       tie=st.booleans(), path=st.sampled_from(["fp32", "fp64", "grad"]))
def test_guarded_token_equals_the_two_vetoes(seed, vocab, ends, token, conf, eos_guard, tie,
                                              path):
    """``guarded_token`` (one pass over the row, through numpy on a CPU row) makes the choice the
    batch vetoes make: ``confident_lm_veto``'s top token where the LM is sure, then
    ``eos_veto``'s most likely end token; ties take the first maximum, as ``torch.argmax``."""
    g = torch.Generator().manual_seed(seed)
    row = torch.softmax(torch.randn(vocab, generator=g) * 4, dim=-1)
    if tie:  # two equal maxima: the first one is the top token
        row[vocab - 1] = row[0] = row.max()
    row = {"fp32": row, "fp64": row.double(), "grad": row.clone().requires_grad_()}[path]
    with torch.no_grad():
        expected = token
        if conf is not None:
            top = int(row.argmax())
            if float(row[top]) > conf and top != token:
                expected = top
        if eos_guard is not None and bool(eos_veto(row[None], ends, eos_guard)[0]):
            expected = ends[int(row[ends].argmax())]
        assert guarded_token(token, row, ends, conf, eos_guard) == expected
        assert top_of(row) == (int(row.argmax()), float(row.max()))
        assert choose_token(row) == int(row.argmax())


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 6), vocab=st.sampled_from([4, 9, 49_152]),
       gamma=st.sampled_from([5e-2, 0.5, 1.0]), ends=st.sampled_from([[], [0], [0, 2], [0, 1, 2]]),
       conf=st.sampled_from([None, 0.3, 0.9]), eos_guard=st.sampled_from([None, 0.2, 0.6]),
       edge=st.sampled_from(["none", "bar", "sure", "mass"]))
def test_guarded_accept_count_equals_the_batch_functions(seed, rows, vocab, gamma, ends, conf,
                                                         eos_guard, edge):
    """``guarded_accept_count`` (row by row through numpy) counts what ``relaxed_accept_count``
    with ``guard_veto`` counts, also where a draft token's probability sits exactly on Eq. 7's
    bar, the LM's top exactly on the confidence threshold, or the end tokens' mass exactly on
    the end guard's (fp32 comparisons, as torch makes them)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(rows, vocab, generator=g) * 3, dim=-1)
    p_lm = torch.softmax(torch.randn(rows, vocab, generator=g) * 3, dim=-1)
    top = p.argmax(-1)
    pick = torch.randint(0, vocab, (rows,), generator=g)
    draft = torch.where(torch.rand(rows, generator=g) < 0.7, top, pick)
    for i in range(rows):
        w = int(draft[i])
        if edge == "bar" and w != int(top[i]):  # exactly on the bar: rejected (">" fails)
            p[i, w] = float(np.float32(0.5 * gamma) * p[i].max().numpy())
        if edge == "sure" and conf is not None:  # the LM's top exactly at the threshold
            p_lm[i] *= conf / float(p_lm[i].max())
            p_lm[i, int(p_lm[i].argmax())] = float(np.float32(conf))
        if edge == "mass" and eos_guard is not None and ends:  # the end tokens' mass on it
            p_lm[i] *= 0.5 * eos_guard / float(p_lm[i].max())
            p_lm[i, ends] = 0.0
            p_lm[i, ends[0]] = float(np.float32(eos_guard))
    veto = guard_veto(p_lm, draft, ends, conf, eos_guard)
    expected = relaxed_accept_count(p, draft, gamma, veto)
    got = guarded_accept_count(p, p_lm, draft.tolist(), gamma, ends, conf, eos_guard)
    assert got == expected
    assert guarded_accept_count(p.double(), p_lm, draft.tolist(), gamma, ends, conf,
                                eos_guard) is None  # not fp32 rows: the batch functions


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


