"""Which preset suits a small model? Copying from the right source vs off-topic copying.

Asks the embedded model a few questions over the shipped sample corpus (ingested with
``nest ingest --sample --persist-dir DIR``): four whose answer is in the corpus (the gold
article is known) and three that are not. For each preset it counts copied tokens, copied
tokens cited to the gold article, and copied tokens on off-corpus questions. Prints a table and
writes ``benchmarks/results/presets.json``.

    nest ingest --sample --persist-dir /tmp/qs
    python benchmarks/compare_presets.py --persist-dir /tmp/qs
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

IN_CORPUS = [
    ("What is pinball?", "Pinball"),
    ("Who was Charles Dickens?", "Charles Dickens"),
    ("What is a cell membrane?", "Cell membrane"),
    ("How does the assert statement work in Python?", "pydoc/assert.txt"),
]
OFF_CORPUS = [
    "Where does the Eddystone Lighthouse stand?",
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
]
PRESETS = ("paper", "paper-70b", "paper-ra")


def main() -> None:
    from nest_integrations import NestConfig, NestEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persist-dir", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    args = ap.parse_args()
    engine = NestEngine.from_defaults(persist_dir=args.persist_dir)
    rows = []
    for name in PRESETS:
        cfg = NestConfig.from_preset(name)
        row = {"preset": name, "in_copied": 0, "in_right": 0, "off_copied": 0, "examples": []}
        for q, gold in [*IN_CORPUS, *((q, None) for q in OFF_CORPUS)]:
            r = engine.generate(
                [{"role": "user", "content": q}], max_new_tokens=args.max_new_tokens, config=cfg
            )
            right = sum(
                c.n_tokens
                for c in r.citations
                if gold and (c.metadata.get("title") == gold or c.doc_id == gold)
            )
            if gold:
                row["in_copied"] += r.stats.copied_tokens
                row["in_right"] += right
            else:
                row["off_copied"] += r.stats.copied_tokens
            row["examples"].append({"question": q, "gold": gold, "text": r.text,
                                    "copied": r.stats.copied_tokens, "right": right})
        rows.append(row)
    out = REPO / "benchmarks" / "results" / "presets.json"
    out.write_text(json.dumps(rows, indent=2, ensure_ascii=False))
    print("| preset | copied (in-corpus Qs) | cited to the gold article | copied (off-corpus Qs) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['in_copied']} | {r['in_right']} | {r['off_copied']} |")


if __name__ == "__main__":
    main()
