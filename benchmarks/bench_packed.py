"""The bf16 CPU kernels (``lm.packing``: prepacked linear weights; ``lm.rowwise_attention``:
verify attention row by row) against plain bf16 and fp32, side by side in one run: the cost
curve c(T), greedy decode speed, whether a verify pass equals one-token steps bit for bit,
greedy agreement and held-out perplexity.

Four copies of the embedded model: bf16 as our engine loads it (packed + row-wise), bf16 packed
with transformers' SDPA, plain bf16 (``pack_weights=False``, SDPA: what a transformers user
gets) and fp32 (the CPU default). Every measurement interleaves them.

- **c(T)**: one forward of T new tokens after a 120-token cache, the median of ``--repeats``.
- **exact rows**: of 9-token verify passes after 100- and 600-token caches, how many rows equal
  the one-token steps' logits bit for bit.
- **greedy**: HF ``generate``, greedy, ``--new-tokens`` tokens on ``--prompts`` held-out
  Wikipedia leads (their first 96 tokens): ms per token pooled, and how many outputs equal
  plain bf16's and fp32's token for token.
- **perplexity**: of the same leads' next 160 tokens after their first 32.

Usage::

    NEST_THREADS=1 python benchmarks/bench_packed.py --threads 1
    python benchmarks/bench_packed.py --prompts 2 --new-tokens 8 --repeats 2 --out /tmp/packed

Writes ``packed_weights.md`` and ``packed_weights.json`` (``--out``, default
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKENS = (1, 2, 3, 5, 9, 17, 33)
NAMES = ("bf16 engine", "bf16 packed", "bf16 plain", "fp32")
LABELS = {
    "bf16 engine": "bf16, packed + row-wise attention (our engine)",
    "bf16 packed": "bf16, packed, SDPA",
    "bf16 plain": "bf16 as transformers loads it",
    "fp32": "fp32 (the CPU default)",
}


def leads(n: int) -> list[str]:
    from nest_integrations.evaluation.corpora import load_wiki_leads

    texts, _ = load_wiki_leads(download=False)
    pool = sorted((v.extract for v in texts.values() if len(v.extract) > 1200), key=len)
    step = max(1, len(pool) // max(1, n))
    return pool[::step][:n]


def exact_rows(lm: Any) -> tuple[int, int]:
    """(rows equal bit for bit, rows) of 9-token verifies against one-token steps."""
    import torch

    same = total = 0
    for context in (100, 600):
        prompt = list(range(3000, 3000 + context))
        new = list(range(500, 509))
        cache = lm.new_cache()
        lm.forward(prompt, cache, last=1)
        steps = [lm.forward([t], cache)[0][0] for t in new]
        cache = lm.new_cache()
        lm.forward(prompt, cache, last=1)
        verify, _ = lm.forward(new, cache)
        same += sum(bool(torch.equal(a, b)) for a, b in zip(steps, verify))
        total += len(new)
    return same, total


def generate(lm: Any, ids: list[int], new: int) -> tuple[list[int], float]:
    import torch

    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, temperature=None,
                                top_p=None, top_k=None, pad_token_id=0)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def perplexity(lm: Any, ids: list[int], context: int = 32) -> tuple[float, int]:
    import torch

    cache = lm.new_cache()
    logits, _ = lm.forward(ids[:-1], cache)
    logp = torch.log_softmax(logits[context - 1:].float(), -1)
    target = torch.tensor(ids[context:])
    nll = -logp.gather(1, target[:, None]).sum().item()
    return nll, len(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()

    from verify_cost import verify_ms  # one forward of T tokens after a 120-token cache

    from nest_integrations.lm import backend
    from nest_integrations.lm.hf import HFLanguageModel

    threads = backend.configure_threads(args.threads)
    lms = {
        "bf16 engine": HFLanguageModel.from_default(dtype="bf16"),
        "bf16 packed": HFLanguageModel.from_default(dtype="bf16", attn_implementation="sdpa"),
        "bf16 plain": HFLanguageModel.from_default(dtype="bf16", pack_weights=False,
                                                   attn_implementation="sdpa"),
        "fp32": HFLanguageModel.from_default(dtype="fp32"),
    }
    if not (lms["bf16 engine"].packed_linears and lms["bf16 engine"].rowwise_attention):
        raise SystemExit("prepacked bf16 linears are not available in this torch build")
    load0 = os.getloadavg()
    for lm in lms.values():
        verify_ms(lm, 2, 1, False)  # warm-up
    cost: dict[str, dict[int, list[float]]] = {n: {t: [] for t in TOKENS} for n in lms}
    for _ in range(args.repeats):
        for t in TOKENS:
            for n, lm in lms.items():
                cost[n][t].append(verify_ms(lm, t, 1, False))
    curve = {n: {t: statistics.median(v) for t, v in c.items()} for n, c in cost.items()}

    exact = {n: exact_rows(lm) for n, lm in lms.items()}
    tok = lms["fp32"]
    texts = leads(args.prompts)
    outs: dict[str, list[list[int]]] = {n: [] for n in lms}
    secs = dict.fromkeys(lms, 0.0)
    nll = dict.fromkeys(lms, 0.0)
    count = dict.fromkeys(lms, 0)
    for i, text in enumerate(texts):
        ids = tok.tokenize(text)
        order = list(lms)[i % len(lms):] + list(lms)[: i % len(lms)]
        for n in order:
            out, s = generate(lms[n], ids[:96], args.new_tokens)
            outs[n].append(out)
            secs[n] += s
            a, b = perplexity(lms[n], ids[:192])
            nll[n] += a
            count[n] += b
    same = {n: {ref: sum(x == y for x, y in zip(outs[n], outs[ref])) for ref in lms}
            for n in lms}
    tokens = args.new_tokens * len(texts)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": threads, "native_bf16": backend.cpu_has_native_bf16(),
        "load": [list(load0), list(os.getloadavg())],
        "packed_linears": lms["bf16 engine"].packed_linears,
        "exact_rows": {n: list(v) for n, v in exact.items()},
        "curve_ms": {n: {str(t): v for t, v in c.items()} for n, c in curve.items()},
        "greedy_ms_per_token": {n: 1e3 * secs[n] / tokens for n in lms},
        "identical": same, "prompts": len(texts), "new_tokens": args.new_tokens,
        "perplexity": {n: math.exp(nll[n] / count[n]) for n in lms},
        "fingerprints_equal": len({lm.fingerprint for lm in lms.values()}) == 1,
    }
    base = result["greedy_ms_per_token"]["bf16 plain"]
    lines = [
        "# bf16 CPU kernels against plain bf16 and fp32 (`benchmarks/bench_packed.py`)",
        "",
        f"{result['date']}; the embedded SmolLM2-135M-Instruct on CPU, {threads} torch "
        f"thread(s), native bf16: {result['native_bf16']}; load average {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end (a shared VM: read the ratios). "
        f"{result['packed_linears']} linears prepacked; the three models have the same "
        f"fingerprint: {result['fingerprints_equal']}.",
        "",
        "Command: `" + " ".join(["python", "benchmarks/bench_packed.py", *sys.argv[1:]]) + "`",
        "",
        f"## c(T): one forward of T new tokens after a 120-token cache (median of "
        f"{args.repeats}, interleaved)",
        "",
        "| model | " + " | ".join(f"c({t}) ms" for t in TOKENS)
        + " | c(9)/c(1) | c(1) vs plain bf16 | verify rows == one-token steps |",
        "|---|" + "---|" * (len(TOKENS) + 3),
    ]
    for n in lms:
        c = curve[n]
        lines.append(f"| {LABELS[n]} | " + " | ".join(f"{c[t]:.0f}" for t in TOKENS)
                     + f" | {c[9] / c[1]:.2f} | {curve['bf16 plain'][1] / c[1]:.2f}x | "
                     f"{exact[n][0]}/{exact[n][1]} |")
    lines += [
        "",
        f"## Greedy decoding: HF `generate`, {args.new_tokens} tokens on {len(texts)} held-out "
        "Wikipedia leads (first 96 tokens), rotating order",
        "",
        "| model | ms / token | speed vs plain bf16 | outputs == our engine's bf16 "
        "| == plain bf16 | == fp32 | perplexity (next 160 tokens) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in lms:
        ms = result["greedy_ms_per_token"][n]
        s = same[n]
        lines.append(f"| {LABELS[n]} | {ms:.1f} | {base / ms:.2f}x | {s['bf16 engine']}/{len(texts)} | "
                     f"{s['bf16 plain']}/{len(texts)} | {s['fp32']}/{len(texts)} | "
                     f"{result['perplexity'][n]:.3f} |")
    md = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "packed_weights.md").write_text(md, encoding="utf-8")
    (out / "packed_weights.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
