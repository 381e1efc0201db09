"""``NestConfig.fact_decoding`` (issue 22): a fact question is answered losslessly w.r.t. the
RA prompt's LM (so exactly in-context RAG's greedy answer), a descriptive one by NEST.

The oracle is plain greedy decoding of the same RA prompt (``decoding="greedy"``): the routed
answer must equal it token for token. Runs on the fake LM (quick)."""

from __future__ import annotations

import pytest

from engines import make_engine
from fakes import FakeLM
from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.core.question import asks_for_fact, question_line
from nest_integrations.types import Passage


@pytest.mark.parametrize("text, fact", [
    ("What is the founding year of Korvanta Systems?", True),
    ("what was the maiden flight date of Orion-7?", True),
    ("When was the Roman Empire founded?", True),
    ("How many strips of Peanuts were published?", True),
    ("Who wrote Hamlet?", True),
    ("Who was the founder of Rome?", True),
    ("In which year did Rome fall?", True),
    ("Name the capital of France.", True),
    ("Context: ...\n\nWhich city hosted the 1948 Olympics?", True),  # the last line decides
    ("Who was Charles Dickens?", False),  # a biography: descriptive
    ("What is Futurism?", False),
    ("What is The Garden of Earthly Delights?", False),  # a title, not "the <attr> of"
    ("How does the assert statement work in Python?", False),
    ("Write the dictionary entry for the computing term 'frogging'.", False),
    ("subscriptions\n\nWhen an object is", False),  # a completion, not a question
    ("", False),
])
def test_asks_for_fact(text, fact):
    assert asks_for_fact(text) is fact


def test_question_line_is_the_last_non_empty_line():
    assert question_line("a\n\n  b?  \n\n") == "b?"
    assert question_line("  \n") == ""


def _passages():
    texts = ["The founding year of Korvanta Systems is 1987. It makes valves.",
             "The founding year of Belmar Works is 1990. It makes pumps.",
             "Korvanta Systems is often confused with Belmar Works."]
    return [Passage(f"p{i}", t, doc_id=f"d{i}", char_start=0, char_end=len(t))
            for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def engine():
    return make_engine(FakeLM(key_dim=8, vocab_size=512, seed=3))


def test_grounded_routes_fact_questions_to_lossless_rag_copy():
    assert PRESETS["grounded"]["fact_decoding"] == "rag-copy"
    assert NestConfig().fact_decoding is None  # paper: off


@pytest.mark.parametrize("question", ["What is the founding year of Korvanta Systems?",
                                      "When was Korvanta Systems founded?"])
def test_a_fact_question_equals_greedy_on_the_ra_prompt(engine, question):
    cfg = NestConfig.from_preset("grounded", rrc_offset=10.0)  # lambda ~ 0: NEST would copy
    msgs = [{"role": "user", "content": question}]
    routed = engine.generate(msgs, max_new_tokens=24, passages=_passages(), config=cfg)
    oracle = engine.generate(msgs, max_new_tokens=24, passages=_passages(), config=cfg,
                             decoding="greedy")
    relaxed = engine.generate(msgs, max_new_tokens=24, passages=_passages(),
                              config=cfg.replace(fact_decoding=None))
    assert routed.stats.decoding == "rag-copy" and oracle.stats.decoding == "greedy"
    assert routed.token_ids == oracle.token_ids
    assert relaxed.stats.decoding == "nest"
    assert relaxed.token_ids != oracle.token_ids  # the control: NEST's copy differs here
    assert all(c.kind == "verbatim" for c in routed.citations)


def test_a_descriptive_question_keeps_nest(engine):
    cfg = NestConfig.from_preset("grounded", rrc_offset=10.0)
    msgs = [{"role": "user", "content": "What is Korvanta Systems?"}]
    out = engine.generate(msgs, max_new_tokens=16, passages=_passages(), config=cfg)
    same = engine.generate(msgs, max_new_tokens=16, passages=_passages(),
                           config=cfg.replace(fact_decoding=None))
    assert out.stats.decoding == "nest" and out.token_ids == same.token_ids


def test_an_explicit_lossless_call_is_not_routed(engine):
    cfg = NestConfig.from_preset("grounded")
    msgs = [{"role": "user", "content": "When was Korvanta Systems founded?"}]
    out = engine.generate(msgs, max_new_tokens=8, passages=_passages(), config=cfg,
                          decoding="prompt-lookup")
    assert out.stats.decoding == "prompt-lookup"


def test_bad_fact_decoding_is_a_clear_error(engine):
    with pytest.raises(ValueError, match="fact_decoding"):
        NestConfig(fact_decoding="")
    with pytest.raises(ValueError, match="fact_decoding"):
        NestConfig(fact_decoding=3)
    msgs = [{"role": "user", "content": "When was Korvanta Systems founded?"}]
    with pytest.raises(ValueError, match="fact_decoding='nest' is not lossless"):
        engine.generate(msgs, max_new_tokens=4, passages=_passages(),
                        config=NestConfig(fact_decoding="nest"))
    with pytest.raises(ValueError, match="unknown decoding"):
        engine.generate(msgs, max_new_tokens=4, passages=_passages(),
                        config=NestConfig(fact_decoding="nope"))
