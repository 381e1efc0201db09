"""The quality protocol (issue 22): the question set builder, its document split, the stats and
the open-ended metrics."""

from __future__ import annotations

import math

import pytest

from nest_integrations.evaluation import open_ended, stats
from benchmarks.sets.quality_set import (
    SOURCES,
    build_question_set,
    entity_hard,
    split_of,
)


@pytest.fixture(scope="module")
def qset():
    return build_question_set(seed=0)


def test_at_least_300_questions_from_three_sources(qset):
    counts = qset.counts()
    closed = {s: counts["dev"].get(s, 0) + counts["test"].get(s, 0) for s in SOURCES}
    assert sum(closed.values()) >= 300 and all(closed[s] >= 20 for s in SOURCES)
    assert counts["dev"]["open"] >= 20 and counts["test"]["open"] >= 20
    assert len({q.id for q in qset.questions}) == len(qset.questions)


def test_split_is_disjoint_by_document(qset):
    docs = {"dev": set(), "test": set()}
    for q in qset.questions + qset.open_questions:
        docs[qset.split[q.id]].add(q.gold_doc_id)
    assert docs["dev"] and docs["test"] and not docs["dev"] & docs["test"]
    assert all(split_of(q.gold_doc_id, 0) == qset.split[q.id] for q in qset.questions)


def test_builder_is_deterministic_and_the_seed_matters(qset):
    again = build_question_set(seed=0)
    assert [q.to_dict() for q in again.questions] == [q.to_dict() for q in qset.questions]
    assert again.split == qset.split
    assert build_question_set(seed=1).split != qset.split


def test_entity_hard_has_dates_and_distractor_notes_naming_the_entity():
    corpus, questions = entity_hard(seed=0, per_kind=3)
    notes = [d for d in corpus.documents if d["id"].endswith("/note")]
    assert len(notes) == 12 and len(corpus.documents) == 24
    dated = [q for q in questions if q.attribute.endswith("date")]
    assert len(dated) == 12 and all(q.answer[-4:].isdigit() for q in dated)
    q = dated[0]
    note = next(d for d in notes if d["id"] == q.gold_doc_id + "/note")
    assert q.entity in note["text"] and q.answer not in note["text"]
    assert all(q.answer not in q.distractors for q in questions)


def test_closed_questions_hold_their_answer_in_the_gold_document(qset):
    from benchmarks.sets.quality_set import SAMPLE_DIR

    texts = {d["id"]: d["text"] for d in qset.entities.documents}
    for q in qset.closed("dev", "entities-hard")[:20]:
        assert q.answer in texts[q.gold_doc_id]
    for q in qset.closed("dev", "wiki") + qset.closed("dev", "pydoc"):
        title, prefix = q.question.split("\n\n", 1)
        assert title == q.entity
        assert q.answer_sentence.startswith(prefix) and len(prefix.split()) >= 4
        assert q.answer_sentence[len(prefix):].lstrip().startswith(q.answer)
        assert q.answer not in q.question
    assert SAMPLE_DIR.is_dir()


def test_interleaved_slice_holds_every_source(qset):
    part = qset.interleaved(qset.closed("dev"), 9)
    assert len(part) == 9 and {qset.sources[q.id] for q in part} == set(SOURCES)
    assert [q.id for q in part] == [q.id for q in qset.interleaved(qset.closed("dev"), 9)]


def test_mcnemar_exact_against_a_hand_computed_case():
    # 6 questions only a gets right, 1 only b: p = 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * 8/128
    a = [True] * 6 + [False] + [True] * 3 + [False] * 2
    b = [False] * 6 + [True] + [True] * 3 + [False] * 2
    m = stats.mcnemar(a, b)
    assert (m["a_only"], m["b_only"], m["both"], m["neither"]) == (6, 1, 3, 2)
    assert m["p"] == pytest.approx(16 / 128)


def test_wilson_interval_hand_computed():
    lo, hi = stats.wilson_ci(8, 10)  # p = 0.8, n = 10: (0.4902, 0.9433)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert stats.wilson_ci(0, 5)[0] == 0.0
    assert all(math.isnan(x) for x in stats.wilson_ci(0, 0))


def test_open_ended_metrics():
    assert open_ended.degenerate("")
    assert open_ended.degenerate('The entry is "................".')
    assert open_ended.degenerate("It is a dance. It is a dance.")
    assert open_ended.degenerate("it is also referred to as, it is also referred to as,")
    assert not open_ended.degenerate("Belly dance is a Middle Eastern dance.")
    # runs of empty lines, and one short line over and over (first test-split run)
    assert open_ended.degenerate('See the entry for "if".' + "\n" * 40)
    assert open_ended.degenerate("The Ellipsis Object\n\n" + "Python\n\n" * 5)
    assert not open_ended.degenerate("Usage:\n\n    x = 1\n\nNote: x is 1.\n\n\nEnd.")
    # junk that degenerate lets through (the open-who answers)
    assert open_ended.junky("Fred Rogers was a, and author,, Presbyterian minister.")
    assert open_ended.junky(", a salt is a chemical compound.")
    assert open_ended.junky("It is the the largest city.")
    assert not open_ended.degenerate("Fred Rogers was a, and author,, Presbyterian minister.")
    assert not open_ended.junky("Fred Rogers was an American television host, author, and minister.")
    assert not open_ended.junky("Usage: x, y = 1, 2")

    class P:
        def __init__(self, pid, doc):
            self.id, self.doc_id = pid, doc

    class C:
        def __init__(self, text):
            self.text = text

    passages = [P("a1", "A"), P("b1", "B")]
    sources = [None, ("a1", 0), ("a1", 1), ("b1", 4)]
    assert open_ended.other_document_tokens(sources, passages, "A") == 1
    assert open_ended.substantial_citation([C("one two three four")])
    assert not open_ended.substantial_citation([C("one two three")])
    assert open_ended.rouge_l("", "anything") == 0.0
    assert open_ended.rouge_l("a b c", "a b c") == pytest.approx(1.0)


def test_the_title_index_finds_every_entity_questions_gold_document(qset):
    """The title index of the entity corpus (distractor notes included, titled
    "X (disambiguation)") names each entity question's gold document, never its note."""
    from nest_integrations.retrieval.titles import TitleIndex

    index = TitleIndex({d["id"]: d["metadata"]["title"] for d in qset.entities.documents})
    for q in qset.questions:
        if qset.sources[q.id] == "entities-hard":
            named = [d for m in index.match(q.question) for d in m.doc_ids]
            assert q.gold_doc_id in named and len(named) == 1, (q.question, named)


def test_open_split_asks_who_was_x_about_every_person(qset):
    """``open-who``: "Who was X?" per People lead of the sample corpus, with that lead's gold
    text and split, besides its "What is X?" prompt."""
    import json

    from benchmarks.sets.quality_set import SAMPLE_DIR

    leads = [json.loads(x) for x in (SAMPLE_DIR / "wikipedia.jsonl").read_text().splitlines()
             if x.strip()]
    people = {d["id"]: d["metadata"]["title"] for d in leads
              if d["metadata"].get("topic") == "People"}
    who = [q for q in qset.open_questions if q.source == "open-who"]
    assert len(people) >= 50 and {q.gold_doc_id for q in who} == set(people)
    what = {q.gold_doc_id: q for q in qset.open_questions if q.source == "open-wiki"}
    for q in who:
        assert q.question == f"Who was {people[q.gold_doc_id]}?"
        assert q.gold_text == what[q.gold_doc_id].gold_text
        assert qset.split[q.id] == qset.split[what[q.gold_doc_id].id]
