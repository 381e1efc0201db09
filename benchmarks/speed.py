"""Decoding speed with quality beside it: our methods, presets and the peers they must beat
(Hugging Face ``generate``, llama.cpp), side by side in one run.

Setting: the sample corpus as ``nest ingest --sample`` stores it, the default engine
(``from_defaults``: the ``grounded`` preset, its retriever and key store) with the model in
``--dtype``, greedy, batch 1. Prompt sets (``harness.prompts``): ``grounded`` (completions whose
continuation is in the corpus), ``held-out`` (completions of leads not in it), ``qa`` (chat
questions about corpus articles), ``tell-me`` ("Tell me about {title}." chat prompts). Every
row runs on each prompt back to back, in an order that rotates per prompt.

Rows (``ROWS``; ``--rows`` takes names, groups of ``GROUPS`` and ``NAME@DTYPE`` variants): the
peers (``hf-greedy`` on the model as transformers loads it, the reference of every ratio;
``hf-greedy-model`` on our engine's model; ``hf-lookup+psg``; ``llama.cpp``), our lossless
methods (``greedy``, ``prompt-lookup``, ``prompt-lookup+psg``, ``rag-copy``, ``dresd`` with an
in-domain datastore, ``knn-ssd`` with the shipped profile, each ``+cost`` with cost-model draft
lengths), RAG greedy on the RA prompt (the reference of the RA rows), the default ``grounded``
(``grounded-la0``/``-la16``: look-ahead off / 16) and the presets ``paper``, ``paper-ra``,
``nest-lossless``. Quality beside speed: outputs identical to the row's reference, ROUGE-L
against it, against the baseline and against the true continuation, cited share, accepted
tokens per verification. Also: the quickstart question, the cost curve c(T) per dtype and
where the default's time goes; ``--kernels`` compares our bf16 CPU kernels with plain bf16 and
fp32 (c(T), bit-exact verify rows, greedy speed, perplexity).

Usage::

    nest ingest --sample                                        # once: the store it reads
    NEST_THREADS=1 python -m benchmarks.speed --threads 1 --per-set 10 --stem speed_all
    python -m benchmarks.speed --rows lookahead --rows grounded@fp32 --stem lookahead
    python -m benchmarks.speed --rows cost --sets tell-me --per-set 6 --stem speed_bf16 \\
        --rows cost@fp32
    python -m benchmarks.speed --rows greedy --kernels --no-curve --quickstart-repeats 0
    python -m benchmarks.speed --per-set 1 --max-new-tokens 8 --quickstart-repeats 1 \\
        --quickstart-tokens 8 --out /tmp/speed                  # smoke run
    python -m benchmarks.speed --render-only --stem speed_all   # re-render from its JSON
    NEST_THREADS=1 python -m benchmarks.speed --rows llama.cpp:greedy,llama.cpp:grounded \
        --baseline llama.cpp --rounds 3 --threads 1 --no-curve --quickstart-repeats 0
        # each prompt 3 times per row, the fastest kept: ratios of a few percent need it

Writes ``<stem>.md`` and ``<stem>.json`` (``--out``, default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks import harness
from benchmarks.harness import decode_timed, fmt, pct, pooled, pooled_decode, rate, ratio, table
from benchmarks.harness.prompts import SETS
from benchmarks.harness.systems import Parts, Row, quant_name, run_row

QUICKSTART = "How does the assert statement work in Python?"
CURVE_TOKENS = (1, 2, 3, 5, 9, 13, 17, 33)

_PSG = "the policy's RA passages in prompt"
ROWS: dict[str, Row] = {r.name: r for r in (
    Row("hf-greedy", "HF greedy `generate`, plain prompt (reference)", engine="peer",
        weights="transformers"),
    Row("hf-greedy-model", "HF greedy `generate` on our engine's model (packed, row-wise "
        "attention)", engine="peer", reference="hf-greedy"),
    Row("hf-greedy-fp32", "HF greedy `generate` in fp32, plain prompt", engine="peer",
        dtype="fp32", weights="transformers", reference="hf-greedy"),
    Row("hf-lookup+psg", f"HF prompt lookup, {_PSG}", "prompt-lookup", engine="peer",
        weights="transformers", retrieve=True, reference="rag-greedy", lossless=True),
    Row("rag-greedy", "RAG greedy (our loop, the `grounded` RA prompt)", retrieve=True),
    Row("llama.cpp", "llama.cpp greedy (`Llama.generate`, the embedded model's GGUF: Q8_0 "
        "unless named)",
        engine="peer", backend="llama.cpp", reference="hf-greedy"),
    Row("llama.cpp+psg", f"llama.cpp greedy, {_PSG} (llama.cpp RAG)", engine="peer",
        backend="llama.cpp", retrieve=True),
    Row("llama.cpp+rag", "llama.cpp greedy, RAG's prompt (the top 3 retrieved passages, as "
        "`rag` in the quality benchmarks)", engine="peer", backend="llama.cpp", retrieve=True,
        prompt="rag"),
    Row("llama.cpp-lookup+psg", f"llama.cpp's own prompt lookup, {_PSG}", "prompt-lookup",
        engine="peer", backend="llama.cpp", retrieve=True, reference="llama.cpp+psg",
        lossless=True),
    Row("greedy", "our `greedy`", reference="hf-greedy-model", lossless=True),
    Row("prompt-lookup", "our `prompt-lookup`, plain prompt", "prompt-lookup",
        reference="hf-greedy-model", lossless=True),
    Row("prompt-lookup+psg", f"our `prompt-lookup`, {_PSG}", "prompt-lookup", retrieve=True,
        reference="rag-greedy", lossless=True),
    Row("rag-copy", f"our `rag-copy`, {_PSG}", "rag-copy", retrieve=True,
        reference="rag-greedy", lossless=True),
    Row("dresd", "our `dresd` (in-domain datastore)", "dresd",
        options=(("datastore", "in-domain"),), reference="hf-greedy-model", lossless=True),
    Row("knn-ssd", "our `knn-ssd` (shipped profile)", "knn-ssd", reference="hf-greedy-model",
        lossless=True),
    Row("prompt-lookup+cost", "our `prompt-lookup`, cost-model draft lengths", "prompt-lookup",
        options=(("cost_model", "auto"),), reference="hf-greedy-model", lossless=True),
    Row("dresd+cost", "our `dresd`, cost-model draft lengths", "dresd",
        options=(("datastore", "in-domain"), ("cost_model", "auto")),
        reference="hf-greedy-model", lossless=True),
    Row("knn-ssd+cost", "our `knn-ssd`, cost-model draft lengths", "knn-ssd",
        options=(("cost_model", "auto"),), reference="hf-greedy-model", lossless=True),
    Row("grounded", "`grounded` (the default: RA-NEST + guards)", None, retrieve=True,
        reference="rag-greedy"),
    Row("grounded-la0", "`grounded`, look-ahead off", None, retrieve=True,
        config=(("lookahead", 0),), reference="grounded"),
    Row("grounded-la16", "`grounded`, look-ahead 16", None, retrieve=True,
        config=(("lookahead", 16),), reference="grounded"),
    Row("paper", "NEST `paper` (relaxed, kNN memory, no passages in prompt)", "nest",
        retrieve=True, preset="paper", reference="hf-greedy-model"),
    Row("paper-ra", "RA-NEST `paper-ra`", "nest", retrieve=True, preset="paper-ra",
        reference="rag-greedy"),
    Row("nest-lossless", "NEST `lossless` preset (strict: greedy of p_M)", "nest",
        retrieve=True, preset="lossless", reference="hf-greedy-model"),
    # ours on llama.cpp (``NAME@Q4_1``: on the shipped Q4_1 file; ``@Q4_0``: requantised)
    Row("llama.cpp:greedy", "ours on llama.cpp: `greedy`", backend="llama.cpp",
        reference="llama.cpp", lossless=True),
    Row("llama.cpp:greedy+psg", f"ours on llama.cpp: `greedy`, {_PSG}", backend="llama.cpp",
        retrieve=True, reference="llama.cpp+psg", lossless=True),
    Row("llama.cpp:prompt-lookup+psg", f"ours on llama.cpp: `prompt-lookup`, {_PSG}",
        "prompt-lookup", backend="llama.cpp", retrieve=True, reference="llama.cpp+psg",
        lossless=True),
    Row("llama.cpp:rag-copy", f"ours on llama.cpp: `rag-copy`, {_PSG}", "rag-copy",
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg", lossless=True),
    Row("llama.cpp:rag-copy-fixed", f"ours on llama.cpp: `rag-copy`, {_PSG}, fixed-rule "
        "drafts (`cost_model=\"off\"`)", "rag-copy", backend="llama.cpp", retrieve=True,
        options=(("cost_model", "off"),), reference="llama.cpp+psg", lossless=True),
    Row("llama.cpp:dresd", "ours on llama.cpp: `dresd` (in-domain datastore)", "dresd",
        backend="llama.cpp", options=(("datastore", "in-domain"),), reference="llama.cpp",
        lossless=True),
    Row("llama.cpp:grounded", "`grounded` (the default) on llama.cpp", None,
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg"),
    Row("llama.cpp:grounded-fixed", "`grounded` on llama.cpp without the cost model (spans of "
        "8, fixed-rule rag-copy: `cost_model=\"off\"`)", None, backend="llama.cpp",
        retrieve=True, options=(("cost_model", "off"),), reference="llama.cpp+psg"),
    # NEST's span length on llama.cpp (8 is `backend_config`'s since the cap)
    Row("llama.cpp:grounded-s16", "`grounded` on llama.cpp, max_span 16", None,
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg",
        config=(("max_span", 16),)),
    Row("llama.cpp:grounded-s8", "`grounded` on llama.cpp, max_span 8", None,
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg",
        config=(("max_span", 8),)),
    Row("llama.cpp:grounded-s63", "`grounded` on llama.cpp, max_span 63 (the cost planner "
        "alone decides span lengths; 64, the preset's, is capped to 8)", None,
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg",
        config=(("max_span", 63),)),
)}
#: ``--rows`` shorthands.
GROUPS: dict[str, tuple[str, ...]] = {
    "all": ("hf-greedy", "hf-greedy-model", "hf-greedy-fp32", "hf-lookup+psg", "rag-greedy",
            "llama.cpp", "greedy", "prompt-lookup+psg", "rag-copy", "dresd", "knn-ssd",
            "grounded"),
    "lossless": ("greedy", "prompt-lookup", "prompt-lookup+psg", "rag-copy", "dresd",
                 "knn-ssd"),
    "cost": ("greedy", "prompt-lookup", "prompt-lookup+cost", "dresd", "dresd+cost", "knn-ssd",
             "knn-ssd+cost"),
    "lookahead": ("rag-greedy", "grounded", "grounded-la0", "grounded-la16"),
    "presets": ("grounded", "paper", "paper-ra", "nest-lossless"),
    # issue 35: llama.cpp's own decoding, ours on llama.cpp, and the torch rows they must beat
    "llama.cpp": ("rag-greedy", "greedy", "rag-copy", "grounded", "llama.cpp", "llama.cpp+psg",
                  "llama.cpp+rag", "llama.cpp-lookup+psg", "llama.cpp:greedy", "llama.cpp:prompt-lookup+psg",
                  "llama.cpp:rag-copy", "llama.cpp:rag-copy-fixed", "llama.cpp:dresd",
                  "llama.cpp:grounded"),
}
PROFILE_PARTS = ("retrieval", "keys", "prefill", "verify", "knn", "draft", "other")
PROFILE_LABELS = {
    "retrieval": "stage-1 retrieval", "keys": "key loading (token memory)",
    "prefill": "RA prefill (prompt forward)", "verify": "verify / decode forwards",
    "knn": "kNN + mixture (p_M)", "draft": "drafting (span proposal)",
    "other": "other (loop, guards, detokenize)",
}


# ------------------------------------------------------------------------------- row choice


def resolve_rows(names: Sequence[str], baseline: str = "hf-greedy") -> dict[str, Row]:
    """The rows ``names`` ask for (names, groups, ``NAME@DTYPE``), plus the baseline and every
    reference they are measured against, in catalogue order. A KeyError names an unknown one."""
    wanted: list[str] = []
    for name in names:
        wanted += GROUPS.get(name, (name,))
    out: dict[str, Row] = {}
    todo = [baseline, *wanted]
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        base, _, dtype = name.partition("@")
        if base not in ROWS:
            raise KeyError(f"unknown row {name!r}: rows are {', '.join(ROWS)}; groups "
                           f"{', '.join(GROUPS)}; NAME@DTYPE for a dtype variant")
        r = ROWS[base].at(dtype) if dtype else ROWS[base]
        ref = ROWS[base].reference
        if dtype and ref in ROWS and ROWS[ref].backend != r.backend:  # a GGUF's quantisation
            r = dataclasses.replace(r, reference=ref)  # is no dtype of a torch reference
        out[name] = r
        if r.reference:
            todo.append(r.reference)
    order = {n: i for i, n in enumerate(ROWS)}
    return dict(sorted(out.items(), key=lambda kv: (order[kv[0].partition("@")[0]], kv[0])))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.speed",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="append", default=None,
                    help="comma-separated rows, groups or NAME@DTYPE (repeatable; default "
                    "'all'); the baseline and each row's reference are added")
    ap.add_argument("--baseline", default="hf-greedy", help="the row every ratio is against")
    ap.add_argument("--sets", default="grounded,held-out,qa", help=f"of {', '.join(SETS)}")
    ap.add_argument("--per-set", type=int, default=10, help="prompts per set (default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="per prompt (default 48)")
    ap.add_argument("--prefix-tokens", type=int, default=24, help="completion prompt length")
    ap.add_argument("--dtype", default="bf16", help="weights of rows without their own dtype")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: $NEST_THREADS, else the physical cores)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every row on each prompt this many times, each round in its own "
                    "rotated order, and keep its fastest run (default 1)")
    ap.add_argument("--n-train", type=int, default=48,
                    help="DReSD in-domain datastore: train prompts (default 48)")
    ap.add_argument("--cost-repeats", type=int, default=5,
                    help="c(T): the minimum of this many interleaved repeats")
    ap.add_argument("--no-curve", action="store_true", help="skip the cost curves")
    ap.add_argument("--quickstart-tokens", type=int, default=96)
    ap.add_argument("--quickstart-repeats", type=int, default=3, help="0: skip the quickstart")
    ap.add_argument("--kernels", action="store_true",
                    help="also compare the bf16 CPU kernels with plain bf16 and fp32")
    ap.add_argument("--kernel-prompts", type=int, default=12)
    ap.add_argument("--kernel-tokens", type=int, default=48)
    ap.add_argument("--kernel-repeats", type=int, default=9)
    ap.add_argument("--no-llama-cpp", action="store_true",
                    help="skip every llama.cpp row even if it imports")
    ap.add_argument("--quant-quality", default="",
                    help="comma-separated GGUF quantisations (e.g. Q4_1,Q4_0,Q8_0): perplexity "
                    "of held-out text on each, beside torch fp32/bf16 (needs llama.cpp)")
    ap.add_argument("--llama-extra-bufts", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's extra weight buffer types (repacked layouts; AMX where "
                    "built with it: SIGILL where the CPU lists AMX but the kernel does not "
                    "enable it) for the peer rows: auto (default) = as our backend loads "
                    "models, on unless the build has AMX kernels")
    ap.add_argument("--out", default=str(harness.RESULTS), help="output folder")
    ap.add_argument("--stem", default="speed", help="output file stem (default speed)")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    ap.add_argument("--render-only", action="store_true",
                    help="recompute the tables of <out>/<stem>.json (or .json.gz), run nothing")
    args = ap.parse_args(argv)
    names = [n.strip() for spec in (args.rows or ["all"]) for n in spec.split(",") if n.strip()]
    try:
        args.systems = resolve_rows(names, args.baseline)
    except KeyError as exc:
        ap.error(str(exc.args[0]))
    if args.no_llama_cpp:
        args.systems = {n: r for n, r in args.systems.items() if r.backend != "llama.cpp"}
    args.set_list = [s.strip() for s in args.sets.split(",") if s.strip()]
    if set(args.set_list) - set(SETS):
        ap.error(f"unknown set(s) {sorted(set(args.set_list) - set(SETS))}: choose from {SETS}")
    if args.per_set < 1 or args.max_new_tokens < 1 or args.rounds < 1:
        ap.error("--per-set, --max-new-tokens and --rounds must be >= 1")
    return args


# ------------------------------------------------------------------------------- scoring


def score(r: dict[str, Any], systems: dict[str, Row], baseline: str, scorer: Any) -> None:
    """ROUGE-L F1 of every row's text in record ``r`` against its reference row's, the
    baseline's and the true continuation (completion prompts only)."""
    from nest_integrations.evaluation.metrics import rouge

    def f(a: str, b: str | None) -> float | None:
        return rouge(a, b, scorer)["rougeL"]["f"] if b and b.strip() else None

    for name, s in systems.items():
        x = r.get(name)
        if not x:
            continue
        ref = r.get(s.reference) if s.reference else None
        x["rougeL_ref"] = f(x["text"], ref["text"]) if ref else None
        x["rougeL_greedy"] = f(x["text"], (r.get(baseline) or {}).get("text"))
        x["rougeL_text"] = f(x["text"], r.get("reference"))


