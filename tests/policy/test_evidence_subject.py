"""Evidence only about the question's subject (``policy.evidence.on_subject``, issue 60): over
documents of the shipped sample corpus, a question about a subject no document is about gets no
evidence quote (the plan answers without it), and one about a document's subject still gets that
document's lead. The grounded preset's real policy and scorer (the packaged MiniLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations.core.evidence import content_words
from nest_integrations.policy import AnswerPolicy, plan_answer
from nest_integrations.policy.evidence import choose_evidence, on_subject, candidates
from nest_integrations.types import Passage

SAMPLE = Path(__file__).resolve().parents[2] / "nest_integrations" / "data" / "sample"
WIKI = ("Marcus Licinius Crassus", "History of Turkey", "Gaiseric", "Pinball", "Charles Dickens")
PYDOC = ("return", "assert", "context-managers", "strings")


def _corpus() -> list[Passage]:
    """The sample corpus's own documents (one passage each, as short documents are stored)."""
    out = []
    with open(SAMPLE / "wikipedia.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["id"] in WIKI:
                out.append(Passage(d["id"], d["text"], d["id"], char_start=0,
                                   metadata={"title": d["metadata"]["title"]}))
    for name in PYDOC:
        text = (SAMPLE / "pydoc" / f"{name}.txt").read_text(encoding="utf-8")
        out.append(Passage(f"pydoc/{name}.txt", text, f"pydoc/{name}.txt", char_start=0,
                           metadata={"title": name}))
    assert len(out) == len(WIKI) + len(PYDOC)
    return out


@pytest.fixture(scope="module")
def corpus() -> list[Passage]:
    return _corpus()


def _plan(question: str, passages: list[Passage]):
    policy = AnswerPolicy.from_preset("grounded")
    return plan_answer(policy, question, passages, n_ra=3)


#: Questions about subjects none of the documents is about, each phrased as the sample
#: corpus's questions are; the passages' sentences share their words (Crassus's lead ends "...
#: into the Roman Empire", return's mentions generators), so before the rule one was quoted.
ABSENT = ["What is the Roman Empire?", "What was the Roman Empire's capital?",
          "What is a generator?", "Who was Julius Caesar?", "How does a steam engine work?",
          "What is the Byzantine Empire?",
          # definitional: a sentence that says "generator function" is no definition of one
          "How does a generator function?",
          # "Escape sequences ... are:" opens with "escape" but is about escape sequences
          "What is escape?"]


@pytest.mark.parametrize("question", ABSENT)
def test_no_evidence_is_quoted_from_a_document_not_about_an_absent_subject(corpus, question):
    # the RA prompt's passages as retrieval would put them: the nearest documents first
    passages = sorted(corpus, key=lambda p: -sum(w in content_words(p.text)
                                                 for w in content_words(question)))
    plan = _plan(question, passages)
    shown = None
    if plan.evidence is not None:
        p = next(p for p in plan.prompt_passages if p.id == plan.evidence.passage_id)
        shown = (p.doc_id, p.text[plan.evidence.start:plan.evidence.sentence_end])
    assert plan.evidence is None, shown
    # greedy over the prompt's passages, none to copy or cite: nothing of a document not
    # about the subject is copied or cited as the answer
    assert plan.method.name == "greedy"
    assert plan.absent and plan.passages == [] and plan.prompt_passages
    assert choose_evidence(question, passages[:3], "combined") is None


@pytest.mark.parametrize("question, doc", [
    ("What is pinball?", "Pinball"),
    ("Who was Charles Dickens?", "Charles Dickens"),
    ("Who was Marcus Licinius Crassus?", "Marcus Licinius Crassus"),
    ("How does the assert statement work?", "pydoc/assert.txt"),
])
def test_a_document_about_the_subject_still_answers_with_its_lead(corpus, question, doc):
    passages = [p for p in corpus if p.doc_id == doc] + [p for p in corpus if p.doc_id != doc]
    plan = _plan(question, passages)
    ev = plan.evidence
    assert ev is not None and ev.passage_id == doc, question
    p = next(p for p in plan.prompt_passages if p.id == ev.passage_id)
    lead = next(c for c in candidates(question, [p], "overlap") if c.lead)
    assert ev.start == lead.start
    # the quote's first part is the lead and, where the lead announces a block (the assert
    # topic's "... into a program:" before its grammar), that block's indented lines
    block = p.text[lead.end:ev.sentence_end]
    assert all(not line.strip() or line[:1].isspace() for line in block.split("\n"))
    assert (ev.sentence_end > lead.end) == lead.text.rstrip().endswith(":")
    assert ev.end > ev.sentence_end  # a lead's window: it goes on through its passage
    assert plan.absent is None
    # with the other documents in the prompt too (title_context "off"), the lead still wins
    ev = choose_evidence(question, passages[:4], "combined")
    assert ev is not None and ev.passage_id == doc


def test_a_sentence_that_says_the_subject_and_the_attribute_answers_from_another_document(
        corpus) -> None:
    """An attribute question whose subject no document is titled with: a sentence that names
    the subject and holds the attribute asked for still answers (the king of the Vandals is in
    Gaiseric's lead), as an attribute (that sentence alone, no lead window)."""
    question = "Who was king of the Vandals and Alans?"
    ev = choose_evidence(question, corpus, "combined")
    assert ev is not None and ev.passage_id == "Gaiseric"
    gaiseric = next(p for p in corpus if p.doc_id == "Gaiseric")
    assert gaiseric.text[ev.start:ev.end].startswith("Gaiseric, also known as Geiseric")
    assert ev.end == ev.sentence_end
    # a sentence that holds the subject's words but nothing asked of it does not
    kept, about, _ = on_subject("What is the Roman Empire?", candidates(
        "What is the Roman Empire?", corpus, "overlap"))
    assert kept == [] and about == set()


def test_without_titles_there_is_nothing_to_judge_by_and_every_sentence_stays(corpus) -> None:
    untitled = [Passage(p.id, p.text, p.doc_id, char_start=0) for p in corpus]
    cands = candidates("What is the Roman Empire?", untitled, "overlap")
    kept, about, _ = on_subject("What is the Roman Empire?", cands)
    assert kept == cands and about is None


def test_a_sentence_that_opens_with_the_subject_defines_it_in_any_document(corpus) -> None:
    """A document titled otherwise ("context-managers" for "context manager") still answers
    "What is X?" with the sentence whose grammatical subject is X; its neighbours that only
    mention X do not."""
    question = "What is a context manager?"
    first = [p for p in corpus if p.doc_id == "pydoc/context-managers.txt"]  # as retrieved
    plan = _plan(question, first + [p for p in corpus if p not in first])
    ev = plan.evidence
    assert ev is not None and plan.absent is None
    p = next(p for p in plan.prompt_passages if p.id == ev.passage_id)
    assert p.text[ev.start:ev.sentence_end].startswith("A *context manager* is an object")


def test_a_follow_up_about_an_absent_subject_gets_no_evidence_either(corpus) -> None:
    """The chat of the report: "What is the Roman Empire?", then "What was its capital?". The
    carry-over makes the follow-up standalone ("What was Roman Empire's capital?"), and no
    sentence says the Roman Empire's capital: no quote, no passage."""
    from nest_integrations.policy.conversation import carry_over

    messages = [{"role": "user", "content": "What is the Roman Empire?"},
                {"role": "assistant", "content": "The Roman Empire was a vast empire."},
                {"role": "user", "content": "What was its capital?"}]
    question = carry_over(messages)
    assert "Roman Empire" in question and "capital" in question
    plan = _plan(question, corpus)
    assert plan.evidence is None and plan.absent and plan.passages == []


def test_an_absent_subject_is_answered_from_the_prompts_passages_with_none_cited() -> None:
    """A user's own documents whose titles do not name the question's subject (a FAQ; a guide
    titled "Setting up the Orbit Kettle" for "How does the kettle work?": a title that holds
    the subject within more words may be about something else, "Satellite navigation" is no
    answer to "What is navigation?"): no quote, and nothing copied or cited, but the model
    still reads the retrieved passages in its prompt."""
    faq = Passage("faq", "Frequently asked questions\n\nRefunds are issued within 14 days. "
                  "To return an item, print the label from your account page.", "faq.md",
                  char_start=0, metadata={"title": "Frequently asked questions"})
    kettle = Passage("kettle", "Fill the kettle to the MAX line and press the switch. The "
                     "light turns off when the water boils.", "kettle.md", char_start=0,
                     metadata={"title": "Setting up the Orbit Kettle"})
    for question, subject in [("What is the return policy?", "return policy"),
                              ("How does the kettle work?", "kettle")]:
        plan = _plan(question, [faq, kettle])
        assert plan.evidence is None and plan.absent == subject and plan.method.name == "greedy"
        assert plan.passages == [] and [p.id for p in plan.prompt_passages] == ["faq", "kettle"]
    plan = _plan("How do I return an item?", [faq, kettle])  # an attribute the FAQ names
    assert plan.evidence is not None and plan.evidence.passage_id == "faq"
