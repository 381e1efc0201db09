"""The grounded-QA loop behind ``python -m benchmarks.quality``: system specs, an interleaved
tiny run through a real engine (closed and open-ended questions), and the summary tables
against hand-computed cases."""

from __future__ import annotations

import pytest

from benchmarks.harness import qa_dev
from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS
from nest_integrations.evaluation.entities import generate_corpus
from nest_integrations.types import Passage


def test_parse_system_specs():
    assert qa_dev.parse_system("rag") is qa_dev.BUILTIN["rag"]
    s = qa_dev.parse_system("g05=nest:paper-ra:relaxation=0.05,max_span=8@prompt")
    assert (s.name, s.decoding, s.preset, s.context) == ("g05", "nest", "paper-ra", "prompt")
    assert s.overrides == {"relaxation": 0.05, "max_span": 8}
    cfg = s.config()
    assert cfg.relaxation == 0.05 and cfg.ra_passages == 3
    assert qa_dev.parse_system("x=:paper:span_copying=false").config().span_copying is False
    with pytest.raises(ValueError, match="unknown system"):
        qa_dev.parse_system("nonsense")
    with pytest.raises(ValueError):
        qa_dev.parse_system("bad=nest:paper:relaxation=7")  # validated at parse time
    with pytest.raises(ValueError, match="context"):
        qa_dev.parse_system("c=nest:paper@everywhere")
    ps = [Passage(id=str(i), text="t") for i in range(5)]
    rag = qa_dev.BUILTIN["rag"]
    assert len(rag.passages_for(ps, rag.config())) == 3
    assert qa_dev.BUILTIN["base"].passages_for(ps, rag.config()) == []
    assert len(qa_dev.BUILTIN["paper"].passages_for(ps, rag.config())) == 5


def test_summary_hand_case():
    def rec(sys, q, ok, new=10, t=1.0, **kw):
        return {"system": sys, "question_id": q, "correct": ok, "new_tokens": new,
                "time_total": t, **kw}

    records = [
        rec("base", "q1", False, t=2.0), rec("rag", "q1", True, t=4.0),
        rec("nest", "q1", False, t=0.5, off_topic_tokens=4, run_on_tokens=5, cited_chars=10,
            gold_cited_chars=0, attributed_tokens=8, wrong_entity=True),
        rec("base", "q2", False, t=2.0), rec("rag", "q2", True, t=4.0),
        rec("nest", "q2", True, t=0.5, off_topic_tokens=0, run_on_tokens=1, cited_chars=30,
            gold_cited_chars=30, attributed_tokens=10),
    ]
    rows = {r["system"]: r for r in qa_dev.summarize(records, reference="rag")}
    n = rows["nest"]
    assert (n["correct"], n["n"], n["wrong_entity"]) == (1, 2, 1)
    assert n["gold_cited_share"] == pytest.approx(30 / 40)
    assert n["off_topic_share"] == pytest.approx(4 / 20) and n["run_on_share"] == 6 / 20
    assert n["tokens_per_s"] == pytest.approx(20.0) and n["speed_vs_base"] == pytest.approx(4.0)
    assert n["vs_reference"]["a_only"] == 0 and n["vs_reference"]["b_only"] == 1
    assert rows["rag"]["speed_vs_base"] == pytest.approx(0.5) and "vs_reference" not in rows["rag"]
    md = qa_dev.markdown_table(list(rows.values()))
    assert "| nest | 1/2 | 50%" in md and "+0/-1, p=1.000" in md