def summarize(records: list[dict[str, Any]], systems: dict[str, Row],
              baseline: str = "hf-greedy") -> dict[str, Any]:
    """Per row: pooled tokens/s, ratios to the baseline and to its reference, quality."""
    out: dict[str, Any] = {"prompts": len(records)}
    base = pooled(records, baseline)
    for name, s in systems.items():
        res = [(r, r[name]) for r in records if r.get(name)]
        if not res:
            continue
        tok = sum(x["tokens"] for _, x in res)
        tps = pooled([r for r, _ in res], name)
        same = [x["ids"] == r[s.reference]["ids"] for r, x in res
                if s.reference and r.get(s.reference)]
        steps = sum(x.get("verify_steps") or 0 for _, x in res)
        mean = lambda k: (lambda v: sum(v) / len(v) if v else None)(  # noqa: E731
            [x[k] for _, x in res if x.get(k) is not None])
        attributed = [x["attributed"] for _, x in res if x.get("attributed") is not None]
        fw = [x["forwards"] for _, x in res if x.get("forwards") is not None]
        out[name] = {
            "tokens": tok, "seconds": round(sum(x["seconds"] for _, x in res), 3),
            "tokens_per_s": tps,
            "vs_base": ratio(tps, base),
            "vs_base_geomean": harness.geomean(
                [rate(x) / rate(r[baseline]) for r, x in res
                 if rate(x) and rate(r.get(baseline))]),
            "reference": s.reference,
            "vs_ref": ratio(tps, pooled([r for r, _ in res], s.reference)) if s.reference
            else None,
            "decode_per_s": pooled_decode([r for r, _ in res], name),
            "vs_ref_decode": decode_ratio([r for r, _ in res], name, s.reference),
            "identical": f"{sum(same)}/{len(same)}" if same else None,
            "identical_n": sum(same) if same else None,
            "rougeL_ref": mean("rougeL_ref"), "rougeL_greedy": mean("rougeL_greedy"),
            "rougeL_text": mean("rougeL_text"),
            "cited": sum(attributed) / tok if attributed and tok else None,
            "accepted_per_verify": (sum(x.get("accepted") or 0 for _, x in res) / steps
                                    if steps else None),
            "tokens_per_pass": tok / sum(fw) if fw and sum(fw) else None,
            "ahead_fed_reused": (sum(x.get("ahead_fed") or 0 for _, x in res),
                                 sum(x.get("ahead_reused") or 0 for _, x in res)),
        }
    return out


