"""``nest info``: the model backend (dtype, threads, whether lossless methods are exact on this
CPU; under ``auto``, the measured answers it chose by), then collections, passages, tokens and the key store's size."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nest_integrations import assembly
from nest_integrations.cli.common import open_store, out, store_args
from nest_integrations.lm.backend import add_backend_args, apply_backend_args


def add_info_args(p: argparse.ArgumentParser) -> None:
    store_args(p, "also show this collection's passages, documents and tokens "
                "(default: list every collection)")
    p.add_argument("--model", default=None,
                   help="a Hugging Face model id or folder (default: embedded SmolLM2)")
    p.add_argument("--no-model", action="store_true",
                   help="skip the model section (loads no model: the store's figures only)")
    add_backend_args(p)


def backend_info(args: argparse.Namespace) -> dict[str, Any]:
    """The model ``nest ask`` would load with these options, as ``lm.exactness.describe``
    reports it: the backend (and why, under ``--backend auto``), device, dtype (and how
    ``auto`` chose it), threads, exact lossless decoding."""
    from nest_integrations.lm.backend import requested_backend
    from nest_integrations.lm.exactness import describe

    apply_backend_args(args)
    spec = assembly.EngineSpec(model=args.model, dtype=args.dtype).resolved()
    lm = assembly.spec_model(spec)
    asked = requested_backend()
    measured: dict[str, Any] = {}
    if asked == "auto":
        from nest_integrations.lm.auto_backend import decide

        decision = decide(args.model, None, args.dtype, key_source=spec.config.key_source)
        measured = decision.record
        why = (f"auto: {'chosen by the figures below' if measured else decision.reason}; "
               "--backend torch|llama.cpp overrides")
    else:
        why = f"asked for (--backend {asked}, or $NEST_BACKEND)"
    return {"model": lm.name, "backend": spec.backend, "backend_choice": why,
            "backend_measured": measured, **describe(assembly.unwrap(lm))}


def cmd_info(args: argparse.Namespace) -> int:
    backend = None if args.no_model else backend_info(args)
    if backend is not None and not args.json:
        _print_backend(backend)
    if not args.chroma_url:
        from nest_integrations import paths

        root = assembly.persist_root(args.persist_dir)
        if not paths.chroma_dir(root).is_dir():  # do not create an empty store just to look
            raise FileNotFoundError(
                f"no store at {root}; create one with `nest ingest PATH...` or "
                "`nest ingest --sample`"
            )
    store = open_store(args)
    collections = {name: store.with_collection(name).count() for name in store.list_collections()}
    info: dict[str, Any] = {"backend": backend, "chroma": store.location,
                            "collections": collections}
    if args.collection in collections:
        info["collection"] = store.stats()
    keys_dir = store.keys_dir
    info["key_store"] = {"path": str(keys_dir), "namespaces": key_store_stats(keys_dir)}
    from nest_integrations.index.lazy_cache import lazy_cache_stats

    info["key_store"]["mode"] = "eager"
    lazy = lazy_cache_stats(keys_dir)
    if lazy is not None:
        info["key_store"].update(mode="lazy", lazy=lazy)
    if args.json:
        out(json.dumps(info, indent=2, default=str))
    else:
        _print_info(info, args.collection)
    if args.collection is not None and args.collection not in collections:
        listed = ", ".join(repr(c) for c in collections) or "none"
        sys.stderr.write(
            f"nest: error: no collection {args.collection!r} (existing: {listed}); create it "
            f"with `nest ingest PATH... --collection {args.collection}` or `nest ingest --sample`\n"
        )
        return 1
    return 0


def key_store_stats(keys_dir: Path) -> list[dict[str, Any]]:
    """``stats()`` of every namespace of the key store at ``keys_dir``, without loading a model."""
    from nest_integrations.index.codecs import load_codec
    from nest_integrations.index.namespaces import fingerprint_backend, list_namespaces
    from nest_integrations.index.store import DiskKeyStore

    out = []
    for ns in list_namespaces(keys_dir):
        with DiskKeyStore(
            keys_dir,
            fingerprint=ns["fingerprint"],
            key_source=ns["key_source"],
            key_dim=ns["key_dim"],
            codec=load_codec({**ns.get("codec", {}), "key_dim": ns["key_dim"]})
            if isinstance(ns.get("codec"), dict)
            else None,
            dtype=None if isinstance(ns.get("codec"), dict) else ns["dtype"],
        ) as ks:
            out.append({**ks.stats(), "backend": fingerprint_backend(ns["fingerprint"])})
    return out


def _print_backend(b: dict[str, Any]) -> None:
    out(f"Backend:      {b['backend']} [{b['backend_choice']}]")
    measured = b.get("backend_measured")
    if measured:  # what ``auto`` chose by (``lm.auto_backend``)
        from nest_integrations.lm.auto_backend import describe_workload, figures

        out(f"Measured:     {describe_workload(measured)}, on {measured.get('threads', '?')} "
            f"thread(s), llama.cpp wheel {measured.get('llama_cpp_level', '?')}, "
            f"{measured.get('measured', '?')} (cached in $NEST_HOME/exactness):")
        for line in figures(measured):
            out(f"                {line}")
    out(f"Model:        {b['model']} on {b['device']}, {b['dtype']}, {b['threads']} thread(s)"
        + (f" [{b['dtype_choice']}]" if b.get("dtype_choice") else ""))
    if b["exact_rows"]:
        out("Lossless:     exact here: verify rows equal one-token steps bit for bit, so "
            "greedy, prompt-lookup, rag-copy, DReSD, REST"
            + (" and KNN-SSD" if b.get("backend") != "llama.cpp" else "")
            + " equal greedy decoding"
            + (" (this model's multi-row decodes are not: verify rows are decoded one at a "
               "time, so drafts save no time)" if b.get("rows_one_at_a_time") else ""))
    else:
        out("Lossless:     NOT guaranteed here: verify rows are not bit-exact, so lossless "
            "methods may leave greedy's output at near-ties (they warn, stats.exact_rows=False)")
    plans = b.get("row_plans") or {}
    if plans:
        shown = sorted({(p["pad_to"], p["block"]) for p in plans.values()})
        out("Row plans:    " + ", ".join(f"calls of {lo}-{hi} rows" if lo != hi else
                                          f"calls of {hi} row(s)" for lo, hi in shown)
            + " (probed on this CPU, cached in $NEST_HOME/exactness)")


def _print_info(info: dict[str, Any], collection: str | None) -> None:
    out(f"Chroma:       {info['chroma']}")
    cols = info["collections"]
    listed = ", ".join(f"{n} ({c:,} passages)" for n, c in cols.items()) if cols else "none"
    out(f"Collections:  {listed}")
    if "collection" in info:
        c = info["collection"]
        out(
            f"Collection {collection!r}: {c['passages']:,} passages, {c['documents']:,} "
            f"documents, {c['tokens']:,} tokens ({c['space']} space)"
        )
    ks = info["key_store"]
    out(f"Key store:    {ks['path']} (shared by the collections of this persist dir and by "
        "both backends: one namespace per model and key source, filled on first use)")
    if ks.get("mode") == "lazy":
        _print_lazy_info(ks["lazy"])
    if not ks["namespaces"] and ks.get("mode") != "lazy":
        out("  (empty: keys are computed by `nest ingest` or on first use)")
    for s in ks["namespaces"]:
        out(
            f"  namespace   {s['fingerprint']} ({s.get('backend', 'torch')} backend, key source "
            f"{s['key_source']!r}, d={s['key_dim']})"
        )
        codec = s.get("codec", s["dtype"])
        detail = ", ".join(f"{k}={v}" for k, v in s.get("codec_params", {}).items()
                           if k not in ("codec", "key_dim"))
        out(
            f"  key codec   {codec}{f' ({detail})' if detail else ''}: "
            f"{s.get('code_bytes', 0):,} bytes/key, decoded as {s['dtype']}"
            + ("" if s.get("codec_fingerprint") or codec in ("fp16", "fp32")
               else " (not trained yet)")
        )
        out(f"  passages    {s['n_passages']:,} with keys, {s['n_tokens']:,} tokens")
        out(
            f"  size        {s['bytes_on_disk'] / 1e6:,.1f} MB, "
            f"{s['bytes_per_token']:,.1f} bytes/token"
        )


def _print_lazy_info(lazy: dict[str, Any]) -> None:
    out(
        f"  mode        lazy (keys encoded at query time), cap {lazy['max_bytes'] / 1e6:,.1f} MB, "
        f"codec {lazy['codec']}"
    )
    for s in lazy["namespaces"]:
        from nest_integrations.index.namespaces import fingerprint_backend

        out(f"  cache       {s['fingerprint']} ({fingerprint_backend(s['fingerprint'])} backend, "
            f"key source {s['key_source']!r}, {s['codec']})")
        out(
            f"  used        {s['bytes_used'] / 1e6:,.1f} MB of {lazy['max_bytes'] / 1e6:,.1f} MB"
            f", {s['n_entries']:,} passages, {s['n_tokens']:,} tokens"
        )
