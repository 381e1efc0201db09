"""Scaling figures: measured cost per corpus token of each key codec and key mode, and what they
extrapolate to (1M, 100M and 1B tokens). The figures behind ``docs/scaling.md``.

One run measures, on real keys of the shipped sample corpus (SmolLM2-135M, d = 576):

- single-process key encoding throughput (tokens/s), the cost every eager mode pays at ingest;
- for each codec (fp16, int8, pq m=72, pq m=96) in the eager store (``DiskKeyStore``) and in the
  lazy cache (``LazyKeyCache``): bytes on disk per token (everything in the namespace folder:
  codes, token ids, offsets, sqlite index, codec tables), write throughput (coding + fsync) and
  the median time to read the keys of one query's passages (``--b`` passages, as stage 2 does);
- the Ray ingest figures of ``benchmarks/results/ray_ingest.json`` when that file exists
  (``python -m benchmarks.ray_ingest``).

Quality per codec (recall against fp16, change in lambda, accepted tokens, perplexity) is
``python -m benchmarks.key_codecs``; lazy-key query latency ``python -m benchmarks.lazy_keys``.

    python -m benchmarks.scaling                 # about 3 minutes on 2 CPU cores
    python -m benchmarks.scaling --passages 150  # quicker
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from benchmarks import harness

SCALES = (1e6, 1e8, 1e9)
CODECS = (("fp16", {}), ("int8", {}), ("pq", {"m": 72}), ("pq", {"m": 96}))


def _label(name: str, opts: dict) -> str:
    return name + (f" m={opts['m']}" if "m" in opts else "")


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return str(n)


def _hours(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:,.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86400:,.1f} days"


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.scaling", __doc__)
    ap.add_argument("--passages", type=int, default=300, help="sample passages encoded")
    ap.add_argument("--b", type=int, default=40, help="passages read per query (NEST b)")
    ap.add_argument("--reads", type=int, default=30, help="timed query reads per codec")
    ap.add_argument("--threads", type=int, default=2)
    args, run = harness.start(ap, argv)

    import torch

    from nest_integrations import assembly
    from nest_integrations.index.codecs import make_codec
    from nest_integrations.index.lazy_cache import LazyKeyCache
    from nest_integrations.index.keys import encode_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.ingest import (
        load_documents,
        sample_corpus_inputs,
        split_documents,
        token_counter_for,
    )

    torch.set_num_threads(args.threads)
    lm = assembly.shared_model()
    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, token_counter_for(lm))
    rng = np.random.default_rng(0)
    pick = sorted(rng.choice(len(passages), size=min(args.passages, len(passages)), replace=False))
    passages = [passages[i] for i in pick]
    ordered = sorted(passages, key=lambda p: len(p.text))  # similar lengths batch well

    print(f"encoding {len(passages)} sample passages with {lm.fingerprint} ...", flush=True)
    t0 = time.perf_counter()
    encoded = {}
    for i in range(0, len(ordered), 16):
        batch = ordered[i : i + 16]
        for p, k in zip(batch, encode_keys(lm, batch, np.dtype(np.float32))):
            encoded[p.id] = k
    encode_s = time.perf_counter() - t0
    keys = [encoded[p.id] for p in passages]
    n_tokens = int(sum(len(k) for k in keys))
    encode_tps = n_tokens / encode_s
    sample = np.concatenate([k.keys for k in keys if len(k)])
    print(f"  {n_tokens:,} tokens in {encode_s:.1f} s: {encode_tps:,.0f} tokens/s", flush=True)

    rows = []
    queries = [
        [passages[j] for j in rng.choice(len(passages), size=min(args.b, len(passages)),
                                         replace=False)]
        for _ in range(args.reads)
    ]  # fmt: skip
    for mode in ("eager", "lazy"):
        for name, opts in CODECS:
            label = _label(name, opts)
            with tempfile.TemporaryDirectory(prefix="nest-scaling-") as tmp:
                codec = make_codec(name, lm.key_dim, **opts)
                t0 = time.perf_counter()
                if mode == "eager":
                    store = DiskKeyStore(
                        tmp, fingerprint=lm.fingerprint, key_source=lm.key_source,
                        key_dim=lm.key_dim, codec=codec,
                    )  # fmt: skip
                    store.train_codec(sample)
                    folder = store.namespace_dir
                else:
                    if codec.needs_training:
                        codec.train(sample)
                        store = _lazy_with(tmp, lm, codec)
                    else:
                        store = LazyKeyCache(
                            tmp, fingerprint=lm.fingerprint, key_source=lm.key_source,
                            key_dim=lm.key_dim, max_bytes=1 << 40, codec=name,
                        )  # fmt: skip
                    folder = store.namespace_dir
                train_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                for i in range(0, len(passages), 64):
                    store.put_keys(passages[i : i + 64], keys[i : i + 64])
                put_s = time.perf_counter() - t0
                times = []
                for q in queries:
                    t0 = time.perf_counter()
                    got = store.get_keys(q)
                    times.append(time.perf_counter() - t0)
                    assert all(g is not None for g in got)
                # exactness of values and offsets under every codec
                back = store.get_keys(passages[:20])
                for k, g in zip(keys[:20], back):
                    assert np.array_equal(k.token_ids, g.token_ids)
                    assert np.array_equal(k.offsets, g.offsets)
                err = float(np.mean([
                    np.linalg.norm(g.keys.astype(np.float32) - k.keys, axis=1).mean()
                    / max(np.linalg.norm(k.keys, axis=1).mean(), 1e-9)
                    for k, g in zip(keys[:20], back) if len(k)
                ]))  # fmt: skip
                store.close()  # checkpoints sqlite's write-ahead log into the index
                n_bytes = _folder_bytes(folder)
                fixed = sum(f.stat().st_size for f in folder.glob("*.json")) + sum(
                    f.stat().st_size for f in folder.glob("codec.npz")
                )  # manifest and codec tables: paid once per store, not per token
            row = {
                "mode": mode,
                "codec": label,
                "code_bytes_per_key": codec.code_size,
                "bytes_per_token": n_bytes / n_tokens,
                "fixed_bytes": fixed,
                "marginal_bytes_per_token": (n_bytes - fixed) / n_tokens,
                "train_s": train_s,
                "put_tokens_per_s": n_tokens / put_s,
                "read_ms_median": 1000 * statistics.median(times),
                "read_ms_p95": 1000 * float(np.percentile(times, 95)),
                "rel_key_error": err,
            }
            rows.append(row)
            print(
                f"  {mode:5s} {label:9s} {row['marginal_bytes_per_token']:8.1f} B/token  "
                f"put {row['put_tokens_per_s']:>9,.0f} tok/s  read {row['read_ms_median']:.2f} ms "
                f"(b={args.b})  rel. key error {err:.4f}",
                flush=True,
            )

    ray = None
    ray_file = harness.RESULTS / "ray_ingest.json"
    if ray_file.exists():
        ray = json.loads(ray_file.read_text())

    out = {
        "config": vars(args),
        "model": lm.fingerprint,
        "key_dim": lm.key_dim,
        "n_passages": len(passages),
        "n_tokens": n_tokens,
        "tokens_per_passage": n_tokens / len(passages),
        "encode_s": encode_s,
        "encode_tokens_per_s": encode_tps,
        "rows": rows,
        "ray": ray,
    }
    harness.write_result(args.out, "scaling", out, render(out), run)
    return 0


def _lazy_with(tmp: str, lm, codec):
    """A lazy cache whose trained codec tables are ``codec``'s (as `nest ingest --keys lazy
    --key-codec X` leaves them)."""
    from nest_integrations.index.lazy_cache import LazyKeyCache
    from nest_integrations.index.lazy_mode import LAZY_DIR, write_manifest
    from nest_integrations.index.namespaces import lazy_namespace_name

    ns = Path(tmp) / LAZY_DIR / lazy_namespace_name(lm.fingerprint, lm.key_source, codec.name)
    ns.mkdir(parents=True, exist_ok=True)
    codec.save(ns)
    write_manifest(ns, lm.fingerprint, lm.key_source, lm.key_dim, codec)
    return LazyKeyCache(
        tmp, fingerprint=lm.fingerprint, key_source=lm.key_source, key_dim=lm.key_dim,
        max_bytes=1 << 40, codec=codec.name,
    )  # fmt: skip


def render(out: dict) -> str:
    n, tpp = out["n_tokens"], out["tokens_per_passage"]
    lines = [
        "# Scaling figures",
        "",
        f"{out['n_passages']} passages of the sample corpus, {n:,} tokens "
        f"({tpp:.0f} tokens per passage), model `{out['model']}` (d = {out['key_dim']}).",
        "",
        f"Single-process key encoding: **{out['encode_tokens_per_s']:,.0f} tokens/s**.",
        "",
        "## Cost per corpus token, measured",
        "",
        "Bytes per token count everything in the namespace folder per token (codes, token ids, "
        "offsets, index) except the fixed part paid once per store (manifest and codec tables, "
        "shown separately). Reads are the keys of one query's "
        f"b = {out['config']['b']} passages (median of {out['config']['reads']}). "
        "`rel. key error` is the mean ‖decoded − fp32‖ / ‖fp32‖ per key.",
        "",
        "| mode | codec | code bytes/key | bytes/token on disk | vs eager fp16 | fixed bytes | "
        "write tokens/s | read ms (median / p95) | rel. key error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = next(r for r in out["rows"] if r["mode"] == "eager" and r["codec"] == "fp16")
    for r in out["rows"]:
        lines.append(
            f"| {r['mode']} | {r['codec']} | {r['code_bytes_per_key']} | "
            f"{r['marginal_bytes_per_token']:,.1f} | "
            f"{r['marginal_bytes_per_token'] / base['marginal_bytes_per_token']:.3f} | "
            f"{_human(r['fixed_bytes'])} | {r['put_tokens_per_s']:,.0f} | {r['read_ms_median']:.2f} / {r['read_ms_p95']:.2f} | "
            f"{r['rel_key_error']:.4f} |"
        )
    lines += [
        "",
        "## Extrapolated (eager key store; measured bytes/token × corpus tokens + fixed bytes)",
        "",
        "| codec | " + " | ".join(f"{s:.0e} tokens" for s in SCALES) + " |",
        "|---|" + "---|" * len(SCALES),
    ]
    for r in out["rows"]:
        if r["mode"] == "eager":
            lines.append(
                f"| {r['codec']} | "
                + " | ".join(
                    _human(r["marginal_bytes_per_token"] * s + r["fixed_bytes"]) for s in SCALES
                )
                + " |"
            )
    lines += [
        "",
        "Key encoding time at the measured single-process rate: "
        + ", ".join(f"{s:.0e} tokens {_hours(s / out['encode_tokens_per_s'])}" for s in SCALES)
        + ".",
    ]
    ray = out.get("ray")
    if ray:
        lines += ["", "## Ray ingest (from `benchmarks/results/ray_ingest.json`)", ""]
        lines.append("```json")
        lines.append(json.dumps({k: v for k, v in ray.items() if not isinstance(v, list)},
                                indent=1)[:1500])  # fmt: skip
        lines.append("```")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
