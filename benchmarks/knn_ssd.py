"""KNN-SSD on domain-switching streams: greedy vs Self-SD (Fix: each domain's set), Self-SD
(Mix) and KNN-SSD, all through ``NestEngine.generate(decoding=...)``, in one run.

Setting: the embedded SmolLM2-135M-Instruct (30 layers), greedy, batch 1, CPU, and the model's
default KNN-SSD profile (``$NEST_HOME/knn_ssd/<fingerprint>/default.json``), built beforehand
from the *train* split of the four built-in domains (``nest knn-ssd prompts / anchors /
search``; see benchmarks/results/knn_ssd.md for the exact commands). Evaluation prompts are the
first ``--per-domain`` prompts of each domain's *eval* split: disjoint from search and anchors.

Methods, run back to back per prompt in a rotating order (the machine is shared and noisy):

- ``greedy``: plain decoding (``decoding="greedy"``);
- ``fix:<domain>``: Self-SD with that domain's searched set on every prompt;
- ``mix``: Self-SD (Mix), the set searched on prompts of all domains;
- ``knn-ssd``: routed per prompt (1-NN cosine over the anchors).

Streams (paper §3.7): the domains are visited in a seeded random order and after each sample the
stream switches domain with probability ``mix_ratio`` (0: task-by-task blocks, 1: fully
interleaved); every eval prompt appears once per stream. Every method here routes or acts per
prompt and keeps no state across prompts, so a stream's totals depend only on its prompts, not on
their order: the three streams are the same per-prompt runs summed in stream order, and their
figures differ only through that composition (identical here, all prompts in each). Reported:
tokens/s ratio to greedy (pooled time), committed tokens per full-model pass (M), acceptance rate
alpha = accepted / drafted, router accuracy and cost, per-domain figures, and whether each
method's tokens equal greedy's.

Usage::

    python -m benchmarks.knn_ssd                        # 4 prompts/domain x 32 tokens
    python -m benchmarks.knn_ssd --per-domain 2 --max-new-tokens 16   # quick look
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any, Sequence

from benchmarks import harness


def stream_order(domains: list[str], per_domain: int, mix_ratio: float, seed: int) -> list[tuple[str, int]]:
    """(domain, prompt index) in stream order: switch domain with probability ``mix_ratio``
    after each sample (forced when the current domain is used up)."""
    rng = random.Random(seed)
    left = {d: list(range(per_domain)) for d in domains}
    cur = rng.choice(domains)
    order = []
    while any(left.values()):
        if not left[cur] or (order and rng.random() < mix_ratio):
            choices = [d for d in domains if left[d] and d != cur] or [cur]
            cur = rng.choice(choices)
        order.append((cur, left[cur].pop(0)))
    return order


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.knn_ssd", __doc__)
    ap.add_argument("--per-domain", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--profile", default=None, help="profile name or path (default: default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite knn_ssd.md from knn_ssd.json without running anything")
    args, run = harness.start(ap, argv)
    if args.render_only:
        result = json.loads((args.out / "knn_ssd.json").read_text())
        names, domains = list(result["overall"]), list(result["per_domain"])
        harness.write_result(args.out, "knn_ssd", result, render(result, names, domains), run)
        return 0

    import torch

    torch.set_num_threads(args.threads)
    from nest_integrations import NestConfig, NestEngine
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.knn_ssd.domains import DOMAINS, domain_prompts, provenance
    from nest_integrations.knn_ssd.profile import MIXED, load_profile, profile_path
    from nest_integrations.knn_ssd.router import Router
    from nest_integrations.lm.hf import HFLanguageModel

    lm = HFLanguageModel.from_default()
    prof = load_profile(lm, args.profile)
    missing = [d for d in (*DOMAINS, MIXED) if d not in prof.skips]
    if missing:
        raise SystemExit(f"the profile lacks skip sets for {missing}: run `nest knn-ssd search`")
    router = Router(prof)
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(), decoding="greedy")
    methods: dict[str, tuple[str, dict[str, Any]]] = {"greedy": ("greedy", {})}
    for d in DOMAINS:
        methods[f"fix:{d}"] = ("knn-ssd", {"profile": prof, "domain": d})
    methods["mix"] = ("knn-ssd", {"profile": prof, "domain": MIXED})
    methods["knn-ssd"] = ("knn-ssd", {"profile": prof})

    prompts = {d: domain_prompts(d, "eval", args.per_domain) for d in DOMAINS}
    runs: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    routes: dict[tuple[str, int], dict[str, Any]] = {}
    names = list(methods)
    engine.generate("warm up", max_new_tokens=4)
    k = 0
    for d in DOMAINS:
        for i, p in enumerate(prompts[d]):
            ids = lm.tokenize(p.text)
            t0 = time.perf_counter()
            route = router.route(lm, ids)
            routes[(d, i)] = {"domain": route.domain, "set": route.skip_name,
                              "similarity": round(route.similarity, 4),
                              "ms": 1000 * (time.perf_counter() - t0)}
            res_by = {}
            rot = names[k % len(names):] + names[: k % len(names)]
            k += 1
            for name in rot:
                decoding, opts = methods[name]
                r = engine.generate(p.text, max_new_tokens=args.max_new_tokens,
                                    decoding=decoding, drafter_options=opts)
                s = r.stats
                res_by[name] = {"tokens": s.new_tokens, "seconds": s.time_total,
                                "passes": s.forward_passes, "steps": s.verify_steps,
                                "drafted": s.drafted_tokens, "accepted": s.accepted_tokens,
                                "ids": r.token_ids}
            ref = res_by["greedy"]["ids"]
            for name in names:
                res_by[name]["exact"] = res_by[name].pop("ids") == ref
            runs[(d, i)] = res_by
            print(f"{d} #{i}: route {routes[(d, i)]['set']} "
                  + " ".join(f"{n}={v['tokens'] / v['seconds']:.1f}" for n, v in res_by.items()),
                  file=sys.stderr, flush=True)

    def agg(keys: list[tuple[str, int]], name: str) -> dict[str, Any]:
        rs = [runs[key][name] for key in keys]
        g = [runs[key]["greedy"] for key in keys]
        tok, sec = sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs)
        drafted, acc = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
        passes = sum(r["passes"] - 1 for r in rs)  # full-model passes after the prefill
        return {
            "tokens_per_s": tok / sec,
            "ratio_to_greedy": (tok / sec) / (sum(r["tokens"] for r in g) / sum(r["seconds"] for r in g)),
            "tokens_per_pass": tok / passes if passes else 0.0,
            "acceptance": acc / drafted if drafted else 0.0,
            "exact": all(r["exact"] for r in rs),
        }

    all_keys = [(d, i) for d in DOMAINS for i in range(args.per_domain)]
    streams = {}
    for ratio in (0.0, 0.5, 1.0):
        order = stream_order(list(DOMAINS), args.per_domain, ratio, args.seed)
        switches = sum(a[0] != b[0] for a, b in zip(order, order[1:]))
        streams[str(ratio)] = {"switches": switches, "order": [d for d, _ in order],
                               "methods": {n: agg(order, n) for n in names}}
    per_domain = {d: {n: agg([(d, i) for i in range(args.per_domain)], n) for n in names}
                  for d in DOMAINS}
    correct = sum(routes[key]["domain"] == key[0] for key in all_keys)
    result = {
        "model": lm.fingerprint,
        "profile": str(profile_path(lm, args.profile)),
        "skip_sets": {d: {"skipped": s.size, **s.to_dict(), **{
            k2: prof.search.get(d, {}).get(k2) for k2 in ("value", "trials", "objective")}}
            for d, s in sorted(prof.skips.items())},
        "router": {"accuracy": correct / len(all_keys), "correct": correct, "n": len(all_keys),
                   "mean_ms": sum(r["ms"] for r in routes.values()) / len(routes),
                   "min_similarity": router.min_similarity,
                   "fallbacks": sum(r["set"] == MIXED for r in routes.values())},
        "settings": {"per_domain": args.per_domain, "max_new_tokens": args.max_new_tokens,
                     "threads": args.threads, "seed": args.seed, "prompts": provenance()},
        "overall": {n: agg(all_keys, n) for n in names},
        "streams": streams,
        "per_domain": per_domain,
        "routes": {f"{d}#{i}": r for (d, i), r in routes.items()},
    }
    harness.write_result(args.out, "knn_ssd", result, render(result, names, list(DOMAINS)), run)
    return 0


def render(r: dict[str, Any], names: list[str], domains: list[str]) -> str:
    s = r["settings"]
    lines = [
        "# KNN-SSD benchmark (`python -m benchmarks.knn_ssd`)",
        "",
        f"Model {r['model']}, greedy, {s['per_domain']} eval prompts per domain x "
        f"{s['max_new_tokens']} new tokens, {s['threads']} torch thread(s). "
        f"Profile: `{r['profile']}`. Eval prompts: the *eval* split of each domain, disjoint "
        "from the search and anchor prompts (*train* split).",
        "",
        "## Skip sets (searched, objective and value as stored in the profile)",
        "",
        "| set | skipped / 60 | attention skipped | MLP skipped | search value | trials |",
        "|---|---|---|---|---|---|",
    ]
    for d, v in r["skip_sets"].items():
        lines.append(f"| {d} | {v['skipped']} | {v['attn']} | {v['mlp']} | "
                     f"{v.get('value')} ({v.get('objective')}) | {v.get('trials')} |")
    ro = r["router"]
    lines += [
        "",
        f"Router: {ro['correct']}/{ro['n']} held-out prompts routed to their own domain "
        f"(accuracy {ro['accuracy']:.2f}); {ro['fallbacks']} fell back to the Mix set "
        f"(min similarity {ro['min_similarity']:.3f}); routing cost {ro['mean_ms']:.1f} ms per "
        "prompt (one base-model forward over the prompt + 40 cosines).",
        "",
        "## Streams",
        "",
        "Every method routes (or not) per prompt and keeps no state across prompts, so a "
        "stream's totals depend only on which prompts it holds, not on their order: the three "
        "streams below hold the same 16 prompts in different orders, so their figures are the "
        "same per-prompt runs summed and come out identical. What the streams test is how one "
        "fixed set does on a mixture of domains against per-prompt routing.",
        "",
    ]
    for ratio, st in r["streams"].items():
        lines += [f"### mix ratio {ratio} ({st['switches']} domain switches)", "",
                  "| method | tok/s | vs greedy | tokens per full pass (M) | acceptance | == greedy |",
                  "|---|---|---|---|---|---|"]
        for n in names:
            m = st["methods"][n]
            lines.append(f"| {n} | {m['tokens_per_s']:.1f} | {m['ratio_to_greedy']:.2f}x | "
                         f"{m['tokens_per_pass']:.2f} | {m['acceptance']:.2f} | {m['exact']} |")
        lines.append("")
    lines += ["## Per domain (tokens/s ratio to greedy; M; acceptance)", "",
              "| method | " + " | ".join(domains) + " |",
              "|---|" + "---|" * len(domains)]
    for n in names:
        cells = [f"{r['per_domain'][d][n]['ratio_to_greedy']:.2f}x; "
                 f"{r['per_domain'][d][n]['tokens_per_pass']:.2f}; "
                 f"{r['per_domain'][d][n]['acceptance']:.2f}" for d in domains]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
