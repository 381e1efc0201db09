"""Answer quality: grounded QA (is the answer right, does it cite the right document, does it
stop?) and open-ended answers, every system on the same questions and retrieved passages,
interleaved, over ``nest_integrations.evaluation``.

Question sets (``--set``):

- ``quality`` (default): ``benchmarks.sets.quality_set``, three sources split dev/test by
  document: entity questions over a hardened generated corpus (distractor notes that outrank the
  gold document), completions of sample-corpus leads and pydoc topics, and open-ended prompts
  ("What is X?", "Who was X?", "Write the reference entry for X"). Make every choice on
  ``--split dev``; report ``--split test``;
- ``entities``: the grounded-QA dev set (``evaluation.entities``: 60 fictional documents sharing
  sentence frames; ``--n`` of its 300 questions);
- ``sample``: the questions about the sample corpus (``benchmarks.sets.sample_questions``);
- ``robust``: every question asked in several phrasing families, over four corpora
  (``benchmarks/robust.py``, which has its own options: ``--set robust --help``).

Systems (``--systems``, ``benchmarks.harness.qa_dev`` names): ``rag`` (greedy, top 3 passages
in the prompt: the McNemar and speed reference), ``base`` (the LM alone), ``grounded`` (the
default), ``paper``, ``paper-ra``, a decoding method (``rag-copy``, ...), ``calibrated``
(``--set entities`` after ``--calibrate``); ``--system NAME=DECODING:PRESET[:k=v,...][@CONTEXT]``
adds one.

Usage::

    nest ingest --sample                                            # the sample store, once
    python -m benchmarks.quality --build                            # the entity corpus, once
    python -m benchmarks.quality --split dev --n 30 --n-open 10 --stem quality_dev
    python -m benchmarks.quality --split test --n 0 --n-open 0 --max-new-tokens 40 \\
        --max-new-tokens-open 64 --stem quality_test             # the whole test split (hours)
    python -m benchmarks.quality --set entities --build --n 40 --systems base,rag,paper,paper-ra
    python -m benchmarks.quality --set sample --systems rag,grounded
    python -m benchmarks.quality --from-records a.jsonl b.jsonl --stem merged   # re-summarise

Writes ``<stem>.md``, ``<stem>.json`` (summary and run record) and ``<stem>.jsonl`` (one record
per answer; ``<stem>.partial.jsonl`` while it runs) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks import harness

QUALITY_SYSTEMS = "rag,grounded,paper,paper-ra,rag-copy"
ENTITY_SYSTEMS = "base,rag,paper,paper-ra"
#: (set) -> (collection, folder under $NEST_HOME) of the generated corpus it asks about.
CORPORA = {"quality": ("entities-hard", "quality"), "entities": ("entities", "qa-dev")}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.quality",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("quality", "entities", "sample"), default="quality")
    ap.add_argument("--build", action="store_true", help="ingest the set's generated corpus first")
    ap.add_argument("--calibrate", action="store_true",
                    help="--set entities: `nest calibrate` the collection (after --build)")
    ap.add_argument("--split", choices=("dev", "test"), default="dev")
    ap.add_argument("--seed", type=int, default=0, help="question-set / corpus seed")
    ap.add_argument("--slice-seed", type=int, default=0, help="which questions of the split")
    ap.add_argument("--per-kind", type=int, default=15, help="--set entities: entities per kind")
    ap.add_argument("--n", type=int, default=30, help="closed questions (0 = all)")
    ap.add_argument("--n-open", type=int, default=10, help="open-ended questions (0 = all)")
    ap.add_argument("--skip-open", action="store_true", help="no open-ended questions")
    ap.add_argument("--skip-closed", action="store_true", help="no closed questions")
    ap.add_argument("--offset", type=int, default=0,
                    help="skip the first N closed questions of the slice (questions an earlier "
                    "run of the same slice already answered)")
    ap.add_argument("--sources", default=None, help="closed-question sources to keep")
    ap.add_argument("--open-sources", default=None,
                    help="open-ended sources to keep: open-wiki, open-who, open-pydoc")
    ap.add_argument("--systems", default=None, help=f"default: {QUALITY_SYSTEMS} "
                    f"(--set entities/sample: {ENTITY_SYSTEMS})")
    ap.add_argument("--system", action="append", default=[], metavar="SPEC")
    ap.add_argument("--reference", default="rag", help="McNemar and speed reference")
    ap.add_argument("--k", type=int, default=8, help="passages retrieved per question")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--max-new-tokens-open", type=int, default=None)
    ap.add_argument("--min-citation-tokens", type=int, default=2)
    ap.add_argument("--persist-dir", type=Path, default=None,
                    help="the generated corpus's store (default: $NEST_HOME/<quality|qa-dev>)")
    ap.add_argument("--no-title-match", action="store_true",
                    help="shared stage-1 retrieval without NestConfig.title_match (dense only)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=None, help="model weights of every system (default: the "
                    "engine's, dtype='auto')")
    ap.add_argument("--out", type=Path, default=harness.RESULTS)
    ap.add_argument("--stem", default="quality")
    ap.add_argument("--from-records", type=Path, nargs="+", default=None, metavar="JSONL",
                    help="summarise recorded answers instead of generating")
    ap.add_argument("--relabel", action="append", default=[], metavar="FILE:OLD=NEW",
                    help="with --from-records: rename system OLD to NEW in FILE's records")
    ap.add_argument("--keep-systems", default=None,
                    help="with --from-records: summarise only these systems")
    args = ap.parse_args(argv)
    if args.systems is None:
        args.systems = QUALITY_SYSTEMS if args.set == "quality" else ENTITY_SYSTEMS
    return args


def specs_of(args: argparse.Namespace, engine: Any = None) -> list[Any]:
    """The systems' ``qa_dev.SystemSpec``s (``calibrated`` reads the stored calibration)."""
    from benchmarks.harness import qa_dev

    out = []
    for name in (s.strip() for s in args.systems.split(",") if s.strip()):
        if name == "grounded":
            out.append(qa_dev.SystemSpec("grounded", None, "grounded", {}, "memory"))
        elif name == "calibrated":
            from nest_integrations.calibrate import load_calibration

            over = load_calibration(args.persist_dir, CORPORA["entities"][0], engine.lm)
            if over is None:
                raise SystemExit("no calibration stored: run with --calibrate first")
            out.append(qa_dev.SystemSpec("calibrated", None, "paper", over, "memory"))
        else:
            out.append(qa_dev.parse_system(name))
    return out + [qa_dev.parse_system(s) for s in args.system]