def decode_ratio(records: list[dict[str, Any]], name: str, reference: str | None
                 ) -> float | None:
    """Row ``name``'s decode rate over its reference's (``harness.pooled_decode``), on the
    prompts where both timed their first token (paired)."""
    if not reference:
        return None
    both = [r for r in records if decode_timed(r, name) and decode_timed(r, reference)]
    return ratio(pooled_decode(both, name), pooled_decode(both, reference))


def profile(records: list[dict[str, Any]], name: str = "grounded") -> dict[str, Any] | None:
    """Where row ``name``'s time goes, pooled over its runs: seconds and shares of each part."""
    runs = [r[name]["time"] for r in records if r.get(name) and r[name].get("time")]
    if not runs:
        return None
    part = {k: sum(t[k] for t in runs) for k in ("retrieval", "keys", "prefill", "knn", "draft")}
    part["verify"] = sum(t["lm"] - t["prefill"] for t in runs)
    total = sum(t["total"] for t in runs)
    part["other"] = max(0.0, total - sum(part.values()))
    shares = {k: part[k] / total if total else 0.0 for k in PROFILE_PARTS}
    return {"runs": len(runs), "total_s": total, "seconds": {k: part[k] for k in PROFILE_PARTS},
            "shares": shares, "largest": max(PROFILE_PARTS, key=lambda k: part[k])}


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21's speed targets against this run's figures (``met`` None where not run)."""
    by, allp = result["by_set"], result["summary"]
    qa, held = by.get("qa", {}), by.get("held-out", {})
    out: list[dict[str, Any]] = []

    def get(s: dict[str, Any], m: str, k: str) -> Any:
        return (s.get(m) or {}).get(k)

    def add(name: str, value: float | None, goal: float, unit: str = "x") -> None:
        out.append({"target": name, "measured": value, "goal": goal, "unit": unit,
                    "met": None if value is None else value >= goal})

    systems = result["systems"]
    for m in sorted(n for n, s in systems.items() if s.get("lossless") and s["engine"] == "nest"):
        s = allp.get(m)
        if s and s.get("identical"):
            add(f"`{m}` identical to greedy on every prompt ({s['reference']})",
                s["identical_n"], int(s["identical"].split("/")[1]), "prompts")
    add("DReSD in-domain (qa) >= 1.5x HF greedy", get(qa, "dresd", "vs_base"), 1.5)
    for m in ("prompt-lookup+psg", "rag-copy"):
        add(f"`{m}` >= HF prompt lookup (all prompts, same RA prompt)",
            ratio(get(allp, m, "tokens_per_s"), get(allp, "hf-lookup+psg", "tokens_per_s")), 1.0)
        add(f"`{m}` >= 1.3x greedy on grounded QA (vs RAG greedy, same prompt)",
            get(qa, m, "vs_ref"), 1.3)
    add("KNN-SSD >= 1.0x HF greedy (all prompts)", get(allp, "knn-ssd", "vs_base"), 1.0)
    add("`grounded` >= 1.5x RAG greedy on grounded QA (qa)", get(qa, "grounded", "vs_ref"), 1.5)
    add("`grounded` >= 1.0x HF greedy on held-out prompts", get(held, "grounded", "vs_base"), 1.0)
    qs = result.get("quickstart") or {}
    add("quickstart `nest ask` (grounded) >= 2.5x HF fp32 greedy", qs.get("grounded_vs_hf_fp32"),
        2.5)
    # issue 35: ours on llama.cpp against llama.cpp's own greedy decoding (same GGUF, threads)
    for m in [n for n, s in systems.items() if s["engine"] == "nest"
              and s["backend"] == "llama.cpp"]:
        ref = systems[m]["reference"]
        worst = min(((get(v, m, "vs_ref"), k) for k, v in by.items()
                     if get(v, m, "vs_ref") is not None), default=(None, "-"))
        add(f"`{m}` >= 1.0x llama.cpp greedy on every set (vs `{ref}`; worst: {worst[1]})",
            worst[0], 1.0)
    for sfx in sorted({n.partition("@")[2] for n in systems if n.startswith("llama.cpp:")}):
        at = f"@{sfx}" if sfx else ""
        add(f"`llama.cpp:grounded{at}` >= 1.3x llama.cpp greedy RAG on grounded QA (qa)",
            get(qa, f"llama.cpp:grounded{at}", "vs_ref"), 1.3)
        if f"llama.cpp+rag{at}" in systems:  # the same target against RAG's own prompt
            add(f"`llama.cpp:grounded{at}` >= 1.3x llama.cpp greedy RAG on grounded QA (qa; "
                "RAG's own prompt: the top 3 passages)",
                ratio(get(qa, f"llama.cpp:grounded{at}", "tokens_per_s"),
                      get(qa, f"llama.cpp+rag{at}", "tokens_per_s")), 1.3)
        add(f"`llama.cpp:grounded{at}` >= 2.5x our torch `grounded` on grounded QA (qa)",
            ratio(get(qa, f"llama.cpp:grounded{at}", "tokens_per_s"),
                  get(qa, "grounded", "tokens_per_s")), 2.5)
        for m in ("rag-copy", "prompt-lookup+psg"):
            add(f"`llama.cpp:{m}{at}` >= 1.2x llama.cpp greedy RAG on grounded QA (qa)",
                get(qa, f"llama.cpp:{m}{at}", "vs_ref"), 1.2)
    return out


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """The summaries, time profiles and targets of ``result["records"]`` (in place)."""
    systems = {n: Row(**s) for n, s in result["systems"].items()}
    recs, base = result["records"], result["baseline"]
    result["summary"] = summarize(recs, systems, base)
    result["by_set"] = {s: summarize([r for r in recs if r["set"] == s], systems, base)
                        for s in SETS if any(r["set"] == s for r in recs)}
    result["profile"] = {n: profile(recs, n) for n in ("grounded", "rag-greedy", "greedy",
                                                        "llama.cpp:grounded", "llama.cpp:rag-copy",
                                                        "llama.cpp:greedy+psg")
                         if n in systems}
    result["targets"] = targets(result)
    return result


# ------------------------------------------------------------------------------- markdown


def rounds_text(result: dict[str, Any]) -> str:
    """How many rounds each prompt was timed in, and what that did (empty for one round)."""
    n = result.get("rounds") or 1
    if n == 1:
        return ""
    runs = [x for r in result["records"] for k, x in r.items() if isinstance(x, dict)
            and x.get("rounds")]
    spreads = sorted(x["spread"] for x in runs if x.get("spread"))
    changed = sum(not x.get("same_output", True) for x in runs)
    return (f"; {n} rounds per prompt, each in its own rotated order, the fastest run of each "
            f"row kept (slowest / fastest round: median {statistics.median(spreads):.2f}, "
            f"max {spreads[-1]:.2f}; runs whose rounds gave other tokens: {changed})"
            if spreads else f"; {n} rounds per prompt, the fastest run of each row kept")


def markdown(result: dict[str, Any]) -> str:
    systems, base = result["systems"], result["baseline"]
    lines = [
        "# Speed with quality: every row side by side (`python -m benchmarks.speed`)", "",
        f"Model `{result['model']}` in **{result['dtype']}** (rows with their own dtype "
        f"say so), on {result['device']}. Corpus: the sample store of `nest ingest --sample` "
        f"({result['passages']} passages), the default engine's retriever, top-"
        f"{result['n_passages']}; RA prompt = the `grounded` preset's passages. "
        f"{result['per_set']} prompts per set x {result['max_new_tokens']} new tokens max, "
        "greedy, batch 1; every row on each prompt back to back in rotating order, after an "
        f"untimed warm-up{rounds_text(result)}. Held-out: {result['heldout_source']}. "
        f"DReSD datastore: {result['datastore']}. "
        f"llama.cpp: {result['llama_cpp'].get('status', '-')}.", "",
        f"Columns: tok/s pooled over the set; **×base** = over `{base}` (geo-mean of "
        "per-prompt ratios in brackets); **×ref** = over the row's reference on the same "
        "prompts; **== ref** = outputs identical to the reference; **R-L ref** / **R-L base** / "
        "**R-L text** = ROUGE-L F1 x100 against the reference, the baseline and the true "
        "continuation; **cited** = output tokens with a corpus source; **acc/verify** = draft "
        "tokens accepted per verification; **tok/pass** = tokens per model forward; "
        "**×ref decode** = ×ref for the decode alone (tokens after the first over the seconds "
        "after the first token: retrieval, keys and the prompt's forward left out, paired over "
        "the prompts where both rows timed it), which a row that stops earlier over the same "
        "prefill does not lower.",
    ]
    for s in ("all", *SETS):
        summ = result["summary"] if s == "all" else result["by_set"].get(s)
        if not summ:
            continue
        lines += ["", f"## {s} ({summ['prompts']} prompts)", ""]
        lines += table(("row", "tok/s", "×base", "×ref (ref)", "×ref decode", "== ref",
                        "R-L ref", "R-L base", "R-L text", "cited %", "acc/verify",
                        "tok/pass"), [
            (systems[n]["label"], fmt(x["tokens_per_s"], 1),
             f"{fmt(x['vs_base'])} ({fmt(x['vs_base_geomean'])})",
             f"{fmt(x['vs_ref'])} ({x['reference']})" if x["reference"] else "-",
             fmt(x.get("vs_ref_decode")),
             x["identical"] or "-", pct(x["rougeL_ref"]), pct(x["rougeL_greedy"]),
             pct(x["rougeL_text"]), pct(x["cited"]), fmt(x["accepted_per_verify"], 1),
             fmt(x["tokens_per_pass"]))
            for n in systems if (x := summ.get(n))])
    lines += ["", "## Targets (issue 21: ratios against HF greedy in the same dtype; issue 35: "
              "ours on llama.cpp against llama.cpp's greedy decoding)", ""]
    lines += table(("target", "measured", "goal", "met"), [
        (t["target"], "-" if t["measured"] is None else
         (f"{t['measured']:.2f}x" if t["unit"] == "x" else f"{t['measured']}/{t['goal']}"),
         f"{t['goal']:g}x" if t["unit"] == "x" else f"{t['goal']}/{t['goal']}",
         "-" if t["met"] is None else ("yes" if t["met"] else "**no**"))
        for t in result["targets"]])
    qs = result.get("quickstart")
    if qs:
        lines += ["", f"## The quickstart question at {qs['max_new_tokens']} tokens", "",
                  f"`nest ask \"{qs['question']}\"`, {qs['repeats']} interleaved repeats, pooled "
                  "(tokens and passes are totals over the repeats).", ""]
        lines += table(("run", "tok/s", "tokens", "forward passes", "×HF fp32"), [
            (n, fmt(x["tokens_per_s"], 1), x["tokens"], x.get("forwards", "-"),
             fmt(x["vs_hf_fp32"])) for n, x in qs["runs"].items()])
        lines += ["", f"`grounded` answer: {qs['text']!r}"]
    if result.get("curves"):
        ct = result["curve_tokens"]
        lines += ["", "## What limits speed", "", "c(T)/c(1): one verify forward over T new "
                  "tokens after a 120-token cache (`nest_integrations.lm.cost`, measured at the "
                  "start of this run, cached as the engine's curve):", ""]
        lines += table(("model", "c(1) ms", *(f"c({t})/c(1)" for t in ct)), [
            (d, f"{1000 * c['seconds'][0]:.0f}", *(f"{v / c['seconds'][0]:.2f}"
                                                   for v in c["seconds"]))
            for d, c in result["curves"].items()])
    for name, prof in (result.get("profile") or {}).items():
        if not prof:
            continue
        lines += ["", f"Where `{name}`'s time goes ({prof['runs']} runs, {prof['total_s']:.1f} s; "
                  "`NestStats` timings, prefill timed around `DecodeLoop.prefill`): " + ", ".join(
                      f"{PROFILE_LABELS[k]} {100 * prof['shares'][k]:.1f}%" for k in PROFILE_PARTS
                      if prof["shares"][k] >= 0.005) + "."]
    if result.get("kernels"):
        lines += ["", *kernels_markdown(result["kernels"])]
    qq = result.get("quant_quality")
    if qq:
        lines += ["", "## Quantisation and quality", "", f"Perplexity of {qq['texts']} held-out "
                  "Wikipedia leads (the next 160 tokens after 32; the same token ids for every "
                  "model). Speed per quantisation: the rows above and the cost curves.", ""]
        lines += table(("model", "perplexity", "tokens", "file MB"), [
            (n, fmt(x["perplexity"], 3), x["tokens"], fmt(x.get("file_mb"), 1))
            for n, x in qq["models"].items()])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- sections


def quickstart(parts: Parts, dtype: str, tokens: int, repeats: int) -> dict[str, Any]:
    """The quickstart's question: `grounded` in ``dtype`` and fp32 against HF greedy."""
    q = {"set": "quickstart", "id": "quickstart", "prompt": QUICKSTART, "chat": True}
    rows = {"grounded": ROWS["grounded"], "grounded-fp32": ROWS["grounded"].at("fp32"),
            "hf-greedy-fp32": ROWS["hf-greedy-fp32"], "hf-greedy": ROWS["hf-greedy"]}
    acc = {n: {"tokens": 0, "seconds": 0.0, "forwards": 0} for n in rows}
    text = ""
    for i in range(repeats):
        for n in harness.rotated(list(rows), i):
            x = run_row(parts, rows[n], q, tokens)
            assert x is not None
            acc[n]["tokens"] += x["tokens"]
            acc[n]["seconds"] += x["seconds"]
            acc[n]["forwards"] += x.get("forwards") or x["tokens"] + 1
            text = x["text"] if n == "grounded" else text
    ref = rate(acc["hf-greedy-fp32"])
    for x in acc.values():
        x["tokens_per_s"] = rate(x)
        x["vs_hf_fp32"] = ratio(rate(x), ref)
    return {"question": QUICKSTART, "max_new_tokens": tokens, "repeats": repeats, "runs": acc,
            "grounded_vs_hf_fp32": acc["grounded"]["vs_hf_fp32"], "text": text}


