"""Benchmark the on-disk key store: put throughput, get latency for b passages, bytes per token.

Writes N synthetic passages (random fp32 keys, d=576 as SmolLM2-135M, about 150 tokens each)
in batches, as ``ensure_keys`` does, then times ``get_keys`` for random sets of b=40 passages
(NEST's per-query load). Prints a table and saves JSON.

    python benchmarks/bench_keystore.py                  # N=1000, d=576, b=40
    python benchmarks/bench_keystore.py --n 5000 --dtype float32 --dir /mnt/fast/tmp
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage, PassageKeys

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic(
    n: int, d: int, mean_tokens: int, seed: int
) -> tuple[list[Passage], list[PassageKeys]]:
    """n passages of about ``mean_tokens`` tokens with random keys, ids and tiling offsets."""
    rng = np.random.default_rng(seed)
    passages, keys = [], []
    for i in range(n):
        m = int(rng.integers(mean_tokens // 2, mean_tokens * 3 // 2 + 1))
        ends = np.cumsum(rng.integers(2, 8, m)).astype(np.int32)
        offsets = np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)
        text = f"{i:08d}".ljust(int(ends[-1]), "x")
        passages.append(Passage(id=f"p{i}", text=text))
        vecs = rng.standard_normal((m, d), dtype=np.float32)
        keys.append(PassageKeys(f"p{i}", vecs, rng.integers(0, 49152, m), offsets))
    return passages, keys


def bench(args: argparse.Namespace, root: Path) -> dict:
    passages, keys = synthetic(args.n, args.d, args.tokens, args.seed)
    n_tokens = sum(len(k) for k in keys)
    kw = dict(fingerprint="bench", key_source="ffn_input", key_dim=args.d, dtype=args.dtype)

    # put: batches of --batch passages, one fsynced transaction each
    store = DiskKeyStore(root, **kw)
    t0 = time.perf_counter()
    for i in range(0, args.n, args.batch):
        store.put_keys(passages[i : i + args.batch], keys[i : i + args.batch])
    put_s = time.perf_counter() - t0
    stats = store.stats()
    store.close()

    # get: b random passages per query, from a freshly opened store
    store = DiskKeyStore(root, **kw)
    rng = np.random.default_rng(args.seed + 1)
    queries = [[passages[j] for j in rng.choice(args.n, args.b, replace=False)]
               for _ in range(args.trials + 1)]  # fmt: skip
    t0 = time.perf_counter()
    got = store.get_keys(queries[0])
    first_ms = (time.perf_counter() - t0) * 1e3
    assert all(g is not None for g in got)
    times, rows = [], []
    for q in queries[1:]:
        t0 = time.perf_counter()
        got = store.get_keys(q)
        times.append((time.perf_counter() - t0) * 1e3)
        rows.append(sum(len(g) for g in got))

    store.close()
    return {
        "config": {**vars(args), "dir": str(root)},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "numpy": np.__version__},  # fmt: skip
        "n_passages": args.n,
        "n_tokens": n_tokens,
        "put_seconds": put_s,
        "put_passages_per_s": args.n / put_s,
        "put_tokens_per_s": n_tokens / put_s,
        "put_mb_per_s": stats["bytes_on_disk"] / put_s / 1e6,
        "get_b": args.b,
        "get_mean_keys": float(np.mean(rows)),
        "get_first_ms": first_ms,
        "get_median_ms": float(np.median(times)),
        "get_p95_ms": float(np.percentile(times, 95)),
        "bytes_on_disk": stats["bytes_on_disk"],
        "bytes_per_token": stats["bytes_per_token"],
        "bytes_per_token_payload": args.d * np.dtype(args.dtype).itemsize + 4 + 8,
    }


def table(r: dict) -> str:
    rows = [
        ("passages / tokens", f"{r['n_passages']} / {r['n_tokens']}"),
        ("put", f"{r['put_passages_per_s']:.0f} passages/s, {r['put_tokens_per_s']:.0f} tokens/s, "
                f"{r['put_mb_per_s']:.0f} MB/s"),  # fmt: skip
        (f"get b={r['get_b']} (~{r['get_mean_keys']:.0f} keys)",
         f"median {r['get_median_ms']:.2f} ms, p95 {r['get_p95_ms']:.2f} ms, "
         f"first {r['get_first_ms']:.2f} ms"),  # fmt: skip
        ("bytes per token", f"{r['bytes_per_token']:.0f} (payload {r['bytes_per_token_payload']})"),
        ("bytes on disk", f"{r['bytes_on_disk'] / 1e6:.1f} MB"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="passages to write")
    ap.add_argument("--d", type=int, default=576, help="key dimension")
    ap.add_argument("--tokens", type=int, default=150, help="mean tokens per passage")
    ap.add_argument("--b", type=int, default=40, help="passages per get (NEST's b)")
    ap.add_argument("--batch", type=int, default=16, help="passages per put")
    ap.add_argument("--trials", type=int, default=200, help="timed gets")
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent folder of the temporary store")
    ap.add_argument("--out", default=str(RESULTS / "bench_keystore.json"))
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nest-keystore-bench-", dir=args.dir))
    try:
        result = bench(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