def build(args: argparse.Namespace) -> None:
    """Write the set's generated corpus as JSONL and ingest it (with token keys)."""
    from nest_integrations.ingest import IngestPipeline
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    collection, _ = CORPORA[args.set]
    if args.set == "quality":
        from benchmarks.sets.quality_set import build_question_set

        corpus: Any = build_question_set(args.seed).entities
        name = f"entities-hard-s{args.seed}.jsonl"
    else:
        from nest_integrations.evaluation.entities import generate_corpus

        corpus = generate_corpus(args.seed, args.per_kind)
        name = f"entities-s{args.seed}-k{args.per_kind}.jsonl"
    path = corpus.write_jsonl(args.persist_dir / "data" / name)
    store = ChromaPassageStore.from_persist_dir(args.persist_dir, collection)
    report = IngestPipeline(store, HFLanguageModel.from_default()).ingest([path], progress=True)
    print(report, file=sys.stderr)
    if report.documents == 0:
        raise SystemExit(f"nothing ingested from {path}: {report.issues}")


def pick(args: argparse.Namespace) -> tuple[list[Any], list[Any], dict[str, str], str]:
    """(closed questions, open-ended questions, question id -> source, what was picked)."""
    if args.set != "quality":
        from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS
        from nest_integrations.evaluation.entities import generate_corpus

        if args.set == "sample":
            closed = list(SAMPLE_QUESTIONS)
        else:
            closed = generate_corpus(args.seed, args.per_kind).sample_questions(
                args.n or None, seed=args.slice_seed)
        closed = closed[args.offset:]
        return closed, [], {q.id: args.set for q in closed}, (
            f"{len(closed)} questions of the {args.set} set (seed {args.seed}, question seed "
            f"{args.slice_seed})")
    from benchmarks.sets.quality_set import SOURCES, build_question_set

    qs = build_question_set(args.seed)
    pool = qs.closed(args.split)
    if args.sources:
        keep = {x.strip() for x in args.sources.split(",") if x.strip()}
        if keep - set(SOURCES):
            raise SystemExit(f"--sources: unknown {sorted(keep - set(SOURCES))}")
        pool = [q for q in pool if qs.sources[q.id] in keep]
    closed = [] if args.skip_closed else qs.interleaved(pool, args.n or None, args.slice_seed)
    closed = closed[args.offset:]
    open_pool = qs.open(args.split)
    if args.open_sources:
        keep = {x.strip() for x in args.open_sources.split(",") if x.strip()}
        open_pool = [q for q in open_pool if q.source in keep]
    opened = [] if args.skip_open else qs.interleaved(open_pool, args.n_open or None,
                                                       args.slice_seed)
    n_closed, n_open = len(qs.closed(args.split)), len(qs.open(args.split))
    scope = ("the whole split" if len(closed) >= n_closed and len(opened) >= n_open else
             f"{len(closed)} of {n_closed} closed and {len(opened)} of {n_open} open-ended "
             f"questions (slice seed {args.slice_seed})")
    return closed, opened, qs.sources, (
        f"the {args.split} split of `benchmarks/sets/quality_set.py` (seed {args.seed}, split by "
        f"document: {json.dumps(qs.counts())}), {scope}")


