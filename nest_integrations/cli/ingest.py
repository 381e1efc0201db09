"""``nest ingest``: load, split, embed and store documents (and their token keys)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from nest_integrations import assembly
from nest_integrations.cli.common import UsageError, open_store, out, quiet_transformers, store_args
from nest_integrations.lm import default as default_model
from nest_integrations.lm.backend import add_backend_args, apply_backend_args


def _load_lm() -> Any:
    """The model for token keys: the shared default (``assembly.shared_model``). Subcommands
    call this so that tests can replace either."""
    return assembly.shared_model()


def add_ingest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or folders (recursive) of .txt .md .rst .html .htm .jsonl .pdf "
        '(JSONL: one {"text", "id"?, "metadata"?} object per line, or BEIR\'s "_id"/"title", '
        'or a Hugging Face dump\'s top-level "title"/"url": docs/own_corpus.md; text in any '
        "detected encoding; PDFs by their extracted text, with page numbers)",
    )
    p.add_argument("--sample", action="store_true", help="also ingest the shipped sample corpus")
    p.epilog = (
        "Without PATHs or --sample, an existing collection gets the token keys of --backend's "
        "model for every passage that lacks them, adding no passage: e.g. `nest ingest --backend "
        "llama.cpp` after ingesting on torch (otherwise they are encoded on first use)."
    )
    p.add_argument(
        "--no-keys",
        action="store_true",
        help="skip computing token keys now (they are computed on first use instead)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first bad input without writing anything (default: skip it and go on)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="encode token keys on Ray (needs the 'ray' extra): no ADDRESS starts a local Ray "
        "instance; HOST:PORT (from `ray start --head`) or 'auto' joins that cluster",
    )
    p.add_argument(
        "--key-codec",
        choices=("fp16", "fp32", "int8", "pq"),
        default=None,
        help="how token keys are stored, chosen when the store is created: fp16 (default for "
        "a new store; 2 bytes/dim), int8 (per-dimension scalar quantisation, half of fp16), pq "
        "(FAISS product quantisation, d/8 bytes/key), fp32; default: the store's own codec. "
        "With --no-keys, int8/pq tables are still trained now, on a sample",
    )
    p.add_argument(
        "--keys",
        choices=("eager", "lazy"),
        default=None,
        help="eager: encode every passage's token keys now (default for a new store); lazy: "
        "encode none now, only the passages a query retrieves, at query time, kept in an "
        "on-disk LRU cache capped by --key-cache-size (with --key-codec int8/pq the codec is "
        "trained now on a sample); default: the store's recorded mode. Eager keys already "
        "stored are still read in lazy mode",
    )
    p.add_argument(
        "--key-cache-size",
        metavar="SIZE",
        default=None,
        help="byte cap of the lazy key cache, e.g. 2GB, 500MB, 1.5GiB (default: the recorded "
        "cap, 2GB for a new one); least recently used passages' keys are evicted beyond it",
    )
    add_backend_args(p)  # --dtype: the keys are encoded in the model's dtype
    store_args(p)


def _lazy_keys(args: argparse.Namespace, store: Any) -> bool:
    """Whether this ingest leaves the persist dir in lazy key mode (``--keys lazy``, or a lazy
    dir without ``--keys``); checks ``--key-cache-size``."""
    from nest_integrations.index.lazy_mode import parse_size, read_mode

    lazy = args.keys == "lazy" or (args.keys is None and read_mode(store.keys_dir) is not None)
    if args.key_cache_size is not None:
        if not lazy:
            raise UsageError("--key-cache-size applies to lazy keys only: add --keys lazy")
        try:
            args.key_cache_size = parse_size(args.key_cache_size)
        except ValueError as exc:
            raise UsageError(f"--key-cache-size: {exc}") from None
    return lazy


def _ray_address(args: argparse.Namespace) -> str | None:
    """``--ray``'s address (None without the flag). A bare ``--ray`` before a PATH swallows
    it (``nest ingest --ray docs/``): a value that is not HOST:PORT/auto/local is put back."""
    value = getattr(args, "ray", None)
    if value is None or value in ("local", "auto") or ":" in value:
        return value
    args.paths = [*args.paths, value]
    args.ray = "local"
    return "local"


class _Clock:
    """The whole command's time, and the part spent converting the model on first use (the
    conversion shows a progress bar on stderr unless --json)."""

    def __init__(self, progress: bool) -> None:
        self.start = time.perf_counter()
        self.converted_before = default_model.conversion_seconds()
        default_model.show_conversion_progress(progress)

    @property
    def conversion(self) -> float:
        return default_model.conversion_seconds() - self.converted_before

    def total(self) -> float:
        return time.perf_counter() - self.start

    def line(self) -> str:
        """The summary's ``time`` line: the total, and the conversion in it."""
        text = f"  time        {self.total():.1f} s"
        if self.conversion:
            text += (f", of which {self.conversion:.1f} s converting the embedded model "
                     "(first use of this NEST_HOME only)")
        return text

    def add_to(self, d: dict[str, Any]) -> dict[str, Any]:
        """``--json``'s report with ``total_seconds`` and ``conversion_seconds``."""
        return {**d, "total_seconds": round(self.total(), 3),
                "conversion_seconds": round(self.conversion, 3)}


