"""Key-encoding throughput: Ray ingest (a local Ray instance, N actors) vs single-process.

Both sides encode the token keys of the same passages of the shipped sample corpus into fresh
``DiskKeyStore``s with the embedded default model, one after the other in this process:

- single process: ``ensure_keys`` (batch 16), once per ``--threads`` setting (torch threads);
- Ray: ``encode_keys_on_ray`` on a local instance (``ray.init(num_cpus=--workers)``), one
  single-threaded actor per CPU; timed without and with the Ray start-up.

The two stores are then compared (same passages and tokens, max key difference) and the
figures written to ``benchmarks/results/ray_ingest.md`` (and ``.json``).

Usage::

    python -m benchmarks.ray_ingest --passages 200 --workers 2 --threads 1,2
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks import harness


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.ray_ingest", __doc__)
    ap.add_argument("--passages", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2, help="Ray actors (= CPUs of the instance)")
    ap.add_argument(
        "--threads", default="1,2", help="torch threads of the single-process runs (comma list)"
    )
    args, run = harness.start(ap, argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    logging.basicConfig(level=logging.WARNING)

    import numpy as np
    import ray
    import torch

    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.ingest import (
        load_documents,
        sample_corpus_inputs,
        split_documents,
        token_counter_for,
    )
    from nest_integrations.lm.hf import HFLanguageModel

    from nest_integrations.ingest.ray_keys import encode_keys_on_ray

    lm = HFLanguageModel.from_default()
    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, token_counter_for(lm))[: args.passages]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))

    singles = []
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        single = DiskKeyStore.open(tmp / f"single-{threads}", lm)
        t = time.perf_counter()
        ensure_keys(single, lm, passages, batch_size=16)
        singles.append((threads, time.perf_counter() - t, os.getloadavg()[0]))
    tokens = single.stats()["n_tokens"]

    torch.set_num_threads(1)
    t = time.perf_counter()
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False,
             object_store_memory=500 * 1024 * 1024, logging_level=logging.WARNING,
             log_to_driver=False)  # fmt: skip
    t_init = time.perf_counter() - t
    try:
        on_ray = DiskKeyStore.open(tmp / "ray", lm)
        t = time.perf_counter()
        result = encode_keys_on_ray(on_ray, lm, passages, workers=args.workers)
        t_ray = time.perf_counter() - t
        load_ray = os.getloadavg()[0]
    finally:
        ray.shutdown()

    a, b = single.stats(), on_ray.stats()
    same = (a["n_passages"], a["n_tokens"]) == (b["n_passages"], b["n_tokens"])
    diff = 0.0
    for x, y in zip(single.get_keys(passages), on_ray.get_keys(passages)):
        same &= np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.offsets, y.offsets)
        diff = max(diff, float(np.abs(x.keys.astype(np.float32) - y.keys.astype(np.float32)).max()))

    rows = [
        *[("single process, ensure_keys", f"1 process x {n} torch thread(s)", s, la)
          for n, s, la in singles],
        ("Ray, encoding run", f"{result.workers} actors x 1 thread", t_ray, load_ray),
        ("Ray, incl. `ray.init`", f"{result.workers} actors x 1 thread", t_ray + t_init, load_ray),
    ]  # fmt: skip
    best = min(s for _, s, _ in singles)
    lines = [
        "# Ray ingest vs single-process key encoding",
        "",
        f"Model SmolLM2-135M-Instruct fp32 on CPU; {len(passages)} passages of the sample "
        f"corpus, {tokens:,} tokens.",
        "",
        "| run | workers | seconds | tokens/s | load avg after |",
        "|---|---|---:|---:|---:|",
        *[f"| {n} | {w} | {s:.1f} | {tokens / s:,.0f} | {la:.1f} |" for n, w, s, la in rows],
        "",
        f"Ray (incl. start-up) / best single process: {best / (t_ray + t_init):.2f}x the "
        f"throughput; encoding run alone: {best / t_ray:.2f}x.",
        "",
        f"`ray.init` (local instance) took {t_init:.1f} s; the Ray encoding run includes "
        f"starting {result.workers} actors and loading one model in each. "
        f"Worker processes that returned batches: {len(result.worker_pids)}.",
        "",
        f"Stores equal: {'yes' if same else 'NO'} (same passages, token counts, token ids and "
        f"offsets); largest key difference {diff:.2e} (fp16 storage).",
    ]
    lines += ["", "## Reading", "", *READING]
    summary = {"passages": len(passages), "tokens": tokens, "workers": result.workers,
               "single": [{"threads": n, "seconds": s, "load": la} for n, s, la in singles],
               "ray_s": t_ray, "ray_init_s": t_init, "stores_equal": bool(same),
               "max_key_diff": diff}
    harness.write_result(args.out, "ray_ingest", summary, "\n".join(lines) + "\n", run)
    return 0


READING = [
    "On one 2-core machine Ray has no extra hardware to use: both sides run the same forward",
    "passes on the same two cores, and Ray adds its start-up (`ray.init`, starting the actors,",
    "one model load per actor), copying key rows through the object store, and the driver's",
    "merge into the key store. Whatever difference remains is in how the two cores are used:",
    "two single-threaded processes against one process with 1 or 2 torch threads. On a machine",
    "shared with other work, 2 OpenMP threads in one process spin-wait for a busy core (see",
    "tests/conftest.py: a forward measured 1.8-3.6 s with 2 threads under load, 0.2 s with 1),",
    "so compare Ray with the best single-process row, not the 2-thread one; the machine's load",
    "also moves between the runs (load column), so small ratios here are noise.",
    "",
    "Ray pays off when the encoding has more hardware than one process can use: several",
    "machines, or GPUs (one actor per GPU, each with its own model). Encoding is embarrassingly",
    "parallel (passages are encoded on their own), so throughput grows with the actors until",
    "the single driver's merge (sequential `put_keys`, one fsync per batch, about 1.2 KB per",
    "token of fp16 keys) becomes the limit; the fixed start-up cost is then amortised over a",
    "large corpus instead of dominating a small one.",
]


if __name__ == "__main__":
    raise SystemExit(main())
