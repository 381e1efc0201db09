"""``nest knn-ssd``: build KNN-SSD profiles (skip sets and anchors) for a model.

Usage::

    nest knn-ssd prompts --out prompts/                     # the 4 built-in domains' prompt files
    nest knn-ssd search --domain python-code --prompts prompts/python-code.train.jsonl --trials 40
    nest knn-ssd search --domain mixed --prompts prompts/python-code.train.jsonl \\
        --prompts prompts/wiki-en.train.jsonl ...           # Self-SD (Mix): prompts of all domains
    nest knn-ssd anchors --domain python-code --prompts prompts/python-code.train.jsonl
    nest knn-ssd show                                       # what the profile holds

Profiles live in ``$NEST_HOME/knn_ssd/<model fingerprint>/default.json`` (``--profile`` takes
another name or a path); ``decoding="knn-ssd"`` finds the default one automatically, and
without one uses the profile shipped in the package for the model (the embedded SmolLM2 has
one; ``show`` prints which file it read).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import zip_longest
from typing import Any

from nest_integrations.lm.backend import add_backend_args, apply_backend_args


def _load_lm(model: str | None) -> Any:
    """The model to profile: the default engine's model or ``--model``, from the shared model
    cache (``assembly.spec_model``; tests replace this)."""
    from nest_integrations import assembly

    spec = assembly.EngineSpec(model=model, device="auto" if model else None).resolved()
    assembly.check_backend(spec.backend, decoding="knn-ssd")  # llama.cpp cannot skip layers
    return assembly.spec_model(spec)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="NAME|PATH",
                   help="profile name in $NEST_HOME/knn_ssd/<model>/ or a JSON path "
                   "(default: 'default')")
    p.add_argument("--model", metavar="PATH",
                   help="a Hugging Face model folder or id (default: the embedded SmolLM2)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_backend_args(p)


def add_knn_ssd_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="knn_command", metavar="ACTION", required=True,
                                help="what to do")
    p = sub.add_parser("prompts", help="write the built-in domains' train/eval prompt files")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--n-train", type=int, default=48)
    p.add_argument("--n-eval", type=int, default=16)
    p.add_argument("--domains", nargs="+", metavar="NAME",
                   help="built-in domains (default: all)")

    p = sub.add_parser("search", help="Bayesian search (optuna TPE) of a domain's skip set")
    p.add_argument("--domain", required=True, help="domain name ('mixed' = Self-SD (Mix))")
    p.add_argument("--prompts", required=True, action="append", metavar="FILE",
                   help="prompt file (.jsonl with \"text\", or blank-line-separated text); "
                   "repeat to mix several (taken round-robin)")
    p.add_argument("--trials", type=int, default=40, help="trial budget (resumes up to it)")
    p.add_argument("--n-prompts", type=int, default=4, help="prompts per trial (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--objective", choices=("model", "wallclock"), default="model",
                   help="'model': speed-up from measured per-pass costs and exact draft "
                   "counts (steady on a shared CPU); 'wallclock': measured tokens/s ratio")
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--max-draft", type=int, default=12)
    _common(p)

    p = sub.add_parser("anchors", help="K-means anchors of a domain's prompts (faiss)")
    p.add_argument("--domain", required=True)
    p.add_argument("--prompts", required=True, action="append", metavar="FILE")
    p.add_argument("--k", type=int, default=10, help="anchors per domain (default 10)")
    _common(p)

    p = sub.add_parser("show", help="print the profile's skip sets and anchors")
    _common(p)


def _texts(files: list[str]) -> list[str]:
    from nest_integrations.knn_ssd.domains import read_prompts

    lists = [read_prompts(f) for f in files]
    return [t for group in zip_longest(*lists) for t in group if t is not None]


def _emit(args: argparse.Namespace, result: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1, default=str) + "\n")
    else:
        sys.stdout.write("\n".join(lines) + "\n")


def cmd_knn_ssd(args: argparse.Namespace) -> int:
    if args.knn_command == "prompts":
        from nest_integrations.knn_ssd.domains import DOMAINS, write_domain_prompts

        paths = write_domain_prompts(args.out, args.n_train, args.n_eval,
                                     tuple(args.domains or DOMAINS))
        sys.stdout.write("\n".join(str(p) for p in paths) + "\n")
        return 0
    apply_backend_args(args)
    texts = _texts(args.prompts) if hasattr(args, "prompts") else []
    lm = _load_lm(args.model)
    if args.knn_command == "search":
        from nest_integrations.builders.knn_ssd_search import search_skip_set

        res = search_skip_set(
            lm, args.domain, texts, trials=args.trials, n_prompts=args.n_prompts,
            max_new_tokens=args.max_new_tokens, objective=args.objective,
            profile=args.profile, threshold=args.threshold, max_draft=args.max_draft,
        )
        out = {"domain": res.domain, "skip": res.skip.to_dict(), "value": res.value,
               "trials": res.trials, "objective": res.objective, "stats": res.stats}
        _emit(args, out, [f"{res.domain}: {res.skip}",
                          f"  {res.objective} speed-up {res.value:.3f} after {res.trials} trials; "
                          f"acceptance {res.stats.get('acceptance_rate')}, "
                          f"tokens/step {res.stats.get('mean_accepted')}"])
        return 0
    if args.knn_command == "anchors":
        from nest_integrations.builders.knn_ssd_search import build_anchors

        out = build_anchors(lm, args.domain, texts, k=args.k, profile=args.profile)
        _emit(args, out, [f"{out['domain']}: {out['anchors']} anchors from {out['n_prompts']} "
                          f"prompts (min self-similarity {out['min_self_similarity']}) -> "
                          f"{out['profile']}"])
        return 0
    from nest_integrations.knn_ssd.profile import load_profile, profile_path
    from nest_integrations.knn_ssd.router import Router

    prof = load_profile(lm, args.profile)
    data = prof.to_json()
    data.pop("anchors")
    data["anchors"] = {d: len(a) for d, a in prof.anchors.items()}
    data["min_similarity"] = Router(prof).min_similarity
    data["source"] = prof.source
    lines = [f"profile {prof.source or profile_path(lm, args.profile)} for {prof.model}"]
    for d, s in sorted(prof.skips.items()):
        lines.append(f"  {d}: {s} value {prof.search.get(d, {}).get('value')}")
    for d, a in sorted(prof.anchors.items()):
        lines.append(f"  anchors {d}: {len(a)}")
    _emit(args, data, lines)
    return 0
