"""Grounded-QA dev check: do the answers name the right entity, cite it, and stop?

Builds (once) a collection of the generated fictional-entity corpus
(``nest_integrations/evaluation/entities.py``: 60 documents sharing sentence frames, 300
questions whose answers only the corpus holds), then runs N questions through a list of
systems, interleaved per question, with chat messages and the same top-k passages for every
system, and prints/saves a table: correct (with a bootstrap 95% interval), wrong-entity
answers, share of cited characters on the gold document, off-topic copied tokens, run-on tokens
after the answer sentence, tokens/s vs the base LM, and McNemar's exact test vs in-context RAG.

    python benchmarks/qa_dev.py --build                       # generate + ingest (~1 min)
    python benchmarks/qa_dev.py --n 40                        # base, rag, paper, paper-ra
    python benchmarks/qa_dev.py --n 20 --systems rag,paper
    python benchmarks/qa_dev.py --systems rag,paper,prompt-lookup \\
        --system 'g05=nest:paper:relaxation=0.05' --system 'ra3=nest:paper-ra:n_passages=3'
    python benchmarks/qa_dev.py --build --calibrate           # also `nest calibrate` it
    python benchmarks/qa_dev.py --systems rag,paper,calibrated
    python benchmarks/qa_dev.py --persist-dir $NEST_HOME/store --collection nest --sample-only
                                                              # the sample corpus's questions

A system is a built-in name (base, rag, paper, paper-ra, calibrated), a decoding method of
``nest_integrations.drafters.METHODS`` (lossless ones get the RAG prompt), or
``NAME=DECODING:PRESET[:field=value,...][@memory|prompt|none]``. Outputs:
``benchmarks/results/qa_dev.md``, ``qa_dev.json`` (summary) and ``qa_dev.jsonl`` (every output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

DEFAULT_SYSTEMS = "base,rag,paper,paper-ra"


def default_persist_dir() -> Path:
    from nest_integrations.paths import nest_home

    return nest_home() / "qa-dev"


def build(persist_dir: Path, collection: str, seed: int, per_kind: int) -> Path:
    """Write the entity corpus as JSONL under ``persist_dir`` and ingest it (with token keys)."""
    from nest_integrations.evaluation.entities import generate_corpus
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    corpus = generate_corpus(seed, per_kind)
    path = corpus.write_jsonl(persist_dir / "data" / f"entities-s{seed}-k{per_kind}.jsonl")
    store = ChromaPassageStore.from_persist_dir(persist_dir, collection)
    lm = HFLanguageModel.from_default()
    try:
        from nest_integrations.ingest import IngestPipeline
    except ImportError:  # before the ingest pipeline split: the store ingests itself
        store.lm = lm
        report = store.ingest([path], progress=True)
    else:
        report = IngestPipeline(store, lm).ingest([path], progress=True)
    print(report)
    if report.documents == 0:
        raise SystemExit(f"nothing ingested from {path}: {report.issues}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="generate and ingest the corpus first")
    ap.add_argument("--calibrate", action="store_true",
                    help="run `nest calibrate` on the collection (after --build)")
    ap.add_argument("--persist-dir", type=Path, default=None,
                    help="store folder (default: $NEST_HOME/qa-dev)")
    ap.add_argument("--collection", default="entities")
    ap.add_argument("--seed", type=int, default=0, help="corpus seed")
    ap.add_argument("--per-kind", type=int, default=15, help="entities per kind (4 kinds)")
    ap.add_argument("--n", type=int, default=40, help="questions (default 40; 0 = all)")
    ap.add_argument("--question-seed", type=int, default=0, help="which questions")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS, help="comma-separated system names")
    ap.add_argument("--system", action="append", default=[], metavar="SPEC",
                    help="extra system NAME=DECODING:PRESET[:k=v,...][@CONTEXT] (repeatable)")
    ap.add_argument("--reference", default="rag", help="McNemar reference system")
    ap.add_argument("--k", type=int, default=8, help="passages retrieved per question")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--min-citation-tokens", type=int, default=2)
    ap.add_argument("--sample-questions", action="store_true",
                    help="also ask the sample-corpus questions (the collection must hold the "
                    "sample corpus: `nest ingest --sample --collection ...`)")
    ap.add_argument("--sample-only", action="store_true",
                    help="only the sample-corpus questions (e.g. --collection nest after "
                    "`nest ingest --sample`)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--dtype", default=None,
                    help="model weights (auto, fp32, bf16, ...; default: the engine's default)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--tag", default="qa_dev", help="output file stem")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from nest_integrations import NestEngine
    from nest_integrations.evaluation import qa_dev
    from nest_integrations.evaluation.entities import SAMPLE_QUESTIONS, generate_corpus

    persist = args.persist_dir or default_persist_dir()
    if args.build:
        build(persist, args.collection, args.seed, args.per_kind)
    if args.calibrate:
        from nest_integrations.calibrate import calibrate_collection

        cal = calibrate_collection(persist, args.collection, progress=True)
        print(json.dumps({k: cal[k] for k in ("overrides", "suggested", "ppl")}, indent=2))

    names = [s for s in args.systems.split(",") if s.strip()]
    engine = NestEngine.from_defaults(collection=args.collection, persist_dir=str(persist),
                                      dtype=args.dtype)
    specs = []
    for name in names:
        if name == "calibrated":
            from nest_integrations.calibrate import load_calibration

            over = load_calibration(persist, args.collection, engine.lm)
            if over is None:
                raise SystemExit(f"no calibration for {args.collection!r} in {persist}: run "
                                 "with --calibrate (or `nest calibrate`) first")
            specs.append(qa_dev.SystemSpec("calibrated", None, "paper", over, "memory"))
        else:
            specs.append(qa_dev.parse_system(name))
    specs += [qa_dev.parse_system(s) for s in args.system]

    corpus = generate_corpus(args.seed, args.per_kind)
    questions: list = corpus.sample_questions(args.n or None, seed=args.question_seed)
    if args.sample_only:
        questions = []
    if args.sample_questions or args.sample_only:
        questions += list(SAMPLE_QUESTIONS)
    start = time.perf_counter()
    records = qa_dev.run_questions(
        engine, questions, specs, k=args.k, max_new_tokens=args.max_new_tokens,
        min_citation_tokens=args.min_citation_tokens,
    )
    wall = time.perf_counter() - start
    rows = qa_dev.summarize(records, reference=args.reference)
    table = qa_dev.markdown_table(rows, reference=args.reference)
    cmd = argv if argv is not None else sys.argv[1:]
    retrieved = [r for r in records if r["system"] == specs[0].name]
    recall = sum(r["gold_rank"] is not None for r in retrieved) / max(1, len(retrieved))
    top3 = sum((r["gold_rank"] or 99) <= 3 for r in retrieved) / max(1, len(retrieved))
    header = (
        f"# Grounded-QA dev set\n\n{len(questions)} questions (corpus seed {args.seed}, "
        f"question seed {args.question_seed}), k = {args.k} passages (gold document retrieved: "
        f"{100 * recall:.0f}%, in the top 3: {100 * top3:.0f}%), max_new_tokens = "
        f"{args.max_new_tokens}, chat messages, embedded model ({str(engine.lm.dtype).removeprefix('torch.')}), "
        f"{torch.get_num_threads()} "
        f"torch thread(s), wall {wall:.0f} s, load {os.getloadavg()[0]:.1f}.\n\n"
        f"Command: `python benchmarks/qa_dev.py {' '.join(cmd)}`\n\n"
    )
    notes = (
        "\n\ncorrect: gold value present (normalised, whole words) and no other entity's value "
        "for the attribute. gold-cited chars: pooled share of cited characters on the gold "
        "document. off-topic copied: output tokens attributed to another document. run-on: "
        "output tokens after the first sentence end following the answer. Shares are of all "
        "output tokens. vs base: pooled tokens/s over the base LM's on the same questions.\n"
    )
    md = header + table + notes
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.md").write_text(md, encoding="utf-8")
    (args.out / f"{args.tag}.json").write_text(
        json.dumps({"rows": rows, "systems": [s.__dict__ for s in specs], "wall_s": wall,
                    "args": {k: str(v) for k, v in vars(args).items()}}, indent=2, default=str),
        encoding="utf-8",
    )
    with open(args.out / f"{args.tag}.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
