"""Answers a person would give (issue 60): is the factoid right, cited on its document, and does
it stop at its sentence; does "What is X?" / "How does X work?" open with the definition or
lead; does an answer that ended on its own end mid-clause. Every system answers the same
prompts back to back; rates carry 95% intervals and paired comparisons are clustered by question
(``benchmarks.harness.answer_summary``).

Families (``benchmarks.sets.answer_sets``, split dev/test by document; make every choice on
``--split dev``, report ``--split test``):

- ``factoid``: attributes of prose fact sheets (countries, products; ``sets.factsheets``);
- ``synonym``: the same attributes asked without their own words (**held out**: reported apart,
  never a dev decision; on ``--split dev`` it is dropped unless ``--with-held-out``);
- ``definition``: "What is X?" over FOLDOC (``sets.glossary``; needs ``--foldoc``);
- ``explanation``: "How does X work?", "Explain X." ... over the shipped pydoc topics.

Systems (``--systems``): ``rag`` (the top 3 retrieved passages in the prompt, greedy, no
policy), ``default`` (the ``grounded`` preset), ``rag-history`` (``rag`` with the whole chat in
its prompt: for multi-turn families; the same as ``rag`` on one turn), and any other name of
``benchmarks.robust.system_spec`` (``default@noev``, ``copy``, ``llama.cpp:default``, ...).
Torch backend unless prefixed, ``--threads`` (default 1).

Usage (from the repository root; the model converted under ``$NEST_HOME``, default ``.nest``)::

    (cd .nest/bench/answers && apt-get download dict-foldoc)  # once: the definition family
    NEST_THREADS=1 python -m benchmarks.answers --split dev --limit 8 \\
        --systems rag,default --out benchmarks/results/answers_dev.md
    NEST_THREADS=1 python -m benchmarks.answers --split test \\
        --out benchmarks/results/answers_test.md      # the whole test split, every family
    python -m benchmarks.answers --from-records benchmarks/results/answers_dev.jsonl.gz \\
        --out benchmarks/results/answers_dev.md               # re-score recorded answers

Writes ``<out>.md`` (the summary: the command, the commit with ``+dirty`` when tracked files
differ, the machine and load, n and intervals per family) and ``<out>.jsonl.gz`` (every answer:
prompt, text, finish reason, citations, metrics, after a first line ``{"run": ...}`` holding the
run record; ``<out>.partial.jsonl`` while it runs). ``--from-records`` re-scores such a file and
keeps its run record (command, commit) in the summary. Stores are built once under ``--work``
(default ``$NEST_HOME/bench/answers``): about 15 minutes on 2 busy cores, most of it the sample
corpus's token keys.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from benchmarks import harness
from benchmarks.harness import answer_metrics, answer_summary
from benchmarks.sets import answer_sets

LOG = logging.getLogger("benchmarks.answers")
#: family -> the collection it is answered from
COLLECTIONS = {"factoid": "answers-facts", "synonym": "answers-facts",
               "definition": "answers-foldoc", "explanation": "nest"}


def parse_args(argv: Sequence[str]) -> Any:
    ap = harness.parser("benchmarks.answers", __doc__)
    ap.set_defaults(out=None)
    ap.add_argument("--split", choices=answer_sets.SPLITS, default="dev")
    ap.add_argument("--families", default=",".join(answer_sets.FAMILIES),
                    help=f"comma-separated from {','.join(answer_sets.FAMILIES)}")
    ap.add_argument("--with-held-out", action="store_true",
                    help="on --split dev, keep the held-out families (not for decisions)")
    ap.add_argument("--systems", default="rag,default")
    ap.add_argument("--reference", default="rag", help="the system paired tests are against")
    ap.add_argument("--limit", type=int, default=None,
                    help="questions per family (all of a question's phrasings)")
    ap.add_argument("--seed", type=int, default=0, help="corpora, splits and question order")
    ap.add_argument("--foldoc", type=Path, default=None,
                    help="dict-foldoc's .deb (apt-get download dict-foldoc) or its folder "
                    "(default: a dict-foldoc_*.deb in $NEST_HOME/bench/answers)")
    ap.add_argument("--max-factoid", type=int, default=48, help="tokens per factoid answer")
    ap.add_argument("--max-lead", type=int, default=96,
                    help="tokens per definitional or explanatory answer")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None, help="the stores' folder")
    ap.add_argument("--from-records", type=Path, default=None, metavar="JSONL",
                    help="re-score recorded answers (a run's .jsonl.gz) instead of generating")
    args = ap.parse_args(list(argv))
    if args.out is None:
        args.out = harness.RESULTS / f"answers_{args.split}.md"
    return args


def spec_of(name: str, collection: str, root: Path) -> Any:
    """The engine spec of system ``name`` (module docstring)."""
    from benchmarks.robust import system_spec

    return system_spec("rag" if name == "rag-history" else name, collection, root)


def build_stores(work: Path, stores: str, src: answer_sets.Sources, families: Sequence[str]
                 ) -> Path:
    """The collections ``families`` need, under ``robust.store_root(work, stores)``."""
    from benchmarks.harness.stores import ingest_once
    from benchmarks.robust import store_root
    from nest_integrations import assembly

    root = store_root(work, stores)
    backend, _, source = stores.partition("~")
    lm = assembly.shared_model(backend=backend, key_source=source or None)
    need = {COLLECTIONS[f] for f in families}
    if "answers-facts" in need:
        ingest_once(root, work, "answers-facts",
                    lambda d: [src.facts.write_jsonl(d / "facts.jsonl")], lm)
    if "answers-foldoc" in need:
        def write(d: Path) -> list[Path]:
            path = d / "foldoc.jsonl"
            with path.open("w", encoding="utf-8") as f:
                for rec in answer_sets.foldoc_documents(src.foldoc_gold, src.foldoc_distractors):
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            return [path]
        ingest_once(root, work, "answers-foldoc", write, lm)
    if "nest" in need:
        from nest_integrations.ingest.documents import sample_corpus_inputs

        ingest_once(root, work, "nest", lambda d: sample_corpus_inputs(), lm, keys=True)
    return root


def record(item: answer_sets.Item, system: str, result: Any, wall: float) -> dict[str, Any]:
    """One answer as stored in the ``.jsonl.gz`` (metrics added by ``rescore``)."""
    rec = {**asdict(item), "prompt": item.prompt, "system": system, "text": result.text,
           "finish": result.stats.finish_reason, "decoding": result.stats.decoding,
           "tokens": len(result.token_ids), "seconds": result.stats.timing.total, "wall": wall,
           "citations": [{"doc_id": c.doc_id, "kind": c.kind, "text": c.text,
                          "start": c.start, "end": c.end} for c in result.citations]}
    return rec


def rescore(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` with the metrics of ``answer_metrics.score`` (and ROUGE-L of the whole answer
    against the gold text, for lead families)."""
    rec.update(answer_metrics.score(rec["kind"], rec["text"], rec["finish"], rec["citations"],
                                    rec["gold_doc_id"], rec.get("answer", ""),
                                    rec.get("distractors", ()),
                                    rec.get("gold_sentence", "")))
    if rec["kind"] == "lead":
        from nest_integrations.evaluation.open_ended import rouge_l

        rec["rouge_l"] = rouge_l(rec["text"], rec["gold_text"])
    return rec


