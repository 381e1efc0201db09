"""`nest ask`: answer a question over an ingested collection, with its sources.

Defaults (collection, token budget, preset, decoding) come from ``nest_integrations.assembly``,
which also builds the engine.
"""

from __future__ import annotations

import argparse
import json
import sys

from nest_integrations import assembly
from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.lm.backend import add_backend_args, apply_backend_args


def _decoding_choices() -> list[str]:
    from nest_integrations.drafters import METHODS

    return sorted(METHODS)


def add_ask_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `nest ask` (the parser itself comes from the CLI registry)."""
    p.description = (
        "Retrieve passages for QUESTION from a collection filled by `nest ingest`, decode "
        "by the preset's answer policy (grounded: losslessly against the top passages, the "
        "documents the question names first) or another --decoding method (nest: NEST's "
        "kNN-LM mixture and relaxed span copying), and print the answer with numbered "
        "markers and the sources of every copied span; under grounded and copy every other "
        "sentence gets a support citation or is flagged [!] as unsupported."
    )
    d = assembly
    p.add_argument("question", help="the question (sent to the model as a chat user message)")
    p.add_argument(
        "--collection", default=d.DEFAULT_COLLECTION,
        help=f"Chroma collection (default: {d.DEFAULT_COLLECTION})",
    )
    p.add_argument("--persist-dir", default=None, help="store folder (default: $NEST_HOME/store)")
    p.add_argument("--chroma-url", default=None, help="a Chroma server, e.g. http://localhost:8000")
    p.add_argument(
        "--max-new-tokens", type=int, default=d.DEFAULT_MAX_NEW_TOKENS,
        help=f"generation budget (default {d.DEFAULT_MAX_NEW_TOKENS})",
    )
    p.add_argument(
        "--decoding", default=d.DEFAULT_DECODING, choices=_decoding_choices(),
        help="decoding method (default: the preset's: rag-copy under grounded, nest under "
        "copy and paper); lossless ones (greedy, prompt-lookup, rag-copy, ...) equal greedy "
        "decoding of their prompt and cite what they reproduce verbatim",
    )
    p.add_argument(
        "--ra",
        action="store_true",
        help="RA-NEST: also put the top 3 passages in the prompt (with the paper preset: "
        "the paper's RA-NEST setting, gamma 0.5; recommended for QA with small models)",
    )
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="stage 1 fuses BM25 over the collection with dense search (the paper's hybrid)",
    )
    p.add_argument(
        "--preset", default=d.DEFAULT_PRESET, choices=sorted(PRESETS),
        help=f"preset: a NestConfig and an answer policy (default {d.DEFAULT_PRESET})",
    )
    p.add_argument("--gamma", type=float, default=None, help="relaxation gamma (overrides the preset)")
    p.add_argument("--passages", type=int, default=None, help="passages retrieved (b; default 40)")
    p.add_argument("--model", default=None,
                   help="a Hugging Face model id or folder; with --backend llama.cpp a .gguf file "
                   "or a quantisation of the embedded model (Q4_0, Q8_0, ...); default: "
                   "embedded SmolLM2")
    p.add_argument("--no-attribute", action="store_true",
                   help="no support citations: sentences the answer did not copy are neither "
                   "cited nor checked (NestConfig.attribute=False; the token ids are the same)")
    p.add_argument("--json", action="store_true", help="print the whole NestResult as JSON")
    add_backend_args(p)


def ask_spec(args: argparse.Namespace) -> assembly.EngineSpec:
    """The engine `nest ask` builds for ``args`` (always over the Chroma store)."""
    overrides: dict[str, object] = {}
    if args.gamma is not None:
        overrides["relaxation"] = args.gamma
    if args.passages is not None:
        overrides["n_passages"] = args.passages
    if getattr(args, "no_attribute", False):
        overrides["attribute"] = False
    preset = args.preset
    if args.ra and preset == "paper":
        preset = "paper-ra"  # the paper's RA-NEST setting: 3 passages in the prompt, gamma 0.5
    elif args.ra:
        overrides["ra_passages"] = max(3, NestConfig.from_preset(preset).ra_passages)
    return assembly.EngineSpec.for_store(
        args.collection,
        persist_dir=args.persist_dir,
        chroma_url=args.chroma_url,
        model=args.model,
        config=NestConfig.from_preset(preset, **overrides),
        policy=args.preset,
        decoding=args.decoding,
        hybrid=True if args.hybrid else None,
        dtype=getattr(args, "dtype", None),
        backend=getattr(args, "backend", None),
    )


def cmd_ask(args: argparse.Namespace) -> int:
    from nest_integrations.cli.formatting import render

    apply_backend_args(args)
    spec = ask_spec(args).resolved()  # ``auto`` decided: the summary says which backend ran
    engine = assembly.build_engine(spec)
    result = engine.generate(
        [{"role": "user", "content": args.question}], max_new_tokens=args.max_new_tokens
    )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result, backend=spec.backend) + "\n")
    return 0
