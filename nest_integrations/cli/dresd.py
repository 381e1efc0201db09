"""``nest dresd``: build and inspect DReSD datastores.

Usage::

    nest dresd build --collection docs                  # from an ingested collection (reuses its
                                                        # token keys); -> <persist>/dresd/docs
    nest dresd build --from-prompts prompts.jsonl       # the model's own greedy responses
                                                        # -> <persist>/dresd/prompts-<stem>
    nest dresd info --collection docs                   # size, fingerprint, index
    nest ask "..." --decoding dresd                     # (where `nest ask` has --decoding)

A build interrupted by a kill resumes when the same command is run again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nest_integrations.lm.backend import add_backend_args, apply_backend_args


def add_dresd_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="dresd_command", metavar="{build,info}", required=True,
                           help="build: build or resume a datastore; info: show one")
    b = sub.add_parser("build", help="build (or resume building) a datastore")
    b.add_argument("--from-prompts", metavar="FILE",
                   help='JSONL prompts ({"prompt"|"messages"|"text": ...} per line): store the '
                   "model's own greedy responses (an in-domain datastore / response cache)")
    b.add_argument("--out", metavar="DIR", help="datastore folder (default: "
                   "<persist-dir>/dresd/<collection> or <persist-dir>/dresd/prompts-<stem>)")
    b.add_argument("--index", default="auto", choices=("auto", "flat", "ivf", "hnsw"),
                   help="FAISS index kind (auto: exact below 300k tokens, else IVF)")
    b.add_argument("--max-new-tokens", type=int, default=128,
                   help="response length for --from-prompts (default 128)")
    b.add_argument("--pca-sample", type=int, default=1_000_000,
                   help="at most this many key vectors fit the PCA (default 1M)")
    _common(b)
    add_backend_args(b)
    i = sub.add_parser("info", help="show a datastore's size, fingerprint and index")
    i.add_argument("--datastore", metavar="DIR", help="datastore folder")
    _common(i)
    # fmt: skip


def _common(p: argparse.ArgumentParser) -> None:
    from nest_integrations.defaults import DEFAULT_COLLECTION

    p.add_argument("--collection", default=DEFAULT_COLLECTION,
                   help=f"Chroma collection (default {DEFAULT_COLLECTION!r})")
    p.add_argument("--persist-dir", metavar="DIR",
                   help="store folder holding chroma/ and keys/ (default: $NEST_HOME/store)")
    p.add_argument("--chroma-url", metavar="URL", help="a Chroma server instead of the "
                   "embedded store")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _out(text: str = "") -> None:
    sys.stdout.write(f"{text}\n")


def _load_lm() -> Any:
    """The default engine's model (``assembly.spec_model`` of a default spec: the shared model
    cache), so that ``decoding="dresd"`` decodes with the model its datastore was built with
    (tests replace this)."""
    from nest_integrations import assembly

    return assembly.spec_model(assembly.EngineSpec())


def cmd_dresd(args: argparse.Namespace) -> int:
    if args.dresd_command == "info":
        return _info(args)
    return _build(args)


def _build(args: argparse.Namespace) -> int:
    apply_backend_args(args)
    from nest_integrations.builders.dresd_responses import PromptSource, read_prompts
    from nest_integrations.dresd import PassageSource, build_datastore, default_datastore_path

    if args.from_prompts:
        prompts = read_prompts(args.from_prompts)  # clear errors before loading the model
        out = Path(args.out) if args.out else default_datastore_path(
            f"prompts-{Path(args.from_prompts).stem}", args.persist_dir)
        lm = _load_lm()
        source: Any = PromptSource(prompts, lm, max_new_tokens=args.max_new_tokens,
                                   batch_size=8)
    else:
        from nest_integrations.index.store import DiskKeyStore

        store = _open_store(args)
        store.count()  # a missing collection fails here, naming the existing ones
        passages = sorted(store.iter_passages(), key=lambda p: p.id)
        if not passages:
            raise ValueError(f"collection {args.collection!r} is empty: ingest documents first")
        out = Path(args.out) if args.out else default_datastore_path(
            args.collection, args.persist_dir)
        lm = _load_lm()
        store.lm = lm
        key_store = DiskKeyStore.open(store.keys_dir, lm)
        source = PassageSource(passages, lm, key_store=key_store, batch_size=64,
                               name=f"collection:{args.collection}")
    ds = build_datastore(lm, source, out, index_kind=args.index, pca_sample=args.pca_sample,
                         progress=not args.json)
    _show(ds.stats(), args.json)
    return 0


def _open_store(args: argparse.Namespace) -> Any:
    from nest_integrations import assembly

    return assembly.open_store(args.collection, args.persist_dir, args.chroma_url)


def _info(args: argparse.Namespace) -> int:
    from nest_integrations.dresd import DresdDatastore, default_datastore_path

    path = Path(args.datastore) if args.datastore else default_datastore_path(
        args.collection, args.persist_dir)
    _show(DresdDatastore.open(path).stats(), args.json)
    return 0


def _show(stats: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _out(json.dumps(stats, indent=2, default=str))
        return
    fp = stats["fingerprint"]
    _out(f"DReSD datastore {stats['path']}")
    _out(f"  tokens      {stats['n_tokens']:,} in {stats['n_passages']:,} passages")
    _out(f"  model       {fp['model']} (key source {fp['key_source']!r}, PCA {fp['dim']}-d "
         f"{fp['pca']}, {stats['pca_explained']:.0%} of variance)")
    _out(f"  index       {stats['index']}")
    _out(f"  size        {stats['bytes_on_disk'] / 1e6:,.1f} MB, "
         f"{stats['bytes_per_token']:,.1f} bytes/token")
