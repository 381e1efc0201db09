"""Cost c(T) of one verify forward over T new tokens after a 120-token cache, per model dtype
side by side (SmolLM2-135M on CPU): what bounds every speculative method's speed-up.

Every dtype's model is loaded once; the timed forwards (a fresh 120-token cache each, fixed ids)
are interleaved across dtypes and T, and for each T the median of ``--repeats`` is reported,
with the ratio c(T)/c(1). ``--tree`` adds the token-tree forward (4 branches) beside the chain.

Usage:
    python benchmarks/verify_cost.py                                # fp32 and bf16, T 1 2 9 17
    python benchmarks/verify_cost.py --dtype fp32 bf16 --tokens 1 2 5 9 17 33 --repeats 5 --tree
    python benchmarks/verify_cost.py --threads 1
Results: benchmarks/results/verify_cost.md.

The engine's own, cached version of this measurement (one chain per T, the minimum of
interleaved repeats, stored per model/dtype/threads/machine under ``$NEST_HOME/cost/``) is
``nest_integrations.lm.cost.load_or_measure``; the draft-length planner reads it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nest_integrations.lm import backend  # noqa: E402
from nest_integrations.lm.hf import HFLanguageModel  # noqa: E402

PROMPT = list(range(1000, 1120))


def verify_ms(lm: HFLanguageModel, t: int, repeats: int, tree: bool) -> float:
    """Median ms of one forward of ``t`` new tokens (a chain, or a 4-branch tree) after a fresh
    120-token cache."""
    times = []
    for _ in range(repeats):
        cache = lm.new_cache()
        lm.forward(PROMPT, cache)
        ids = list(range(2000, 2000 + t))
        t0 = time.perf_counter()
        if tree and t > 4:
            per = (t - 1) // 4
            parents = [-1] + [0 if j % per == 0 else j for j in range(t - 1)]
            lm.forward_tree(ids, parents, cache)
        else:
            lm.forward(ids, cache)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=backend.DTYPE_CHOICES)
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 9, 17])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: $NEST_THREADS, else the physical cores)")
    ap.add_argument("--tree", action="store_true", help="also time a 4-branch token tree")
    args = ap.parse_args()
    threads = backend.configure_threads(args.threads)
    tokens = sorted(set(args.tokens) | {1})
    lms = {}
    for name in args.dtype:
        lm = HFLanguageModel.from_default(dtype=name)
        lms[backend.dtype_label(name, lm.device)] = lm
        verify_ms(lm, 2, 1, False)  # warm-up
    # Interleaved: each repeat times every dtype in turn, so load from other jobs on a shared
    # machine falls on all of them alike.
    chain: dict[str, dict[int, list[float]]] = {d: {t: [] for t in tokens} for d in lms}
    trees: dict[str, dict[int, list[float]]] = {d: {t: [] for t in tokens} for d in lms}
    for _ in range(args.repeats):
        for t in tokens:
            for d, lm in lms.items():
                chain[d][t].append(verify_ms(lm, t, 1, False))
                if args.tree and t > 4:
                    trees[d][t].append(verify_ms(lm, t, 1, True))
    results = {
        d: {t: (statistics.median(chain[d][t]),
                statistics.median(trees[d][t]) if trees[d][t] else None) for t in tokens}
        for d in lms
    }
    print(f"machine: {platform.processor() or platform.machine()}, torch threads {threads}, "
          f"native bf16: {backend.cpu_has_native_bf16()}; median of {args.repeats}, "
          f"after a {len(PROMPT)}-token cache\n")
    head = " | ".join(f"{d} c(T) ms | {d} c(T)/c(1)" for d in results)
    print(f"| new tokens T | {head} |" + (" tree ms (4 branches) per dtype |" if args.tree else ""))
    print("|---|" + "---|---|" * len(results) + ("---|" if args.tree else ""))
    for t in tokens:
        cells = []
        for d, row in results.items():
            ms, c1 = row[t][0], row[1][0]
            cells.append(f"{ms:.0f} | {ms / c1:.2f}")
        line = f"| {t} | " + " | ".join(cells) + " |"
        if args.tree:
            line += " " + " / ".join(
                f"{row[t][1]:.0f}" if row[t][1] is not None else "-" for row in results.values()
            ) + " |"
        print(line)


if __name__ == "__main__":
    main()
