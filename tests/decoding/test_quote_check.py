"""The model's say in the evidence quote (issue 60), and the answer's extent.

The quote is a draft of the loop: its one pass also gives the LM's probability of every quote
token, and ``Guards.quote_check`` keeps it only where the LM's mean log-probability reaches the
bar. A rejected quote commits nothing, and the engine answers without the evidence (the plan's
fallback method), flagged in ``NestStats.evidence``. An attribute's quote is the whole answer:
the answer ends where its evidence ends.
"""

from __future__ import annotations

import dataclasses

import pytest

from nest_integrations.config import Guards
from nest_integrations.core.verification import quote_score
from nest_integrations.policy import AnswerPolicy
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Passage
from tests.engines import make_engine

SENTENCE = "Its life expectancy at birth is 76.6 years."
TEXT = f"Tumouland is a small island in the Pacific. {SENTENCE} It exports copra and fish."
PASSAGE = Passage("p1", TEXT, "profile/tumouland", char_start=0,
                  metadata={"title": "Tumouland"})
QUESTION = [{"role": "user", "content": "What is the life expectancy at birth in Tumouland?"}]


def _engine(tiny_lm, quote_check=None, evidence="overlap"):
    policy = AnswerPolicy(decoding="rag-copy", evidence=evidence, evidence_min=0.0,
                          guards=Guards(quote_check=quote_check))
    return make_engine(tiny_lm, InMemoryRetriever([PASSAGE]), policy=policy)


def test_an_attribute_answer_is_its_sentence_and_ends_there(tiny_lm):
    """A random tiny model would run on for the whole budget; the quote is the answer, and
    the drafter ends it where the evidence window (the attribute's sentence) ends."""
    res = _engine(tiny_lm).generate(QUESTION, max_new_tokens=48)
    assert res.text.strip() == SENTENCE
    assert res.stats.finish_reason == "stop" and res.stats.evidence == "quoted"
    assert res.stats.quote_score is not None and res.stats.quote_score < 0.0
    assert [c.text for c in res.citations if c.kind == "copy"] == [SENTENCE]


def test_a_quote_below_the_bar_is_rejected_and_the_answer_is_the_fallbacks(tiny_lm):
    """Oracle: with the quote rejected, the answer is token for token the one the same
    engine gives with no evidence at all (the plan's fallback, rag-copy over the RA prompt)."""
    score = _engine(tiny_lm).generate(QUESTION, max_new_tokens=24).stats.quote_score
    rejected = _engine(tiny_lm, quote_check=min(0.0, score + 0.5)).generate(
        QUESTION, max_new_tokens=24)
    assert rejected.stats.evidence == "rejected"
    assert rejected.stats.decoding == "rag-copy"
    plain = _engine(tiny_lm, evidence=None).generate(QUESTION, max_new_tokens=24)
    assert plain.stats.evidence == ""
    assert rejected.token_ids == plain.token_ids and rejected.text == plain.text
    assert not rejected.text.strip().startswith(SENTENCE)
    # at the bar the quote is kept: the check compares, it does not always reject
    kept = _engine(tiny_lm, quote_check=score).generate(QUESTION, max_new_tokens=24)
    assert kept.stats.evidence == "quoted" and kept.text.strip() == SENTENCE


def test_quote_score_is_the_mean_log_probability_of_the_quote():
    import torch

    p_first = torch.tensor([0.5, 0.25, 0.25])
    logits = torch.log(torch.tensor([[0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [1.0, 1.0, 1.0]]))
    got = quote_score(p_first, logits, [0, 1, 2])
    want = (torch.log(torch.tensor(0.5)) + torch.log(torch.tensor(0.8))
            + torch.log(torch.tensor(0.6))) / 3
    assert got == pytest.approx(float(want), abs=1e-6)
    assert quote_score(p_first, logits, []) == 0.0


@pytest.mark.parametrize("bad", [0.5, float("nan"), True, "low"])
def test_quote_check_refuses_a_bar_that_is_no_mean_log_probability(bad):
    with pytest.raises(ValueError, match="quote_check"):
        Guards(quote_check=bad)
    assert dataclasses.replace(Guards(), quote_check=-2.0).quote_check == -2.0


def test_what_a_document_is_is_answered_by_its_lead_quoted_whole(tiny_lm):
    """"What is X?" of X's document: the lead, and the window after it, quoted (two passes:
    the prompt with the opening sentence, then the rest), cited whole, and the answer ends
    with it."""
    body = ("Tumouland is a small island nation in the Pacific. It exports copra and fish. "
            "Most of its people live on the main island.")
    text = f"Tumouland\n=========\n\n{body}"
    doc = Passage("d1", text, "wiki/tumouland", char_start=0, metadata={"title": "Tumouland"})
    policy = AnswerPolicy(decoding="rag-copy", evidence="overlap", evidence_min=0.0)
    engine = make_engine(tiny_lm, InMemoryRetriever([doc]), policy=policy)
    res = engine.generate([{"role": "user", "content": "What is Tumouland?"}], max_new_tokens=64)
    assert res.text == body
    assert res.stats.finish_reason == "stop" and res.stats.evidence == "quoted"
    assert res.stats.forward_passes == 2  # the prompt with the opening sentence, the rest
    (cite,) = res.citations
    assert cite.text == body and cite.doc_id == "wiki/tumouland"