def _keys_only(args: argparse.Namespace, store: Any, ray_address: str | None,
               clock: _Clock) -> int:
    """``nest ingest`` without PATHs: the token keys of an existing collection for this
    backend's model (``IngestPipeline.fill_keys``), no passage added."""
    from nest_integrations.ingest.pipeline import IngestPipeline

    if args.no_keys or args.keys or args.key_codec or args.key_cache_size:
        raise UsageError("nothing to ingest: give one or more PATHs, or --sample")
    if not store.exists():
        raise UsageError(
            "nothing to ingest: give one or more PATHs, or --sample (without them, an existing "
            f"collection gets its token keys; there is no collection {store.collection_name!r} "
            f"at {store.location})"
        )
    pipeline = IngestPipeline(store, _load_lm(), ray_address=ray_address)
    report = pipeline.fill_keys(progress=not args.json)
    if args.json:
        out(json.dumps(clock.add_to(report.to_dict()), indent=2))
        return 0
    out(f"Token keys of collection {report.collection!r} ({report.location})")
    out(f"  passages    {report.passages:,} (none added)")
    keys = f"{report.keys_added:,} passages newly encoded"
    if report.keys_mode == "lazy":
        keys = "lazy: encoded when a query retrieves them (cache: `nest info`)"
    out(f"  token keys  {keys}")
    out(clock.line())
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from nest_integrations.ingest import sample_corpus_inputs

    clock = _Clock(progress=not args.json)  # the total printed counts everything from here
    ray_address = _ray_address(args)  # first: a bare --ray may have taken a PATH
    apply_backend_args(args)
    inputs: list[str | Path] = list(args.paths)
    if args.sample:
        inputs += sample_corpus_inputs()
    from nest_integrations.ingest.pipeline import IngestPipeline

    quiet_transformers()
    with_keys = not args.no_keys
    store = open_store(args)  # connect first: fail fast, before the LM
    if not inputs:
        return _keys_only(args, store, ray_address, clock)
    codec = getattr(args, "key_codec", None)
    lazy = _lazy_keys(args, store)
    if lazy:
        with_keys = False  # keys are encoded at query time (a trained codec needs the LM now)
    lm = _load_lm() if with_keys or (codec and not lazy) or codec in ("int8", "pq") else None
    pipeline = IngestPipeline(
        store, lm, with_keys=with_keys, ray_address=ray_address, key_codec=codec,
        keys=args.keys, key_cache_size=args.key_cache_size,
    )  # fmt: skip
    if codec and not with_keys and not lazy:
        pipeline.key_store().close()  # records the codec (refuses another one) before writing
    report = pipeline.ingest(inputs, strict=args.strict, progress=not args.json)
    if args.json:
        out(json.dumps(clock.add_to(report.to_dict()), indent=2))
    else:
        out(f"Ingested into collection {report.collection!r} ({report.location})")
        formats = ", ".join(f"{v} {k}" for k, v in report.formats.items())
        out(f"  documents   {report.documents:,}" + (f": {formats}" if formats else ""))
        out(f"  titles      {report.titled:,} of {report.documents:,} documents have a title "
            "other than their id" + ("" if report.titled else
                                     " (JSONL: a top-level or metadata \"title\")"))
        out(
            f"  passages    {report.passages:,} ({report.added:,} added, "
            f"{report.unchanged:,} unchanged, {report.removed:,} removed)"
        )
        out(f"  tokens      {report.tokens:,}")
        keys = (
            f"{report.keys_added:,} passages newly encoded" if with_keys else "skipped (--no-keys)"
        )
        if report.keys_encoder == "ray":
            keys += f" on Ray ({report.key_workers} workers)"
        if report.keys_mode == "lazy":
            keys = "lazy: encoded when a query retrieves them (cache: `nest info`)"
        out(f"  token keys  {keys}")
        out(clock.line())
    if report.issues:
        sys.stderr.write(f"nest: skipped {len(report.issues)} input(s):\n")
        for issue in report.issues:
            sys.stderr.write(f"  {issue}\n")
    if report.documents == 0:
        sys.stderr.write("nest: error: no documents could be ingested\n")
        return 1
    return 0