def generate(items: list[answer_sets.Item], systems: list[str], roots: dict[str, Path],
             args: Any, partial: Path) -> list[dict[str, Any]]:
    """Every item through every system, in an order that rotates per item."""
    from benchmarks.robust import store_id
    from nest_integrations import assembly

    engines: dict[tuple[str, str], Any] = {}
    records = []
    with partial.open("w", encoding="utf-8") as f:
        for i, item in enumerate(items):
            for name in harness.rotated(systems, i):
                key = (name, item.collection)
                if key not in engines:
                    engines[key] = assembly.build_engine(
                        spec_of(name, item.collection, roots[store_id(name)]))
                budget = args.max_factoid if item.kind == "factoid" else args.max_lead
                t0 = time.perf_counter()
                result = engines[key].generate(item.messages, max_new_tokens=budget)
                rec = record(item, name, result, time.perf_counter() - t0)
                records.append(rec)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
            LOG.info("%d/%d prompts", i + 1, len(items))
    return records


def sources_text(src: answer_sets.Sources, foldoc: Path | None) -> list[str]:
    """What the corpora were (versions, pins), for the result file."""
    from benchmarks.sets import factsheets

    out = [f"fact sheets: `benchmarks/sets/factsheets.py` v{factsheets.GENERATOR_VERSION}"
           if src.facts is not None else "",
           f"FOLDOC: `{foldoc.name}` sha256 "
           f"`{hashlib.sha256(foldoc.read_bytes()).hexdigest()}`, {len(src.foldoc_gold)} "
           f"entries asked about, {len(src.foldoc_distractors)} more in the store"
           if foldoc is not None and foldoc.is_file() and src.foldoc_gold else "",
           f"pydoc topics: the shipped sample (`nest_integrations/data/sample/pydoc`, "
           f"{len(src.topics)} topics; Python {platform.python_version()})"
           if src.topics else ""]
    return [x for x in out if x]


