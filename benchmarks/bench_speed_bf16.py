"""fp32 vs bf16, side by side in one run: greedy, KNN-SSD (the shipped profile), prompt lookup
and DReSD (in-domain datastore), each also with the cost-model draft lengths
(``drafter_options={"cost_model": "auto"}``: the c(T) curve of that dtype, measured once and
cached under ``$NEST_HOME/cost/``).

Prompts: "Tell me about {title}." chat prompts (``bench_lossless.prompt_sets``: the first
``--n-train`` build the DReSD datastore from the model's own fp32 greedy responses, the next
``--n-eval``, disjoint, are timed). Every prompt runs every (dtype, method) in turn, rotated per
prompt, so load from other jobs on a shared machine falls on all alike. Ratios are tokens/s
against our greedy loop in the same dtype; ``== greedy`` counts outputs identical to that
greedy, ``== fp32 greedy`` to the fp32 one.

Usage::

    NEST_HOME=.nest HF_HUB_OFFLINE=1 python benchmarks/bench_speed_bf16.py            # 6 x 48
    python benchmarks/bench_speed_bf16.py --n-eval 1 --max-new-tokens 8 --n-train 2    # smoke

Writes ``benchmarks/results/speed_bf16.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_lossless import id_datastore, prompt_sets  # noqa: E402

from nest_integrations.config import NestConfig  # noqa: E402
from nest_integrations.decoding.engine import NestEngine  # noqa: E402
from nest_integrations.index.in_memory_store import InMemoryKeyStore  # noqa: E402
from nest_integrations.lm import backend, cost  # noqa: E402
from nest_integrations.lm.hf import HFLanguageModel  # noqa: E402


def methods(datastore: str) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "greedy": ("greedy", {}),
        "knn-ssd": ("knn-ssd", {}),
        "knn-ssd +cost": ("knn-ssd", {"cost_model": "auto"}),
        "prompt-lookup": ("prompt-lookup", {}),
        "prompt-lookup +cost": ("prompt-lookup", {"cost_model": "auto"}),
        "dresd": ("dresd", {"datastore": datastore}),
        "dresd +cost": ("dresd", {"datastore": datastore, "cost_model": "auto"}),
    }


def same(rows: list[dict[str, Any]], ref: list[dict[str, Any]]) -> int:
    """How many outputs equal the reference's, prompt by prompt."""
    return sum(r["ids"] == q["ids"] for r, q in zip(rows, ref))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-eval", type=int, default=6)
    ap.add_argument("--n-train", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "speed_bf16.md"))
    args = ap.parse_args()
    threads = backend.configure_threads(args.threads)
    load_before = os.getloadavg()
    lms = {d: HFLanguageModel.from_default(dtype=d) for d in args.dtypes}
    first = lms[args.dtypes[0]]
    train, evals = prompt_sets(args.n_train, args.n_eval)
    ds = str(id_datastore(first, train, 96))  # same fingerprint in every dtype: shared
    engines = {d: NestEngine(lm, None, InMemoryKeyStore(), NestConfig(temperature=0.0))
               for d, lm in lms.items()}
    table = methods(ds)
    curves = {d: cost.load_or_measure(lm) for d, lm in lms.items()}
    runs = [(d, m) for d in args.dtypes for m in table]
    msgs = [[{"role": "user", "content": p["prompt"]}] for p in evals]
    for d, m in runs:  # warm-up, untimed
        decoding, opts = table[m]
        engines[d].generate(msgs[0], max_new_tokens=4, decoding=decoding, drafter_options=opts)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {r: [] for r in runs}
    t_start = time.time()
    for i, m_ in enumerate(msgs):
        order = runs[i % len(runs):] + runs[: i % len(runs)]
        for d, m in order:
            decoding, opts = table[m]
            t0 = time.perf_counter()
            res = engines[d].generate(m_, max_new_tokens=args.max_new_tokens, decoding=decoding,
                                      drafter_options=opts)
            dt = time.perf_counter() - t0
            s = res.stats
            rows[(d, m)].append({"ids": list(res.token_ids), "seconds": dt,
                                 "forwards": s.forward_passes, "drafted": s.drafted_tokens,
                                 "accepted": s.accepted_tokens, "steps": s.verify_steps,
                                 "draft_forwards": s.draft_forwards,
                                 "route": s.route_skip_set})
        print(f"prompt {i + 1}/{len(msgs)} done", flush=True)
    wall = time.time() - t_start
    load_after = os.getloadavg()
    report = []
    fp32_ref = rows.get(("fp32", "greedy"))
    for d, m in runs:
        rs, ref = rows[(d, m)], rows[(d, "greedy")]
        toks = sum(len(r["ids"]) for r in rs)
        secs = sum(r["seconds"] for r in rs)
        ref_tps = sum(len(r["ids"]) for r in ref) / sum(r["seconds"] for r in ref)
        fp32_tps = (sum(len(r["ids"]) for r in fp32_ref) / sum(r["seconds"] for r in fp32_ref)
                    if fp32_ref else float("nan"))
        steps = sum(r["steps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        report.append({
            "dtype": d, "method": m, "tokens": toks, "seconds": round(secs, 2),
            "tokens_per_s": round(toks / secs, 2),
            "vs_greedy_same_dtype": round(toks / secs / ref_tps, 3),
            "vs_fp32_greedy": round(toks / secs / fp32_tps, 3),
            "identical_to_greedy": f"{same(rs, ref)}/{len(rs)}",
            "identical_to_fp32_greedy": f"{same(rs, fp32_ref)}/{len(rs)}" if fp32_ref else "-",
            "forwards": sum(r["forwards"] for r in rs),
            "draft_forwards": sum(r["draft_forwards"] for r in rs),
            "accepted_per_step": round(accepted / steps, 2) if steps else 0.0,
            "acceptance": round(accepted / drafted, 2) if drafted else 0.0,
            "routes": sorted({str(r["route"]) for r in rs}) if m.startswith("knn") else [],
        })
    cmd = "python benchmarks/bench_speed_bf16.py " + " ".join(sys.argv[1:])
    head = (f"# fp32 vs bf16, side by side (`{cmd.strip()}`)\n\n"
            f"Model {first.fingerprint}, {args.n_eval} chat prompts x {args.max_new_tokens} new "
            f"tokens (greedy), DReSD datastore from {args.n_train} disjoint train prompts' fp32 "
            f"greedy responses (96 tokens). CPU: {cost.machine_name()} "
            f"({platform.machine()}, native bf16: {backend.cpu_has_native_bf16()}), "
            f"{threads} torch thread(s). **Shared machine**: 2 cores used by several workers at "
            f"once; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
            f"({wall:.0f} s timed). Methods interleaved per prompt, rotated.\n\n"
            "Cost curves (c(T)/c(1), cached in $NEST_HOME/cost/, used by the `+cost` rows):\n\n")
    for d, c in curves.items():
        head += (f"- {d}: c(1) {1000 * c.cost(1):.0f} ms; "
                 + ", ".join(f"c({t})/c(1) {c.ratio(t):.2f}" for t in c.tokens[1:]) + "\n")
    lines = ["| dtype | method | tok/s | vs greedy (same dtype) | vs fp32 greedy | == greedy | "
             "== fp32 greedy | full passes | draft passes | tokens/step | acceptance | route |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report:
        lines.append(f"| {r['dtype']} | {r['method']} | {r['tokens_per_s']} | "
                     f"{r['vs_greedy_same_dtype']:.2f}x | {r['vs_fp32_greedy']:.2f}x | "
                     f"{r['identical_to_greedy']} | {r['identical_to_fp32_greedy']} | "
                     f"{r['forwards']} | {r['draft_forwards']} | {r['accepted_per_step']} | "
                     f"{r['acceptance']} | {', '.join(r['routes'])} |")
    out = Path(args.out)
    out.write_text(head + "\n" + "\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(
        {"args": vars(args), "threads": threads, "load": [load_before, load_after],
         "curves": {d: c.to_json() for d, c in curves.items()}, "rows": report}, indent=1) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
