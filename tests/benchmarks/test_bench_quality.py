"""``python -m benchmarks.quality``'s pure parts, without a model: options per question set,
which questions a run picks, re-summarising recorded answers (relabel, keep, only questions every
system answered) and the written summary."""

from __future__ import annotations

import json

import pytest

from benchmarks import quality


def test_each_set_has_its_systems_and_questions():
    assert quality.parse_args([]).systems == quality.QUALITY_SYSTEMS
    assert quality.parse_args(["--set", "entities"]).systems == quality.ENTITY_SYSTEMS
    assert quality.parse_args(["--set", "sample", "--systems", "rag"]).systems == "rag"
    with pytest.raises(SystemExit):
        quality.parse_args(["--set", "everything"])
    args = quality.parse_args(["--set", "entities", "--n", "5", "--offset", "2"])
    closed, opened, sources, scope = quality.pick(args)
    assert len(closed) == 3 and opened == [] and set(sources.values()) == {"entities"}
    args = quality.parse_args(["--split", "dev", "--n", "6", "--n-open", "2"])
    closed, opened, sources, scope = quality.pick(args)
    assert len(closed) == 6 and len(opened) == 2 and "the dev split" in scope
    assert len({sources[q.id] for q in closed}) == 3  # a small slice holds every source


def rec(system, qid, question="What is X?", source="wiki", **kw):
    return {"system": system, "question_id": qid, "question": question, "source": source,
            "correct": kw.pop("correct", True), "new_tokens": 10, "time_total": 1.0, **kw}


def test_recorded_answers_are_relabelled_and_completed(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in [
        rec("rag", "q1"), rec("grounded", "q1"),
        rec("rag", "q2", "Who founded Y?"), rec("grounded", "q2", "Who founded Y?"),
        rec("rag", "q3")]) + "\n")  # q3: grounded never answered it
    b.write_text(json.dumps(rec("rag", "q1", correct=False)) + "\n")
    args = quality.parse_args(["--from-records", str(a), str(b), "--relabel", "b.jsonl:rag=rag-b"])
    got = quality.read_records(args)
    by = {(r["system"], r["question_id"]) for r in got}
    # q1: every system answered (rag-b only there); q2 lacks rag-b, q3 lacks grounded
    assert by == {("rag", "q1"), ("grounded", "q1"), ("rag-b", "q1")}
    args = quality.parse_args(["--from-records", str(a), "--keep-systems", "rag"])
    assert {r["question_id"] for r in quality.read_records(args)} == {"q1", "q2", "q3"}


def test_the_summary_has_a_table_per_source_and_the_open_ended_one(tmp_path):
    records = [rec("rag", "q1", source="entities-hard"), rec("grounded", "q1",
                                                              source="entities-hard"),
               rec("rag", "q2", source="wiki", correct=False), rec("grounded", "q2")]
    for r in records:
        r.update(cited_chars=10, gold_cited_chars=10)
    opened = [{"system": s, "question_id": "o1", "source": "open-wiki", "rouge_l": x,
               "text": "Belly dance is a dance.",
               "degenerate": False, "junk": False, "other_doc_tokens": 0,
               "substantial_citation": True, "cited_chars": 5, "gold_cited_chars": 5,
               "new_tokens": 10, "time_total": 1.0} for s, x in (("rag", 0.3), ("grounded", 0.5))]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records + opened))
    assert quality.main(["--from-records", str(path), "--out", str(tmp_path), "--stem", "q",
                         "--n", "2", "--n-open", "1"]) == 0
    md = (tmp_path / "q.md").read_text()
    assert "python -m benchmarks.quality --from-records" in md
    assert "### entities-hard" in md and "### wiki" in md and "## Open-ended" in md
    assert "| grounded | 2/2 |" in md and "| rag | 1/2 |" in md
    summary = json.loads((tmp_path / "q.json").read_text())
    assert [r["system"] for r in summary["open"]] == ["rag", "grounded"]
    assert summary["run"]["commit"] and len((tmp_path / "q.jsonl").read_text().splitlines()) == 6


def test_a_robust_system_names_its_backend_key_source_and_stores(tmp_path):
    """``llama.cpp:`` picks the backend and ``~SOURCE`` the key source; each pair reads its own
    stores (token keys are per backend and key source), and the key source reaches the config."""
    from benchmarks import robust

    assert [robust.store_id(n) for n in ("default", "llama.cpp:rag", "default~final_norm")] \
        == ["torch", "llama.cpp", "torch~final_norm"]
    roots = [robust.store_root(tmp_path, s) for s in ("torch", "llama.cpp", "torch~final_norm")]
    assert [r.name for r in roots] == ["store", "store-llama.cpp", "store~final_norm"]
    plain = robust.system_spec("default@first", "entities", tmp_path)
    other = robust.system_spec("default@first~final_norm", "entities", tmp_path)
    assert plain.config.key_source == "ffn_input" and other.config.key_source == "final_norm"
    assert other.policy == plain.policy and other.policy.title_context == "first"
    assert other.config.replace(key_source="ffn_input") == plain.config
    fixed = robust.system_spec("llama.cpp:default-fixed", "entities", tmp_path)
    planned = robust.system_spec("llama.cpp:default", "entities", tmp_path)
    assert robust.store_id("llama.cpp:default-fixed") == "llama.cpp"
    assert dict(fixed.drafter_options) == {"cost_model": "off"} and not planned.drafter_options
    assert fixed.policy == planned.policy and fixed.config == planned.config


