"""Token keys from the feed-forward input (the paper's, ``ffn_input``) against the final norm's
output (``final_norm``: what llama.cpp's embeddings give, the llama.cpp backend's default keys),
on the same model and text (issue 35).

SmolLM2-135M-Instruct loaded once per backend and key source: torch (``--dtype``) and, when
llama-cpp-python is installed, llama.cpp (the default Q8_0 GGUF; ``ffn_input`` through its eval
callback). The memory:
the first sample Wikipedia leads up to ~5k tokens, encoded as passages and kept as the default
fp16 codec keeps them; key j's value is the passage's token j (``TokenMemory``). The queries:
every token state of held-out leads (the last ones), whose value is the next token. Reported per
key source, with the ``grounded`` preset's r, mu, alpha and tau:

- the squared distance to the nearest and to the r-th neighbour (the scale mu meets);
- the mean RRC lambda (Eq. 4; the weight of p_LM);
- how often the nearest neighbour's value is the true next token, and the mean p_kNN of it;
- perplexity of the held-out tokens under p_LM alone and under the mixture (Eq. 3);

and the overlap of each one's top-r neighbour sets (r = 1, 64, 1,024) with torch ``ffn_input``'s.
On llama.cpp, the cost of each key source per step: 40 greedy steps after a 96-token prompt,
with keys (as NEST's steps) and without (as greedy's), interleaved, medians of 7. With
``--answers RECORDS`` (the records of ``benchmarks.quality --set robust --systems
default,default~final_norm --reference default``) the paired answers on the dev split are added.

Usage: python -m benchmarks.key_source [--answers robust_dev_keys.jsonl]
(about 2 minutes on 2 cores). Results: benchmarks/results/key_source.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from benchmarks import harness
from benchmarks.bf16_keys import memory_and_queries, recall, topk
from benchmarks.harness.prompts import SAMPLE_LEADS as SAMPLE
from nest_integrations.config import NestConfig
from nest_integrations.core.mixture import knn_weights, rrc_ratio, rrc_weight
from nest_integrations.lm import backend
from nest_integrations.lm.hf import HFLanguageModel

SOURCES = ("ffn_input", "final_norm")
REFERENCE = ("torch", "ffn_input")


def measure(lm: HFLanguageModel, passages: list[list[int]], queries: list[list[int]],
            cfg: NestConfig, r: int) -> dict[str, Any]:
    """One key source's memory, queries, neighbours and scores."""
    mem = torch.from_numpy(np.concatenate(lm.encode_passages(passages))
                           .astype(np.float16).astype(np.float32))
    values = torch.tensor([t for p in passages for t in p])
    states, targets, lm_logp = [], [], []
    for q in queries:
        logits, keys = lm.forward(q, lm.new_cache())
        tgt = torch.tensor(q[1:])
        states.append(keys[:-1].float())
        targets.append(tgt)
        lm_logp.append(torch.log_softmax(logits[:-1].float(), -1).gather(1, tgt[:, None])[:, 0])
    qs, tgt, lm_lp = torch.cat(states), torch.cat(targets), torch.cat(lm_logp)
    dist, idx = topk(qs, mem, r)
    lam = rrc_weight(rrc_ratio(dist), cfg.rrc_offset, cfg.rrc_scale)
    hit = values[idx] == tgt[:, None]
    p_knn = (knn_weights(dist, cfg.knn_temperature) * hit).sum(-1)
    mix = lam * lm_lp.exp() + (1 - lam) * p_knn
    return {"mem": mem, "queries": qs, "idx": idx, "tokens": int(len(tgt)),
            "d1": float(dist[:, 0].median()), "dr": float(dist[:, -1].median()),
            "lambda": float(lam.mean()), "top1_next": float(hit[:, 0].float().mean()),
            "p_knn_true": float(p_knn.mean()), "ppl_lm": math.exp(float(-lm_lp.mean())),
            "ppl_mix": math.exp(float(-mix.clamp_min(1e-30).log().mean()))}


def load(backend_name: str, source: str, dtype: str) -> Any:
    """The embedded model on ``backend_name`` with keys from ``source`` (None: llama.cpp is not
    installed)."""
    if backend_name == "torch":
        return HFLanguageModel.from_default(dtype=dtype, key_source=source)
    try:
        from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel

        return LlamaCppLanguageModel.from_default(key_source=source)
    except ImportError:
        return None


