"""Ingest throughput: token-key encoding vs a raw prefill of the same model, in one run.

Ingests the shipped sample corpus (or its first ``--limit`` documents) into a fresh store with the
embedded default LM (SmolLM2-135M-Instruct) and reports:

- phase 1, ``ingest --no-keys``: load + split + embed (MiniLM) + Chroma writes, seconds;
- phase 2, ``ingest`` again: only the token keys are new (Chroma is unchanged), so its time is
  the cost of keys; **ingest tokens/s (keys)** = passage tokens / phase-2 seconds;
- **raw prefill tokens/s**: the same passages (BOS + tokens) through the full causal LM
  (logits included), right-padded batches of 16 sorted by length, no KV cache, same process;
- key-store bytes per token (``DiskKeyStore.stats()``).

Writes ``benchmarks/results/ingest.json`` and ``ingest.md``. Usage::

    python -m benchmarks.ingest               # whole sample corpus (several minutes on CPU)
    python -m benchmarks.ingest --limit 60    # a quick slice

Key encoding on Ray against one process is ``python -m benchmarks.ray_ingest``.
"""

from __future__ import annotations

import tempfile
import time
from typing import Sequence

from benchmarks import harness


def prefill_tokens_per_s(lm, passages, batch_size: int = 16) -> tuple[float, int, float]:
    """(tokens/s, tokens, seconds) of a full forward over ``passage_prefix + tokens``."""
    import numpy as np
    import torch

    seqs = sorted((lm.passage_prefix + lm.tokenize(p.text) for p in passages), key=len)
    n_tokens = sum(len(s) - len(lm.passage_prefix) for s in seqs)
    pad = lm.passage_prefix[0]
    start = time.perf_counter()
    for b in range(0, len(seqs), batch_size):
        rows = seqs[b : b + batch_size]
        batch = np.full((len(rows), len(rows[-1])), pad, dtype=np.int64)  # (B, L)
        for r, s in enumerate(rows):
            batch[r, : len(s)] = s
        with torch.inference_mode():
            lm.model(input_ids=torch.from_numpy(batch).to(lm.device), use_cache=False)
    seconds = time.perf_counter() - start
    return n_tokens / seconds, n_tokens, seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser("benchmarks.ingest", "ingest tokens/s vs raw prefill tokens/s")
    parser.add_argument("--limit", type=int, default=0, help="ingest only the first N documents")
    parser.add_argument("--device", default=None, help="torch device for the LM (default cpu)")
    args, run = harness.start(parser, argv)

    from nest_integrations.ingest import IngestPipeline, load_documents, sample_corpus_inputs
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    docs, _ = load_documents(sample_corpus_inputs())
    docs = docs[: args.limit] if args.limit else docs
    t0 = time.perf_counter()
    lm = HFLanguageModel.from_default(device=args.device)
    load_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="nest-bench-") as tmp:
        store = ChromaPassageStore.from_persist_dir(tmp, "bench")
        pipeline = IngestPipeline(store, lm)
        first = pipeline.ingest(docs, with_keys=False, progress=True)
        second = pipeline.ingest(docs, with_keys=True, progress=True)
        passages = list(store.iter_passages())
        with pipeline.key_store() as ks:
            key_stats = ks.stats()
    prefill_tps, prefill_tokens, prefill_s = prefill_tokens_per_s(lm, passages)

    tokens = second.tokens
    result = {
        "corpus": "nest_integrations/data/sample"
        + (f" (first {args.limit} docs)" if args.limit else ""),
        "documents": second.documents,
        "passages": second.passages,
        "tokens": tokens,
        "model": lm.fingerprint,
        "device": str(lm.device),
        "lm_load_s": round(load_s, 2),
        "ingest_no_keys_s": round(first.seconds, 2),
        "ingest_keys_s": round(second.seconds, 2),
        "ingest_keys_tokens_per_s": round(tokens / second.seconds, 1),
        "raw_prefill_tokens_per_s": round(prefill_tps, 1),
        "raw_prefill_s": round(prefill_s, 2),
        "keys_vs_prefill": round((tokens / second.seconds) / prefill_tps, 3),
        "key_store_bytes_per_token": round(key_stats["bytes_per_token"], 1),
        "key_store_bytes": key_stats["bytes_on_disk"],
        "key_dtype": key_stats["dtype"],
        "key_dim": key_stats["key_dim"],
    }
    assert prefill_tokens == tokens, (prefill_tokens, tokens)
    md = [
        "# Ingest benchmark",
        "",
        f"{result['corpus']}: {result['documents']} documents, {result['passages']} passages, "
        f"{tokens:,} tokens; model `{result['model']}` on {result['device']}.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| ingest without keys (split, MiniLM, Chroma), s | {result['ingest_no_keys_s']} |",
        f"| ingest of token keys, s | {result['ingest_keys_s']} |",
        f"| **ingest tokens/s (keys)** | **{result['ingest_keys_tokens_per_s']}** |",
        f"| raw prefill tokens/s (full LM, batch 16) | {result['raw_prefill_tokens_per_s']} |",
        f"| keys / prefill | {result['keys_vs_prefill']} |",
        f"| key-store bytes per token ({result['key_dtype']}, d={result['key_dim']}) | "
        f"{result['key_store_bytes_per_token']} |",
    ]
    harness.write_result(args.out, "ingest", result, "\n".join(md) + "\n", run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
