"""Lazy token keys vs pre-encoded keys: first-query (cold cache) and warm-query latency.

One run, side by side, on the embedded default LM (SmolLM2-135M-Instruct, CPU, 1 torch thread)
and the shipped sample corpus ingested into a fresh temporary persist dir with
``--keys lazy`` (passages in Chroma, no keys encoded at ingest). For each sample question:

1. **pre-encoded**: an engine on an eager ``DiskKeyStore`` that already holds the keys of the
   passages the question retrieves (encoded before the timed run, as ``nest ingest`` would;
   query latency depends only on those passages being stored, not on the rest of the corpus);
2. **lazy, cold**: the engine ``assembly`` builds for the lazy persist dir (a ``LazyKeyCache``),
   the first time the question is asked: its retrieved passages not yet in the cache (a passage
   retrieved by an earlier question is already cached) are encoded inside the query;
3. **lazy, warm**: the same question again: every key comes from the cache.

Stage 2 (``NestStats.time_keys``: loading or encoding the keys and building the token memory) is
reported apart from the whole generation (retrieval + stage 2 + decoding), and the three answers
are checked to be identical. Writes ``benchmarks/results/lazy_keys.json`` and ``lazy_keys.md``.

Usage::

    python -m benchmarks.lazy_keys                  # 6 questions, 64 new tokens
    python -m benchmarks.lazy_keys --questions 3 --max-new-tokens 32
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks import harness


def run_question(engine, question: str, max_new_tokens: int) -> dict:
    """One generation: whole wall time, stage-2 time, and what came out."""
    t0 = time.perf_counter()
    res = engine.generate([{"role": "user", "content": question}], max_new_tokens=max_new_tokens)
    total = time.perf_counter() - t0
    return {
        "total_s": total,
        "keys_s": res.stats.time_keys,
        "retrieval_s": res.stats.time_retrieval,
        "n_keys": res.stats.n_keys,
        "text": res.text,
        "citations": [(c.start, c.end, c.passage_id) for c in res.citations],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser("benchmarks.lazy_keys", __doc__)
    parser.add_argument("--questions", type=int, default=6, help="sample questions to ask")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of the pre-encoded and warm cases per question (the fastest "
                        "is kept; the cold case runs once by definition)")
    args, run = harness.start(parser, argv)

    import torch

    torch.set_num_threads(1)
    from nest_integrations import assembly
    from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS
    from nest_integrations.index.lazy_cache import LazyKeyCache
    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.ingest import sample_corpus_inputs
    from nest_integrations.ingest.pipeline import IngestPipeline

    questions = [q.question for q in SAMPLE_QUESTIONS[: args.questions]]
    lm = assembly.shared_model()
    tmp = Path(tempfile.mkdtemp(prefix="nest-lazy-bench-"))
    persist = tmp / "store"

    # Ingest, lazy: passages into Chroma, no keys.
    store = assembly.open_store("bench", persist)
    t0 = time.perf_counter()
    report = IngestPipeline(store, lm, keys="lazy", key_cache_size="1GB").ingest(
        sample_corpus_inputs()
    )
    ingest_s = time.perf_counter() - t0
    print(f"lazy ingest: {report}", file=sys.stderr)

    spec = assembly.EngineSpec.for_store("bench", persist_dir=str(persist))
    lazy = assembly.build_engine(spec, lm=lm)
    assert isinstance(lazy.key_store, LazyKeyCache), lazy.key_store
    eager_store = DiskKeyStore.open(tmp / "eager-keys", lm)
    eager = assembly.build_engine(spec, lm=lm, key_store=eager_store)

    # Warm the model and the retriever up (first forward passes are slower), outside the timing.
    eager.generate([{"role": "user", "content": "Hello."}], max_new_tokens=8, passages=[])
    lazy.retrieve("warm up")

    # Pre-encode the retrieved passages of every question into the eager store.
    retrieved = {q: eager.retrieve(q, eager.config.n_passages) for q in questions}
    unique = {p.id: p for ps in retrieved.values() for p in ps}
    t0 = time.perf_counter()
    ensure_keys(eager_store, lm, list(unique.values()))
    pre_s = time.perf_counter() - t0
    pre_tokens = eager_store.stats()["n_tokens"]

    rows = []
    for q in questions:
        misses0 = lazy.key_store.misses
        e_runs = [run_question(eager, q, args.max_new_tokens)]
        cold = run_question(lazy, q, args.max_new_tokens)
        encoded = lazy.key_store.misses - misses0
        w_runs = [run_question(lazy, q, args.max_new_tokens)]
        for _ in range(args.repeats - 1):  # interleaved, so load drifts hit both alike
            e_runs.append(run_question(eager, q, args.max_new_tokens))
            w_runs.append(run_question(lazy, q, args.max_new_tokens))
        runs = [*e_runs, cold, *w_runs]
        same = all((r["text"], r["citations"]) == (cold["text"], cold["citations"]) for r in runs)
        e = min(e_runs, key=lambda r: r["total_s"])
        warm = min(w_runs, key=lambda r: r["total_s"])
        rows.append({"question": q, "eager": e, "cold": cold, "warm": warm,
                     "passages_encoded_cold": encoded, "identical": same})  # fmt: skip
        print(f"{q!r}: eager {e['total_s']:.2f}s (keys {e['keys_s']:.3f}), cold "
              f"{cold['total_s']:.2f}s (keys {cold['keys_s']:.3f}, {encoded} encoded), warm "
              f"{warm['total_s']:.2f}s (keys {warm['keys_s']:.3f}); identical={same}",
              file=sys.stderr)  # fmt: skip

    cache = lazy.key_store.stats()
    summary = {
        "model": lm.fingerprint,
        "threads": torch.get_num_threads(),
        "corpus": {"passages": report.passages, "tokens": report.tokens},
        "lazy_ingest_s": ingest_s,
        "pre_encode": {"passages": len(unique), "tokens": pre_tokens, "seconds": pre_s},
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "cache_after": {k: cache[k] for k in ("n_entries", "n_tokens", "bytes_used",
                                               "bytes_per_token", "max_bytes")},
        "rows": rows,
    }
    harness.write_result(args.out, "lazy_keys", summary, render(summary), run)
    eager_store.close()
    lazy.key_store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def render(s: dict) -> str:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    rows = s["rows"]
    lines = [
        "# Lazy token keys vs pre-encoded keys",
        "",
        f"One run, `torch.set_num_threads(1)`. Model `{s['model']}`; sample corpus {s['corpus']['passages']} passages, "
        f"{s['corpus']['tokens']:,} tokens, ingested with `--keys lazy` in "
        f"{s['lazy_ingest_s']:.1f} s (no keys encoded). Pre-encoded baseline: the "
        f"{s['pre_encode']['passages']} passages the questions retrieve "
        f"({s['pre_encode']['tokens']:,} tokens) encoded into a `DiskKeyStore` before timing "
        f"({s['pre_encode']['seconds']:.1f} s). Chat prompts, grounded preset, "
        f"{s['max_new_tokens']} new tokens; pre-encoded and warm: fastest of "
        f"{s['repeats']} interleaved runs, cold: its one run. Stage 2 = `NestStats.time_keys` (read or encode "
        "keys, build the token memory); total = whole `generate` (retrieval, stage 2, decoding).",
        "",
        "| question | passages encoded (cold) | stage 2 pre-encoded, s | stage 2 cold, s | "
        "stage 2 warm, s | total pre-encoded, s | total cold, s | total warm, s | same answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['question']} | {r['passages_encoded_cold']} | {r['eager']['keys_s']:.3f} | "
            f"{r['cold']['keys_s']:.3f} | {r['warm']['keys_s']:.3f} | "
            f"{r['eager']['total_s']:.2f} | {r['cold']['total_s']:.2f} | "
            f"{r['warm']['total_s']:.2f} | {'yes' if r['identical'] else 'NO'} |"
        )
    e_k = med([r["eager"]["keys_s"] for r in rows])
    c_k = med([r["cold"]["keys_s"] for r in rows])
    w_k = med([r["warm"]["keys_s"] for r in rows])
    e_t = med([r["eager"]["total_s"] for r in rows])
    c_t = med([r["cold"]["total_s"] for r in rows])
    w_t = med([r["warm"]["total_s"] for r in rows])
    lines.append(
        f"| **median** | | **{e_k:.3f}** | **{c_k:.3f}** | **{w_k:.3f}** | **{e_t:.2f}** | "
        f"**{c_t:.2f}** | **{w_t:.2f}** | |"
    )
    c = s["cache_after"]
    enc_tokens, enc_s = c["n_tokens"], sum(r["cold"]["keys_s"] for r in rows)
    lines += [
        "",
        f"First query (cold) vs pre-encoded: {c_t - e_t:+.2f} s median total "
        f"({(c_t / e_t - 1) * 100:+.0f}%), the encoding of its new passages in stage 2 "
        f"({enc_tokens:,} tokens in {enc_s:.1f} s over the run: {enc_tokens / enc_s:.0f} "
        f"tokens/s). Warm vs pre-encoded: {w_t - e_t:+.2f} s ({(w_t / e_t - 1) * 100:+.0f}%): "
        "reading a passage's keys from the cache costs as much as from the eager store.",
        f"Cache after the run: {c['n_entries']} passages, {c['n_tokens']:,} tokens, "
        f"{c['bytes_used'] / 1e6:.2f} MB ({c['bytes_per_token']:.0f} bytes/token, fp16) of a "
        f"{c['max_bytes'] / 1e9:.1f} GB cap.",
        "",
        "Timings on a shared CPU are noisy; answers are compared exactly (text and citations).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