def test_tiny_interleaved_run(tiny_lm):
    from tests.engines import make_engine
    from nest_integrations.evaluation.retrieval import BM25Retriever

    corpus = generate_corpus(seed=2, per_kind=3)
    passages = [Passage(id=f"p/{d.id}", text=d.text, doc_id=d.id) for d in corpus.documents]
    engine = make_engine(tiny_lm, BM25Retriever(passages))
    questions = corpus.sample_questions(2, seed=0) + [SAMPLE_QUESTIONS[0]]
    specs = [qa_dev.BUILTIN["base"], qa_dev.BUILTIN["rag"], qa_dev.BUILTIN["paper"]]
    seen = []
    records = qa_dev.run_questions(engine, questions, specs, k=3, max_new_tokens=6,
                                   progress=False, on_record=seen.append)
    assert len(records) == 9 and seen == records
    assert [r["system"] for r in records[:3]] == ["base", "rag", "paper"]  # interleaved
    for r in records:
        assert "error" not in r, r.get("error")
        assert 0 <= r["run_on_tokens"] <= r["new_tokens"] <= 6
    base = [r for r in records if r["system"] == "base"]
    assert all(r["attributed_tokens"] == 0 and r["n_citations"] == 0 for r in base)
    rows = qa_dev.summarize(records)
    assert [r["system"] for r in rows] == ["base", "rag", "paper"]
    assert rows[0]["speed_vs_base"] == 1.0 and "vs_reference" in rows[2]


def test_tiny_open_ended_run_and_its_summary(tiny_lm):
    """Open-ended questions through two systems, interleaved, scored by ``open_ended``; the
    summary pools them per system with the paired ROUGE-L difference to the reference."""
    from tests.engines import make_engine
    from nest_integrations.evaluation import open_ended
    from benchmarks.sets.quality_set import OpenQuestion
    from nest_integrations.evaluation.retrieval import BM25Retriever

    corpus = generate_corpus(seed=2, per_kind=3)
    passages = [Passage(id=f"p/{d.id}", text=d.text, doc_id=d.id) for d in corpus.documents]
    engine = make_engine(tiny_lm, BM25Retriever(passages))
    docs = corpus.documents[:2]
    questions = [OpenQuestion(f"o{i}", f"What is {d.name}?", d.id, d.text, "open-wiki")
                 for i, d in enumerate(docs)]
    specs = [qa_dev.BUILTIN["rag"], qa_dev.BUILTIN["paper"]]
    seen = []
    records = qa_dev.run_open_questions(engine, questions, specs, k=3, max_new_tokens=6,
                                        on_record=seen.append)
    assert seen == records and [r["system"] for r in records] == ["rag", "paper"] * 2
    for r in records:
        assert 0.0 <= r["rouge_l"] <= 1.0 and 0 <= r["other_doc_tokens"] <= r["new_tokens"] <= 6
        assert r["source"] == "open-wiki" and r["gold_doc_id"] in {d.id for d in docs}
    rows = {r["system"]: r for r in open_ended.summarize(records, "rag")}
    assert rows["rag"]["n"] == 2 and "rouge_l_diff" not in rows["rag"]
    assert "rouge_l_diff" in rows["paper"]
    md = open_ended.markdown_table(list(rows.values()), "rag")
    assert md.count("\n") == 3 and "| paper | 2 |" in md


def test_open_ended_summary_hand_case():
    def rec(sys, q, rl, deg=False, junk=False, other=0, gold=0, cited=0, t=1.0):
        return {"system": sys, "question_id": q, "rouge_l": rl, "degenerate": deg,
                "junk": junk, "other_doc_tokens": other, "substantial_citation": cited > 3,
                "cited_chars": cited, "gold_cited_chars": gold, "new_tokens": 10,
                "time_total": t}

    from nest_integrations.evaluation import open_ended

    records = [rec("rag", "a", 0.2, t=2.0), rec("nest", "a", 0.6, other=2, gold=8, cited=10),
               rec("rag", "b", 0.4, deg=True, t=2.0), rec("nest", "b", 0.4, junk=True)]
    rows = {r["system"]: r for r in open_ended.summarize(records, "rag")}
    n = rows["nest"]
    assert n["rouge_l"] == pytest.approx(0.5) and n["junk"] == 1 and n["degenerate"] == 0
    assert n["run_on_share"] == pytest.approx(2 / 20) and n["gold_cited_share"] == 0.8
    assert n["rouge_l_diff"][0] == pytest.approx(0.2) and n["tokens_per_s"] == 10.0
    md = open_ended.markdown_table(list(rows.values()), "rag")
    assert "| nest | 2 | 50.0 (" in md and "| +20.0 (" in md and "| 2.00x |" in md
