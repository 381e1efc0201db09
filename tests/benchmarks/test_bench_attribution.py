"""``python -m benchmarks.attribution``'s measuring parts, on small hand-made inputs: the threshold
rule, the precision-recall curve and its operating points, the pydoc items, and the flags of
recorded answers (``--answers``) with the fuzzy scorer (no model)."""

from __future__ import annotations

import random

import pytest

from benchmarks import attribution as B
from nest_integrations.attribution import AttributionConfig, Attributor
from nest_integrations.types import Passage


def _item(kind: str) -> B.Item:
    return B.Item("entities", kind, "d", "x", [])


def _row(score: float, on_gold: bool) -> dict:
    return {"units": [{"verbatim": False, "score": score, "on_gold": on_gold}]}


# positives score 0.9 / 0.8 / 0.7 (on the gold sentence), negatives 0.75 and 0.3
ITEMS = [_item("positive")] * 3 + [_item("wrong_value"), _item("unrelated")]
ROWS = [_row(0.9, True), _row(0.8, True), _row(0.7, True), _row(0.75, False), _row(0.3, False)]


def test_threshold_rule_takes_the_middle_of_the_max_recall_range() -> None:
    # at 92%: only t = 0.8 (2 of 3 positives, no negative) and 0.9 qualify; 0.8 recalls more
    t, rule = B.choose_threshold(ITEMS, ROWS, 0.92)
    assert t == 0.8 and "max recall" in rule
    # two positives at 0.9 / 0.8, negatives at 0.6 / 0.5: at 50% every t from 0.5 to 0.8
    # recalls both, so the middle of that range is taken
    items = [_item("positive")] * 2 + [_item("unrelated")] * 2
    rows = [_row(0.9, True), _row(0.8, True), _row(0.6, False), _row(0.5, False)]
    t, rule = B.choose_threshold(items, rows, 0.5)
    assert t == pytest.approx(0.65) and "mid-range" in rule
    m = B.metrics(items, rows, t)
    assert m["support_precision"] == 1.0 and m["support_recall"] == 1.0
    # nothing reaches the target: the best F1
    t, rule = B.choose_threshold(ITEMS, ROWS, 1.01)
    assert "best dev F1" in rule and t == 0.7  # P 3/4, R 1: F1 0.857


def test_pr_curve_and_operating_points() -> None:
    curve = B.pr_curve(ITEMS, ROWS)
    assert curve[0]["recall"] == 0.0  # above every score
    assert [round(c["threshold"], 2) for c in curve] == [1.01, 0.9, 0.8, 0.75, 0.7, 0.3]
    assert B.at_operating_point(curve, recall=1.0) == pytest.approx(3 / 4)
    assert B.at_operating_point(curve, precision=1.0) == pytest.approx(2 / 3)
    assert B.at_operating_point(curve, precision=1.01) is None


def test_pydoc_items_are_labelled_from_their_topic() -> None:
    from nest_integrations.embedders.minilm import shared_embedder

    items = B.pydoc_items(6, random.Random(0), shared_embedder())
    assert sum(it.positive for it in items) == 6
    assert {"positive", "unrelated", "fabricated"} <= {it.kind for it in items}
    for it in items:
        assert it.corpus == "pydoc" and it.passages[0].doc_id == it.doc_id
        assert len(it.passages) == 4 and len({p.doc_id for p in it.passages}) == 4
        if it.positive:  # a paraphrase of the gold sentence, which ends a prose sentence
            s, e = it.gold_span
            gold = it.passages[0].text[s:e]
            assert gold.rstrip("\"'’”)").endswith((".", "?", "!")) and "::=" not in gold
            words = {w for w in gold.split() if len(w) >= 5}
            assert len(words & set(it.text.split())) >= 0.5 * len(words)
        if it.kind in ("wrong_value", "fabricated"):
            assert it.text not in it.passages[0].text


GOLD = ("Pouthubrirt Labs is a company. The founding year of Pouthubrirt Labs is 1938. "
        "The approval year of Pouthubrirt Labs is 1981.")
NOTE = ("Biziom Labs is often confused with Pouthubrirt Labs. The founding year of Pouthubrirt "
        "Labs is 1938. The stock ticker of Biziom Labs is QZNX.")
NOTE2 = ("Biziom Labs is often confused with Pouthubrirt Labs. The founding year of Biziom Labs "
         "is 1990.")


def test_recorded_answers_flags() -> None:
    passages = {"note": [Passage("n", NOTE, doc_id="note"), Passage("g", GOLD, doc_id="gold")],
                "note2": [Passage("n2", NOTE2, doc_id="note2"), Passage("g", GOLD, doc_id="gold")]}
    q = "What is the founding year of Pouthubrirt Labs?"
    q2 = "When was Pouthubrirt Labs founded?"
    def record(system: str, correct: bool, text: str, question: str = q) -> dict:
        return {"question_id": question, "question": question, "system": system,
                "correct": correct, "gold_doc_id": "gold", "gold_rank": 2,
                "source": "entities-hard", "text": text}

    records = [
        # true, and word for word in the decoy note ranked first: not flagged
        record("rag", True, "The founding year of Pouthubrirt Labs is 1938."),
        # a value no passage holds: unsupported
        record("base", False, "The founding year of Pouthubrirt Labs is 1777."),
        # only the note supports it
        record("other", False, "The stock ticker of Biziom Labs is QZNX."),
        # the gold document's sentence frame copied, the value from the note's other entity:
        # the verbatim frame on the gold document does not make it supported there
        record("frame", False, "The founding year of Pouthubrirt Labs is 1990.", q2),
        {**record("rag", False, ""), "error": "x"},  # a failed generation is left out
    ]
    calls = []

    def retrieve(source: str, question: str, k: int) -> list[Passage]:
        calls.append((source, question, k))
        return passages["note" if question == q else "note2"]

    att = Attributor(AttributionConfig(scorer="fuzzy"))
    out = B.attribute_answers(records, att, retrieve, k=4)
    assert out["_retrieval"] == {"questions": 2, "same_gold_rank": 2}
    assert calls == [("entities-hard", q, 8), ("entities-hard", q2, 8)]  # once per question
    assert out["rag"]["n"] == 1 and out["rag"]["right_flagged"] == 0.0
    assert out["base"]["wrong_flagged"] == 1.0
    assert out["base"]["answers"][0]["why"] == ["unsupported"]
    assert out["other"]["answers"][0]["why"] == ["other-document"]
    assert out["other"]["wrong_other_document"] == 1.0
    assert out["frame"]["answers"][0]["why"] == ["other-document"]