def read_records(args: argparse.Namespace) -> list[dict]:
    """The recorded answers of ``--from-records``, relabelled and filtered, keeping
    only questions every system answered; open-ended metrics recomputed as they are now."""
    from nest_integrations.evaluation import open_ended

    relabel: dict[tuple[str, str], str] = {}
    for item in args.relabel:
        fname, _, pair = item.rpartition(":")
        old, _, new = pair.partition("=")
        if not (fname and old and new):
            raise SystemExit(f"--relabel {item!r}: use FILE:OLD=NEW")
        relabel[(Path(fname).name, old)] = new
    recs = []
    for path in args.from_records:  # plain or gzipped JSON Lines
        for r in harness.read_jsonl(path):
            r["system"] = relabel.get((path.name, r["system"]), r["system"])
            recs.append(r)
    if args.keep_systems:
        keep = {x.strip() for x in args.keep_systems.split(",") if x.strip()}
        recs = [r for r in recs if r["system"] in keep]
    systems = set(r["system"] for r in recs)
    per_q: dict[str, set] = {}
    for r in recs:
        per_q.setdefault(r["question_id"], set()).add(r["system"])
    recs = [r for r in recs if per_q[r["question_id"]] == systems]
    for r in recs:
        if str(r.get("source", "")).startswith("open-"):
            r["degenerate"] = open_ended.degenerate(r["text"])
            r["junk"] = open_ended.junky(r["text"])
    return recs


def generate(args: argparse.Namespace, closed: list, opened: list, sources: dict[str, str]
             ) -> tuple[list[dict], str]:
    """Every question through every system: (records, the model's dtype)."""
    from nest_integrations import NestEngine
    from nest_integrations.assembly import EngineSpec, build_engine
    from benchmarks.harness import qa_dev

    partial = open(args.out / f"{args.stem}.partial.jsonl", "w", encoding="utf-8")

    def keep(rec: dict) -> None:
        partial.write(json.dumps({**rec, "source": sources.get(rec["question_id"],
                                                                rec.get("source"))},
                                 ensure_ascii=False, default=str) + "\n")
        partial.flush()

    sample = NestEngine.from_defaults(dtype=args.dtype)
    engines = {"sample": sample}
    if args.set in CORPORA:
        collection, _ = CORPORA[args.set]
        engines["corpus"] = build_engine(
            EngineSpec(collection=collection, persist_dir=str(args.persist_dir)), lm=sample.lm)
    if args.calibrate:
        from nest_integrations.calibrate import calibrate_collection

        calibrate_collection(args.persist_dir, CORPORA["entities"][0], progress=True)
    for eng in engines.values():  # the retrieval every system shares
        eng.config = eng.config.replace(title_match=not args.no_title_match)
    specs = specs_of(args, engines.get("corpus", sample))
    on_corpus = {"quality": "entities-hard", "entities": "entities"}.get(args.set)
    records = []
    for key, qsub in (("corpus", [q for q in closed if sources[q.id] == on_corpus]),
                      ("sample", [q for q in closed if sources[q.id] != on_corpus])):
        if qsub:
            for r in qa_dev.run_questions(engines[key], qsub, specs, k=args.k,
                                          max_new_tokens=args.max_new_tokens,
                                          min_citation_tokens=args.min_citation_tokens,
                                          on_record=keep):
                records.append({**r, "source": sources[r["question_id"]]})
    records += qa_dev.run_open_questions(sample, opened, specs, k=args.k,
                                         max_new_tokens=args.max_new_tokens_open
                                         or args.max_new_tokens, on_record=keep)
    partial.close()
    return records, str(sample.lm.dtype).removeprefix("torch.")


