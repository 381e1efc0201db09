"""Quality benchmark (issue 22): grounded QA and open-ended answers on a dev or test split.

The question set is ``nest_integrations.evaluation.quality_set`` (three sources, split by
document, seed 0): entity questions over a hardened generated corpus (distractor notes that
outrank the gold document, dates and numbers), and completion questions over the Wikipedia
leads and pydoc topics of the sample corpus; plus an open-ended split ("What is X?", "Who was
X?" for the People leads, "Write the reference entry for X"; ``--open-sources`` picks some).
Make every choice on ``--split dev``; report ``--split test``.

    python benchmarks/quality.py --build                    # ingest the entity corpus (once)
    python benchmarks/quality.py --split dev --n 30 --n-open 10 --max-new-tokens 40
    python benchmarks/quality.py --split test --n 0 --n-open 0   # the full test split (hours)

Needs the sample corpus in the default store (``nest ingest --sample``). Systems (``--systems``,
names of ``evaluation.qa_dev``): ``rag`` (HF greedy, top 3 passages in the prompt; the McNemar
and speed reference), ``grounded`` (the default preset), ``paper``, ``paper-ra``, ``rag-copy``;
``--system NAME=DECODING:PRESET[:k=v,...][@CONTEXT]`` adds one. Writes
``benchmarks/results/<tag>.md`` (default ``quality``), ``.json`` and ``.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

DEFAULT_SYSTEMS = "rag,grounded,paper,paper-ra,rag-copy"
ENTITY_COLLECTION = "entities-hard"


def entity_persist_dir() -> Path:
    from nest_integrations.paths import nest_home

    return nest_home() / "quality"


def build(persist_dir: Path, seed: int) -> None:
    """Write the hardened entity corpus as JSONL and ingest it (with token keys)."""
    from nest_integrations.evaluation.quality_set import build_question_set
    from nest_integrations.ingest import IngestPipeline
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    qs = build_question_set(seed)
    path = qs.entities.write_jsonl(persist_dir / "data" / f"entities-hard-s{seed}.jsonl")
    store = ChromaPassageStore.from_persist_dir(persist_dir, ENTITY_COLLECTION)
    report = IngestPipeline(store, HFLanguageModel.from_default()).ingest([path], progress=True)
    print(report)


def system(name: str) -> Any:
    from nest_integrations.evaluation import qa_dev

    if name == "grounded":
        return qa_dev.SystemSpec("grounded", None, "grounded", {}, "memory")
    return qa_dev.parse_system(name)


def run_open(engine: Any, questions: list, specs: list, k: int, max_new_tokens: int,
             on_record: Any = None) -> list:
    """Every open-ended question through every system; one scored record each."""
    from nest_integrations.evaluation import open_ended, qa_dev
    from nest_integrations.evaluation.grounded import gold_cited_share
    from nest_integrations.evaluation.metrics import rouge_scorer

    scorer = rouge_scorer()
    records = []
    for q in questions:
        passages = engine.retrieve(q.question, k)
        docs = [p.doc_id for p in passages]
        messages = [{"role": "user", "content": q.question}]
        for spec in specs:
            r = qa_dev.generate(engine, spec, messages, passages, max_new_tokens)
            cites = list(r.citations)
            cited = sum(len(c.text) for c in cites)
            records.append({
                "question_id": q.id, "question": q.question, "system": spec.name,
                "source": q.source, "gold_doc_id": q.gold_doc_id,
                "gold_rank": docs.index(q.gold_doc_id) + 1 if q.gold_doc_id in docs else None,
                "text": r.text,
                "rouge_l": open_ended.rouge_l(r.text, q.gold_text, scorer),
                "degenerate": open_ended.degenerate(r.text),
                "junk": open_ended.junky(r.text),
                "other_doc_tokens": open_ended.other_document_tokens(
                    r.token_sources, r.passages, q.gold_doc_id),
                "substantial_citation": open_ended.substantial_citation(cites),
                "cited_chars": cited,
                "gold_cited_chars": sum(len(c.text) for c in cites
                                        if c.doc_id == q.gold_doc_id),
                "gold_cited_share": gold_cited_share(cites, q.gold_doc_id),
                "new_tokens": r.stats.new_tokens, "time_total": r.stats.time_total,
                "finish_reason": r.stats.finish_reason,
            })
            if on_record is not None:
                on_record(records[-1])
    return records


def compose_default(records: list, facts: list) -> list:
    """``records`` plus a ``default`` system: ``facts``' ``default`` records where the question
    asks for a fact (the questions ``NestConfig.fact_decoding`` routes), and a relabelled copy
    of the recorded ``grounded`` answer for every other question, where the routed default
    runs exactly ``grounded``'s relaxed path (``tests/test_quality.py`` checks the routing on
    every question of the set). A question the facts run lacks is left out of ``default``."""
    from nest_integrations.core.question import asks_for_fact

    routed = {r["question_id"]: r for r in facts if r["system"] == "default"}
    out = list(records)
    for r in records:
        if r["system"] != "grounded":
            continue
        if asks_for_fact(r["question"]):
            if r["question_id"] in routed:
                out.append({**routed[r["question_id"]], "composed_from": "facts run"})
        else:
            out.append({**r, "system": "default", "composed_from": "grounded (not routed)"})
    return out


def summarize_open(records: list, reference: str) -> list[dict[str, Any]]:
    from nest_integrations.evaluation import stats

    systems: list[str] = []
    for r in records:
        if r["system"] not in systems:
            systems.append(r["system"])
    rows = []
    ref = {r["question_id"]: r for r in records if r["system"] == reference}
    for s in systems:
        rs = [r for r in records if r["system"] == s]
        new = sum(r["new_tokens"] for r in rs)
        cited = sum(r["cited_chars"] for r in rs)
        t = sum(r["time_total"] for r in rs)
        rl, lo, hi = stats.bootstrap_ci([r["rouge_l"] for r in rs])
        row = {
            "system": s, "n": len(rs), "rouge_l": rl, "rouge_l_ci": (lo, hi),
            "degenerate": sum(r["degenerate"] for r in rs),
            "junk": sum(r["junk"] for r in rs),
            "run_on_share": sum(r["other_doc_tokens"] for r in rs) / new if new else None,
            "substantial": sum(r["substantial_citation"] for r in rs),
            "gold_cited_share": (sum(r["gold_cited_chars"] for r in rs) / cited
                                 if cited else None),
            "tokens_per_s": new / t if t else None,
        }
        if s != reference and ref:
            common = [r for r in rs if r["question_id"] in ref]
            row["rouge_l_diff"] = stats.paired_bootstrap_diff(
                [r["rouge_l"] for r in common], [ref[r["question_id"]]["rouge_l"] for r in common])
        rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def closed_table(rows: list, reference: str) -> str:
    from nest_integrations.evaluation import stats

    lines = ["| system | correct | accuracy (95% Wilson) | wrong entity | gold-cited chars | "
             f"off-topic copied | run-on | tok/s | vs {reference} speed | "
             f"vs {reference} (+/-, McNemar p) |", "|" + "---|" * 10]
    ref_tps = next((r["tokens_per_s"] for r in rows if r["system"] == reference), None)
    for r in rows:
        lo, hi = stats.wilson_ci(r["correct"], r["n"])
        mc = r.get("vs_reference")
        vs = f"+{mc['a_only']}/-{mc['b_only']}, p={mc['p']:.3f}" if mc else "-"
        tps = r.get("tokens_per_s")
        sp = f"{tps / ref_tps:.2f}x" if tps and ref_tps else "-"
        lines.append(
            f"| {r['system']} | {r['correct']}/{r['n']} | {100 * r['accuracy']:.0f}% "
            f"({100 * lo:.0f}-{100 * hi:.0f}) | {r['wrong_entity']} | "
            f"{_pct(r['gold_cited_share'])} | {_pct(r['off_topic_share'])} | "
            f"{_pct(r['run_on_share'])} | {'-' if tps is None else f'{tps:.1f}'} | {sp} | {vs} |")
    return "\n".join(lines)


def open_table(rows: list, reference: str) -> str:
    lines = ["| system | n | ROUGE-L (95% CI) | vs " + reference + " (diff, 95% CI) | "
             "degenerate | junk | run-on (other-doc tokens) | >= 4-word citation | "
             "gold-cited chars | tok/s | vs " + reference + " speed |", "|" + "---|" * 11]
    ref_tps = next((r["tokens_per_s"] for r in rows if r["system"] == reference), None)
    for r in rows:
        lo, hi = r["rouge_l_ci"]
        d = r.get("rouge_l_diff")
        diff = f"{100 * d[0]:+.1f} ({100 * d[1]:+.1f}, {100 * d[2]:+.1f})" if d else "-"
        tps = r["tokens_per_s"]
        sp = f"{tps / ref_tps:.2f}x" if tps and ref_tps else "-"
        lines.append(
            f"| {r['system']} | {r['n']} | {100 * r['rouge_l']:.1f} ({100 * lo:.1f}-"
            f"{100 * hi:.1f}) | {diff} | {r['degenerate']}/{r['n']} | {r['junk']}/{r['n']} "
            f"| {_pct(r['run_on_share'])} "
            f"| {r['substantial']}/{r['n']} | {_pct(r['gold_cited_share'])} | "
            f"{'-' if tps is None else f'{tps:.1f}'} | {sp} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="ingest the entity corpus first")
    ap.add_argument("--split", choices=("dev", "test"), default="dev")
    ap.add_argument("--seed", type=int, default=0, help="question-set seed (the split)")
    ap.add_argument("--slice-seed", type=int, default=0, help="which questions of the split")
    ap.add_argument("--n", type=int, default=30, help="closed questions (0 = the whole split)")
    ap.add_argument("--n-open", type=int, default=10, help="open-ended questions (0 = all)")
    ap.add_argument("--skip-open", action="store_true", help="no open-ended questions")
    ap.add_argument("--offset", type=int, default=0,
                    help="skip the first N closed questions of the slice (questions an earlier "
                         "run of the same slice already answered)")
    ap.add_argument("--skip-closed", action="store_true", help="no closed questions")
    ap.add_argument("--sources", default=None,
                    help="closed-question sources to keep, comma-separated (default: all)")
    ap.add_argument("--open-sources", default=None,
                    help="open-ended sources to keep, comma-separated: open-wiki, open-who, "
                    "open-pydoc (default: all; open-who was added after issue 22's runs, so "
                    "their slices are open-wiki,open-pydoc)")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS)
    ap.add_argument("--system", action="append", default=[], metavar="SPEC")
    ap.add_argument("--reference", default="rag")
    ap.add_argument("--k", type=int, default=8, help="passages retrieved per question")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--max-new-tokens-open", type=int, default=None,
                    help="open-ended answers (default: --max-new-tokens)")
    ap.add_argument("--persist-dir", type=Path, default=None,
                    help="entity store (default $NEST_HOME/quality)")
    ap.add_argument("--no-title-match", action="store_true",
                    help="shared stage-1 retrieval without NestConfig.title_match (the dense "
                         "ranking every system got before issue 22's title match)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=None,
                    help="model weights for every system: auto, fp32, bf16, ... (default: the "
                         "engine's default dtype)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--tag", default="quality")
    ap.add_argument("--from-records", type=Path, nargs="+", default=None, metavar="JSONL",
                    help="summarise recorded answers (e.g. <tag>.partial.jsonl of a run that "
                         "was stopped) instead of generating")
    ap.add_argument("--compose-default", type=Path, default=None, metavar="JSONL",
                    help="with --from-records: add a 'default' system made of this run's "
                         "'default' records (the fact questions) and the recorded 'grounded' "
                         "ones for every other question (see compose_default)")
    ap.add_argument("--relabel", action="append", default=[], metavar="FILE:OLD=NEW",
                    help="with --from-records: rename system OLD to NEW in the records of FILE "
                         "(its file name), e.g. a dense-retrieval run's rag as rag-dense")
    ap.add_argument("--keep-systems", default=None,
                    help="with --from-records: summarise only these systems (comma-separated)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from nest_integrations import NestEngine
    from nest_integrations.assembly import EngineSpec, build_engine
    from nest_integrations.evaluation import qa_dev
    from nest_integrations.evaluation.quality_set import SOURCES, build_question_set

    persist = args.persist_dir or entity_persist_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.build:
        build(persist, args.seed)
    qs = build_question_set(args.seed)
    pool = qs.closed(args.split)
    if args.sources:
        keep = {x.strip() for x in args.sources.split(",") if x.strip()}
        bad = keep - set(SOURCES)
        if bad:
            ap.error(f"--sources: unknown {sorted(bad)}; choose from {list(SOURCES)}")
        pool = [q for q in pool if qs.sources[q.id] in keep]
    closed = [] if args.skip_closed else qs.interleaved(pool, args.n or None, args.slice_seed)
    closed = closed[args.offset:]
    open_pool = qs.open(args.split)
    if args.open_sources:
        keep_open = {x.strip() for x in args.open_sources.split(",") if x.strip()}
        known = {q.source for q in qs.open_questions}
        if keep_open - known:
            ap.error(f"--open-sources: unknown {sorted(keep_open - known)}; "
                     f"choose from {sorted(known)}")
        open_pool = [q for q in open_pool if q.source in keep_open]
    opened = ([] if args.skip_open else
              qs.interleaved(open_pool, args.n_open or None, args.slice_seed))
    specs = [system(s) for s in args.systems.split(",") if s.strip()]
    specs += [qa_dev.parse_system(s) for s in args.system]

    if args.from_records:
        relabel: dict[tuple[str, str], str] = {}
        for item in args.relabel:
            fname, _, pair = item.rpartition(":")
            old_name, _, new_name = pair.partition("=")
            if not fname or not old_name or not new_name:
                ap.error(f"--relabel {item!r}: use FILE:OLD=NEW")
            relabel[(Path(fname).name, old_name)] = new_name
        recs = []
        for path in args.from_records:
            for line in open(path, encoding="utf-8"):
                if line.strip():
                    r = json.loads(line)
                    r["system"] = relabel.get((path.name, r["system"]), r["system"])
                    recs.append(r)
        if args.keep_systems:
            keep_s = {x.strip() for x in args.keep_systems.split(",") if x.strip()}
            recs = [r for r in recs if r["system"] in keep_s]
        if args.compose_default:
            facts = [json.loads(line) for line in open(args.compose_default, encoding="utf-8")
                     if line.strip()]
            recs = compose_default(recs, facts)
        systems = list(dict.fromkeys(r["system"] for r in recs))
        per_q: dict[str, set] = {}
        for r in recs:
            per_q.setdefault(r["question_id"], set()).add(r["system"])
        done = {q for q, ss in per_q.items() if ss == set(systems)}  # every system answered
        records = [r for r in recs if r["question_id"] in done
                   and not str(r.get("source", "")).startswith("open-")]
        open_records = [r for r in recs if r["question_id"] in done
                        and str(r.get("source", "")).startswith("open-")]
        from nest_integrations.evaluation import open_ended

        for r in open_records:  # the metric as it is now (records may predate a change)
            r["degenerate"] = open_ended.degenerate(r["text"])
            r["junk"] = open_ended.junky(r["text"])
        ids = {r["question_id"] for r in records}
        closed = [q for q in closed if q.id in ids]
        oids = {r["question_id"] for r in open_records}
        opened = [q for q in opened if q.id in oids]
        specs = [qa_dev.SystemSpec(n) for n in systems]  # names only: nothing is generated
        start = time.perf_counter()
        wall = float("nan")
    else:
        partial = open(args.out / f"{args.tag}.partial.jsonl", "w", encoding="utf-8")

        def keep(rec: dict) -> None:
            partial.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            partial.flush()

        sample = NestEngine.from_defaults(dtype=args.dtype)
        entities = build_engine(
            EngineSpec(collection=ENTITY_COLLECTION, persist_dir=str(persist)), lm=sample.lm)
        for eng in (sample, entities):  # the retrieval every system shares
            eng.config = eng.config.replace(title_match=not args.no_title_match)
        start = time.perf_counter()
        records = []
        for eng, qsub in ((entities, [q for q in closed if qs.sources[q.id] == "entities-hard"]),
                          (sample, [q for q in closed if qs.sources[q.id] != "entities-hard"])):
            if qsub:
                for r in qa_dev.run_questions(eng, qsub, specs, k=args.k,
                                              max_new_tokens=args.max_new_tokens,
                                              on_record=lambda r: keep(
                                                  {**r, "source": qs.sources[r["question_id"]]})):
                    r["source"] = qs.sources[r["question_id"]]
                    records.append(r)
        open_records = run_open(sample, opened, specs, args.k,
                                args.max_new_tokens_open or args.max_new_tokens, on_record=keep)
        partial.close()
        wall = time.perf_counter() - start

    rows = qa_dev.summarize(records, reference=args.reference, speed_reference=args.reference)
    per_source = []
    for src in sorted({r["source"] for r in records}):
        sub = qa_dev.summarize([r for r in records if r["source"] == src],
                               reference=args.reference, speed_reference=args.reference)
        per_source.append(f"\n\n### {src}\n\n" + closed_table(sub, args.reference))
    orows = summarize_open(open_records, args.reference) if open_records else []
    retrieved = [r for r in records if r["system"] == specs[0].name]
    first = sum(r["gold_rank"] == 1 for r in retrieved) / max(1, len(retrieved))
    top3 = sum((r["gold_rank"] or 99) <= 3 for r in retrieved) / max(1, len(retrieved))
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    counts = qs.counts()
    n_closed, n_open = len(qs.closed(args.split)), len(qs.open(args.split))
    whole = len(closed) >= n_closed and len(opened) >= n_open
    scope = ("the whole split" if whole else
             f"{len(closed)} of {n_closed} closed and {len(opened)} of {n_open} open-ended "
             "questions of the split (slice seed " + str(args.slice_seed) + ")")
    if args.from_records:
        scope += ", summarised from the recorded answers " + ", ".join(
            f"`{p.name}`" for p in args.from_records)
        if args.compose_default:
            scope += (" with the routed `default` composed from "
                      f"`{args.compose_default.name}` (see `compose_default`)")
    md = (
        f"# Quality: grounded QA and open-ended answers, {args.split} split, {scope}\n\n"
        f"Question set: `evaluation/quality_set.py`, seed {args.seed}, split by document "
        f"(dev {sum(counts['dev'].values())} / test {sum(counts['test'].values())} questions: "
        f"{json.dumps(counts)}). This run: {len(closed)} closed questions (slice seed "
        f"{args.slice_seed}, gold document first for {100 * first:.0f}%, in the top 3 for "
        f"{100 * top3:.0f}%) and {len(opened)} open-ended, k = {args.k}, max_new_tokens = "
        f"{args.max_new_tokens}, chat messages, SmolLM2-135M-Instruct"
        + ("" if args.from_records else f" ({str(sample.lm.dtype).removeprefix('torch.')})")
        + ", shared retrieval "
        + ("dense only" if args.no_title_match else "with title match") + ", "
        f"{torch.get_num_threads()} torch thread(s)"
        + ("" if args.from_records else
           f", wall {wall:.0f} s, load {os.getloadavg()[0]:.1f}")
        + f".\n\nCommand: `python benchmarks/quality.py {cmd}`\n\n"
        "Full run (hours on 2 shared cores): `python benchmarks/quality.py --split test --n 0 "
        "--n-open 0 --max-new-tokens 40 --max-new-tokens-open 64`\n\n"
        "## Grounded QA (strict: gold value present, no other entity's value)\n\n"
        + closed_table(rows, args.reference) + "".join(per_source)
        + "\n\n## Open-ended\n\n" + (open_table(orows, args.reference) if orows else "none")
        + "\n\nrun-on (open-ended): output tokens attributed to another document than the gold "
        "one. degenerate: empty, mostly punctuation, a repeated sentence/line or a phrase loop. "
        "junk: a rough pattern count (`open_ended.JUNK_PATTERN`: ',,', a function word before a "
        "comma, an opening comma, a doubled word). "
        "Speed: pooled tokens/s over the reference's on the same questions.\n"
    )
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.md").write_text(md, encoding="utf-8")
    (args.out / f"{args.tag}.json").write_text(json.dumps(
        {"closed": rows, "open": orows, "wall_s": wall, "counts": counts,
         "args": {k: str(v) for k, v in vars(args).items()}}, indent=2, default=str),
        encoding="utf-8")
    with open(args.out / f"{args.tag}.jsonl", "w", encoding="utf-8") as f:
        for r in records + open_records:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    if not args.from_records:  # the run finished: its partial record is the .jsonl now
        (args.out / f"{args.tag}.partial.jsonl").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