def markdown(args: Any, rows: list[dict[str, Any]], counts: dict[str, tuple[int, int]],
             corpora: list[str], records: list[dict[str, Any]],
             rescored: tuple[str, str] | None = None) -> str:
    fams = ", ".join(f"{f} {n} prompts ({q} questions)" for f, (n, q) in counts.items())
    lines = [f"# Answers a person would give: {args.split} split (issue 60)", "",
             f"Families: {fams}"
             f"; split by document (`benchmarks/sets/answer_sets.py`, seed {args.seed})"
             + (f", the first {args.limit} questions of each family" if args.limit else "")
             + ".", "", "Corpora: " + "; ".join(corpora) + ".", "",
             "Rates are `k/n = rate [95% Wilson interval]`; `*`: a question has several "
             "phrasings, so the interval counts one observation per question (conservative). "
             "Paired: a question is won "
             "when a system is right on more of its phrasings than the reference (exact sign "
             "test; McNemar's with one phrasing). Metrics: "
             "`benchmarks/harness/answer_metrics.py` (opens with the lead: ROUGE-L F1 of the "
             f"first sentence against the gold sentence >= {answer_metrics.LEAD_THRESHOLD})."]
    if rescored:
        lines += ["", f"Re-scored from the recorded answers with `{rescored[0]}` at commit "
                  f"`{rescored[1]}` (the command and commit above are the answering run's)."]
    lines += answer_summary.markdown(rows, args.reference)
    lines += ["", "Seconds per answer and tok/s are means over the family's answers "
              "(retrieval included), on a shared machine: compare systems side by side."]
    lines += lead_examples(records)
    return "\n".join(lines) + "\n"


def lead_examples(records: list[dict[str, Any]]) -> list[str]:
    """The hand-checked examples behind ``LEAD_THRESHOLD``, with their scores now."""
    from benchmarks.harness.lead_examples import EXAMPLES, NEAR_MISSES

    out = ["", "### Why 0.5 for \"opens with the lead\": 10 answers checked by hand", "",
           "Real answers (`benchmarks/harness/lead_examples.py`), labelled by reading them: a "
           "paraphrase of the definition or lead counts, a second sense, usage note, example or "
           "heading does not. The last three rows are near misses (headings and side sentences "
           "of short pydoc leads that repeat the statement's name): they score up to 0.37, so "
           "the threshold sits above them and below the lowest paraphrase (0.50).", "",
           "| family | answer's first sentence | gold sentence | by hand | ROUGE-L F1 |",
           "|---|---|---|---|---|"]
    for ex in EXAMPLES + NEAR_MISSES:
        score = answer_metrics.lead_overlap(ex["answer"], ex["gold"])
        first = answer_metrics.first_sentence(ex["answer"]).replace("|", "\\|")
        out.append(f"| {ex['family']} | {first[:150]} | {ex['gold'][:110]} | "
                   f"{'lead' if ex['lead'] else 'not the lead'} | {score:.2f} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    harness.setup()
    run_record = harness.Run.start("benchmarks.answers", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)  # rouge_score's per-call notice
    families = [f for f in args.families.split(",") if f]
    systems = [s for s in args.systems.split(",") if s]
    if args.reference not in systems:
        raise SystemExit(f"--reference {args.reference!r} is not one of --systems")
    if args.split == "dev" and not args.with_held_out:
        families = [f for f in families if f not in answer_sets.HELD_OUT_FAMILIES]
    out_dir, stem = args.out.parent, args.out.name.removesuffix(".md")
    if args.foldoc is None:
        from nest_integrations import paths

        found = sorted((paths.nest_home() / "bench" / "answers").glob("dict-foldoc_*.deb"))
        args.foldoc = found[-1] if found else None
    src = answer_sets.load_sources(families, args.foldoc, args.seed)
    items = answer_sets.build_items(src, families, args.split, args.seed, args.limit)
    out_dir.mkdir(parents=True, exist_ok=True)
    rescored = None
    if args.from_records is not None:
        records = harness.read_jsonl(args.from_records)
        if records and "run" in records[0]:  # the answering run's record: its command, commit
            rescored = (run_record.command, run_record.commit)
            run_record.record = records.pop(0)["run"]
    else:
        from benchmarks.robust import store_id
        from nest_integrations import paths
        from nest_integrations.lm.backend import configure_threads

        configure_threads(args.threads)
        work = args.work or paths.nest_home() / "bench" / "answers"
        roots = {b: build_stores(work, b, src, families)
                 for b in sorted({store_id(n) for n in systems})}
        records = generate(items, systems, roots, args, out_dir / f"{stem}.partial.jsonl")
    records = [rescore(r) for r in records]
    head = {"run": run_record.finish()}
    with gzip.open(out_dir / f"{stem}.jsonl.gz", "wt", encoding="utf-8") as f:
        for r in [head, *records]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out_dir / f"{stem}.partial.jsonl").unlink(missing_ok=True)
    rows = answer_summary.summarize(records, systems, args.reference,
                                    answer_sets.HELD_OUT_FAMILIES)
    counts: dict[str, tuple[int, int]] = {}
    for fam in dict.fromkeys(r["family"] for r in records):
        rr = [r for r in records if r["family"] == fam and r["system"] == systems[0]]
        counts[fam] = (len(rr), len({r["qid"] for r in rr}))
    _, summary = harness.write_result(
        out_dir, stem, {"rows": rows, "counts": counts},
        markdown(args, rows, counts, sources_text(src, args.foldoc), records, rescored),
        run_record)
    summary.unlink()  # benchmarks/results keeps summaries as Markdown, raw records gzipped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