def markdown(args: argparse.Namespace, scope: str, records: list[dict], dtype: str,
             result: dict[str, Any]) -> str:
    from benchmarks.harness import qa_dev
    from nest_integrations.evaluation import open_ended

    closed = [r for r in records if not str(r.get("source", "")).startswith("open-")]
    ref = args.reference
    lines = [f"# Quality: grounded QA and open-ended answers ({args.set} set)", "",
             f"Questions: {scope}. k = {args.k} passages, max_new_tokens = {args.max_new_tokens}"
             f" (open-ended: {args.max_new_tokens_open or args.max_new_tokens}), chat messages, "
             f"SmolLM2-135M-Instruct ({dtype}), shared retrieval "
             + ("dense only" if args.no_title_match else "with title match") + ".", "",
             "## Grounded QA (strict: gold value present, no other entity's value)", "",
             qa_dev.markdown_table(result["closed"], ref, ref)]
    sources = sorted({r["source"] for r in closed})
    for src in sources if len(sources) > 1 else []:
        sub = qa_dev.summarize([r for r in closed if r["source"] == src], ref, ref)
        lines += ["", f"### {src}", "", qa_dev.markdown_table(sub, ref, ref)]
    if result["open"]:
        lines += ["", "## Open-ended", "", open_ended.markdown_table(result["open"], ref), "",
                  "run-on: output tokens attributed to another document than the gold one. "
                  "degenerate: empty, mostly punctuation, a repeated sentence or line, a phrase "
                  "loop. junk: `open_ended.JUNK_PATTERN` (',,', a function word before a comma, "
                  "an opening comma, a doubled word)."]
    lines += ["", "correct: gold value present (normalised, whole words) and no other entity's "
              "value. gold-cited chars: pooled share of cited characters on the gold document. "
              "Speed: pooled tokens/s over the reference's on the same questions."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--set" in argv and argv[argv.index("--set") + 1 :][:1] == ["robust"]:
        from benchmarks import robust  # the phrasing families: its own options

        i = argv.index("--set")
        return robust.main(argv[:i] + argv[i + 2 :])
    args = parse_args(argv)
    harness.setup()
    run = harness.Run.start("benchmarks.quality", argv)
    import torch

    from benchmarks.harness import qa_dev
    from nest_integrations.evaluation import open_ended
    from nest_integrations.paths import nest_home

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.persist_dir is None and args.set in CORPORA:
        args.persist_dir = nest_home() / CORPORA[args.set][1]
    if args.build:
        build(args)
    closed, opened, sources, scope = pick(args)
    if args.from_records:
        records, dtype = read_records(args), "as recorded"
        scope += ", summarised from " + ", ".join(f"`{p.name}`" for p in args.from_records)
    else:
        records, dtype = generate(args, closed, opened, sources)
    ref = args.reference
    closed_recs = [r for r in records if not str(r.get("source", "")).startswith("open-")]
    open_recs = [r for r in records if str(r.get("source", "")).startswith("open-")]
    result: dict[str, Any] = {
        "set": args.set, "split": args.split, "scope": scope,
        "closed": qa_dev.summarize(closed_recs, ref, ref) if closed_recs else [],
        "open": open_ended.summarize(open_recs, ref) if open_recs else [],
    }
    harness.write_result(args.out, args.stem, result,
                         markdown(args, scope, records, dtype, result), run)
    with open(args.out / f"{args.stem}.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    (args.out / f"{args.stem}.partial.jsonl").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
