"""The benchmark harness and ``python -m benchmarks.speed``'s pure parts, without a model:
row choice, the runner registry, summaries (ratios, identical counts, ROUGE means), the time
profile, the targets, the Markdown, the result writer and reading an older result file."""

from __future__ import annotations

import json

import pytest

from benchmarks import harness, speed
from benchmarks.harness import systems
from benchmarks.harness.run import Run, command_line
from benchmarks.harness.systems import Row


def test_rows_pull_in_the_baseline_and_their_references():
    got = speed.resolve_rows(["grounded", "dresd"])
    # catalogue order, plus the baseline and the references the chosen rows are measured against
    assert list(got) == ["hf-greedy", "hf-greedy-model", "rag-greedy", "dresd", "grounded"]
    variant = speed.resolve_rows(["grounded@fp32"])
    assert variant["grounded@fp32"].dtype == "fp32"
    assert variant["grounded@fp32"].reference == "rag-greedy@fp32"
    assert "rag-greedy@fp32" in variant and "hf-greedy" in variant
    assert set(speed.resolve_rows(["lookahead"])) >= {"grounded-la0", "grounded-la16"}
    with pytest.raises(KeyError, match="turbo"):
        speed.resolve_rows(["turbo"])


def test_parse_args():
    args = speed.parse_args(["--rows", "grounded,dresd", "--per-set", "2", "--rows", "paper"])
    assert "paper" in args.systems and "dresd" in args.systems and args.per_set == 2
    assert args.dtype == "bf16" and args.set_list == ["grounded", "held-out", "qa"]
    assert not any(r.backend == "llama.cpp" for r in speed.parse_args(
        ["--rows", "llama.cpp", "--no-llama-cpp"]).systems.values())
    assert args.rounds == 1 and speed.parse_args(["--rounds", "3"]).rounds == 3
    for bad in (["--rows", "grounded,turbo"], ["--per-set", "0"], ["--sets", "qa,nope"],
                ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            speed.parse_args(bad)
    assert command_line("benchmarks.speed", ["--per-set", "2", "--out", "a b"]) == (
        "python -m benchmarks.speed --per-set 2 --out 'a b'")
    assert command_line("benchmarks.speed", [], "1") == "NEST_THREADS=1 python -m benchmarks.speed"


def test_a_row_names_a_known_engine_backend_and_weights():
    with pytest.raises(ValueError, match="backend"):
        Row("x", "x", backend="onnx")
    with pytest.raises(ValueError, match="threads"):
        Row("x", "x", threads=0)
    with pytest.raises(ValueError, match="prompt must be one of"):
        Row("x", "x", prompt="top-3")


def test_a_new_backend_is_one_registered_runner(monkeypatch):
    """A row on a backend with no runner is a clear error; registering one makes it run."""
    monkeypatch.setattr(systems, "RUNNERS", {k: v for k, v in systems.RUNNERS.items()
                                             if k != ("nest", "llama.cpp")})
    row = Row("rag-copy@llama.cpp", "ours on llama.cpp", "rag-copy", backend="llama.cpp",
              retrieve=True, reference="rag-greedy", lossless=True, threads=1)
    with pytest.raises(ValueError, match="no runner for engine='nest', backend='llama.cpp'"):
        systems.run_row(None, row, {}, 4)
    seen = []

    def fake(parts, r, q, max_new):
        import torch

        seen.append((r.name, max_new, torch.get_num_threads()))
        return {"ids": [1], "tokens": 1, "seconds": 0.5, "text": "x"}

    systems.register("nest", "llama.cpp", fake)
    assert systems.run_row(None, row, {"prompt": "q"}, 4)["tokens"] == 1
    assert seen == [("rag-copy@llama.cpp", 4, 1)]


def test_rotated_interleaving():
    assert [harness.rotated("abc", i) for i in range(4)] == [
        list("abc"), list("bca"), list("cab"), list("abc")]
    assert harness.geomean([2.0, 0.5]) == pytest.approx(1.0)


def test_rounds_keep_each_row_s_fastest_run_and_say_how_far_apart():
    runs = [{"tokens": 8, "seconds": 1.2, "ids": [1, 2]}, {"tokens": 8, "seconds": 1.0,
                                                          "ids": [1, 2]},
            {"tokens": 8, "seconds": 1.5, "ids": [1, 2]}]
    best = harness.fastest(runs)
    assert best["seconds"] == 1.0 and best["rounds"] == 3 and best["same_output"]
    assert best["spread"] == pytest.approx(1.5)
    assert not harness.fastest([*runs, {"tokens": 8, "seconds": 2.0, "ids": [1, 3]}])[
        "same_output"]
    with pytest.raises(ValueError):
        harness.fastest([])
    records = [{"set": "qa", "a": best, "b": {**best, "spread": 1.1}}]
    text = speed.rounds_text({"rounds": 3, "records": records})
    assert "3 rounds" in text and "max 1.50" in text and "other tokens: 0" in text
    assert speed.rounds_text({"rounds": 1, "records": records}) == ""


def test_the_decode_rate_leaves_out_the_prefill_and_pairs_prompts():
    """``pooled_decode``: tokens after the first over the seconds after the first token, so a
    row that stops earlier over the same prefill keeps its per-step rate; ``decode_ratio``
    pairs the prompts where both rows timed their first token."""
    peer = {"tokens": 11, "seconds": 3.0, "first_s": 2.0}  # 10 steps in 1 s after a 2 s prefill
    short = {"tokens": 6, "seconds": 2.5, "first_s": 2.0}  # the same steps, stopped at 5
    records = [{"peer": peer, "ours": short},
               {"peer": {**peer, "first_s": None}, "ours": short},  # no first token: not paired
               {"peer": {"tokens": 1, "seconds": 2.0, "first_s": 2.0}, "ours": short}]
    assert harness.pooled([records[0]], "ours") < 0.7 * harness.pooled([records[0]], "peer")
    assert harness.pooled_decode([records[0]], "ours") == pytest.approx(10.0)
    assert harness.pooled_decode(records, "peer") == pytest.approx(10.0)
    assert speed.decode_ratio(records, "ours", "peer") == pytest.approx(1.0)
    assert speed.decode_ratio(records, "ours", None) is None
    assert harness.pooled_decode([{"peer": {**peer, "first_s": None}}], "peer") is None


def run(tokens, seconds, ids, text="x", **extra):
    return {"tokens": tokens, "seconds": seconds, "ids": ids, "text": text, **extra}


def timing(retrieval, keys, prefill, lm, knn, draft, total):
    return {"retrieval": retrieval, "keys": keys, "prefill": prefill, "lm": lm, "knn": knn,
            "draft": draft, "total": total}


@pytest.fixture
def records():
    return [
        {"set": "qa",
         "hf-greedy": run(10, 1.0, [1, 2]),
         "hf-greedy-model": run(10, 0.9, [1, 2]),
         "rag-greedy": run(10, 2.0, [3, 4]),
         "greedy": run(10, 1.25, [1, 2], verify_steps=0, accepted=0, forwards=11),
         "grounded": run(10, 0.5, [3, 5], attributed=5, verify_steps=2, accepted=6, forwards=3,
                         rougeL_ref=0.5, time=timing(0.05, 0.05, 0.2, 0.3, 0.05, 0.0, 0.5))},
        {"set": "held-out",
         "hf-greedy": run(20, 1.0, [7]),
         "hf-greedy-model": run(20, 0.9, [7]),
         "rag-greedy": run(20, 2.0, [8]),
         "greedy": run(20, 1.0, [9], verify_steps=0, accepted=0, forwards=21),
         "grounded": run(20, 2.0, [8], attributed=0, verify_steps=4, accepted=2, forwards=10,
                         rougeL_ref=1.0, time=timing(0.1, 0.1, 0.8, 1.6, 0.1, 0.1, 2.0))},
    ]


def test_summary_ratios_and_quality(records):
    rows = speed.resolve_rows(["greedy", "grounded"])
    s = speed.summarize(records, rows)
    assert s["prompts"] == 2
    # pooled: HF 30 tok / 2 s = 15/s; RAG 30 / 4 = 7.5/s; grounded 30 / 2.5 = 12/s
    assert s["grounded"]["tokens_per_s"] == pytest.approx(12.0)
    assert s["grounded"]["vs_base"] == pytest.approx(0.8)
    assert s["grounded"]["vs_ref"] == pytest.approx(1.6)  # against rag-greedy
    assert s["greedy"]["vs_ref"] == pytest.approx((30 / 2.25) / (30 / 1.8))  # hf-greedy-model
    assert s["hf-greedy"]["vs_ref"] is None  # it is the baseline, no reference
    # geo-mean of per-prompt ratios: grounded 20/s vs 10/s and 10/s vs 20/s -> 1.0
    assert s["grounded"]["vs_base_geomean"] == pytest.approx(1.0)
    assert s["greedy"]["identical"] == "1/2" and s["greedy"]["reference"] == "hf-greedy-model"
    assert s["grounded"]["identical"] == "1/2" and s["grounded"]["reference"] == "rag-greedy"
    assert s["grounded"]["cited"] == pytest.approx(5 / 30)
    assert s["grounded"]["rougeL_ref"] == pytest.approx(0.75)
    assert s["grounded"]["accepted_per_verify"] == pytest.approx(8 / 6)
    assert s["grounded"]["tokens_per_pass"] == pytest.approx(30 / 13)
    assert s["hf-greedy"]["identical"] is None


def test_profile_names_the_largest_share(records):
    p = speed.profile(records, "grounded")
    assert p["runs"] == 2 and p["total_s"] == pytest.approx(2.5)
    assert p["seconds"]["prefill"] == pytest.approx(1.0)
    assert p["seconds"]["verify"] == pytest.approx(0.9)  # time_lm minus the prefill
    assert p["seconds"]["other"] == pytest.approx(2.5 - 2.45)  # the rest of time_total
    assert sum(p["shares"].values()) == pytest.approx(1.0)
    assert p["largest"] == "prefill"
    assert speed.profile(records, "greedy") is None  # no timings recorded


def result_of(records):
    rows = speed.resolve_rows(["greedy", "grounded"])
    return {
        "records": records, "baseline": "hf-greedy",
        "systems": {n: speed.vars_of(r) for n, r in rows.items()},
        "quickstart": {"question": "q?", "max_new_tokens": 96, "repeats": 1, "text": "a",
                       "grounded_vs_hf_fp32": 2.6,
                       "runs": {"grounded": {"tokens_per_s": 26.0, "tokens": 96, "forwards": 30,
                                             "vs_hf_fp32": 2.6}}},
        "model": "m", "dtype": "bf16", "device": "cpu", "passages": 3, "n_passages": 8,
        "per_set": 1, "max_new_tokens": 48, "heldout_source": "h", "datastore": "-",
        "llama_cpp": {"status": "not importable: x"}, "curve_tokens": [1, 9],
        "curves": {"bf16": {"tokens": [1, 9], "seconds": [0.05, 0.06]}},
    }


def test_targets_and_markdown(records):
    result = speed.derive(result_of(records))
    assert result["by_set"]["qa"]["grounded"]["vs_ref"] == pytest.approx(4.0)
    assert result["profile"]["greedy"] is None and result["profile"]["grounded"]["runs"] == 2
    t = {x["target"]: x for x in result["targets"]}
    qa = t["`grounded` >= 1.5x RAG greedy on grounded QA (qa)"]
    assert qa["measured"] == pytest.approx(4.0) and qa["met"] is True  # 20/s vs 5/s
    held = t["`grounded` >= 1.0x HF greedy on held-out prompts"]
    assert held["measured"] == pytest.approx(0.5) and held["met"] is False
    assert t["`greedy` identical to greedy on every prompt (hf-greedy-model)"]["met"] is False
    assert t["DReSD in-domain (qa) >= 1.5x HF greedy"]["met"] is None  # not run
    assert t["quickstart `nest ask` (grounded) >= 2.5x HF fp32 greedy"]["met"] is True
    md = speed.markdown(result)
    assert "| `grounded` >= 1.0x HF greedy on held-out prompts | 0.50x | 1x | **no** |" in md
    assert "| bf16 | 50 | 1.00 | 1.20 |" in md  # c(1) ms, then c(T)/c(1)
    assert "RA prefill (prompt forward) 40.0%" in md
    assert "llama.cpp: not importable: x." in md
    assert ("| `grounded` (the default: RA-NEST + guards) | 12.0 | 0.80 (1.00) | "
            "1.60 (rag-greedy) | - | 1/2 |") in md


def test_llama_cpp_rows_and_targets(records):
    """Ours on llama.cpp is measured against llama.cpp's own greedy decoding of the same GGUF
    (plain or RA prompt); a quantisation variant's reference is that quantisation's peer; the
    issue-35 targets read the worst set, the QA set and our torch default."""
    rows = speed.resolve_rows(["llama.cpp", "llama.cpp:rag-copy@Q4_0"])
    assert rows["llama.cpp:rag-copy"].reference == "llama.cpp+psg"
    assert rows["llama.cpp:greedy"].reference == "llama.cpp"
    assert rows["llama.cpp:rag-copy@Q4_0"].dtype == "Q4_0"
    assert rows["llama.cpp:rag-copy@Q4_0"].reference == "llama.cpp+psg@Q4_0"
    assert "llama.cpp+psg@Q4_0" in rows and rows["llama.cpp-lookup+psg"].engine == "peer"
    for r in records:  # llama.cpp RAG greedy 10/s; ours twice as fast on qa, slower held out
        r["llama.cpp+psg"] = run(r["rag-greedy"]["tokens"], r["rag-greedy"]["tokens"] / 10,
                                 [3, 4])
        fast = r["set"] == "qa"
        r["llama.cpp:rag-copy"] = run(r["llama.cpp+psg"]["tokens"],
                                      r["llama.cpp+psg"]["seconds"] / (2 if fast else 0.8),
                                      [3, 4], verify_steps=1, accepted=3, forwards=5)
        r["llama.cpp:grounded"] = run(10 if fast else 20, 0.25 if fast else 4.0, [3, 5])
        r["llama.cpp+rag"] = run(10, 0.5, [3, 6])  # RAG's own prompt: 20/s
    res = result_of(records)
    res["systems"] = {n: speed.vars_of(r) for n, r in speed.resolve_rows(
        ["greedy", "grounded", "llama.cpp:rag-copy", "llama.cpp:grounded",
         "llama.cpp+rag"]).items()}
    t = {x["target"]: x for x in speed.derive(res)["targets"]}
    worst = t["`llama.cpp:rag-copy` >= 1.0x llama.cpp greedy on every set (vs `llama.cpp+psg`; "
              "worst: held-out)"]
    assert worst["measured"] == pytest.approx(0.8) and worst["met"] is False
    assert t["`llama.cpp:rag-copy` >= 1.2x llama.cpp greedy RAG on grounded QA (qa)"][
        "measured"] == pytest.approx(2.0)
    assert t["`llama.cpp:rag-copy` identical to greedy on every prompt (llama.cpp+psg)"][
        "met"] is True
    # qa: llama.cpp grounded 10 tok / 0.25 s = 40/s; torch grounded 10 / 0.5 = 20/s
    assert t["`llama.cpp:grounded` >= 2.5x our torch `grounded` on grounded QA (qa)"][
        "measured"] == pytest.approx(2.0)
    assert t["`llama.cpp:grounded` >= 1.3x llama.cpp greedy RAG on grounded QA (qa)"][
        "measured"] == pytest.approx(4.0)
    assert t["`llama.cpp:grounded` >= 1.3x llama.cpp greedy RAG on grounded QA (qa; RAG's own "
             "prompt: the top 3 passages)"]["measured"] == pytest.approx(2.0)
    assert speed.ROWS["llama.cpp+rag"].prompt == "rag" and speed.ROWS["llama.cpp+psg"].prompt \
        == "policy"
    assert t["`llama.cpp:prompt-lookup+psg` >= 1.2x llama.cpp greedy RAG on grounded QA (qa)"][
        "met"] is None  # not run
    assert "| ours on llama.cpp: `rag-copy`, the policy's RA passages in prompt |" in speed.markdown(res)


def test_the_writer_heads_both_files_with_the_run(tmp_path, records, monkeypatch):
    monkeypatch.delenv("NEST_THREADS", raising=False)  # tests/conftest.py sets it
    run = Run.start("benchmarks.speed", ["--per-set", "1"])
    result = speed.derive(result_of(records))
    md, js = harness.write_result(tmp_path, "speed", result, speed.markdown(result), run,
                                  quiet=True)
    text, data = md.read_text(), json.loads(js.read_text())
    assert text.startswith("# Speed with quality")
    assert "Command: `python -m benchmarks.speed --per-set 1`" in text
    record = data["run"]
    assert record["command"] == "python -m benchmarks.speed --per-set 1"
    assert record["machine"]["cpu"] and record["commit"] and len(record["load_start"]) == 3
    assert f"commit `{record['commit']}`" in text and record["machine"]["cpu"] in text


def test_an_older_result_file_renders(tmp_path, records):
    """``--render-only`` reads ``bench_speed_all.py``'s layout (rows keyed by method) too, and
    keeps that run's command, with the command that re-runs it now."""
    old = {"rows": records, "methods": ["hf-greedy", "hf-greedy-model", "rag-greedy", "greedy",
                                        "grounded"],
           "command": "python benchmarks/bench_speed_all.py --methods grounded", "when": "then",
           "machine": {"cpu": "cpu0", "cpus": 2, "loadavg_start": [1.0], "loadavg_end": [1.5]},
           "model": "m", "dtype": "bf16", "device": "cpu", "passages": 3, "n_passages": 8,
           "per_set": 1, "max_new_tokens": 48, "heldout_source": "h", "datastore": "-"}
    (tmp_path / "speed_all.json").write_text(json.dumps(old))
    assert speed.main(["--render-only", "--stem", "speed_all", "--out", str(tmp_path),
                       "--quiet"]) == 0
    text = (tmp_path / "speed_all.md").read_text()
    assert "Command: `python benchmarks/bench_speed_all.py --methods grounded`" in text
    assert "Re-run with: `python -m benchmarks.speed --rows grounded --stem speed_all`" in text
    assert "cpu0" in text and "| our `greedy` | 13.3 |" in text


def test_every_benchmark_opens_the_same_way(monkeypatch):
    """``harness.parser`` names the module and adds ``--out``; ``harness.start`` parses, sets the
    environment defaults and records the command."""
    monkeypatch.delenv("NEST_THREADS", raising=False)
    ap = harness.parser("benchmarks.example", "One line.\n\nMore.")
    ap.add_argument("--n", type=int, default=1)
    args, run = harness.start(ap, ["--n", "3"])
    assert ap.description == "One line." and ap.prog == "python -m benchmarks.example"
    assert args.n == 3 and args.out == harness.RESULTS
    assert run.command == "python -m benchmarks.example --n 3"


def test_raw_records_are_read_plain_or_gzipped(tmp_path):
    import gzip

    rows = [{"a": 1}, {"b": [2]}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + "\n"
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert harness.read_jsonl(tmp_path / "r.jsonl") == rows  # only the .gz exists
    (tmp_path / "p.jsonl").write_text(text)
    assert harness.read_jsonl(tmp_path / "p.jsonl") == rows


def test_an_engine_in_a_second_dtype_keeps_the_default_engine_s_policy(tiny_lm, monkeypatch):
    """``grounded@fp32`` must be the default in fp32: the same answer policy (rag-copy for chat
    questions), not a bare engine's NEST."""
    from nest_integrations import NestEngine
    from nest_integrations.config import NestConfig
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.policy.answer import AnswerPolicy

    parts = systems.Parts("bf16", 1)
    first = NestEngine(tiny_lm, None, InMemoryKeyStore(),
                       NestConfig(key_source=tiny_lm.key_source),
                       policy=AnswerPolicy.from_preset("grounded"), string_prompts="chat")
    parts._engines["bf16"] = first
    monkeypatch.setattr(parts, "lm", lambda dtype=None, weights="engine": tiny_lm)
    other = parts.engine("fp32")
    assert other is not first and other.policy == first.policy
    assert other.policy.method().name == "rag-copy"
    assert other.string_prompts == first.string_prompts


def test_the_run_record_says_how_model_files_are_mapped(tmp_path):
    """``model_mappings`` reads this process's maps of model files (size, and the part in 2 MB
    pages), and the run line reports the share: a systematic shift between two rows of one run
    can come from one model's weights sitting in 4 kB pages."""
    import mmap
    import sys

    from benchmarks.harness.report import mapping_text
    from benchmarks.harness.run import model_mappings

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/smaps")
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"\0" * (4 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ):
        maps = [x for x in model_mappings() if x["file"] == "tiny.gguf"]
        assert len(maps) == 1 and maps[0]["kb"] >= 4096 and 0 <= maps[0]["pmd_kb"] <= maps[0]["kb"]
    assert mapping_text([{"file": "a.gguf", "kb": 200, "pmd_kb": 50}]).endswith("a.gguf 25%.")
    assert mapping_text([]) == "" and mapping_text(None) == ""


def test_step_profile_pools_the_decode_after_the_first_token():
    """``benchmarks.step_profile``'s summary: per-token figures over the tokens after the first,
    LM passes grouped by rows, multi-row drafts counted; runs without a timed first token left
    out."""
    from benchmarks import step_profile

    def run(tokens, seconds, first, passes, drafts, knn=0.0, draft=0.0, cut=0, c=0.0):
        return {"tokens": tokens, "seconds": seconds, "first_s": first,
                "time": {"knn": knn, "draft": draft},
                "observed": {"passes": passes, "drafts": drafts, "cut": cut, "c_seconds": c}}

    s = step_profile.summarise([
        run(11, 1.2, 0.2, {1: [0.08] * 9, 8: [0.1]}, [(8, 6)], knn=0.05, draft=0.01, c=0.7),
        run(5, 0.5, 0.1, {1: [0.09] * 4}, [], knn=0.02, cut=6, c=0.3),
        run(1, 0.3, 0.3, {}, []),          # one token: no decode to time
        run(6, 0.6, None, {1: [0.1]}, []),  # first token not timed
    ])
    assert s["runs"] == 2 and s["tokens"] == 14
    assert s["ms_per_token"] == pytest.approx(1000 * 1.4 / 14)
    assert s["cut"] == 6 and s["ms_per_decoded_token"] == pytest.approx(1000 * 1.4 / 20)
    assert s["outside_c_ms_per_decoded_token"] == pytest.approx(1000 * 0.4 / 20)
    assert s["lm_ms_per_token"] == pytest.approx(1000 * (0.72 + 0.1 + 0.36) / 14)
    assert s["knn_ms_per_token"] == pytest.approx(1000 * 0.07 / 14)
    assert s["other_ms_per_token"] == pytest.approx(1000 * (1.4 - 1.18 - 0.07 - 0.01) / 14)
    assert s["passes"][1]["n"] == 13 and s["passes"][8]["mean_ms"] == pytest.approx(100.0)
    assert s["drafts"] == {"n": 1, "drafted": 8, "accepted": 6}
    md = step_profile.markdown({"set": "held-out", "prompts": 2, "rounds": 1, "threads": 1,
                                "rows": {"ref": s, "other": s}})
    assert "| other | 14 | 100.00 | 1.00 | 6 | 70.00 | 1.00 | 20.00 |" in md and "T=8: 1 x 100.00" in md and "1 (6 of 8)" in md
    assert step_profile.base_row("llama.cpp:rag-copy@logits") == "llama.cpp:rag-copy"
    assert step_profile.base_row("llama.cpp:rag-copy") == "llama.cpp:rag-copy"
