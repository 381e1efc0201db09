"""Decoding speed: NEST vs HF greedy ``generate`` vs HF prompt-lookup ``generate``, in one run.

Setting: the shipped sample corpus (``nest_integrations/data/sample``: 300 Wikipedia leads +
40 pydoc topics) split into <= 200-token passages, BM25 stage-1 retrieval (b = 40), token keys
in the on-disk key store (computed once before timing, as ``nest ingest`` does), the embedded
SmolLM2-135M-Instruct, greedy decoding, batch size 1.

Prompts (fixed, corpus-grounded): the opening tokens of sample passages to continue (Wikipedia
leads and pydoc topics, raw text) and "Write a short biography of X." chat prompts for people
in the corpus. Per prompt, every method runs back to back in a rotating order (the machine is
noisy, so ratios are measured side by side):

- **NEST** (``paper`` preset, gamma 5e-4): retrieval + key loading + decoding, all timed;
- **HF greedy**: ``model.generate(do_sample=False)`` on the same prompt;
- **HF prompt lookup + passages**: ``generate(prompt_lookup_num_tokens=10,
  max_matching_ngram_size=2)`` with the top-3 retrieved passages in the prompt (the engine's RA
  template), retrieval time included, so lookup has corpus text to copy;
- **HF prompt lookup**: the same without passages.

Reported: tokens/s per method (pooled and per prompt kind), NEST/greedy ratios (pooled and the
geometric mean of per-prompt ratios), NEST's attribution ratio, mean tokens accepted per verify
step and the share of its time spent in retrieval + key loading + kNN. Targets (reported, not
asserted): NEST >= 2x HF greedy tokens/s (aim 3x), retrieval + kNN <= 10% of step time,
attribution >= 50%.

Writes ``benchmarks/results/speed.json`` and ``speed.md``. Usage::

    python benchmarks/bench_speed.py                       # 12 prompts x 96 tokens
    python benchmarks/bench_speed.py --prompts 4 --max-new-tokens 32   # quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

METHODS = ("nest", "greedy", "lookup+passages", "lookup")
LABELS = {
    "nest": "NEST (paper preset)",
    "greedy": "HF greedy generate",
    "lookup+passages": "HF prompt lookup, passages in prompt",
    "lookup": "HF prompt lookup, plain prompt",
}


def sha1(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


def build_prompts(lm: Any, passages: list, n: int, prefix_tokens: int) -> list[dict[str, Any]]:
    """A fixed prompt set: half Wikipedia-lead openings, a quarter pydoc openings, a quarter
    biography requests (deterministic: sha1 order)."""
    from nest_integrations.evaluation.tasks import cut_lead

    first = {}
    for p in passages:  # the first passage of each document
        if p.metadata.get("chunk_index", 0) == 0 and p.doc_id not in first:
            first[p.doc_id] = p
    wiki = sorted(
        (
            p
            for p in first.values()
            if p.metadata.get("title") and str(p.metadata.get("source", "")).endswith(".jsonl")
        ),
        key=lambda p: sha1(p.doc_id),
    )
    pydoc = sorted(
        (p for p in first.values() if str(p.metadata.get("source", "")).endswith(".txt")),
        key=lambda p: sha1(p.doc_id),
    )
    people = [p for p in wiki if p.metadata.get("topic") == "People"]
    others = [p for p in wiki if p.metadata.get("topic") != "People"]
    n_bio = max(1, n // 4)
    n_pydoc = max(1, n // 4)
    n_wiki = max(1, n - n_bio - n_pydoc)
    prompts = []
    for kind, pool, count in (
        ("wiki-completion", others, n_wiki),
        ("pydoc-completion", pydoc, n_pydoc),
    ):
        for p in pool:
            if sum(q["kind"] == kind for q in prompts) >= count:
                break
            cut = cut_lead(lm, p.text, prefix_tokens, 16)
            if cut is not None:
                prompts.append({"kind": kind, "id": p.doc_id, "prompt": cut[0], "chat": False})
    for p in people[:n_bio]:
        title = p.metadata["title"]
        prompts.append(
            {
                "kind": "biography",
                "id": p.doc_id,
                "chat": True,
                "prompt": f"Write a short biography of {title}.",
            }
        )
    return prompts


def hf_generate(lm: Any, ids: list[int], max_new: int, lookup: bool) -> tuple[list[int], float]:
    """(generated ids cut at EOS, seconds) of HF ``generate``, greedy."""
    import torch

    from nest_integrations.evaluation.metrics import cut_at_eos

    input_ids = torch.tensor([ids], dtype=torch.long, device=lm.device)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=sorted(lm.eos_token_ids),
        pad_token_id=sorted(lm.eos_token_ids)[0],
        attention_mask=torch.ones_like(input_ids),
    )
    if lookup:
        kwargs.update(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(input_ids, **kwargs)
    seconds = time.perf_counter() - t0
    return cut_at_eos(out[0, len(ids) :].tolist(), lm.eos_token_ids), seconds


def run_method(
    method: str, engine: Any, retriever: Any, prompt: dict, max_new: int, cfg: Any
) -> dict[str, Any]:
    lm = engine.lm
    p = [{"role": "user", "content": prompt["prompt"]}] if prompt["chat"] else prompt["prompt"]
    if method == "nest":
        r = engine.generate(p, max_new_tokens=max_new, config=cfg)
        st = r.stats
        return {
            "tokens": st.new_tokens,
            "seconds": st.time_total,
            "text": r.text,
            "attributed": st.attributed_tokens,
            "verify_steps": st.verify_steps,
            "accepted": st.accepted_tokens,
            "drafted": st.drafted_tokens,
            "forwards": st.forward_passes,
            "time_retrieval": st.time_retrieval,
            "time_keys": st.time_keys,
            "time_knn": st.time_knn,
            "time_lm": st.time_lm,
        }
    t0 = time.perf_counter()
    ra = []
    if method == "lookup+passages":
        ra = retriever.retrieve(prompt["prompt"], cfg.n_passages)[:3]
    ids = engine.prompt_ids(p, ra)
    prep = time.perf_counter() - t0
    out, seconds = hf_generate(lm, ids, max_new, lookup=method != "greedy")
    return {
        "tokens": len(out),
        "seconds": seconds + prep,
        "text": lm.detokenize(out),
        "prompt_tokens": len(ids),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def tps(m: str, sub: list) -> float | None:
        t = sum(r[m]["tokens"] for r in sub)
        s = sum(r[m]["seconds"] for r in sub)
        return t / s if s else None

    out: dict[str, Any] = {"prompts": len(rows)}
    for m in METHODS:
        out[f"{m}_tokens_per_s"] = tps(m, rows)
        out[f"{m}_tokens"] = sum(r[m]["tokens"] for r in rows)
    g = out["greedy_tokens_per_s"]
    for m in ("nest", "lookup+passages", "lookup"):
        out[f"{m}_vs_greedy_pooled"] = out[f"{m}_tokens_per_s"] / g if g else None
        logs = [
            math.log(
                (r[m]["tokens"] / r[m]["seconds"])
                / (r["greedy"]["tokens"] / r["greedy"]["seconds"])
            )
            for r in rows
            if r[m]["tokens"]
            and r["greedy"]["tokens"]
            and r[m]["seconds"]
            and r["greedy"]["seconds"]
        ]
        out[f"{m}_vs_greedy_geomean"] = math.exp(sum(logs) / len(logs)) if logs else None
    nest = [r["nest"] for r in rows]
    toks = sum(n["tokens"] for n in nest)
    total = sum(n["seconds"] for n in nest)
    steps = sum(n["verify_steps"] for n in nest)
    out.update(
        nest_attribution_ratio=sum(n["attributed"] for n in nest) / toks if toks else None,
        nest_accepted_per_verify=sum(n["accepted"] for n in nest) / steps if steps else None,
        nest_drafted_per_verify=sum(n["drafted"] for n in nest) / steps if steps else None,
        nest_forwards_per_token=sum(n["forwards"] for n in nest) / toks if toks else None,
        nest_share_retrieval=sum(n["time_retrieval"] for n in nest) / total if total else None,
        nest_share_keys=sum(n["time_keys"] for n in nest) / total if total else None,
        nest_share_knn=sum(n["time_knn"] for n in nest) / total if total else None,
        nest_share_lm=sum(n["time_lm"] for n in nest) / total if total else None,
    )
    out["nest_share_retrieval_keys_knn"] = (
        out["nest_share_retrieval"] + out["nest_share_keys"] + out["nest_share_knn"]
        if total
        else None
    )
    return out


def fmt(x: Any, d: int = 1) -> str:
    return "-" if x is None else f"{x:.{d}f}" if isinstance(x, float) else str(x)


def pct(x: float | None) -> str:
    return fmt(None if x is None else 100.0 * x)


def row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    m = result["machine"]
    lines = [
        "# Decoding speed: NEST vs HF greedy vs HF prompt lookup",
        "",
        f"Corpus: {result['corpus']} ({result['passages']} passages), "
        f"BM25 top-{result['n_passages']}; model `{result['model']}` on {result['device']}; "
        f"{s['prompts']} corpus-grounded prompts x {result['max_new_tokens']} new tokens max; "
        "greedy, batch 1; methods interleaved per prompt in rotating order. "
        f"{m['torch_threads']} torch threads on {m['cpus']} CPUs, load average "
        f"{m['loadavg_start']} at start and {m['loadavg_end']} at end (**the CPU was shared "
        "with other jobs: absolute tokens/s are low and noisy; compare the side-by-side "
        "ratios**).",
        "",
        row(
            "Method",
            "tokens/s (pooled)",
            "vs greedy (pooled)",
            "vs greedy (geo-mean/prompt)",
            "tokens",
        ),
        "|---|---|---|---|---|",
    ]
    for meth in METHODS:
        ratio = "1.00" if meth == "greedy" else fmt(s.get(f"{meth}_vs_greedy_pooled"), 2)
        geo = "1.00" if meth == "greedy" else fmt(s.get(f"{meth}_vs_greedy_geomean"), 2)
        tps = fmt(s[f"{meth}_tokens_per_s"], 2)
        lines.append(row(LABELS[meth], tps, ratio, geo, s[f"{meth}_tokens"]))
    lines += [
        "",
        "Per prompt kind (tokens/s; NEST/greedy pooled ratio; NEST attribution %):",
        "",
        row(
            "Kind",
            "prompts",
            "NEST",
            "greedy",
            "lookup+passages",
            "lookup",
            "NEST/greedy",
            "Attr%",
            "acc/verify",
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, k in result["by_kind"].items():
        lines.append(
            row(
                kind,
                k["prompts"],
                fmt(k["nest_tokens_per_s"], 2),
                fmt(k["greedy_tokens_per_s"], 2),
                fmt(k["lookup+passages_tokens_per_s"], 2),
                fmt(k["lookup_tokens_per_s"], 2),
                fmt(k["nest_vs_greedy_pooled"], 2),
                pct(k["nest_attribution_ratio"]),
                fmt(k["nest_accepted_per_verify"], 2),
            )
        )
    parts = (
        f"retrieval {pct(s['nest_share_retrieval'])}%, keys {pct(s['nest_share_keys'])}%, "
        f"kNN + mixture {pct(s['nest_share_knn'])}%"
    )
    lines += [
        "",
        row("NEST measure", "value", "target"),
        "|---|---|---|",
        row(
            "tokens/s vs HF greedy (pooled)",
            f"{fmt(s['nest_vs_greedy_pooled'], 2)}x",
            ">= 2x (aim 3x)",
        ),
        row(
            "tokens/s vs HF greedy (geo-mean per prompt)",
            f"{fmt(s['nest_vs_greedy_geomean'], 2)}x",
            "",
        ),
        row("attribution ratio", f"{pct(s['nest_attribution_ratio'])}%", ">= 50%"),
        row(
            "retrieval + key loading + kNN share of time",
            f"{pct(s['nest_share_retrieval_keys_knn'])}% ({parts})",
            "<= 10%",
        ),
        row("LM forward share of time", f"{pct(s['nest_share_lm'])}%", ""),
        row("mean tokens accepted per verify step", fmt(s["nest_accepted_per_verify"], 2), ""),
        row("mean proposed draft length", fmt(s["nest_drafted_per_verify"], 1), ""),
        row("LM forward passes per generated token", fmt(s["nest_forwards_per_token"], 3), ""),
        "",
        "NEST's time includes stage-1 retrieval and loading the passages' stored keys; prompt "
        "lookup with passages includes retrieval too. NEST is not lossless (relaxed acceptance), "
        "so its text differs from greedy decoding; HF prompt lookup is lossless.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="NEST vs HF greedy vs HF prompt lookup tokens/s")
    parser.add_argument("--prompts", type=int, default=12, help="number of prompts (default 12)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="per prompt (default 96)")
    parser.add_argument("--prefix-tokens", type=int, default=24, help="completion prompt length")
    parser.add_argument("--passages", type=int, default=40, help="b, passages per query")
    parser.add_argument("--preset", default="paper", help="NestConfig preset (default paper)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output folder")
    parser.add_argument("--device", default=None, help="torch device (default cpu)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()

    import torch
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    from nest_integrations.config import NestConfig
    from nest_integrations.engine import NestEngine
    from nest_integrations.evaluation.retrieval import BM25Retriever
    from nest_integrations.index.store import DiskKeyStore, ensure_keys
    from nest_integrations.ingest import (
        default_token_counter,
        load_documents,
        sample_corpus_inputs,
        split_documents,
    )
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.paths import nest_home

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    load_start = list(os.getloadavg())
    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, default_token_counter())
    lm = HFLanguageModel.from_default(device=args.device)
    cfg = NestConfig.from_preset(args.preset, n_passages=args.passages)
    retriever = BM25Retriever(passages)
    store = DiskKeyStore.open(nest_home() / "eval" / "keys", lm, allow_new_namespace=True)
    engine = NestEngine(lm, retriever, store, cfg)
    prompts = build_prompts(lm, passages, args.prompts, args.prefix_tokens)

    # Keys of every passage the prompts retrieve: computed once, before timing (ingest's job).
    needed = {p.id: p for q in prompts for p in retriever.retrieve(q["prompt"], cfg.n_passages)}
    ensure_keys(store, lm, list(needed.values()), progress=not args.quiet)

    for m in METHODS:  # warm-up, untimed
        run_method(m, engine, retriever, prompts[0], 4, cfg)
    rows = []
    bar = tqdm(total=len(prompts) * len(METHODS), desc="speed", unit="gen", disable=args.quiet)
    for i, q in enumerate(prompts):
        row: dict[str, Any] = {"kind": q["kind"], "id": q["id"], "prompt": q["prompt"]}
        order = METHODS[i % len(METHODS) :] + METHODS[: i % len(METHODS)]  # rotate the order
        for m in order:
            bar.set_postfix_str(m, refresh=False)
            row[m] = run_method(m, engine, retriever, q, args.max_new_tokens, cfg)
            bar.update(1)
        rows.append(row)
    bar.close()
    store.close()

    kinds = sorted({r["kind"] for r in rows})
    result = {
        "corpus": "nest_integrations/data/sample",
        "passages": len(passages),
        "n_passages": cfg.n_passages,
        "model": lm.fingerprint,
        "device": str(lm.device),
        "config": cfg.to_dict(),
        "max_new_tokens": args.max_new_tokens,
        "summary": summarize(rows),
        "by_kind": {k: summarize([r for r in rows if r["kind"] == k]) for k in kinds},
        "rows": rows,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "process_cpu_s": round(time.process_time(), 1),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    md = markdown(result)
    (out / "speed.md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
