"""The robust-answers benchmark's parts: phrasing families, the wrong-attribute metric (hand cases),
the held-out profile corpus and the FAQ parser."""

from __future__ import annotations

import pytest

from benchmarks.sets.faq import parse_faq
from benchmarks.sets.phrasings import (
    CLOSED_FAMILIES,
    HELD_OUT,
    OPEN_FAMILIES,
    closed_phrasings,
    first_sentence,
    open_phrasings,
    wrong_attribute,
)
from benchmarks.sets.profiles import generate_profiles


def test_every_closed_question_gets_six_phrasings_from_five_families():
    ph = closed_phrasings("q1", "founding year", "Korvanta Systems")
    assert len(ph) == 6 and len({p.family for p in ph}) == 5 == len(CLOSED_FAMILIES)
    assert [p.family for p in ph].count(HELD_OUT) == 2
    texts = [p.text for p in ph]
    assert "korvanta systems founding year" in texts and "founding year of Korvanta Systems?" in texts
    # the template of each other family rotates with the question
    used = {(p.family, p.template) for q in range(40)
            for p in closed_phrasings(f"q{q}", "a", "X")}
    assert used == {(f, i) for f, ts in CLOSED_FAMILIES.items() for i in range(len(ts))}
    assert [p.text for p in open_phrasings("Futurism", "arts")] == [
        "What is Futurism?", "Tell me about Futurism", "Futurism?", "Define Futurism",
        "What does Futurism mean in arts?"]
    assert len(OPEN_FAMILIES) == 5


OTHER = [("chief of state", "King Norodom"), ("capital", "Phnom Penh")]


@pytest.mark.parametrize("text, wrong", [
    ("The life expectancy at birth in Cambodia is 71.4 years.", False),  # the gold value
    ("The chief of state of Cambodia is King Norodom (since 2004).", True),  # another attribute
    ("The capital of Cambodia is Phnom Penh. Life expectancy is 71.4.", True),  # first sentence
    ("The chief of state is elected.", True),  # names another attribute, not the asked one
    ("The life expectancy at birth in Cambodia is 66.3 years.", True),  # another country's value
    ("In Malawi, life expectancy at birth is high.", True),  # another entity
    ("I do not know.", False),  # wrong, but states no other attribute or entity
    ("  1. 71.4 years\n2. Phnom Penh", False),  # a list: its first line has the value
])
def test_wrong_attribute(text, wrong):
    assert wrong_attribute(text, "71.4", "life expectancy at birth", OTHER, ["66.3"],
                           ["Malawi"]) is wrong


def test_first_sentence():
    assert first_sentence("  It is 71.4 years. And more.") == "It is 71.4 years."
    assert first_sentence("Line one\nline two") == "Line one"
    assert first_sentence("No end") == "No end"


def test_profiles_are_seeded_unique_and_unlike_the_entity_frames():
    a, b = generate_profiles(0), generate_profiles(0)
    assert [d["text"] for d in a.documents] == [d["text"] for d in b.documents]
    assert len(a.documents) == 40 and len(a.questions) == 80
    for q in a.questions:
        doc = next(d for d in a.documents if d["id"] == q.gold_doc_id)
        assert q.answer in doc["text"] and doc["metadata"]["title"] == q.entity
        assert q.answer not in q.distractors and len(q.distractors) == 39
        assert " is " not in doc["text"].split("\n", 4)[-1]  # field lines, no prose frames
    assert generate_profiles(1).documents[0]["text"] != a.documents[0]["text"]


FAQ = """General FAQ
===========

.. contents::

What is Python?
---------------

Python is an interpreted language.

It is free.

Why is it slow?
---------------

It is not.

Section without question
------------------------

Text.
"""


def test_the_faq_parser_takes_question_headings_and_their_sections():
    qs = parse_faq(FAQ, "faq/general.rst.txt")
    assert [q.question for q in qs] == ["What is Python?", "Why is it slow?"]
    assert qs[0].answer == "Python is an interpreted language.\n\nIt is free."
    assert FAQ[qs[0].start : qs[0].end] == qs[0].answer and qs[1].answer == "It is not."
