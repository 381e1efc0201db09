"""The look-ahead of NEST's target-first schedule (``NestConfig.lookahead``), side by side.

The default (``grounded``) with guesses of up to N tokens against the same preset with the
look-ahead off, and RAG greedy on the same RA prompt, on the prompt sets of
``bench_speed.build_prompts`` (grounded completions, held-out completions, QA), in each dtype
asked for. Methods are interleaved per prompt (the order rotates); ratios are pooled tokens/s
within one run. Quality beside speed: how many answers are token-identical to the look-ahead
off (it never decides a token, so only the numerics of a wider pass can change one), and
ROUGE-L between the two.

Usage::

    NEST_THREADS=1 python benchmarks/bench_lookahead.py --dtype fp32,bf16 --per-set 10
    python benchmarks/bench_lookahead.py --per-set 1 --dtype fp32 --out /tmp/la   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_speed import SETS, write_outputs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32,bf16", help="comma-separated dtypes")
    ap.add_argument("--per-set", type=int, default=10)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lookahead", default="8,16", help="guess lengths to compare with 0")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(RESULTS))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # noqa: F401

    from bench_speed import build_prompts

    from nest_integrations import NestEngine
    from nest_integrations.evaluation.metrics import rouge, rouge_scorer
    from nest_integrations.ingest import (
        default_token_counter,
        load_documents,
        sample_corpus_inputs,
        split_documents,
    )
    from nest_integrations.lm import backend

    threads = backend.configure_threads(args.threads)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    sizes = [0] + [int(x) for x in args.lookahead.split(",") if x.strip()]
    methods = ["rag-greedy"] + [f"lookahead-{n}" for n in sizes]
    scorer = rouge_scorer()
    docs, _ = load_documents(sample_corpus_inputs())
    result: dict[str, Any] = {"threads": threads, "per_set": args.per_set, "sets": sets,
                              "max_new_tokens": args.max_new_tokens, "methods": methods,
                              "load": [round(x, 2) for x in os.getloadavg()], "dtypes": {}}
    lines = ["# Look-ahead (`NestConfig.lookahead`) on the default `grounded`", "",
             f"{args.per_set} prompts per set ({', '.join(sets)}), {args.max_new_tokens} new "
             f"tokens, {threads} torch thread(s), methods interleaved per prompt; `lookahead-0` "
             "is the preset with the look-ahead off, `rag-greedy` greedy decoding of the same "
             "RA prompt. Command: `python benchmarks/bench_lookahead.py "
             + " ".join(sys.argv[1:] if argv is None else argv) + "`", ""]
    for dtype in [d.strip() for d in args.dtype.split(",") if d.strip()]:
        engine = NestEngine.from_defaults(dtype=dtype)
        passages = split_documents(docs, default_token_counter())
        prompts, _, _ = build_prompts(engine.lm, docs, passages, args.per_set, 64,
                                      args.max_new_tokens)
        prompts = [q for q in prompts if q["set"] in sets]
        first = prompts[0]
        first_p = [{"role": "user", "content": first["prompt"]}] if first["chat"] else \
            first["prompt"]
        engine.generate(first_p, max_new_tokens=4, decoding="greedy")  # warm-up, untimed
        engine.generate(first_p, max_new_tokens=4)
        rows = []
        for i, q in enumerate(prompts):
            p = [{"role": "user", "content": q["prompt"]}] if q["chat"] else q["prompt"]
            r: dict[str, Any] = {"set": q["set"], "id": q["id"]}
            k = i % len(methods)
            for m in methods[k:] + methods[:k]:
                if m == "rag-greedy":
                    res = engine.generate(p, max_new_tokens=args.max_new_tokens, decoding="greedy")
                else:
                    cfg = dataclasses.replace(engine.config, lookahead=int(m.rsplit("-", 1)[1]))
                    res = engine.generate(p, max_new_tokens=args.max_new_tokens, config=cfg)
                s = res.stats
                r[m] = {"ids": list(res.token_ids), "text": res.text, "tokens": s.new_tokens,
                        "seconds": s.time_total, "forwards": s.forward_passes,
                        "ahead_fed": s.ahead_fed, "ahead_reused": s.ahead_tokens}
            rows.append(r)
            print(f"{dtype} prompt {i + 1}/{len(prompts)} ({q['set']}): "
                  + " ".join(f"{m}={r[m]['tokens'] / r[m]['seconds']:.1f}" for m in methods),
                  file=sys.stderr, flush=True)
        lines += [f"## {dtype}", "", "| set | method | tok/s | × RAG | × look-ahead off | "
                  "tokens / pass | guessed / reused rows | identical to off | ROUGE-L vs off |",
                  "|---|---|---|---|---|---|---|---|---|"]
        summary: dict[str, Any] = {}
        for s in [*sets, "all"]:
            sub = [r for r in rows if s in ("all", r["set"])]
            if not sub:
                continue
            rate = {m: sum(r[m]["tokens"] for r in sub) / sum(r[m]["seconds"] for r in sub)
                    for m in methods}
            for m in methods:
                tok = sum(r[m]["tokens"] for r in sub)
                fw = sum(r[m]["forwards"] for r in sub)
                same = sum(r[m]["ids"] == r["lookahead-0"]["ids"] for r in sub)
                rl = [rouge(r[m]["text"], r["lookahead-0"]["text"], scorer)["rougeL"]["f"]
                      for r in sub if r["lookahead-0"]["text"].strip()]
                summary[f"{s}/{m}"] = {
                    "tokens_per_s": rate[m], "vs_rag": rate[m] / rate["rag-greedy"],
                    "vs_off": rate[m] / rate["lookahead-0"], "tokens_per_pass": tok / fw,
                    "identical_to_off": same, "n": len(sub),
                    "rougeL_vs_off": 100 * sum(rl) / len(rl) if rl else None,
                    "fed": sum(r[m]["ahead_fed"] for r in sub),
                    "reused": sum(r[m]["ahead_reused"] for r in sub)}
                x = summary[f"{s}/{m}"]
                lines.append(
                    f"| {s} | {m} | {x['tokens_per_s']:.1f} | {x['vs_rag']:.2f} | "
                    f"{x['vs_off']:.2f} | {x['tokens_per_pass']:.2f} | {x['fed']} / "
                    f"{x['reused']} | {same}/{len(sub)} | "
                    + (f"{x['rougeL_vs_off']:.1f}" if rl else "-") + " |")
        lines.append("")
        result["dtypes"][dtype] = {"rows": rows, "summary": summary}
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_outputs(args.out, "lookahead", result, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
