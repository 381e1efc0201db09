"""Questions about subjects the corpus does not hold, beside the same questions about subjects it
does: is an evidence quote ever taken from a document that is not about the question's subject
(issue 60: "What is the Roman Empire?" answered, cited, with Marcus Licinius Crassus's lead)?

No decoding: stage 1 and the ``grounded`` policy's plan over the shipped sample store
(``nest ingest --sample``) give the evidence the answer would open with, quoted and cited
(``policy.evidence``). Two families, each in the same phrasings (``PHRASINGS``):

- **absent**: FOLDOC headwords (Debian's ``dict-foldoc``, ``sets.glossary``) that the project's
  FOLDOC sets never draw (``glossary.choose``'s gold and distractors, seed 0, left out) and that
  no sample document's title is found in (``TitleIndex.match``): computing terms over a corpus
  of pydoc topics and Wikipedia leads, so many share words with it. Any quote here comes from a
  document that is not about the subject: wrong and cited.
- **present**: titles of the sample corpus's documents. Right and cited: the quote opens with
  that document's lead; wrong and cited: a quote from another document.

Run it with the code to measure on the path (``PYTHONPATH``); ``--out`` keeps the records::

    python -m benchmarks.absent_subjects --store /tmp/sample_store --n 60 --out after.json
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

from benchmarks.evidence_rank import wilson
from benchmarks.sets import glossary
from nest_integrations import assembly
from nest_integrations.retrieval.titles import TitleIndex

LOG = logging.getLogger("absent_subjects")
#: The phrasings every subject is asked in ("What is X?", "How does X work?").
PHRASINGS = ("What is {x}?", "How does {x} work?")


def absent_subjects(foldoc: Path, index: TitleIndex, n: int, seed: int) -> list[str]:
    """``n`` FOLDOC headwords never drawn by the project's sets, none naming a sample title."""
    entries = glossary.load_foldoc(foldoc)
    used = {e.headword for part in glossary.choose(entries, seed=0) for e in part}
    pool = sorted({e.headword for e in entries if glossary.HEADWORD.fullmatch(e.headword)
                   and e.headword not in used and not index.match(e.headword)})
    random.Random(f"absent:{seed}").shuffle(pool)
    return pool[:n]


def present_subjects(index: TitleIndex, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (title, document id) of the sample store, titles of 1-4 words."""
    pool = sorted((t, d) for d, t in index.titles.items() if 1 <= len(t.split()) <= 4)
    random.Random(f"present:{seed}").shuffle(pool)
    return pool[:n]


def record(engine: Any, question: str, gold: str | None) -> dict[str, Any]:
    from nest_integrations.policy.evidence import candidates

    plan = engine.plan(question, engine.retrieve(question))
    ev = plan.evidence
    out: dict[str, Any] = {"question": question, "gold": gold, "quoted": ev is not None,
                           "no_passages": bool(getattr(plan, "absent", None))}
    if ev is None:
        return out
    p = next(p for p in plan.prompt_passages if p.id == ev.passage_id)
    lead = next((c for c in candidates(question, [p], "overlap") if c.lead), None)
    out.update(doc=p.doc_id, text=p.text[ev.start:ev.sentence_end][:160],
               lead=lead is not None and lead.start == ev.start)
    return out


def summary(recs: list[dict[str, Any]]) -> dict[str, str]:
    def share(k: int, n: int) -> str:
        lo, hi = wilson(k, n)
        return f"{k}/{n} [{max(lo, 0.0):.2f}, {min(hi, 1.0):.2f}]"

    absent = [r for r in recs if r["gold"] is None]
    present = [r for r in recs if r["gold"] is not None]
    right = [r for r in present if r["quoted"] and r["doc"] == r["gold"] and r["lead"]]
    other = [r for r in present if r["quoted"] and r["doc"] != r["gold"]]
    return {"absent: wrong and cited": share(sum(r["quoted"] for r in absent), len(absent)),
            "absent: answered without passages": share(sum(r["no_passages"] for r in absent),
                                                       len(absent)),
            "present: right and cited (the lead)": share(len(right), len(present)),
            "present: cited from another document": share(len(other), len(present)),
            "present: no quote": share(sum(not r["quoted"] for r in present), len(present)),
            "present: answered without passages": share(sum(r["no_passages"] for r in present),
                                                        len(present))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a `nest ingest --sample` persist dir")
    ap.add_argument("--foldoc", type=Path, required=True, help="dict-foldoc's .deb")
    ap.add_argument("--n", type=int, default=60, help="subjects per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="the records as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    engine = assembly.build_engine(assembly.EngineSpec.for_store(persist_dir=args.store))
    index = engine.retriever.title_index()
    items = [(f.format(x=x), None) for x in absent_subjects(args.foldoc, index, args.n,
                                                            args.seed) for f in PHRASINGS]
    items += [(f.format(x=t), d) for t, d in present_subjects(index, args.n, args.seed)
              for f in PHRASINGS]
    recs = [record(engine, q, g) for q, g in items]
    if args.out:
        Path(args.out).write_text(json.dumps(recs, indent=1), encoding="utf-8")
    for k, v in summary(recs).items():
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