def step_cost(lms: dict[str, Any], text: str, steps: int = 40, repeats: int = 7
              ) -> dict[str, dict[str, float]]:
    """ms per greedy step of each llama.cpp model, with and without keys (interleaved)."""
    import time

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for source, lm in lms.items():
            ids = lm.tokenize(text)[:96]
            for mode in ("logits", "keys"):
                step = lm.forward if mode == "keys" else lm.forward_logits
                cache = lm.new_cache()
                logits, _ = lm.forward_logits(ids, cache, last=1)
                t0 = time.perf_counter()
                for _ in range(steps):
                    logits, _ = step([int(logits[-1].argmax())], cache)
                times.setdefault((source, mode), []).append(
                    (time.perf_counter() - t0) / steps * 1e3)
                lm.release_cache(cache)
    return {s: {m: float(np.median(times[(s, m)])) for m in ("logits", "keys")} for s in lms}


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.key_source", __doc__)
    ap.add_argument("--memory-tokens", type=int, default=5000)
    ap.add_argument("--query-texts", type=int, default=12)
    ap.add_argument("--dtype", default="auto", help="model weights (default: this machine's)")
    ap.add_argument("--answers", type=Path, nargs="*", default=[], metavar="JSONL",
                    help="records of paired robust runs (default vs default~final_norm)")
    args, run = harness.start(ap, argv)
    threads = backend.configure_threads()
    texts = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")]
    cfg = NestConfig.from_preset("grounded")
    r = cfg.n_neighbors
    res: dict[tuple[str, str], dict[str, Any]] = {}
    llama: dict[str, Any] = {}
    for backend_name in ("torch", "llama.cpp"):
        for source in SOURCES:
            lm = load(backend_name, source, args.dtype)
            if lm is None:
                break
            passages, n, queries = memory_and_queries(lm, texts, args.memory_tokens,
                                                      args.query_texts)
            res[(backend_name, source)] = measure(lm, passages, queries, cfg, r)
            if backend_name == "llama.cpp":
                llama[source] = lm
            else:
                dtype = str(lm.dtype).removeprefix("torch.")
                del lm
    a = res[REFERENCE]
    lines = [
        "# Token keys: the feed-forward input (the paper's) against the final norm's output "
        "(llama.cpp's embeddings)", "",
        f"Model: the embedded SmolLM2-135M-Instruct, torch in {dtype} and llama.cpp "
        f"({'Q8_0' if llama else 'not installed'}), {threads} thread(s). Memory: "
        f"{len(passages)} sample Wikipedia leads, {n} tokens (fp16 keys, as a store keeps them); "
        f"queries: {a['tokens']} token states of {len(queries)} held-out leads, each predicting "
        f"its next token. The `grounded` preset's r = {r}, mu = {cfg.knn_temperature}, alpha = "
        f"{cfg.rrc_offset}, tau = {cfg.rrc_scale}; lambda weights p_LM. Overlap: of the "
        "top-k neighbour sets with torch `ffn_input`'s (same queries and memory texts).", "",
        "| backend | key source | median d(nearest) | median d(r-th) | mean lambda | nearest's "
        "value = next token | mean p_kNN(next token) | perplexity p_LM | perplexity mixture | "
        "overlap top-1 / 64 / 1024 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (backend_name, source), x in res.items():
        ov = [recall(a["idx"][:, :k], x["idx"][:, :k]) for k in (1, 64, r)]
        x["overlap"] = ov
        lines.append(f"| {backend_name} | `{source}` | {x['d1']:.1f} | {x['dr']:.1f} | "
                     f"{x['lambda']:.3f} | {x['top1_next']:.3f} | {x['p_knn_true']:.3f} | "
                     f"{x['ppl_lm']:.2f} | {x['ppl_mix']:.2f} | "
                     + " / ".join(f"{v:.3f}" for v in ov) + " |")
    if llama:
        cost = step_cost(llama, texts[-1])
        lines += ["", "llama.cpp, ms per step (40 greedy steps after a 96-token prompt; "
                  "interleaved, medians of 7):", "",
                  "| key source | steps without keys (greedy) | steps with keys (NEST) |",
                  "|---|---|---|"]
        lines += [f"| `{s}` | {c['logits']:.2f} | {c['keys']:.2f} |" for s, c in cost.items()]
        for lm in llama.values():
            lm.close()
    else:
        cost = {}
    summary: dict[str, Any] = {
        "tokens": n, "queries": a["tokens"], "llama_cpp_step_ms": cost,
        "sources": {f"{b}:{s}": {k: v for k, v in x.items() if not isinstance(v, torch.Tensor)}
                    for (b, s), x in res.items()}}
    if args.answers:
        import collections

        from benchmarks import robust

        systems = ["default", "default~final_norm"]
        records = [r for path in args.answers for r in harness.read_jsonl(path)]
        rows = robust.summarize(records, systems, "default")
        texts_of: dict[Any, dict[str, str]] = collections.defaultdict(dict)
        for rec in records:
            texts_of[(rec["set"], rec["family"], rec["prompt"])][rec["system"]] = rec["text"]
        same = sum(len(set(t.values())) == 1 for t in texts_of.values())
        routes = collections.Counter((rec["set"], rec["decoding"]) for rec in records
                                     if rec["system"] == "default")
        lines += ["", "## Answers, paired (`default~final_norm`: the default with final-norm "
                  "keys, on torch)", "",
                  "Commands: `python -m benchmarks.quality --set robust --split dev --sets "
                  "SETS --systems default,default~final_norm --reference default --threads 1 "
                  "--stem STEM` with SETS = `entities,open` and `completions`; records given "
                  f"to `--answers`. Identical answers: {same} of {len(texts_of)} prompts. The "
                  "answer policy's decoding per set (the default's): "
                  + ", ".join(f"{s} {d} {n}" for (s, d), n in sorted(routes.items())) + ".",
                  "", robust.markdown(rows, "default").split("\n", 2)[2].replace("## ", "### ")]
        summary["answers"] = {"rows": rows, "identical": same, "prompts": len(texts_of)}
    harness.write_result(args.out, "key_source", summary, "\n".join(lines) + "\n", run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
