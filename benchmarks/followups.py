"""Follow-up questions in a chat: right, cited on gold and wrong with a citation, per system
(issue 60).

The set is ``benchmarks.sets.followups`` (two-turn conversations over fictional country
profiles and invented devices; dev and test split by document). Every system answers the whole
conversation (the chat template holds both turns); they differ in the question retrieval, the
title index and the evidence read:

- ``last``: the last user message (``AnswerPolicy.conversation="last"``: before issue 60);
- ``carry``: the carry-over rule (``policy.conversation``, no model);
- ``rewrite``: the engine's own LM rewrites the follow-up first (greedy, short);
- ``rag-history``: in-context RAG (the top passages in the prompt, greedy) with the history in
  its prompt and retrieval on the last message.

``last``, ``carry`` and ``rewrite`` are the default (``grounded``) with that mode. Per system
and family: right answers (the gold value or operation term, no other document's), right
answers cited on the gold document (a copy or verbatim citation there that holds the answer),
wrong answers that carry a citation, each with n and a 95% Wilson interval; the share of
retrieval queries that name the gold document's title; mean seconds per answer (the rewrite
included).

    NEST_THREADS=1 python -m benchmarks.followups --split dev --limit 16 --stem followups_dev  # the test split: --split test --systems last,carry,rag-history
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness.report import pct, table
from benchmarks.sets.followups import FAMILIES, Conversation, FollowupSet, build_followups
from nest_integrations import assembly
from nest_integrations.evaluation import grounded
from nest_integrations.evaluation.stats import wilson_ci
from nest_integrations.policy import AnswerPolicy

LOG = logging.getLogger("followups")
SYSTEMS = ("last", "carry", "rewrite", "rag-history")
COLLECTIONS = {"profiles": "followups-profiles", "devices": "followups-devices"}


class RecordingRetriever:
    """A retriever that records the queries it is asked (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.queries = inner, []

    def retrieve(self, query: str, k: int) -> Any:
        self.queries.append(query)
        return self.inner.retrieve(query, k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def build_stores(work: Path, fs: FollowupSet) -> Path:
    """Both corpora ingested once under ``work/store`` (a marker file per collection)."""
    from nest_integrations.ingest.pipeline import IngestPipeline

    root = work / "store"
    lm = assembly.shared_model()
    for corpus, collection in COLLECTIONS.items():
        marker = root / f".{collection}.done"
        if marker.exists():
            continue
        src = work / "src"
        src.mkdir(parents=True, exist_ok=True)
        path = getattr(fs, corpus).write_jsonl(src / f"{corpus}.jsonl")
        report = IngestPipeline(assembly.open_store(collection, root), lm,
                                with_keys=False).ingest([path], progress=True)
        LOG.info("%s: %s", collection, report)
        marker.touch()
    return root


def system_spec(name: str, collection: str, root: Path) -> assembly.EngineSpec:
    """The engine of a system (module docstring) over ``collection``."""
    common: dict[str, Any] = dict(persist_dir=str(root), config="grounded")
    if name == "rag-history":
        return assembly.EngineSpec.for_store(collection, policy=AnswerPolicy(conversation="last"),
                                             decoding="greedy", **common)
    if name in ("last", "carry", "rewrite"):
        policy = AnswerPolicy.from_preset("grounded", conversation=name)
        return assembly.EngineSpec.for_store(collection, policy=policy, **common)
    raise ValueError(f"unknown system {name!r}: choose from {list(SYSTEMS)}")


def score(conv: Conversation, result: Any, title: str) -> dict[str, Any]:
    """Right, cited on gold, wrong with a citation (module docstring) of one answer."""
    text = result.text
    shown = [c for c in result.citations if c.kind in ("copy", "verbatim")]
    right = any(grounded.answer_correct(text, a, conv.distractors) for a in conv.answers)
    on_gold = right and any(c.doc_id == conv.gold_doc_id and any(
        grounded.answer_correct(c.text, a) for a in conv.answers) for c in shown)
    return {"text": text, "right": right, "cited_on_gold": on_gold,
            "wrong_cited": not right and bool(shown), "n_cites": len(shown),
            "decoding": result.stats.decoding, "title": title}


def engine_of(name: str, corpus: str, root: Path) -> Any:
    """System ``name``'s engine over ``corpus``, its retriever recording the queries."""
    engine = assembly.build_engine(system_spec(name, COLLECTIONS[corpus], root))
    engine.retriever = RecordingRetriever(engine.retriever)
    return engine


def run(convs: list[Conversation], systems: list[str], root: Path, max_tokens: int,
        records_path: Path, titles: dict[str, str]) -> list[dict[str, Any]]:
    engines = {(name, corpus): engine_of(name, corpus, root)
               for corpus in sorted({c.corpus for c in convs}) for name in systems}
    records = []
    with records_path.open("w", encoding="utf-8") as f:
        for i, conv in enumerate(convs):
            for name in systems:
                engine = engines[(name, conv.corpus)]
                engine.retriever.queries.clear()
                t0 = time.perf_counter()
                result = engine.generate(conv.chat(), max_new_tokens=max_tokens)
                query = engine.retriever.queries[0] if engine.retriever.queries else ""
                rec = {"id": conv.id, "family": conv.family, "split": conv.split,
                       "system": name, "follow_up": conv.messages[-1][1], "query": query,
                       "query_names_gold": titles[conv.gold_doc_id].casefold()
                       in query.casefold(),
                       **score(conv, result, titles[conv.gold_doc_id]),
                       "seconds": time.perf_counter() - t0}
                records.append(rec)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
            LOG.info("%d/%d conversations", i + 1, len(convs))
    return records


def summarize(records: list[dict[str, Any]], systems: list[str]) -> list[dict[str, Any]]:
    """One row per (family or "all", system): counts, shares and Wilson intervals."""
    rows = []
    for family in [*FAMILIES, "all"]:
        for name in systems:
            recs = [r for r in records if r["system"] == name and family in ("all", r["family"])]
            if not recs:
                continue
            n = len(recs)
            right = sum(r["right"] for r in recs)
            on_gold = sum(r["cited_on_gold"] for r in recs)
            wrong = n - right
            wrong_cited = sum(r["wrong_cited"] for r in recs)
            rows.append({
                "family": family, "system": name, "n": n, "right": right,
                "right_ci": wilson_ci(right, n), "cited_on_gold": on_gold,
                "cited_on_gold_ci": wilson_ci(on_gold, right) if right else None,
                "wrong": wrong, "wrong_cited": wrong_cited,
                "wrong_cited_ci": wilson_ci(wrong_cited, wrong) if wrong else None,
                "query_names_gold": sum(r["query_names_gold"] for r in recs),
                "seconds": sum(r["seconds"] for r in recs) / n,
            })
    return rows


def _share(k: int, n: int, ci: Any) -> str:
    if not n:
        return "-"
    return f"{k}/{n} = {pct(k / n, 0)}% [{pct(ci[0], 0)}, {pct(ci[1], 0)}]"


def markdown(rows: list[dict[str, Any]], split: str, note: str = "") -> str:
    body = [(r["family"], r["system"], r["n"], _share(r["right"], r["n"], r["right_ci"]),
             _share(r["cited_on_gold"], r["right"], r["cited_on_gold_ci"]),
             _share(r["wrong_cited"], r["wrong"], r["wrong_cited_ci"]),
             f"{r['query_names_gold']}/{r['n']}", f"{r['seconds']:.1f}") for r in rows]
    lines = [f"# Follow-up questions, {split} split", "",
             "Two-turn conversations (`benchmarks.sets.followups`); shares with 95% Wilson "
             "intervals. Right: the gold value (or operation term) and no other document's. "
             "Cited on gold: of the right answers, those with a copy or verbatim citation on the "
             "gold document that holds the answer. Wrong cited: of the wrong answers, those "
             "with a citation. Query names gold: retrieval queries holding the gold title. "
             "s: mean seconds per answer, the rewrite included.", "",
             *table(["family", "system", "n", "right", "right cited on gold",
                     "wrong with a citation", "query names gold", "s"], body)]
    return "\n".join(lines + ([note] if note else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    from nest_integrations import paths
    from nest_integrations.lm.backend import configure_threads

    ap = harness.parser("benchmarks.followups", __doc__)
    ap.add_argument("--split", default="dev", choices=("dev", "test"))
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated from {list(SYSTEMS)}")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--limit", type=int, default=None,
                    help="conversations per family (a seeded sample), default all")
    ap.add_argument("--seed", type=int, default=0, help="the --limit sample's seed")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", type=Path, default=None, help="the stores' folder")
    ap.add_argument("--stem", default=None, help="results file name (default followups_SPLIT)")
    ap.add_argument("--from-records", type=Path, default=None, metavar="JSONL",
                    help="summarise recorded answers instead of generating")
    args, record = harness.start(ap, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    configure_threads(args.threads)
    systems = [s for s in args.systems.split(",") if s]
    families = [f for f in args.families.split(",") if f]
    for name in systems:
        if name not in SYSTEMS:
            ap.error(f"unknown system {name!r}: choose from {list(SYSTEMS)}")
    for f in families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}: choose from {list(FAMILIES)}")
    stem = args.stem or f"followups_{args.split}"
    if args.from_records is not None:
        rows = summarize(harness.read_jsonl(args.from_records), systems)
        harness.write_result(args.out, stem, {"rows": rows}, markdown(rows, args.split), record)
        return 0
    fs = build_followups()
    convs: list[Conversation] = []
    for f in families:
        pool = fs.conversations(args.split, f)
        if args.limit is not None:
            pool = random.Random(f"followups:{args.seed}:{f}").sample(pool,
                                                                       min(args.limit, len(pool)))
        convs += pool
    titles = {d["id"]: d["metadata"]["title"]
              for d in fs.profiles.documents + fs.devices.documents}
    work = args.work or paths.nest_home() / "bench" / "followups"
    root = build_stores(work, fs)
    args.out.mkdir(parents=True, exist_ok=True)
    records = run(convs, systems, root, args.max_tokens, args.out / f"{stem}.jsonl", titles)
    rows = summarize(records, systems)
    harness.write_result(args.out, stem, {"rows": rows}, markdown(rows, args.split), record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
