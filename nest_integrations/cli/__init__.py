"""The ``nest`` command line: one module per subcommand, registered in ``COMMANDS``.

Each subcommand module (``ingest``, ``info``, ``ask``, ``attribute``, ``eval``, ``dresd``, ``calibrate``,
``knn_ssd``, ``serve``) has ``add_<name>_args(parser)``, which adds its options, and
``cmd_<name>(args) -> int``, which runs it (``knn_ssd`` for ``nest knn-ssd``); ``common`` holds
the shared store options and ``formatting`` the terminal rendering of answers. ``main`` parses,
configures logging, runs the command and turns expected errors into one line on stderr and exit
status 1 (``--debug`` shows the traceback instead).

Usage::

    nest ingest docs/ notes.jsonl --collection docs     # embedded store in $NEST_HOME/store
    nest ingest --sample                                 # the shipped sample corpus
    nest ingest docs/ --chroma-url http://localhost:8000 # a `chroma run` server
    nest info                                            # every collection
    nest info --collection docs
    nest ask "What is belly dance?"
    nest attribute "Belly dance comes from Egypt." --question "What is belly dance?"

Defaults (collection name, store folder) come from ``nest_integrations.assembly``. The command
line is the outermost adapter: no library module imports this package.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Callable, Sequence

from nest_integrations.cli.ask import ASK_HELP, add_ask_args, cmd_ask
from nest_integrations.cli.attribute import ATTRIBUTE_HELP, add_attribute_args, cmd_attribute
from nest_integrations.cli.calibrate import CALIBRATE_HELP, add_calibrate_args, cmd_calibrate
from nest_integrations.cli.common import UsageError
from nest_integrations.cli.dresd import DRESD_HELP, add_dresd_args, cmd_dresd
from nest_integrations.cli.eval import EVAL_HELP, add_eval_args, cmd_eval
from nest_integrations.cli.info import INFO_HELP, add_info_args, cmd_info
from nest_integrations.cli.ingest import INGEST_HELP, add_ingest_args, cmd_ingest
from nest_integrations.cli.knn_ssd import KNN_SSD_HELP, add_knn_ssd_args, cmd_knn_ssd
from nest_integrations.cli.serve import SERVE_HELP, add_serve_args, cmd_serve

LOG = logging.getLogger("nest_integrations.cli")

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]


# --------------------------------------------------------------------------------- registry

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]

#: name -> (add arguments, run, help). Add a subcommand (e.g. ``ask``) with one entry.
COMMANDS: dict[str, Command] = {
    "ingest": (add_ingest_args, cmd_ingest, INGEST_HELP),
    "info": (add_info_args, cmd_info, INFO_HELP),
    "ask": (add_ask_args, cmd_ask, ASK_HELP),
    "attribute": (add_attribute_args, cmd_attribute, ATTRIBUTE_HELP),
    "eval": (add_eval_args, cmd_eval, EVAL_HELP),
    "dresd": (add_dresd_args, cmd_dresd, DRESD_HELP),
    "calibrate": (add_calibrate_args, cmd_calibrate, CALIBRATE_HELP),
    "knn-ssd": (add_knn_ssd_args, cmd_knn_ssd, KNN_SSD_HELP),
    "serve": (add_serve_args, cmd_serve, SERVE_HELP),
}


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