def test_completion_gate_thresholds_and_their_carry_over():
    """``benchmarks.completion_gate``'s pure parts: the dev threshold makes the fewest errors
    (the lowest among ties), and a family's threshold is applied to every family's test half."""
    from benchmarks import completion_gate as cg

    assert cg.best_threshold([0.8, 0.9], [0.3, 0.5]) == (0.8, 0)
    assert cg.best_threshold([0.6, 0.9], [0.7, 0.3]) == (0.6, 1)  # 0.6 and 0.9 tie: lowest
    rows = ([{"family": "a", "split": s, "inside": True, "cos": c}
             for s, c in (("dev", 0.8), ("test", 0.85), ("dev", 0.9))]
            + [{"family": "a", "split": s, "inside": False, "cos": c}
               for s, c in (("dev", 0.4), ("test", 0.75))]
            + [{"family": "b", "split": s, "inside": i, "cos": c}
               for s, i, c in (("dev", True, 0.6), ("dev", False, 0.3), ("test", True, 0.65),
                               ("test", False, 0.2))])
    rel = cg.relevance(rows)
    assert rel["families"]["a"]["threshold"] == 0.8 and rel["families"]["b"]["threshold"] == 0.6
    assert rel["carry"]["a"]["b"] == {"off_in": 1, "n_in": 1, "off_out": 1, "n_out": 1}
    assert rel["carry"]["b"]["a"] == {"off_in": 0, "n_in": 1, "off_out": 0, "n_out": 1}
    md = cg.markdown({"n_inside": {"a": 3, "b": 2}, "n_outside": 2, "relevance": rel,
                      "answers": {"n": 1, "examples": [], "methods": {"m": {
                          "citing": 1, "citations": 2, "attributed": 5, "tokens": 10,
                          "rouge_l": 0.25}}}})
    assert "| a | 0.800 | 0 | 0/1 / 1/1 | 1/1 / 1/1 |" in md and "| m | 0/1 | 1/1 | 2 |" in md


def test_completion_gate_chooses_on_the_dev_rows_and_reports_the_held_out_ones():
    """The gate study: the threshold comes from the sample corpus's Wikipedia dev rows alone
    (a held-out row with a value that would move it does not), and every other row is counted
    per corpus / family / side."""
    from benchmarks import completion_gate as cg

    def row(corpus, family, split, side, rel):
        return {"corpus": corpus, "family": family, "split": split, "side": side, "rel": rel}

    rows = [row("sample", "qs-wiki", "dev", "in", 0.9), row("sample", "lead24", "dev", "in", 1.0),
            row("sample", "lead24", "dev", "out", 0.5), row("sample", "lead24", "dev", "loo", 0.85),
            row("sample", "qs-wiki", "test", "in", 0.7), row("sample", "qs-pydoc", "dev", "in", 0.6),
            row("profiles", "24", "dev", "out", 0.95)]
    assert [cg.is_dev(r) for r in rows] == [True, True, True, False, False, False, False]
    g = cg.gate_study(rows, "rel")
    assert (g["threshold"], g["dev_errors"], g["n_dev"]) == (0.9, 0, 3)
    assert g["groups"]["sample / lead24 / loo"] == {"n": 1, "off": 1, "median": 0.85,
                                                    "min": 0.85, "max": 0.85}
    assert g["groups"]["sample / qs-wiki / in"]["off"] == 1  # the test question at 0.7
    assert g["groups"]["profiles / 24 / out"]["off"] == 0
    md = "\n".join(cg.gate_markdown({"rel": g}))
    assert "| rel | 0.900 | 0/3 |" in md and "| sample / qs-pydoc / in | 1 | 0.60 [0.60, 0.60] | 1/1 |" in md


def test_the_question_set_benchmarks_share_their_opening(monkeypatch, tmp_path):
    """``harness.question_parser`` / ``question_sets``: the options ``benchmarks.robust`` and
    ``benchmarks.evidence`` share, and their held-out sets refused on the dev split (both mains
    stop there, before any store or model)."""
    import os

    from benchmarks import evidence, harness, robust

    ap = harness.question_parser("benchmarks.x", "First line.\n\nMore.", sets="a,b",
                                 sets_help="which", n_closed=3, n_open=2, stem="x")
    args = ap.parse_args([])
    assert (args.split, args.sets, args.n_closed, args.n_open, args.seed, args.work,
            args.out, args.stem) == ("dev", "a,b", 3, 2, 0, None, harness.RESULTS, "x")
    assert ap.description == "First line." and ap.prog == "python -m benchmarks.x"
    assert harness.question_sets(ap, args, held_out=("c",)) == ["a", "b"]
    test = ap.parse_args(["--split", "test", "--sets", "a,,c"])
    assert harness.question_sets(ap, test, held_out=("c",)) == ["a", "c"]
    with pytest.raises(SystemExit):
        harness.question_sets(ap, ap.parse_args(["--sets", "c"]), held_out=("c",))
    monkeypatch.setenv("NEST_HOME", os.environ.get("NEST_HOME", str(tmp_path)))
    for main, held in ((robust.main, "fr-es"), (evidence.main, "profiles")):
        with pytest.raises(SystemExit) as stop:
            main(["--sets", f"entities,{held}", "--out", str(tmp_path)])
        assert stop.value.code == 2
    assert not list(tmp_path.iterdir())  # nothing written
