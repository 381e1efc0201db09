"""Evidence first: how often each evidence scorer picks a sentence that holds the gold answer.

No decoding: stage 1, the title index and the prompt's passages as the ``grounded`` policy plans
them, then each scorer of ``policy.evidence`` (``overlap``, ``embedding``, ``combined``) picks a
sentence of those passages. A pick is right when the sentence holds the gold value
(``evaluation.grounded.answer_correct`` on the sentence) and is in the gold document. Per set,
phrasing family and scorer: picks right, and for the ``evidence_min`` threshold the share of
questions above it and the right picks among them (the threshold is chosen on dev only: the
lowest that keeps the unanswerable questions, entity questions asked of the sample corpus, out).
For open-ended prompts a pick is right when it is a sentence of the gold document.

    python -m benchmarks.evidence --split dev --sets entities --n-closed 40
    python -m benchmarks.evidence --split test --sets entities,profiles --n-closed 40

Stores as ``benchmarks.robust`` builds them (``--work``, default ``$NEST_HOME/bench/robust``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness, robust
from nest_integrations import assembly
from nest_integrations.evaluation.grounded import answer_correct
from nest_integrations.policy import AnswerPolicy
from nest_integrations.policy.evidence import EVIDENCE_SCORERS

LOG = logging.getLogger("evidence")
THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6)


def picks(items: list[robust.Item], roots: dict[str, Path], scorers: list[str]
          ) -> list[dict[str, Any]]:
    engines: dict[str, Any] = {}
    out = []
    for item in items:
        if item.collection not in engines:
            engines[item.collection] = assembly.build_engine(
                robust.system_spec("default", item.collection, roots["torch"]))
        engine = engines[item.collection]
        passages = engine.retrieve(item.prompt)
        for scorer in scorers:
            policy = AnswerPolicy.from_preset("grounded", evidence=scorer, evidence_min=0.0)
            plan = engine.plan(item.prompt, passages, policy=policy)
            ev = plan.evidence
            rec = {"set": item.set, "family": item.family, "qid": item.qid,
                   "prompt": item.prompt, "scorer": scorer, "score": None, "right": False,
                   "sentence": None}
            if ev is not None:
                p = next(p for p in plan.passages if p.id == ev.passage_id)
                sentence = p.text[ev.start: ev.sentence_end or ev.end]
                on_gold = p.doc_id == item.gold_doc_id
                rec.update(score=ev.score, sentence=sentence,
                           right=on_gold and (item.kind == "open" or answer_correct(
                               sentence, item.answer, item.distractors)))
            out.append(rec)
    return out


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        for fam in (r["family"], "all"):
            groups.setdefault((r["set"], fam, r["scorer"]), []).append(r)
    for (s, fam, scorer), rr in sorted(groups.items()):
        row = {"set": s, "family": fam, "scorer": scorer, "n": len(rr),
               "right": sum(r["right"] for r in rr)}
        for t in THRESHOLDS:
            above = [r for r in rr if r["score"] is not None and r["score"] >= t]
            row[f"above_{t}"] = (len(above), sum(r["right"] for r in above))
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = " | ".join(f"≥{t}: n / right" for t in THRESHOLDS)
    out = ["# Evidence picks: the chosen sentence holds the gold value, in the gold document", "",
           f"| set | family | scorer | n | right | {head} |",
           "|---|---|---|---|---|" + "---|" * len(THRESHOLDS)]
    for r in rows:
        cells = " | ".join(f"{r[f'above_{t}'][0]} / {r[f'above_{t}'][1]}" for t in THRESHOLDS)
        out.append(f"| {r['set']} | {r['family']} | {r['scorer']} | {r['n']} | {r['right']} | "
                   f"{cells} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    harness.setup()
    from nest_integrations import paths

    p = harness.question_parser(
        "benchmarks.evidence", __doc__, sets="entities,open,unanswerable",
        sets_help="entities, open (right: a sentence of the gold document), unanswerable (entity "
                  "questions asked of the sample corpus: right is never; the share above a "
                  "threshold is what would be answered with a wrong quote), profiles (test only)",
        n_closed=40, n_open=16, stem="evidence")
    p.add_argument("--scorers", default=",".join(EVIDENCE_SCORERS))
    args = p.parse_args(argv)
    run_record = harness.Run.start("benchmarks.evidence", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sets = harness.question_sets(p, args, held_out=("profiles",))
    items: list[robust.Item] = []
    qs = profiles = None
    if "entities" in sets:
        ent, qs = robust.entity_items(args.split, args.n_closed, args.seed)
        items += ent
    if "profiles" in sets:
        prof, profiles = robust.profile_items(args.n_closed, args.seed)
        items += prof
    if "open" in sets:
        if qs is None:
            _, qs = robust.entity_items(args.split, 0, args.seed)
        items += robust.open_items(qs, args.split, args.n_open, args.seed)
    if "unanswerable" in sets:  # entity questions asked of the sample corpus: no answer there
        ent, qs = robust.entity_items(args.split, args.n_closed, args.seed)
        items += [dataclasses.replace(i, set="unanswerable", collection="nest",
                                      gold_doc_id="-") for i in ent]
    if args.split == "dev":
        items = [i for i in items if i.family != robust.HELD_OUT]
    work = args.work or paths.nest_home() / "bench" / "robust"
    store_sets = set(sets) | ({"open"} if "unanswerable" in sets else set())
    roots = {"torch": robust.build_stores(work, store_sets, qs, profiles, None, None)}
    records = picks(items, roots, [s for s in args.scorers.split(",") if s])
    rows = summarize(records)
    args.out.mkdir(parents=True, exist_ok=True)
    harness.write_result(args.out, args.stem, {"rows": rows, "records": records},
                         markdown(rows), run_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