def verify_ms(lm: Any, t: int, repeats: int = 1, tree: bool = False) -> float:
    """Median ms of one forward of ``t`` new tokens (a chain, or a 4-branch token tree) after
    a fresh 120-token cache."""
    times = []
    for _ in range(repeats):
        cache = lm.new_cache()
        lm.forward(list(range(1000, 1120)), cache)
        ids = list(range(2000, 2000 + t))
        t0 = time.perf_counter()
        if tree and t > 4:
            per = (t - 1) // 4
            lm.forward_tree(ids, [-1] + [0 if j % per == 0 else j for j in range(t - 1)], cache)
        else:
            lm.forward(ids, cache)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernels(parts: Parts, prompts: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Our bf16 CPU kernels (prepacked linears, row-wise verify attention) against packed with
    SDPA, plain bf16 and fp32: c(T), verify rows bit-exact with one-token steps, HF greedy
    ms/token and agreement on held-out leads, perplexity of their next 160 tokens."""
    import torch

    from benchmarks.harness.prompts import held_out_leads
    from nest_integrations.lm.hf import HFLanguageModel

    lms = {"bf16 engine": parts.lm("bf16"),
           "bf16 packed": HFLanguageModel.from_default(dtype="bf16", attn_implementation="sdpa"),
           "bf16 plain": parts.lm("bf16", "transformers"), "fp32": parts.lm("fp32")}
    tokens = (1, 2, 3, 5, 9, 17, 33)
    for lm in lms.values():  # warm-up, untimed
        verify_ms(lm, 2)
    cost = {n: {t: [] for t in tokens} for n in lms}
    for _ in range(repeats):
        for t in tokens:
            for n, lm in lms.items():
                cost[n][t].append(verify_ms(lm, t))

    def exact_rows(lm: Any) -> list[int]:
        same = total = 0
        for context in (100, 600):
            prompt, new = list(range(3000, 3000 + context)), list(range(500, 509))
            cache = lm.new_cache()
            lm.forward(prompt, cache, last=1)
            steps = [lm.forward([t], cache)[0][0] for t in new]
            cache = lm.new_cache()
            lm.forward(prompt, cache, last=1)
            verify, _ = lm.forward(new, cache)
            same += sum(bool(torch.equal(a, b)) for a, b in zip(steps, verify))
            total += len(new)
        return [same, total]

    from benchmarks.harness.systems import hf_generate

    texts = held_out_leads(prompts)
    outs: dict[str, list[list[int]]] = {n: [] for n in lms}
    secs, nll, count = dict.fromkeys(lms, 0.0), dict.fromkeys(lms, 0.0), dict.fromkeys(lms, 0)
    for i, text in enumerate(texts):
        ids = lms["fp32"].tokenize(text)
        for n in harness.rotated(list(lms), i):
            out, s = hf_generate(lms[n], ids[:96], new_tokens)
            outs[n].append(out)
            secs[n] += s
            logits, _ = lms[n].forward(ids[:191], lms[n].new_cache())
            logp = torch.log_softmax(logits[31:].float(), -1)
            nll[n] += -logp.gather(1, torch.tensor(ids[32:192])[:, None]).sum().item()
            count[n] += len(ids[32:192])
    return {
        "labels": {"bf16 engine": "bf16, packed + row-wise attention (our engine)",
                   "bf16 packed": "bf16, packed, SDPA", "bf16 plain": "bf16 as transformers "
                   "loads it", "fp32": "fp32"},
        "curve_ms": {n: {str(t): statistics.median(v) for t, v in c.items()}
                     for n, c in cost.items()},
        "exact_rows": {n: exact_rows(lm) for n, lm in lms.items()},
        "ms_per_token": {n: 1e3 * secs[n] / max(1, sum(len(o) for o in outs[n])) for n in lms},
        "identical": {n: {r: sum(a == b for a, b in zip(outs[n], outs[r])) for r in lms}
                      for n in lms},
        "perplexity": {n: math.exp(nll[n] / count[n]) if count[n] else None for n in lms},
        "prompts": len(texts), "new_tokens": new_tokens, "repeats": repeats,
        "packed_linears": lms["bf16 engine"].packed_linears,
    }


def kernels_markdown(k: dict[str, Any]) -> list[str]:
    names = list(k["labels"])
    tokens = list(k["curve_ms"][names[0]])
    lines = ["## bf16 CPU kernels against plain bf16 and fp32", "",
             f"c(T) in ms (median of {k['repeats']}, interleaved); verify rows of 9-token passes "
             "after 100- and 600-token caches that equal one-token steps bit for bit; HF greedy "
             f"on {k['prompts']} held-out leads x {k['new_tokens']} tokens; perplexity of their "
             "next 160 tokens after 32.", ""]
    lines += table(("model", *(f"c({t})" for t in tokens), "c(9)/c(1)", "exact rows",
                    "ms/token", "== engine", "== plain", "== fp32", "perplexity"), [
        (k["labels"][n], *(f"{k['curve_ms'][n][t]:.0f}" for t in tokens),
         f"{k['curve_ms'][n]['9'] / k['curve_ms'][n]['1']:.2f}",
         "{}/{}".format(*k["exact_rows"][n]), f"{k['ms_per_token'][n]:.1f}",
         *(f"{k['identical'][n][r]}/{k['prompts']}" for r in ("bf16 engine", "bf16 plain",
                                                             "fp32")),
         fmt(k["perplexity"][n], 3)) for n in names])
    return lines


def llama_quant(name: str) -> str | None:
    """A llama.cpp row's quantisation as ``Parts.llama_engine`` takes it (None: the default)."""
    return None if quant_name(name) == quant_name(None) else name


def quant_quality(parts: Parts, quants: list[str], prompts: int) -> dict[str, Any]:
    """Perplexity of held-out text on each llama.cpp quantisation and on torch fp32 and bf16:
    ``prompts`` held-out Wikipedia leads, the next 160 tokens after 32, the same token ids for
    every model (the Hugging Face tokenizer's; the vocabularies are one)."""
    import numpy as np
    import torch

    from benchmarks.harness.prompts import held_out_leads

    texts = held_out_leads(prompts)
    tok = parts.lm("fp32")
    ids = [tok.tokenize(t)[:192] for t in texts]
    models = {f"torch {d}": parts.lm(d) for d in ("fp32", "bf16")}
    from nest_integrations import assembly

    models.update({f"llama.cpp {q}": assembly.shared_model(llama_quant(q), backend="llama.cpp")
                   for q in quants})  # the model alone: no corpus ingested for it
    out: dict[str, Any] = {}
    for name, lm in models.items():
        nll = count = 0.0
        for x in ids:
            logits, _ = lm.forward(x[:-1], lm.new_cache())
            logits = torch.as_tensor(np.asarray(logits, dtype=np.float32)
                                     if not isinstance(logits, torch.Tensor) else logits.float())
            logp = torch.log_softmax(logits[31:], -1)
            nll -= logp.gather(1, torch.tensor(x[32:])[:, None]).sum().item()
            count += len(x[32:])
        out[name] = {"perplexity": math.exp(nll / count), "tokens": int(count),
                     "fingerprint": lm.fingerprint}
    for q in quants:
        from nest_integrations.lm.llama_cpp import resolve_gguf

        out[f"llama.cpp {q}"]["file_mb"] = round(
            resolve_gguf(llama_quant(q))[0].stat().st_size / 2**20, 1)
    return {"texts": len(texts), "models": out}


# ------------------------------------------------------------------------------- main


def load_result(path: Path) -> dict[str, Any]:
    """A result JSON (or ``.json.gz``); results of ``bench_speed_all.py`` (per-prompt
    ``rows`` keyed by method) are read as records of the same rows."""
    gz = path.with_suffix(".json.gz")
    raw = (json.loads(gzip.decompress(gz.read_bytes())) if not path.exists() and gz.exists()
           else json.loads(path.read_text(encoding="utf-8")))
    if "records" not in raw:  # the old layout
        raw["records"], names = raw.pop("rows"), raw.pop("methods")
        raw.setdefault("baseline", "hf-greedy")
        raw["systems"] = {n: vars_of(ROWS[n]) for n in names}
        raw.setdefault("llama_cpp", {})
        m = raw.get("machine", {})
        old = raw.get("command", "?")
        raw["run"] = {"command": old, "when": raw.get("when", "?"), "rerun": rerun_of(old),
                      "machine": {k: m[k] for k in ("cpu", "cpus", "torch_threads",
                                                    "native_bf16") if k in m},
                      "load_start": m.get("loadavg_start", [0.0]),
                      "load_end": m.get("loadavg_end", [0.0]), "commit": "unknown",
                      "wall_s": m.get("timed_wall_s", 0.0)}
    return raw


def rerun_of(command: str) -> str:
    """The ``python -m benchmarks.speed`` command that re-runs a ``bench_speed_all.py`` one:
    ``--methods`` is ``--rows``, and its output folder (default ``speed_all``) the stem."""
    new = command.replace("python benchmarks/bench_speed_all.py", "python -m benchmarks.speed")
    new = new.replace("--methods", "--rows")
    folder = re.search(r" --out benchmarks/results/(\S+)", new)
    if folder:
        return new.replace(folder.group(0), f" --stem {folder.group(1)}")
    return new + " --stem speed_all"


def vars_of(r: Row) -> dict[str, Any]:
    return {k: getattr(r, k) for k in r.__dataclass_fields__}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    harness.setup()
    run = harness.Run.start("benchmarks.speed", argv)
    if args.quant_quality:  # its text is read at the end: a missing wheel fails now, not then
        from nest_integrations.wikipedia import load_wiki_leads

        try:
            load_wiki_leads(download=False)
        except FileNotFoundError as exc:
            raise SystemExit(f"--quant-quality needs the held-out leads: {exc}") from exc
    from nest_integrations.evaluation.metrics import rouge_scorer

    if args.render_only:
        result = load_result(Path(args.out) / f"{args.stem}.json")
        systems = {n: Row(**s) for n, s in result["systems"].items()}
        for r in result["records"]:  # records of older versions lack some scores
            score(r, systems, result["baseline"], rouge_scorer())
        derive(result)
        harness.write_result(args.out, args.stem, result, markdown(result), run, args.quiet)
        return 0

    from transformers.utils import logging as hf_logging

    from benchmarks.harness.prompts import (
        in_domain_datastore,
        sample_passages,
        speed_sets,
        tell_me_about,
    )
    from nest_integrations.lm import backend, cost

    threads = backend.configure_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    parts = Parts(args.dtype, threads, llama_extra_bufts={"auto": None, "on": True, "off": False}[
        args.llama_extra_bufts])
    engine = parts.engine()
    passages = sample_passages()
    prompts, held_source = speed_sets(engine.lm, passages, args.per_set, args.prefix_tokens,
                                      args.max_new_tokens)
    tell_pool, tell_eval = tell_me_about(None, args.per_set)
    prompts = [q for q in prompts + tell_eval if q["set"] in args.set_list]
    systems: dict[str, Row] = args.systems
    quants = list(dict.fromkeys(quant_name(s.dtype) for s in systems.values()
                                if s.backend == "llama.cpp"))
    if quants and parts.llama_engine(llama_quant(quants[0])) is None:
        say(f"llama.cpp: {parts.llama_info['status']}")
        systems = {n: s for n, s in systems.items() if s.backend != "llama.cpp"}
        quants = []
    elif quants:
        parts.llama_info = {**parts.llama_info, "status": "ok"}
    in_domain = {(s.backend, quant_name(s.dtype) if s.backend == "llama.cpp" else
                  s.dtype or args.dtype)
                 for s in systems.values() if dict(s.options).get("datastore") == "in-domain"}
    if in_domain:
        used = {q.get("title") or q["id"] for q in prompts}  # no prompt's own article
        train = [t for t in tell_pool if t["id"] not in used][: args.n_train]
        for backend_name, d in sorted(in_domain):
            if backend_name == "torch":
                parts.datastore = str(in_domain_datastore(parts.lm(), train, 128, "bench-speed"))
            else:
                say(f"DReSD datastore on llama.cpp {d}")
                parts.llama_datastores[d] = str(in_domain_datastore(
                    parts.llama_engine(llama_quant(d)).lm, train, 128,
                    f"bench-speed-llama.cpp-{d}"))
    curves: dict[str, Any] = {}
    if not args.no_curve:
        say("measuring the cost curves")
        for d in dict.fromkeys(s.dtype or args.dtype for s in systems.values()
                               if s.engine == "nest" and s.backend == "torch"):
            curves[d] = cost.load_or_measure(parts.lm(d), refresh=True, tokens=CURVE_TOKENS,
                                             repeats=args.cost_repeats)
        for d in quants:
            curves[f"llama.cpp {d}"] = cost.load_or_measure(
                parts.llama_engine(llama_quant(d)).lm, refresh=True, tokens=CURVE_TOKENS,
                repeats=args.cost_repeats)
    for name, s in systems.items():  # warm-up, untimed
        run_row(parts, s, prompts[0], 4)
        run_row(parts, s, prompts[-1], 4)
    scorer = rouge_scorer()
    records = []
    for i, q in enumerate(prompts):
        r: dict[str, Any] = {k: q[k] for k in ("set", "id", "prompt", "reference")}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for k in range(args.rounds):
            for name in harness.rotated(list(systems), i + k):
                runs[name].append(run_row(parts, systems[name], q, args.max_new_tokens))
        for name, done in runs.items():
            r[name] = done[0] if args.rounds == 1 else harness.fastest(done)
        score(r, systems, args.baseline, scorer)
        records.append(r)
        say(f"prompt {i + 1}/{len(prompts)} ({q['set']}): "
            + " ".join(f"{n}={rate(r[n]) or 0:.1f}" for n in systems))
    qs = None
    if args.quickstart_repeats > 0:
        say("quickstart question")
        qs = quickstart(parts, args.dtype, args.quickstart_tokens, args.quickstart_repeats)
    ct = sorted(set.intersection(*(set(c.tokens) for c in curves.values()))) if curves else []
    result: dict[str, Any] = {
        "model": engine.lm.fingerprint, "dtype": args.dtype, "device": str(engine.lm.device),
        "threads": threads, "passages": len(passages), "n_passages": engine.config.n_passages,
        "per_set": args.per_set, "max_new_tokens": args.max_new_tokens, "sets": args.set_list,
        "rounds": args.rounds,
        "heldout_source": held_source, "baseline": args.baseline,
        "datastore": (f"{args.n_train} \"Tell me about {{title}}.\" prompts' 128-token greedy "
                      "responses, titles disjoint from the prompts") if parts.datastore else "-",
        "llama_cpp": parts.llama_info,
        "systems": {n: vars_of(s) for n, s in systems.items()},
        "quickstart": qs, "curve_tokens": ct,
        "curves": {d: {"tokens": ct, "seconds": [c.cost(t) for t in ct]}
                   for d, c in curves.items()},
        "kernels": (kernels(parts, args.kernel_prompts, args.kernel_tokens, args.kernel_repeats)
                    if args.kernels else None),
        "quant_quality": (quant_quality(parts, [q.strip() for q in args.quant_quality.split(",")
                                                if q.strip()], args.kernel_prompts)
                          if args.quant_quality else None),
        "records": records,
    }
    derive(result)
    harness.write_result(args.out, args.stem, result, markdown(result), run, args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
