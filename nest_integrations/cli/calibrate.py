"""``nest calibrate``: its arguments and its summary table."""

from __future__ import annotations

import argparse
import json
import sys

from nest_integrations.calibrate.runs import calibrate_collection
from nest_integrations.lm.backend import add_backend_args, apply_backend_args

__all__ = ["add_calibrate_args", "cmd_calibrate"]


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collection", default="nest", help="Chroma collection (default: 'nest')")
    p.add_argument("--persist-dir", metavar="DIR",
                   help="store folder holding chroma/ and keys/ (default: $NEST_HOME/store)")
    p.add_argument("--n-texts", type=int, default=24,
                   help="documents held out, and documents kept in, to score (default 24)")
    p.add_argument("--passages", type=int, default=40, help="passages retrieved per text (b)")
    p.add_argument("--seed", type=int, default=0, help="split seed")
    p.add_argument("--dry-run", action="store_true", help="fit and print, store nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_backend_args(p)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.n_texts < 1 or args.passages < 1:
        raise ValueError("--n-texts and --passages must be at least 1")
    from nest_integrations.assembly import shared_model

    apply_backend_args(args)
    lm = shared_model()
    res = calibrate_collection(
        args.persist_dir, args.collection, lm, n_texts=args.n_texts, n_passages=args.passages,
        seed=args.seed, save=not args.dry_run, progress=not args.json,
    )
    out = sys.stdout.write
    if args.json:
        out(json.dumps(res, indent=2) + "\n")
        return 0
    o, s, ppl = res["overrides"], res["suggested"], res["ppl"]
    out(f"Calibrated collection {args.collection!r} "
        f"({res['n_texts']['in_corpus']} in-corpus + {res['n_texts']['held_out']} held-out texts,"
        f" {res['n_tokens']['in_corpus'] + res['n_tokens']['held_out']} tokens, "
        f"{res['seconds']['total']:.0f} s)\n")
    out(f"  knn_temperature (mu)  {o['knn_temperature']:.4g}   (default "
        f"{res['default']['knn_temperature']:.4g})\n")
    out(f"  rrc_offset (alpha)    {o['rrc_offset']:.3g}   "
        f"(default {res['default']['rrc_offset']})\n")
    out(f"  rrc_scale (tau)       {o['rrc_scale']:.3g}   (default {res['default']['rrc_scale']})\n")
    out(f"  suggested span_threshold (delta) {s['span_threshold']:.3g}, "
        f"relaxation (gamma) {s['relaxation']:.3g}\n")
    out("  p_M perplexity        base LM   default   calibrated\n")
    for name, key in (("in corpus", "in_corpus"), ("held out", "held_out")):
        v = ppl[key]
        out(f"    {name:<19} {v['base']:8.2f}  {v['default']:8.2f}  {v['calibrated']:10.2f}\n")
    if not res["feasible"]:
        out("  note: no grid point kept held-out perplexity at or below the base LM's; "
            "the lowest held-out perplexity was taken\n")
    out(f"  saved to {res['path']}\n" if "path" in res else "  (dry run: nothing stored)\n")
    return 0
