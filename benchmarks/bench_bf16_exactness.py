"""Are the lossless methods still token-identical to greedy when the weights are bf16?

For each prompt, HF ``generate`` greedy (1-token steps) is the reference, in the same dtype.
Compared with it: our ``greedy``, ``prompt-lookup`` and ``rag-copy`` (multi-token verify passes),
and HF's own prompt lookup (``prompt_lookup_num_tokens=10``), in fp32 and in bf16. A row says
whether the output is identical and, if not, the first differing token.

    python benchmarks/bench_bf16_exactness.py            # 6 prompts x 48 tokens, fp32 and bf16

Writes ``benchmarks/results/bf16_exactness.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUESTIONS = [
    ("What does the assert statement do in Python?",
     "The assert statement is a convenient way to insert debugging assertions into a program. "
     "The simple form, assert expression, is equivalent to: if __debug__: if not expression: "
     "raise AssertionError."),
    ("What is the capital of France?",
     "Paris is the capital and most populous city of France. With an estimated population of "
     "2,102,650 residents in January 2023 in an area of more than 105 km2, Paris is the "
     "fourth-most populous city in the European Union."),
    ("Write a Python function that reverses a string.",
     "To reverse a string in Python, use slicing: s[::-1] returns the string reversed. For "
     "example, 'hello'[::-1] is 'olleh'."),
    ("List the days of the week.",
     "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and "
     "Sunday."),
    ("Explain photosynthesis in one paragraph.",
     "Photosynthesis is the process by which green plants use sunlight, water and carbon "
     "dioxide to make glucose and release oxygen."),
    ("Count from 1 to 20, separated by commas.",
     "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20"),
]


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48, help="new tokens per prompt")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from nest_integrations import NestEngine
    from nest_integrations.config import NestConfig
    from nest_integrations.decoding.prompts import RA_CHAT_TEMPLATE
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.types import Passage

    rows, totals = [], {}
    start = time.perf_counter()
    for dt in args.dtypes.split(","):
        lm = HFLanguageModel.from_default(dtype=dt)
        engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())
        tok, eos = lm.tokenizer, sorted(lm.eos_token_ids)

        def ids_of(content: str) -> list[int]:
            text = tok.apply_chat_template([{"role": "user", "content": content}],
                                           tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False)["input_ids"])

        def hf(ids: list[int], **kw) -> list[int]:
            out = lm.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                    dtype=torch.long), max_new_tokens=args.n, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos[0], **kw)
            new = out[0, len(ids):].tolist()
            return next((new[:i] for i, t in enumerate(new) if t in lm.eos_token_ids), new)

        for k, (q, passage_text) in enumerate(QUESTIONS):
            msgs = [{"role": "user", "content": q}]
            passage = Passage(f"p{k}", passage_text, doc_id=f"d{k}")
            ids = ids_of(q)
            ra_ids = ids_of(RA_CHAT_TEMPLATE.format(context=passage_text, question=q))
            ref, ra_ref = hf(ids), hf(ra_ids)
            runs = {
                "greedy": (engine.generate(msgs, max_new_tokens=args.n, decoding="greedy")
                           .token_ids, ref),
                "prompt-lookup": (engine.generate(msgs, max_new_tokens=args.n,
                                                  decoding="prompt-lookup").token_ids, ref),
                "rag-copy": (engine.generate(msgs, max_new_tokens=args.n, decoding="rag-copy",
                                             passages=[passage]).token_ids, ra_ref),
                "HF prompt lookup": (hf(ra_ids, prompt_lookup_num_tokens=10), ra_ref),
            }
            for method, (got, want) in runs.items():
                d = first_diff(got, want)
                rows.append((dt, method, q, d))
                same, n = totals.get((dt, method), (0, 0))
                totals[(dt, method)] = (same + (d is None), n + 1)
                print(dt, method, q[:40], "identical" if d is None else f"differs at {d}",
                      flush=True)
    wall = time.perf_counter() - start
    lines = [
        "# Lossless methods vs HF greedy, fp32 and bf16 weights\n",
        f"{len(QUESTIONS)} chat prompts x {args.n} new tokens; reference: HF `generate` greedy "
        f"in the same dtype (for rag-copy and HF prompt lookup: on the RA prompt with the "
        f"passage). {args.threads} torch thread(s); wall {wall:.0f} s.\n",
        f"Command: `python benchmarks/bench_bf16_exactness.py {' '.join(argv or sys.argv[1:])}`\n",
        "| dtype | method | identical to HF greedy |",
        "|---|---|---|",
    ]
    for (dt, method), (same, n) in totals.items():
        lines.append(f"| {dt} | {method} | {same}/{n} |")
    lines += ["", "First differing token (— = identical):", "",
              "| dtype | method | prompt | first diff |", "|---|---|---|---|"]
    lines += [f"| {dt} | {m} | {q[:40]} | {'—' if d is None else d} |" for dt, m, q, d in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bf16_exactness.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
