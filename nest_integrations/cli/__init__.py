"""The ``nest`` command line: one module per subcommand, registered in ``COMMANDS``.

Each subcommand module (``ingest``, ``info``, ``ask``, ``attribute``, ``eval``, ``dresd``, ``calibrate``,
``knn_ssd``, ``serve``) has ``add_<name>_args(parser)``, which adds its options, and
``cmd_<name>(args) -> int``, which runs it (``knn_ssd`` for ``nest knn-ssd``); ``common`` holds
the shared store options and ``formatting`` the terminal rendering of answers. ``main`` parses,
configures logging, runs the command and turns expected errors into one line on stderr and exit
status 1 (``--debug`` shows the traceback instead). Only the module of the command being run is
imported: ``import nest_integrations.cli`` and ``nest --help`` load no torch, transformers,
Chroma or LlamaIndex (``tests/cli/test_startup.py``).

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
import importlib
import logging
import os
import sys
import traceback
from types import ModuleType
from typing import Callable, Iterable, Sequence

from nest_integrations.cli.common import UsageError

LOG = logging.getLogger("nest_integrations.cli")

__all__ = ["COMMANDS", "UsageError", "build_parser", "command_module", "main"]


# --------------------------------------------------------------------------------- registry

#: name -> one-line help (shown by ``nest --help``). The subcommand ``name`` lives in the module
#: ``nest_integrations.cli.<name with _ for ->``, as ``add_<module>_args(parser)`` and
#: ``cmd_<module>(args) -> int``; the module is imported only when the command runs or its
#: arguments are parsed, so ``nest --help`` loads no model library. Add a subcommand with one
#: entry and its module.
COMMANDS: dict[str, str] = {
    "ingest": "load, split, embed and store documents (and their token keys)",
    "info": "show the model backend (dtype, exact lossless decoding here), collections, "
            "passages, tokens and key-store size",
    "ask": "answer a question with NEST; every copied span is cited",
    "attribute": "attribute any text to a collection: verbatim and support citations, "
                 "unsupported sentences",
    "eval": "compare base LM, RA, kNN-LM, NEST and RA-NEST (Table 1 style report + plots)",
    "dresd": "build or inspect a DReSD datastore (lossless dense-retrieval drafts)",
    "calibrate": "fit the kNN temperature and RRC (mu, alpha, tau) to the model and a collection",
    "knn-ssd": "build KNN-SSD skip-set profiles: domain prompts, skip-set search, anchors",
    "serve": "serve an OpenAI-compatible API with span citations, and a playground page at /",
}



def command_module(name: str) -> ModuleType:
    """The module of subcommand ``name`` (imported now)."""
    return importlib.import_module(f"nest_integrations.cli.{name.replace('-', '_')}")


def _functions(name: str) -> tuple[Callable[[argparse.ArgumentParser], None],
                                   Callable[[argparse.Namespace], int]]:
    module, stem = command_module(name), name.replace("-", "_")
    return getattr(module, f"add_{stem}_args"), getattr(module, f"cmd_{stem}")


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``nest`` parser. ``commands``: the subcommands whose arguments it parses (their
    modules are imported); default all. The others are listed by name and help only."""
    parser = argparse.ArgumentParser(
        prog="nest",
        description="NEST (Nearest Neighbor Speculative Decoding) with span citations.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do")
    wanted = set(COMMANDS if commands is None else commands)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in wanted:
            _functions(name)[0](p)
    return parser


def _named_command(argv: Sequence[str]) -> list[str]:
    """The subcommand ``argv`` names, as a list for ``build_parser``; ``[]`` when it names none
    (``nest --help``: no subcommand module is imported) or an unknown one (argparse says so)."""
    for word in argv:
        if word.startswith("-"):  # an option of ``nest`` itself: none takes a value
            continue
        return [word] if word in COMMANDS else []
    return []


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
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_named_command(argv))
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    _setup_logging(args.verbose)
    run = _functions(args.command)[1]
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
