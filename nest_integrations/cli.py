"""The ``nest`` command line: ``nest ingest`` and ``nest info`` (``nest ask`` plugs in here too).

Each subcommand is two functions registered in ``COMMANDS``: ``_<name>_args(parser)`` adds its
options and ``_cmd_<name>(args) -> int`` runs it. ``main`` parses, configures logging, runs the
command and turns expected errors into one line on stderr and exit status 1 (``--debug`` shows
the traceback instead).

Usage::

    nest ingest docs/ notes.jsonl --collection docs     # embedded store in $NEST_HOME/store
    nest ingest --sample                                 # the shipped sample corpus
    nest ingest docs/ --chroma-url http://localhost:8000 # a `chroma run` server
    nest info                                            # every collection
    nest info --collection docs

Defaults (collection name, store folder) come from ``nest_integrations.assembly``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from nest_integrations import assembly
from nest_integrations.ask import ASK_HELP, add_ask_args, cmd_ask
from nest_integrations.dresd.cli import DRESD_HELP, add_dresd_args, cmd_dresd
from nest_integrations.calibrate import CALIBRATE_HELP, add_calibrate_args, cmd_calibrate
from nest_integrations.evaluation.cli import EVAL_HELP, add_eval_arguments, run_eval
from nest_integrations.knn_ssd.cli import KNN_SSD_HELP, add_knn_ssd_args, cmd_knn_ssd
from nest_integrations.lm.backend import add_backend_args, apply_backend_args
from nest_integrations.server.cli import SERVE_HELP, add_serve_args, cmd_serve

LOG = logging.getLogger("nest_integrations.cli")


# --------------------------------------------------------------------------------- shared options


def _out(text: str = "") -> None:
    """One line of command output on stdout (results; progress and errors go to stderr)."""
    sys.stdout.write(f"{text}\n")


def _store_args(p: argparse.ArgumentParser, collection_help: str | None = None) -> None:
    default = None if collection_help else assembly.DEFAULT_COLLECTION
    p.add_argument(
        "--collection",
        default=default,
        help=collection_help or f"Chroma collection name (default: {default!r})",
    )
    p.add_argument(
        "--persist-dir",
        metavar="DIR",
        help="store folder holding chroma/ and keys/ (default: $NEST_HOME/store)",
    )
    p.add_argument(
        "--chroma-url",
        metavar="URL",
        help="use a Chroma server (e.g. http://localhost:8000, started with `chroma run`) "
        "instead of the embedded store; token keys stay in --persist-dir",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def _open_store(args: argparse.Namespace) -> Any:
    return assembly.open_store(args.collection, args.persist_dir, args.chroma_url)


def _load_lm() -> Any:
    """The model for token keys: the shared default (``assembly.shared_model``). Subcommands
    call this so that tests can replace either."""
    return assembly.shared_model()


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars are the ones that matter


# --------------------------------------------------------------------------------- nest ingest


def _ingest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or folders (recursive) of .txt .md .rst .html .htm .jsonl .pdf "
        '(JSONL: one {"text", "id"?, "metadata"?} object per line; text in any detected '
        "encoding; PDFs by their extracted text, with page numbers)",
    )
    p.add_argument("--sample", action="store_true", help="also ingest the shipped sample corpus")
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
    _store_args(p)


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


def _cmd_ingest(args: argparse.Namespace) -> int:
    from nest_integrations.ingest import sample_corpus_inputs

    ray_address = _ray_address(args)  # first: a bare --ray may have taken a PATH
    apply_backend_args(args)
    inputs: list[str | Path] = list(args.paths)
    if args.sample:
        inputs += sample_corpus_inputs()
    if not inputs:
        raise UsageError("nothing to ingest: give one or more PATHs, or --sample")
    from nest_integrations.ingest.pipeline import IngestPipeline

    _quiet_transformers()
    with_keys = not args.no_keys
    store = _open_store(args)  # connect first: fail fast, before the LM
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
        _out(json.dumps(report.to_dict(), indent=2))
    else:
        _out(f"Ingested into collection {report.collection!r} ({report.location})")
        formats = ", ".join(f"{v} {k}" for k, v in report.formats.items())
        _out(f"  documents   {report.documents:,}" + (f": {formats}" if formats else ""))
        _out(
            f"  passages    {report.passages:,} ({report.added:,} added, "
            f"{report.unchanged:,} unchanged, {report.removed:,} removed)"
        )
        _out(f"  tokens      {report.tokens:,}")
        keys = (
            f"{report.keys_added:,} passages newly encoded" if with_keys else "skipped (--no-keys)"
        )
        if report.keys_encoder == "ray":
            keys += f" on Ray ({report.key_workers} workers)"
        if report.keys_mode == "lazy":
            keys = "lazy: encoded when a query retrieves them (cache: `nest info`)"
        _out(f"  token keys  {keys}")
        _out(f"  time        {report.seconds:.1f} s")
    if report.issues:
        sys.stderr.write(f"nest: skipped {len(report.issues)} input(s):\n")
        for issue in report.issues:
            sys.stderr.write(f"  {issue}\n")
    if report.documents == 0:
        sys.stderr.write("nest: error: no documents could be ingested\n")
        return 1
    return 0


# --------------------------------------------------------------------------------- nest info


def _info_args(p: argparse.ArgumentParser) -> None:
    _store_args(p, "also show this collection's passages, documents and tokens "
                "(default: list every collection)")


def _cmd_info(args: argparse.Namespace) -> int:
    if not args.chroma_url:
        from nest_integrations import paths

        root = assembly.persist_root(args.persist_dir)
        if not paths.chroma_dir(root).is_dir():  # do not create an empty store just to look
            raise FileNotFoundError(
                f"no store at {root}; create one with `nest ingest PATH...` or "
                "`nest ingest --sample`"
            )
    store = _open_store(args)
    collections = {name: store.with_collection(name).count() for name in store.list_collections()}
    info: dict[str, Any] = {"chroma": store.location, "collections": collections}
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
        _out(json.dumps(info, indent=2, default=str))
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
    from nest_integrations.index.namespaces import list_namespaces
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
            out.append(ks.stats())
    return out


def _print_info(info: dict[str, Any], collection: str | None) -> None:
    _out(f"Chroma:       {info['chroma']}")
    cols = info["collections"]
    listed = ", ".join(f"{n} ({c:,} passages)" for n, c in cols.items()) if cols else "none"
    _out(f"Collections:  {listed}")
    if "collection" in info:
        c = info["collection"]
        _out(
            f"Collection {collection!r}: {c['passages']:,} passages, {c['documents']:,} "
            f"documents, {c['tokens']:,} tokens ({c['space']} space)"
        )
    ks = info["key_store"]
    _out(f"Key store:    {ks['path']} (shared by the collections of this persist dir)")
    if ks.get("mode") == "lazy":
        _print_lazy_info(ks["lazy"])
    if not ks["namespaces"] and ks.get("mode") != "lazy":
        _out("  (empty: keys are computed by `nest ingest` or on first use)")
    for s in ks["namespaces"]:
        _out(
            f"  model       {s['fingerprint']} (key source {s['key_source']!r}, "
            f"d={s['key_dim']})"
        )
        codec = s.get("codec", s["dtype"])
        detail = ", ".join(f"{k}={v}" for k, v in s.get("codec_params", {}).items()
                           if k not in ("codec", "key_dim"))
        _out(
            f"  key codec   {codec}{f' ({detail})' if detail else ''}: "
            f"{s.get('code_bytes', 0):,} bytes/key, decoded as {s['dtype']}"
            + ("" if s.get("codec_fingerprint") or codec in ("fp16", "fp32")
               else " (not trained yet)")
        )
        _out(f"  passages    {s['n_passages']:,} with keys, {s['n_tokens']:,} tokens")
        _out(
            f"  size        {s['bytes_on_disk'] / 1e6:,.1f} MB, "
            f"{s['bytes_per_token']:,.1f} bytes/token"
        )


def _print_lazy_info(lazy: dict[str, Any]) -> None:
    _out(
        f"  mode        lazy (keys encoded at query time), cap {lazy['max_bytes'] / 1e6:,.1f} MB, "
        f"codec {lazy['codec']}"
    )
    for s in lazy["namespaces"]:
        _out(f"  cache       {s['fingerprint']} (key source {s['key_source']!r}, {s['codec']})")
        _out(
            f"  used        {s['bytes_used'] / 1e6:,.1f} MB of {lazy['max_bytes'] / 1e6:,.1f} MB"
            f", {s['n_entries']:,} passages, {s['n_tokens']:,} tokens"
        )


# --------------------------------------------------------------------------------- registry

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]

#: name -> (add arguments, run, help). Add a subcommand (e.g. ``ask``) with one entry.
COMMANDS: dict[str, Command] = {
    "ingest": (
        _ingest_args,
        _cmd_ingest,
        "load, split, embed and store documents (and their token keys)",
    ),
    "info": (_info_args, _cmd_info, "show collections, passages, tokens and key-store size"),
    "ask": (add_ask_args, cmd_ask, ASK_HELP),
    "eval": (add_eval_arguments, run_eval, EVAL_HELP),
    "dresd": (add_dresd_args, cmd_dresd, DRESD_HELP),
    "calibrate": (add_calibrate_args, cmd_calibrate, CALIBRATE_HELP),
    "knn-ssd": (add_knn_ssd_args, cmd_knn_ssd, KNN_SSD_HELP),
    "serve": (add_serve_args, cmd_serve, SERVE_HELP),
}


class UsageError(ValueError):
    """A command-line mistake (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nest",
        description="NEST (Nearest Neighbor Speculative Decoding) with span citations.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do")
    for name, (add_args, _, help_text) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _setup_logging(verbose: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("nest: %(levelname)s: %(message)s"))
    root = logging.getLogger("nest_integrations")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    if not verbose:  # skipped inputs are listed in the command's own summary
        logging.getLogger("nest_integrations.ingest.documents").setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``nest`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is local: never reach a hub
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    _setup_logging(args.verbose)
    run = COMMANDS[args.command][1]
    try:
        return run(args)
    except KeyboardInterrupt:
        sys.stderr.write("nest: interrupted\n")
        return 130
    except UsageError as exc:
        sys.stderr.write(f"nest {args.command}: error: {exc}\n")
        return 2
    except Exception as exc:  # the CLI boundary: one line, no traceback unless --debug
        from nest_integrations.retrieval.chroma import InvalidCollectionNameError

        if isinstance(exc, InvalidCollectionNameError):  # a bad --collection: a usage error
            sys.stderr.write(f"nest {args.command}: error: {exc}\n")
            return 2
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(f"nest: error: {_describe(exc)}\n")
        return 1


def _describe(exc: BaseException) -> str:
    """Expected errors carry actionable messages; anything else also names its type."""
    from nest_integrations.index.base import KeyStoreCorruptError
    from nest_integrations.ingest import IngestError
    from nest_integrations.ingest.ray_keys import RayKeysError
    from nest_integrations.retrieval.chroma import ChromaConnectionError, CollectionNotFoundError

    expected = (
        IngestError,
        KeyStoreCorruptError,
        RayKeysError,
        CollectionNotFoundError,
        ChromaConnectionError,
        ImportError,
        OSError,
        ValueError,
        LookupError,
    )
    text = (
        str(exc)
        if isinstance(exc, expected)
        else f"{type(exc).__name__}: {exc} (use --debug for details)"
    )
    return text


if __name__ == "__main__":
    raise SystemExit(main())
