"""What the ``nest`` subcommands share: output on stdout, the store options, usage errors."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nest_integrations.defaults import DEFAULT_COLLECTION


class UsageError(ValueError):
    """A command-line mistake (exit status 2)."""


def out(text: str = "") -> None:
    """One line of command output on stdout (results; progress and errors go to stderr)."""
    sys.stdout.write(f"{text}\n")


def store_args(p: argparse.ArgumentParser, collection_help: str | None = None) -> None:
    default = None if collection_help else DEFAULT_COLLECTION
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


def open_store(args: argparse.Namespace) -> Any:
    from nest_integrations import assembly

    return assembly.open_store(args.collection, args.persist_dir, args.chroma_url)


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars are the ones that matter
