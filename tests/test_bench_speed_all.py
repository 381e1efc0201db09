"""benchmarks/bench_speed_all.py's pure parts, without a model: argument handling, the summary
(ratios, identical counts, ROUGE means), the time profile, the targets and the markdown."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_speed_all",
                                                  REPO / "benchmarks" / "bench_speed_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_methods_subset_pulls_in_its_references(bench):
    args = bench.parse_args(["--methods", "grounded,dresd", "--per-set", "2"])
    # the order of METHODS, plus the references the chosen methods are measured against
    assert args.methods == ("hf-greedy", "hf-greedy-model", "rag-greedy", "dresd", "grounded")
    assert args.per_set == 2 and args.dtype == "bf16"
    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", "grounded,turbo"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--per-set", "0"])
    assert bench.command_line(["--per-set", "2", "--out", "a b"]) == (
        "python benchmarks/bench_speed_all.py --per-set 2 --out 'a b'")
    assert bench.command_line([], "1") == "NEST_THREADS=1 python benchmarks/bench_speed_all.py"


def run(tokens, seconds, ids, text="x", **extra):
    return {"tokens": tokens, "seconds": seconds, "ids": ids, "text": text, **extra}


def timing(retrieval, keys, prefill, lm, knn, draft, total):
    return {"retrieval": retrieval, "keys": keys, "prefill": prefill, "lm": lm, "knn": knn,
            "draft": draft, "total": total}


@pytest.fixture
def rows():
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


def test_summary_ratios_and_quality(bench, rows):
    methods = ("hf-greedy", "hf-greedy-model", "rag-greedy", "greedy", "grounded")
    s = bench.summarize(rows, methods)
    assert s["prompts"] == 2
    # pooled: HF 30 tok / 2 s = 15/s; RAG 30 / 4 = 7.5/s; grounded 30 / 2.5 = 12/s
    assert s["grounded"]["tokens_per_s"] == pytest.approx(12.0)
    assert s["grounded"]["vs_hf_greedy"] == pytest.approx(0.8)
    assert s["grounded"]["vs_rag_greedy"] == pytest.approx(1.6)
    assert s["greedy"]["vs_rag_greedy"] is None  # not an RA method
    assert s["hf-greedy"]["vs_hf_fp32"] is None  # no fp32 baseline in these rows
    # geo-mean of per-prompt ratios: grounded 20/s vs 10/s and 10/s vs 20/s -> 1.0
    assert s["grounded"]["vs_hf_greedy_geomean"] == pytest.approx(1.0)
    assert s["greedy"]["identical"] == "1/2" and s["greedy"]["reference"] == "hf-greedy-model"
    assert s["grounded"]["identical"] == "1/2" and s["grounded"]["reference"] == "rag-greedy"
    assert s["grounded"]["cited"] == pytest.approx(5 / 30)
    assert s["grounded"]["rougeL_ref"] == pytest.approx(0.75)
    assert s["grounded"]["accepted_per_verify"] == pytest.approx(8 / 6)
    assert s["hf-greedy"]["identical"] is None  # it is the reference


def test_profile_names_the_largest_share(bench, rows):
    p = bench.profile(rows, "grounded")
    assert p["runs"] == 2 and p["total_s"] == pytest.approx(2.5)
    assert p["seconds"]["prefill"] == pytest.approx(1.0)
    assert p["seconds"]["verify"] == pytest.approx(0.9)  # time_lm minus the prefill
    assert p["seconds"]["other"] == pytest.approx(2.5 - 2.45)  # the rest of time_total
    assert sum(p["shares"].values()) == pytest.approx(1.0)
    assert p["largest"] == "prefill"
    assert bench.profile(rows, "greedy") is None  # no timings recorded


def test_targets_and_markdown(bench, rows):
    methods = ["hf-greedy", "rag-greedy", "greedy", "grounded"]
    result = {
        "rows": rows,
        "methods": methods,
        "quickstart": {"question": "q?", "max_new_tokens": 96, "repeats": 1, "text": "a",
                       "grounded_vs_hf_fp32": 2.6,
                       "runs": {"grounded": {"tokens_per_s": 26.0, "tokens": 96, "forwards": 30,
                                             "vs_hf_fp32": 2.6}}},
    }
    bench.derive(result)  # summaries, profiles and targets from the rows
    assert result["by_set"]["qa"]["grounded"]["vs_rag_greedy"] == pytest.approx(4.0)
    assert result["profile_greedy"] is None and result["profile"]["runs"] == 2
    t = {x["target"]: x for x in result["targets"]}
    qa = t["`grounded` >= 1.5x RAG greedy on grounded QA (qa)"]
    assert qa["measured"] == pytest.approx(4.0) and qa["met"] is True  # 20/s vs 5/s
    held = t["`grounded` >= 1.0x HF greedy on held-out prompts"]
    assert held["measured"] == pytest.approx(0.5) and held["met"] is False
    assert t["`greedy` identical to greedy on every prompt (hf-greedy-model)"]["met"] is False
    assert t["DReSD in-domain (qa) >= 1.5x HF greedy"]["met"] is None  # not run
    assert t["quickstart `nest ask` (grounded) >= 2.5x HF fp32 greedy"]["met"] is True
    result.update(
        when="now", model="m", dtype="bf16",
        device="cpu", passages=3, n_passages=8, per_set=1, max_new_tokens=48,
        heldout_source="h", datastore="-", llama_cpp={"status": "not importable: x"},
        command="python benchmarks/bench_speed_all.py", curve_tokens=[1, 9],
        curves={"bf16": {"tokens": [1, 9], "seconds": [0.05, 0.06]}},
        machine={"torch_threads": 1, "cpus": 2, "cpu": "x", "native_bf16": True,
                 "loadavg_start": [1.0], "loadavg_end": [1.0]},
    )
    md = bench.markdown(result)
    assert "| `grounded` >= 1.0x HF greedy on held-out prompts | 0.50x | 1x | **no** |" in md
    assert "| bf16 | 50 | 1.00 | 1.20 |" in md  # c(1) ms, then c(T)/c(1)
    assert "Largest share: **RA prefill (prompt forward)** (40%)." in md
    assert "llama.cpp: not importable: x." in md
    assert "| `grounded` (the default: RA-NEST + guards) | 12.0 | 0.80 (1.00) |" in md
