"""Are token keys encoded in fp32 and in bf16 interchangeable? (issue 21, "choose by measurement")

SmolLM2-135M-Instruct (embedded default) loaded twice, fp32 and bf16 (``dtype="bf16"``). The
memory: the first sample Wikipedia texts up to ~5k tokens, encoded as passages by each model
and stored as the default fp16 codec does (fp16 round trip). The queries: every token state of
held-out sample texts (the last ones), from each model's own forward. Reported:

- per-key cosine similarity and relative error ||k_bf16 - k_fp32|| / ||k_fp32||;
- recall@r (r = 64, 1024) of the top-r neighbour sets against the all-fp32 reference, for a bf16
  model on a bf16 store (a fresh store) and on an fp32 store (an old store used under bf16), and
  the overlap of those two (is the old store as good as a re-encoded one?);
- the RRC lambda (default alpha, tau; r = 1024) of each case against the reference;
- passage-encoding speed of each dtype (ingest's key encoding).

Usage: python -m benchmarks.bf16_keys [--memory-tokens 5000] [--query-texts 12]
(about 1-2 minutes on 2 cores). Results: benchmarks/results/bf16_keys.md.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

import numpy as np
import torch

from benchmarks import harness
from benchmarks.harness.prompts import SAMPLE_LEADS as SAMPLE
from nest_integrations.config import NestConfig
from nest_integrations.lm import backend
from nest_integrations.lm.hf import HFLanguageModel


def topk(q: torch.Tensor, mem: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared L2 distances (fp32, as ``TokenMemory.search``) and indices of the top r."""
    dist = (q * q).sum(-1, keepdim=True) + (mem * mem).sum(-1)[None] - 2.0 * (q @ mem.T)
    top = torch.topk(dist.clamp_min(0.0), min(r, mem.shape[0]), dim=-1, largest=False,
                     sorted=True)
    return top.values, top.indices


def recall(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean |a_i & b_i| / r over rows of two (T, r) index sets."""
    return float(np.mean([len(set(x.tolist()) & set(y.tolist())) / a.shape[1]
                          for x, y in zip(a, b)]))


def memory_and_queries(lm: Any, texts: list[str], memory_tokens: int, query_texts: int
                       ) -> tuple[list[list[int]], int, list[list[int]]]:
    """(memory passages: the first texts up to ``memory_tokens`` tokens, their token count,
    queries: the last ``query_texts`` texts), as token ids of ``lm``."""
    passages, n = [], 0
    for text in texts[:-query_texts]:
        ids = lm.tokenize(text)
        if n + len(ids) > memory_tokens:
            break
        passages.append(ids)
        n += len(ids)
    return passages, n, [lm.tokenize(t) for t in texts[-query_texts:]]


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.bf16_keys", __doc__)
    ap.add_argument("--memory-tokens", type=int, default=5000)
    ap.add_argument("--query-texts", type=int, default=12)
    args, run = harness.start(ap, argv)
    threads = backend.configure_threads()
    texts = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")]
    lms = {name: HFLanguageModel.from_default(dtype=name) for name in ("fp32", "bf16")}
    lm32 = lms["fp32"]
    passages, n, queries = memory_and_queries(lm32, texts, args.memory_tokens, args.query_texts)
    mem, qs, secs = {}, {}, {}
    for name, lm in lms.items():
        lm.encode_passages(passages[:4])  # warm-up
        t0 = time.perf_counter()
        keys = lm.encode_passages(passages)
        secs[name] = time.perf_counter() - t0
        mem[name] = torch.from_numpy(np.concatenate(keys).astype(np.float16).astype(np.float32))
        qs[name] = torch.cat([lm.forward(q, lm.new_cache())[1] for q in queries])
    a, b = mem["fp32"], mem["bf16"]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
    qcos = torch.nn.functional.cosine_similarity(qs["fp32"], qs["bf16"], dim=-1)
    cfg = NestConfig()
    lines = [
        "# Token keys encoded in fp32 and in bf16", "",
        f"memory: {len(passages)} passages, {n} tokens; queries: {len(qs['fp32'])} token states "
        f"of {len(queries)} held-out texts; torch threads {threads}",
        "",
        "| keys fp32 vs bf16 | mean | min | p1 |",
        "|---|---|---|---|",
        f"| cosine (memory keys) | {cos.mean():.5f} | {cos.min():.5f} | "
        f"{cos.quantile(0.01):.5f} |",
        f"| relative error (memory keys) | {rel.mean():.4f} | max {rel.max():.4f} | "
        f"p99 {rel.quantile(0.99):.4f} |",
        f"| cosine (query states) | {qcos.mean():.5f} | {qcos.min():.5f} | "
        f"{qcos.quantile(0.01):.5f} |",
        "",
        "| r | recall bf16 query + bf16 store | recall bf16 query + fp32 store | "
        "overlap of the two | mean abs d lambda (bf16 store / fp32 store) | "
        "max abs d lambda (bf16 / fp32 store) |",
        "|---|---|---|---|---|---|",
    ]
    for r in (64, 1024):
        ref_d, ref_i = topk(qs["fp32"], a, r)
        bb_d, bb_i = topk(qs["bf16"], b, r)
        bf_d, bf_i = topk(qs["bf16"], a, r)
        lam = [torch.sigmoid((d[:, 0] / d[:, -1] - cfg.rrc_offset) / cfg.rrc_scale)
               for d in (ref_d, bb_d, bf_d)]
        lines.append(
            f"| {r} | {recall(ref_i, bb_i):.3f} | {recall(ref_i, bf_i):.3f} | "
            f"{recall(bb_i, bf_i):.3f} | {(lam[1] - lam[0]).abs().mean():.4f} / "
            f"{(lam[2] - lam[0]).abs().mean():.4f} | {(lam[1] - lam[0]).abs().max():.3f} / "
            f"{(lam[2] - lam[0]).abs().max():.3f} |"
        )
        if r == 1024:
            top1 = [float((ref_i[:, 0] == x[:, 0]).float().mean()) for x in (bb_i, bf_i)]
            lines.append("")
            lines.append(f"nearest neighbour identical to the fp32 reference: bf16 store "
                         f"{top1[0]:.3f}, fp32 store {top1[1]:.3f}; mean lambda fp32 "
                         f"{lam[0].mean():.4f}, bf16 store {lam[1].mean():.4f}, "
                         f"fp32 store under bf16 {lam[2].mean():.4f}")
    lines.append("")
    lines.append(f"passage encoding ({n} tokens): fp32 {secs['fp32']:.2f} s "
                 f"({n / secs['fp32']:.0f} tok/s), bf16 {secs['bf16']:.2f} s "
                 f"({n / secs['bf16']:.0f} tok/s): {secs['fp32'] / secs['bf16']:.2f}x")
    summary = {"passages": len(passages), "tokens": n, "encode_s": secs,
               "cosine_mean": float(cos.mean()), "query_cosine_mean": float(qcos.mean())}
    harness.write_result(args.out, "bf16_keys", summary, "\n".join(lines) + "\n", run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
