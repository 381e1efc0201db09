"""Post-hoc attribution, measured (issue 23): support P/R, unsupported detection P/R, verbatim
exactness and time per sentence, per scorer, with thresholds chosen on a dev split and reported
on a test split, split BY DOCUMENT (sha1 of the document id, even = dev).

Three corpora, all in the repository:

- **entities**: the grounded-QA generator (``evaluation/entities.py``, seed 0: 60 fictional
  documents, 300 questions); passages are the top-4 BM25 passages for the question
  (``InMemoryRetriever``), as a RAG pipeline would give them.
- **wiki**: the 300 Wikipedia leads of the sample corpus (``data/sample/wikipedia.jsonl``);
  passages are the gold lead plus its 3 nearest leads (MiniLM cosine).
- **pydoc**: the 40 Python reference topics of the sample corpus (``data/sample/pydoc``),
  up to 2 prose sentences per topic; passages are the gold topic plus its 3 nearest topics.

Items (one answer sentence each, against the item's passages):

- ``positive``: the gold sentence paraphrased by templates (entities: 4 frames around the
  attribute and value; wiki and pydoc: a synonym list, parentheses dropped, a lead-in phrase).
  Gold support: the gold sentence of the gold document.
- ``wrong_value``: the same paraphrase with another entity's value (entities: a distractor;
  wiki: a number changed, else a name swapped for another lead's title, outside parentheses;
  pydoc: a quoted code name swapped for another topic's, else a number changed).
- ``unrelated``: a sentence of a document outside the passages.
- ``fabricated``: a fluent sentence about the gold entity that the corpus does not contain
  (templates: acquisitions, prizes, moves, namesakes; pydoc: deprecations, PEPs, modules).

A prediction is **supported** when the verdict is ``verbatim`` or ``support``; it is a
**correct support** when the item is a positive and the cited passage span overlaps the gold
sentence in the gold document. Support precision = correct supports / supported predictions
(all items); support recall = correct supports / positives. Unsupported detection: precision =
negatives among units flagged unsupported, recall = flagged negatives / negatives. Each scorer
runs once with threshold -1 (so every best candidate and score is kept); thresholds are then
swept offline on DEV only (``choose_threshold``): among those with dev support precision >= 92%
(``DEV_PRECISION``, ``--dev-precision``: a margin over the 90% test target), the middle of the
range with the highest dev recall, else the best dev F1. Test figures are reported at that
threshold, never used to choose it. The scorers are also compared along their whole test
precision-recall curves (``pr_curve``, ``curve_comparison``: each one's precision at the fuzzy
baselines' recall and recall at their precision), which chooses nothing.

Scorers: ``fuzzy`` (difflib), ``fuzzy-rapidfuzz`` (``rapidfuzz`` partial ratio, the ``bench``
extra), ``embedding``, ``keys``, ``combined``; ``-novalues`` runs one without the value check
(``fuzzy-novalues`` is the plain string match of LangChain's recipes).

    python -m benchmarks.attribution --per-corpus 60        # all scorers, ~15 min here
    python -m benchmarks.attribution --scorers embedding,fuzzy --per-corpus 60

Writes ``benchmarks/results/attribution.md``, ``attribution.json`` and ``attribution_pr.png``.
The cost of ``NestConfig(attribute=True)`` in an answer is ``python -m
benchmarks.attribution_overhead``.

``--answers JSONL`` instead attributes the closed-question answers that
``python -m benchmarks.quality`` recorded (``attribute_answers``: the flag rates of wrong and right
answers per system), with the stores quality.py generated from (``--persist-dir``,
``--store-dir``; default under ``$NEST_HOME``), and writes
``results/attribution_answers_<stem>.md``:

    python -m benchmarks.attribution --answers benchmarks/results/quality_test.jsonl \\
        --answers-systems rag,base
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from benchmarks import harness
from nest_integrations.attribution import (
    AttributionConfig,
    Attributor,
    split_sentences,
    word_tokens,
)
from nest_integrations.types import Passage

REPO, RESULTS = harness.REPO, harness.RESULTS
NEGATIVE_KINDS = ("wrong_value", "unrelated", "fabricated")
CORPORA = ("entities", "wiki", "pydoc")


@dataclass
class Item:
    corpus: str
    kind: str  # positive | wrong_value | unrelated | fabricated
    doc_id: str  # the gold document (what the split hashes)
    text: str
    passages: list[Passage]
    gold_span: tuple[int, int] | None = None  # the gold sentence in the gold passage
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def positive(self) -> bool:
        return self.kind == "positive"

    @property
    def split(self) -> str:
        return "dev" if int(hashlib.sha1(self.doc_id.encode()).hexdigest(), 16) % 2 == 0 else "test"


# ------------------------------------------------------------------------------------ items


def _doc_passage(doc_id: str, text: str, title: str) -> Passage:
    return Passage(f"p:{doc_id}", text, doc_id=doc_id, char_start=0, char_end=len(text),
                   metadata={"title": title})


_FAKE_NAMES = ["Velmora", "Quistan", "Orlevik", "Brannoch", "Tessaly", "Marrowind", "Calderon",
               "Ystrada", "Pellinor", "Varnholt"]


def entity_items(n_questions: int, rng: random.Random) -> list[Item]:
    from nest_integrations.evaluation.entities import generate_corpus
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    corpus = generate_corpus(seed=0)
    passages = {d.id: _doc_passage(d.id, d.text, d.name) for d in corpus.documents}
    kinds = {d.id: d.kind for d in corpus.documents}
    retriever = InMemoryRetriever(list(passages.values()))
    templates = ["{e}'s {a} is {v}.", "{v} is the {a} of {e}.", "As for {e}, its {a} is {v}.",
                 "{e} has {v} as its {a}."]
    fabrications = ["{e} was acquired by {n} Group in {y}.",
                    "{e} won the {n} Prize for design in {y}.",
                    "In {y}, {e} was moved to the town of {n}.",
                    "{e} is named after a {n} sailor who lived in the {c}th century."]
    items = []
    for q in corpus.sample_questions(n_questions, seed=3):
        ctx = retriever.retrieve(q.question, 4)
        gold = passages[q.gold_doc_id]
        s = gold.text.index(q.answer_sentence)
        span = (s, s + len(q.answer_sentence))
        t = rng.choice(templates)
        pos = t.format(e=q.entity, a=q.attribute, v=q.answer)
        pos = pos[0].upper() + pos[1:]
        items.append(Item("entities", "positive", q.gold_doc_id, pos, ctx, span))
        wrong = rng.choice(q.distractors)
        neg = t.format(e=q.entity, a=q.attribute, v=wrong)
        items.append(Item("entities", "wrong_value", q.gold_doc_id, neg[0].upper() + neg[1:], ctx))
        ctx_ids = {p.doc_id for p in ctx}
        others = [d for d in corpus.documents
                  if d.id not in ctx_ids and d.kind != kinds[q.gold_doc_id]]
        other = rng.choice(others)
        sent = rng.choice(other.text.split(". ")[1:]).rstrip(".") + "."
        items.append(Item("entities", "unrelated", q.gold_doc_id, sent, ctx))
        fab = rng.choice(fabrications).format(e=q.entity, n=rng.choice(_FAKE_NAMES),
                                              y=rng.randint(1900, 2020), c=rng.randint(12, 19))
        items.append(Item("entities", "fabricated", q.gold_doc_id, fab, ctx))
    return items


_SYNONYMS = {
    "large": "big", "largest": "biggest", "small": "little", "famous": "well-known",
    "known as": "called", "located": "situated", "began": "started", "begin": "start",
    "used": "employed", "uses": "employs", "many": "numerous", "several": "a number of",
    "often": "frequently", "important": "significant", "major": "principal",
    "country": "nation", "people": "individuals", "include": "comprise",
    "includes": "comprises", "including": "such as", "became": "turned into",
    "created": "made", "developed": "devised", "approximately": "about", "around": "roughly",
    "main": "chief", "usually": "typically", "generally": "broadly", "refers to": "denotes",
    "consists of": "is made up of", "modern": "contemporary", "ancient": "old",
    "however": "yet", "primarily": "mainly", "mostly": "largely", "considered": "regarded",
    "described": "characterised", "also": "in addition", "first": "earliest",
    "popular": "widely liked", "region": "area", "form": "type", "areas": "regions",
    "the most": "the very most", "one of the": "among the", "is a": "is a kind of",
    "was a": "was a kind of", "are": "are considered", "based": "founded", "known": "recognised",
}
_LEADINS = ["In short, ", "Put simply, ", "Broadly speaking, ", "To summarise, ", ""]


_PARENS = re.compile(r"\s*\([^()]*\)")


def paraphrase(sentence: str, rng: random.Random) -> str:
    s = _PARENS.sub("", sentence)
    for a, b in sorted(_SYNONYMS.items(), key=lambda kv: -len(kv[0])):
        s = re.sub(rf"\b{re.escape(a)}\b", b, s)
    lead = rng.choice(_LEADINS)
    if lead:
        first = s.split(" ", 1)[0]
        keep = first.isupper() or (first[:1].isupper() and any(c.isupper() for c in first[1:]))
        s = lead + (s if keep or _is_name(first) else s[0].lower() + s[1:])
    return s


def _is_name(word: str) -> bool:
    return word not in {"The", "A", "An", "It", "In", "This", "These", "They", "He", "She", "Its",
                        "Their", "There", "As", "On", "At", "For", "From", "With", "By", "Since"}


def wrong_value(sentence: str, titles: list[str], own: str, rng: random.Random) -> str | None:
    nums = list(re.finditer(r"\b\d{2,4}\b", sentence))
    if nums:
        m = rng.choice(nums)
        v = int(m.group())
        new = str(v + rng.choice([-1, 1]) * rng.randint(3, 40)) if v > 100 else str(v * 3 + 7)
        return sentence[: m.start()] + new + sentence[m.end():]
    names = [m for m in re.finditer(r"(?<=\s)[A-Z][a-z]{3,}(?:\s[A-Z][a-z]+)*", sentence)
             if m.group() not in own]
    if not names:
        return None
    m = rng.choice(names)
    other = rng.choice([t for t in titles if t != own and "(" not in t])
    return sentence[: m.start()] + other + sentence[m.end():]


def wiki_items(n_docs: int, rng: random.Random, embedder: Any) -> list[Item]:
    import numpy as np

    lines = (REPO / "nest_integrations" / "data" / "sample" / "wikipedia.jsonl").read_text(
        encoding="utf-8").splitlines()
    docs = [json.loads(line) for line in lines if line.strip()]
    passages = [_doc_passage(d["id"], d["text"], d["metadata"]["title"]) for d in docs]
    titles = [d["metadata"]["title"] for d in docs]
    emb = np.asarray(embedder.embed([p.text for p in passages]))
    fabrications = ["{t} was banned in {n} in {y} after a public vote.",
                    "{t} is named after a {n} merchant who lived in the {c}th century.",
                    "In {y}, the records of {t} were moved to a new museum in {n}.",
                    "A {n} study from {y} found that {t} had been greatly exaggerated."]
    order = list(range(len(docs)))
    rng.shuffle(order)
    items = []
    for i in order[:n_docs]:
        near = np.argsort(-(emb @ emb[i]))
        ctx_idx = [i] + [int(j) for j in near if j != i][:3]
        ctx = [passages[j] for j in ctx_idx]
        gold = passages[i]
        spans = [(s, e) for s, e in split_sentences(gold.text) if len(gold.text[s:e].split()) >= 6]
        if not spans:
            continue
        s, e = rng.choice(spans)
        sent = gold.text[s:e]
        items.append(Item("wiki", "positive", gold.doc_id, paraphrase(sent, rng), ctx, (s, e)))
        # the value is changed outside parentheses: the paraphrase drops them, and a change
        # inside would leave a correct sentence labelled wrong
        bare = _PARENS.sub("", sent)
        wrong = wrong_value(bare, titles, titles[i], rng)
        if wrong and wrong != bare:
            items.append(Item("wiki", "wrong_value", gold.doc_id, paraphrase(wrong, rng), ctx))
        outside = [j for j in order if j not in ctx_idx]
        other = passages[rng.choice(outside)]
        ospans = [(a, b) for a, b in split_sentences(other.text)
                  if len(other.text[a:b].split()) >= 6]
        if ospans:
            a, b = rng.choice(ospans)
            items.append(Item("wiki", "unrelated", gold.doc_id, other.text[a:b], ctx))
        fab = rng.choice(fabrications).format(t=titles[i].split(" (")[0],
                                              n=rng.choice(_FAKE_NAMES),
                                              y=rng.randint(1900, 2020), c=rng.randint(12, 19))
        items.append(Item("wiki", "fabricated", gold.doc_id, fab, ctx))
    return items


def _prose_sentences(text: str, min_words: int = 8) -> list[tuple[int, int]]:
    """Sentences of a pydoc topic that are prose: not the title, not grammar or code."""
    out = []
    for s, e in split_sentences(text):
        sent = text[s:e]
        words = sent.split()
        if (len(words) < min_words or "::=" in sent or "*****" in sent or ">>>" in sent
                or "\n   " in sent or sum(ch.isalpha() for ch in sent) < 0.7 * len(sent)
                or not sent.rstrip("\"'’”)").endswith((".", "?", "!"))):  # "... equivalent to"
            continue
        out.append((s, e))
    return out


_QUOTED = re.compile(r'"([^"\n]{2,30})"')


def pydoc_wrong_value(sentence: str, terms: list[str], rng: random.Random) -> str | None:
    """A quoted term ("assert", "__debug__") swapped for another topic's, else a number
    changed; None when the sentence has neither."""
    quoted = list(_QUOTED.finditer(sentence))
    if quoted:
        m = rng.choice(quoted)
        other = rng.choice([t for t in terms if t != m.group(1)])
        return sentence[: m.start(1)] + other + sentence[m.end(1):]
    nums = list(re.finditer(r"\b\d+\b", sentence))
    if nums:
        m = rng.choice(nums)
        return sentence[: m.start()] + str(int(m.group()) * 3 + 7) + sentence[m.end():]
    return None


def pydoc_items(n_positives: int, rng: random.Random, embedder: Any) -> list[Item]:
    """The 40 Python reference topics of the sample corpus (``data/sample/pydoc``); passages
    are the gold topic plus its 3 nearest topics (MiniLM cosine), whole. Up to 2 positives
    per topic, until ``n_positives``."""
    import numpy as np

    folder = REPO / "nest_integrations" / "data" / "sample" / "pydoc"
    docs = [(f"pydoc/{p.name}", p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]
    passages = [_doc_passage(d, text, d.split("/", 1)[1][:-4]) for d, text in docs]
    emb = np.asarray(embedder.embed([p.text for p in passages]))
    prose = [_prose_sentences(p.text) for p in passages]
    terms = sorted({m.group(1) for p in passages for m in _QUOTED.finditer(p.text)})
    fabrications = [
        'The "{t}" statement was deprecated in Python 3.{m} and removed in Python 3.{m2}.',
        'The "{t}" construct was proposed by {n} in PEP {p} and accepted in {y}.',
        'In CPython, "{t}" is implemented by the {n} module, added in version 3.{m}.',
        'Since Python 3.{m}, using "{t}" inside a finally clause raises a {n}Warning.',
    ]
    order = [i for i in range(len(passages)) if prose[i]]
    rng.shuffle(order)
    picked: dict[int, list[tuple[int, int]]] = {}
    for rnd in range(2):
        for i in order:
            if sum(map(len, picked.values())) >= n_positives:
                break
            left = [sp for sp in prose[i] if sp not in picked.get(i, [])]
            if left:
                picked.setdefault(i, []).append(rng.choice(left))
    items = []
    for i, spans in picked.items():
        near = np.argsort(-(emb @ emb[i]))
        ctx_idx = [i] + [int(j) for j in near if j != i][:3]
        ctx = [passages[j] for j in ctx_idx]
        gold = passages[i]
        name = gold.metadata["title"]
        for s, e in spans:
            sent = " ".join(gold.text[s:e].split())
            items.append(Item("pydoc", "positive", gold.doc_id, paraphrase(sent, rng), ctx, (s, e)))
            wrong = pydoc_wrong_value(_PARENS.sub("", sent), terms, rng)
            if wrong:
                items.append(Item("pydoc", "wrong_value", gold.doc_id, paraphrase(wrong, rng),
                                  ctx))
            outside = [j for j in order if j not in ctx_idx]
            other = passages[rng.choice(outside)]
            ospans = _prose_sentences(other.text)
            if ospans:
                a, b = rng.choice(ospans)
                items.append(Item("pydoc", "unrelated", gold.doc_id,
                                  " ".join(other.text[a:b].split()), ctx))
            fab = rng.choice(fabrications).format(
                t=name, n=rng.choice(_FAKE_NAMES), m=rng.randint(2, 12), m2=rng.randint(13, 20),
                p=rng.randint(300, 800), y=rng.randint(2001, 2024))
            items.append(Item("pydoc", "fabricated", gold.doc_id, fab, ctx))
    return items


# ------------------------------------------------------------------------------------ running


def run_scorer(attributor: Attributor, items: list[Item]) -> list[dict[str, Any]]:
    """One row per item: verbatim verdict, best score, cited span, exactness."""
    rows = []
    for it in items:
        t0 = time.perf_counter()
        a = attributor(it.text, it.passages)
        dt = time.perf_counter() - t0
        by_id = {p.id: p for p in a.passages}
        exact = all(
            by_id[c.passage_id].text[c.passage_start:c.passage_end] == c.text
            and (c.kind != "verbatim" or it.text[c.start:c.end] == c.text)
            for c in a.citations
        )
        units = []
        for u in a.sentences:
            cites = [c for c in a.citations if c.start < u.end and c.end > u.start
                     and (c.kind == "support") == (u.verdict != "verbatim")]
            on_gold = it.gold_span is not None and any(
                by_id[c.passage_id].doc_id == it.doc_id and c.passage_start < it.gold_span[1]
                and c.passage_end > it.gold_span[0] for c in cites)
            units.append({"verbatim": u.verdict == "verbatim", "score": u.score,
                          "on_gold": on_gold})
        rows.append({"units": units, "time": dt, "n_units": len(a.sentences), "exact": exact,
                     "n_verbatim": sum(c.kind == "verbatim" for c in a.citations)})
    return rows


def supported(row: dict[str, Any], t: float) -> tuple[bool, bool]:
    """(every unit supported at threshold t, and every unit on the gold sentence)."""
    ok = all(u["verbatim"] or (u["score"] is not None and u["score"] >= t) for u in row["units"])
    return ok, ok and all(u["on_gold"] for u in row["units"])


def metrics(items: list[Item], rows: list[dict[str, Any]], t: float) -> dict[str, Any]:
    pred = correct = pos = flagged = flagged_neg = neg = 0
    by_kind: dict[str, list[int]] = {}
    for it, row in zip(items, rows):
        ok, good = supported(row, t)
        pred += ok
        if it.positive:
            pos += 1
            correct += good
        else:
            neg += 1
            flagged_neg += not ok
        flagged += not ok
        k = by_kind.setdefault(it.kind, [0, 0])
        k[0] += ok
        k[1] += 1
    p = correct / pred if pred else 0.0
    r = correct / pos if pos else 0.0
    return {
        "threshold": t, "support_precision": p, "support_recall": r,
        "support_f1": 2 * p * r / (p + r) if p + r else 0.0,
        "unsupported_precision": flagged_neg / flagged if flagged else 0.0,
        "unsupported_recall": flagged_neg / neg if neg else 0.0,
        "supported_by_kind": {k: v[0] / v[1] for k, v in by_kind.items()},
        "n": len(items), "positives": pos, "negatives": neg,
    }


#: The threshold rule's precision target on DEV: a margin over the issue's 90% test target.
DEV_PRECISION = 0.92


def choose_threshold(
    items: list[Item], rows: list[dict[str, Any]], min_precision: float = DEV_PRECISION
) -> tuple[float, str]:
    """The threshold, chosen on the items given (always the dev split), and the rule that
    chose it: among the thresholds whose support precision is >= ``min_precision``, those with
    the highest recall; recall is flat over a range of them (the value check, not the score,
    decides the rest), and the lowest of the range sits at the negatives' edge, the highest at
    the positives', so the middle of the range is taken (the widest margin both ways; the
    lowest if the middle falls in a gap). Else (none reaches it) the best support F1."""
    scores = sorted({round(u["score"], 4) for r in rows for u in r["units"]
                     if u["score"] is not None})
    grid = [s for s in scores] or [0.5]
    best_f1, best_f1_t = -1.0, grid[-1]
    ok: list[tuple[float, float]] = []  # (recall, threshold) meeting the precision target
    for t in grid:
        m = metrics(items, rows, t)
        if m["support_precision"] >= min_precision and m["support_recall"] > 0:
            ok.append((m["support_recall"], t))
        if m["support_f1"] > best_f1:
            best_f1, best_f1_t = m["support_f1"], t
    if ok:
        top = max(r for r, _ in ok)
        flat = [t for r, t in ok if r == top]
        mid = round((flat[0] + flat[-1]) / 2, 4)
        m = metrics(items, rows, mid)
        if m["support_precision"] >= min_precision and m["support_recall"] == top:
            return mid, f"dev P >= {min_precision:.0%}, max recall, mid-range"
        return flat[0], f"dev P >= {min_precision:.0%}, max recall"
    return best_f1_t, f"best dev F1 (none reaches {min_precision:.0%})"


def pr_curve(items: list[Item], rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Support precision and recall at every threshold the scores allow (the split given),
    highest threshold first; thresholds are swept here, so the curve compares scorers, it
    chooses nothing."""
    grid = sorted({round(u["score"], 4) for r in rows for u in r["units"]
                   if u["score"] is not None} | {1.01}, reverse=True)
    out = []
    for t in grid:
        m = metrics(items, rows, t)
        out.append({"threshold": t, "precision": m["support_precision"],
                    "recall": m["support_recall"]})
    return out


def at_operating_point(curve: list[dict[str, float]], precision: float | None = None,
                       recall: float | None = None) -> float | None:
    """The best precision among the curve's points with recall >= ``recall``, or the best
    recall among those with precision >= ``precision`` (None when no point qualifies)."""
    if recall is not None:
        ps = [c["precision"] for c in curve if c["recall"] >= recall - 1e-9]
        return max(ps) if ps else None
    rs = [c["recall"] for c in curve if c["precision"] >= precision - 1e-9 and c["recall"] > 0]
    return max(rs) if rs else None


class RapidfuzzAttributor(Attributor):
    """The fuzzy baseline with ``rapidfuzz.fuzz.partial_ratio`` (the best-aligned substring's
    similarity, over 100) in place of difflib's matched characters."""

    def _fuzzy_scores(self, units: Any, cands: Any) -> Any:
        import numpy as np
        from rapidfuzz import fuzz

        out = np.zeros((len(units), len(cands)), dtype=np.float32)
        for i, u in enumerate(units):
            ul = u.lower()
            for j, c in enumerate(cands):
                out[i, j] = fuzz.partial_ratio(ul, c.text.lower()) / 100.0
        return out


def verbatim_sweep(items: list[Item], lengths: range) -> list[dict[str, Any]]:
    """How often each minimum run length cites something in negatives that are not in the
    passages (unrelated, fabricated) and in positives (word tokens; the fuzzy scorer is unused
    by this count)."""
    from nest_integrations.attribution.verbatim import verbatim_runs

    out = []
    for n in lengths:
        hits = {"unrelated": [0, 0], "fabricated": [0, 0], "positive": [0, 0]}
        for it in items:
            if it.kind not in hits:
                continue
            a = verbatim_runs(it.text, it.passages, word_tokens, n)
            hits[it.kind][0] += bool(a)
            hits[it.kind][1] += 1
        out.append({"min_tokens": n, **{k: v[0] / max(v[1], 1) for k, v in hits.items()}})
    return out


def generator_answers(path: Path, attributor: Attributor, systems: tuple[str, ...]) -> dict:
    """Attribute the recorded answers of the grounded-QA dev set (``qa_dev.jsonl``: the
    embedded model without retrieval, ``base``, and RAG greedy, ``rag``) to the top-4 BM25
    passages of their question, and relate the verdicts to the QA metric's correctness. An
    answer is **flagged** when a sentence is unsupported, or every cited passage belongs to
    another entity's document."""
    from nest_integrations.evaluation.entities import generate_corpus
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    corpus = generate_corpus(seed=0)
    retriever = InMemoryRetriever([_doc_passage(d.id, d.text, d.name) for d in corpus.documents])
    records = harness.read_jsonl(path)
    out: dict[str, Any] = {}
    for system in systems:
        rows = []
        for r in (r for r in records if r["system"] == system):
            t0 = time.perf_counter()
            a = attributor(r["text"], retriever.retrieve(r["question"], 4))
            dt = time.perf_counter() - t0
            docs = {c.doc_id for c in a.citations}
            other_only = bool(docs) and r["gold_doc_id"] not in docs
            rows.append({"correct": r["correct"], "flagged": bool(a.unsupported) or other_only,
                         "supported": a.supported_ratio, "time": dt,
                         "split": "dev" if int(hashlib.sha1(r["gold_doc_id"].encode())
                                               .hexdigest(), 16) % 2 == 0 else "test",
                         "gen_time": r.get("time_total"), "new_tokens": r.get("new_tokens")})
        right = [x for x in rows if x["correct"]]
        wrong = [x for x in rows if not x["correct"]]
        out[system] = {
            "n": len(rows), "right": len(right), "wrong": len(wrong),
            "wrong_flagged": sum(x["flagged"] for x in wrong) / len(wrong) if wrong else None,
            "right_flagged": sum(x["flagged"] for x in right) / len(right) if right else None,
            "supported_sentences": sum(x["supported"] for x in rows) / max(len(rows), 1),
            "ms_per_answer": 1000 * sum(x["time"] for x in rows) / max(len(rows), 1),
            "gen_s_per_answer": sum(x["gen_time"] or 0 for x in rows) / max(len(rows), 1),
            "tokens_per_answer": sum(x["new_tokens"] or 0 for x in rows) / max(len(rows), 1),
            "test_n": sum(x["split"] == "test" for x in rows),
        }
    return out


# ------------------------------------------------------------------------------------ answers


def _flagged_sentences(a: Any, gold_doc_id: str | None, attributor: Attributor) -> list[str]:
    """Why each flagged unit of an attribution is flagged: ``"unsupported"``, or
    ``"other-document"`` when the unit is supported only by documents other than the
    question's gold one: the citations that decided its verdict are all elsewhere, and
    attributed to the gold
    document's passages alone it is unsupported (a true sentence that a decoy note repeats
    word for word is cited to whichever passage comes first, and is not flagged for that)."""
    why = []
    gold = [p for p in a.passages if p.doc_id == gold_doc_id]
    for u in a.sentences:
        if u.verdict == "unsupported":
            why.append("unsupported")
            continue
        # the citations that decided the verdict (as in run_scorer): a support verdict's
        # support citation, not a verbatim run of the sentence frame it also holds
        docs = {c.doc_id for c in a.citations if c.start < u.end and c.end > u.start
                and (c.kind == "support") == (u.verdict == "support")}
        if gold_doc_id is None or not docs or gold_doc_id in docs:
            continue
        alone = attributor(a.text[: u.end], gold, span=(u.start, u.end)) if gold else None
        if alone is None or any(s.verdict == "unsupported" for s in alone.sentences):
            why.append("other-document")
    return why


def answer_retrieval(persist_dir: Path | None, store_dir: Path | None) -> Any:
    """``retrieve(source, question, k)`` with the retrievers ``python -m benchmarks.quality``
    generated with, per question source: the entity collection (``--build``:
    ``$NEST_HOME/quality``) for ``entities-hard``, the default sample store
    (``$NEST_HOME/store``) for ``wiki`` and ``pydoc``; opened the way the engine opens them
    (``assembly.attributor_from_defaults``: the same store, the same hybrid setting), so it
    returns the generator's passages."""
    from benchmarks.quality import ENTITY_COLLECTION, entity_persist_dir
    from nest_integrations.assembly import attributor_from_defaults

    opened: dict[str, Any] = {}

    def retrieve(source: str, question: str, k: int) -> list[Passage]:
        key = "entities" if source == "entities-hard" else "sample"
        if key not in opened:
            if key == "entities":
                att = attributor_from_defaults(
                    ENTITY_COLLECTION, persist_dir=str(persist_dir or entity_persist_dir()))
            else:
                att = attributor_from_defaults(
                    None, persist_dir=None if store_dir is None else str(store_dir))
            opened[key] = att.retriever
        return opened[key].retrieve(question, k)

    return retrieve


def attribute_answers(
    records: list[dict[str, Any]], attributor: Attributor, retrieve: Any, k: int,
    systems: list[str] | None = None, recorded_k: int = 8,
) -> dict[str, Any]:
    """Attribute recorded closed-question answers (``python -m benchmarks.quality``'s JSONL: ``question``, ``system``, ``text``, ``correct``, ``gold_doc_id``,
    ``source``) to the top ``k`` passages the same retrieval gives their question
    (``retrieve(source, question, k)``), and relate the flags to the QA metric. An answer is
    **flagged** when one of its sentences is unsupported, or supported only by another
    document than the gold one. Per system: the share of wrong answers flagged (the issue's
    target: >= 60%), of right answers flagged (<= 15%), with Wilson 95% intervals, overall and
    per source. ``recorded_k`` passages are retrieved (quality.py's ``--k``) to check that the
    retrieval is the generator's: ``same_gold_rank`` counts the questions whose gold rank
    equals the recorded ``gold_rank``."""
    from nest_integrations.evaluation.stats import wilson_ci

    closed = [r for r in records if "correct" in r and "error" not in r]
    names = systems or list(dict.fromkeys(r["system"] for r in closed))
    passages: dict[tuple[str, str], list[Passage]] = {}
    ranks: dict[tuple[str, str], bool] = {}
    per: dict[str, list[dict[str, Any]]] = {}
    for r in closed:
        if r["system"] not in names:
            continue
        key = (r.get("source", "entities-hard"), r["question"])
        if key not in passages:
            found = retrieve(key[0], r["question"], max(k, recorded_k))
            docs = [p.doc_id for p in found[:recorded_k]]
            rank = docs.index(r["gold_doc_id"]) + 1 if r.get("gold_doc_id") in docs else None
            ranks[key] = rank == r.get("gold_rank")
            passages[key] = found[:k]
        t0 = time.perf_counter()
        a = attributor(r["text"], passages[key])
        dt = time.perf_counter() - t0
        why = _flagged_sentences(a, r.get("gold_doc_id"), attributor)
        per.setdefault(r["system"], []).append({
            "question_id": r["question_id"], "source": key[0], "correct": bool(r["correct"]),
            "flagged": bool(why), "why": why, "units": len(a.sentences),
            "supported": a.supported_ratio, "time": dt,
            "gold_retrieved": any(p.doc_id == r.get("gold_doc_id") for p in passages[key])})

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        right = [x for x in rows if x["correct"]]
        wrong = [x for x in rows if not x["correct"]]
        wf, rf = sum(x["flagged"] for x in wrong), sum(x["flagged"] for x in right)
        return {
            "n": len(rows), "right": len(right), "wrong": len(wrong),
            "wrong_flagged": wf / len(wrong) if wrong else None,
            "wrong_flagged_ci": wilson_ci(wf, len(wrong)),
            "right_flagged": rf / len(right) if right else None,
            "right_flagged_ci": wilson_ci(rf, len(right)),
            "wrong_other_document": sum("other-document" in x["why"] for x in wrong)
            / len(wrong) if wrong else None,
            "supported_sentences": sum(x["supported"] for x in rows) / max(len(rows), 1),
            "ms_per_answer": 1000 * sum(x["time"] for x in rows) / max(len(rows), 1),
        }

    out: dict[str, Any] = {"_retrieval": {"questions": len(ranks),
                                          "same_gold_rank": sum(ranks.values())}}
    for name in names:
        rows = per.get(name, [])
        out[name] = {**summary(rows), "by_source": {
            src: summary([x for x in rows if x["source"] == src])
            for src in sorted({x["source"] for x in rows})}, "answers": rows}
    return out


def render_answers(r: dict[str, Any]) -> str:
    def pct(v: float | None, ci: tuple[float, float] | None = None) -> str:
        if v is None:
            return "n/a"
        return f"{v:.0%}" + (f" ({ci[0]:.0%}-{ci[1]:.0%})" if ci else "")

    lines = [f"# Attribution of recorded answers: `{r['records']}`", "",
             "Scorer "
             f"`{r['scorer']}` at its dev-chosen threshold {r['threshold']:.4f} "
             "(`attribution.DEFAULT_THRESHOLDS`, chosen on the labelled set's dev split, never on "
             f"these answers); passages: the top {r['k']} of the retrieval the generator used "
             "(`python -m benchmarks.quality`'s stores). Flagged: a sentence unsupported, or supported "
             "only by a document other than the question's gold one. Targets (issue 23): "
             ">= 60% of wrong answers flagged, <= 15% of right ones. 95% Wilson intervals. "
             f"The retrieval gives the recorded gold rank on {r['retrieval']['same_gold_rank']} "
             f"of {r['retrieval']['questions']} questions.", "",
             "| system | answers (right / wrong) | wrong flagged | of which other-document | "
             "right flagged | supported sentences | ms / answer |",
             "|---|---|---|---|---|---|---|"]
    for name, g in r["systems"].items():
        lines.append(f"| {name} | {g['n']} ({g['right']} / {g['wrong']}) | "
                     f"{pct(g['wrong_flagged'], g['wrong_flagged_ci'])} | "
                     f"{pct(g['wrong_other_document'])} | "
                     f"{pct(g['right_flagged'], g['right_flagged_ci'])} | "
                     f"{g['supported_sentences']:.0%} | {g['ms_per_answer']:.0f} |")
    lines += ["", "Per question source (wrong flagged / right flagged):", "",
              "| system | " + " | ".join(r["sources"]) + " |",
              "|---" * (len(r["sources"]) + 1) + "|"]
    for name, g in r["systems"].items():
        cells = []
        for src in r["sources"]:
            b = g["by_source"].get(src)
            cells.append("-" if b is None else f"{pct(b['wrong_flagged'])} of {b['wrong']} / "
                         f"{pct(b['right_flagged'])} of {b['right']}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def answers_main(args: Any, run: harness.Run) -> int:
    """``--answers PATH``: attribute recorded answers (``attribute_answers``)."""
    path = Path(args.answers)
    records = harness.read_jsonl(path)
    retrieve = answer_retrieval(args.persist_dir, args.store_dir)
    cfg = AttributionConfig(scorer=args.answers_scorer)
    from nest_integrations.embedders.minilm import shared_embedder

    att = Attributor(cfg, embedder=shared_embedder())
    systems = [s for s in args.answers_systems.split(",") if s] or None
    res = attribute_answers(records, att, retrieve, args.answers_k, systems)
    retrieval = res.pop("_retrieval")
    print(f"retrieval: the recorded gold rank on {retrieval['same_gold_rank']} of "
          f"{retrieval['questions']} questions", flush=True)
    for name, g in res.items():
        print(f"{name}: n {g['n']} ({g['right']} right) wrong flagged {g['wrong_flagged']} "
              f"right flagged {g['right_flagged']}", flush=True)
    shown = path.resolve()
    if shown.is_relative_to(REPO):
        shown = shown.relative_to(REPO)
    elif "benchmarks/results/" in shown.as_posix():  # another checkout's results: their name
        shown = Path("benchmarks/results") / shown.as_posix().split("benchmarks/results/", 1)[1]
    report = {"records": str(shown),
              "scorer": cfg.scorer, "threshold": cfg.threshold, "k": args.answers_k,
              "systems": res, "retrieval": retrieval,
              "sources": sorted({s for g in res.values() for s in g["by_source"]})}
    stem = args.answers_out or f"attribution_answers_{path.name.split('.')[0]}"
    harness.write_result(args.out, stem, report, render_answers(report), run)
    return 0


def curve_comparison(scorers: dict[str, Any]) -> dict[str, Any]:
    """Each scorer's test curve at the fuzzy baselines' test operating points (their dev-chosen
    thresholds): precision at the baseline's recall, recall at the baseline's precision, and
    recall at precision >= 90% (the target)."""
    out: dict[str, Any] = {}
    for ref in [n for n in scorers if n.startswith("fuzzy")]:
        p0 = scorers[ref]["test"]["support_precision"]
        r0 = scorers[ref]["test"]["support_recall"]
        rows = {}
        for name, sc in scorers.items():
            c = sc["test_curve"]
            rows[name] = {"precision_at_ref_recall": at_operating_point(c, recall=r0),
                          "recall_at_ref_precision": at_operating_point(c, precision=p0),
                          "recall_at_p90": at_operating_point(c, precision=0.90)}
        out[ref] = {"precision": p0, "recall": r0, "scorers": rows}
    return out


def plot_curves(scorers: dict[str, Any], path: Path) -> None:
    """The test precision-recall curves, each scorer's dev-chosen point marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, sc in scorers.items():
        c = sc["test_curve"]
        line, = ax.step([x["recall"] for x in c], [x["precision"] for x in c], where="post",
                        label=name)
        ax.plot(sc["test"]["support_recall"], sc["test"]["support_precision"], "o",
                color=line.get_color())
    ax.axhline(0.9, color="grey", lw=0.6, ls="--")
    ax.axvline(0.7, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("support recall (test)")
    ax.set_ylabel("support precision (test)")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0.4, 1.02)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("Attribution scorers, test split (dots: dev-chosen thresholds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.attribution", __doc__)
    ap.add_argument("--per-corpus", type=int, default=100,
                    help="questions (entities), documents (wiki) and positives (pydoc) per "
                         "corpus")
    ap.add_argument("--scorers",
                    default="fuzzy,fuzzy-rapidfuzz,fuzzy-novalues,fuzzy-rapidfuzz-novalues,"
                            "embedding,embedding-novalues,keys,combined")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--qa-records", default=str(RESULTS / "qa_dev.jsonl"),
                    help="recorded grounded-QA dev answers (base, rag) that are attributed "
                    "(`python -m benchmarks.quality --set entities --stem qa_dev`; read "
                    "gzipped when only <path>.gz exists)")
    ap.add_argument("--dev-precision", type=float, default=DEV_PRECISION,
                    help="the threshold rule: the lowest threshold with at least this DEV "
                         "support precision (else the best dev F1); never chosen on test")
    ap.add_argument("--answers", default=None, metavar="JSONL",
                    help="instead of the labelled set: attribute the closed-question answers "
                         "recorded by python -m benchmarks.quality (e.g. results/quality_test.jsonl)")
    ap.add_argument("--answers-systems", default="",
                    help="systems of --answers to attribute (default: all)")
    ap.add_argument("--answers-k", type=int, default=AttributionConfig().k,
                    help="passages per question (the top of the generator's retrieval)")
    ap.add_argument("--answers-scorer", default="embedding")
    ap.add_argument("--answers-out", default=None,
                    help="output stem (default attribution_answers_<records stem>)")
    ap.add_argument("--persist-dir", type=Path, default=None,
                    help="quality.py's entity store (default $NEST_HOME/quality)")
    ap.add_argument("--store-dir", type=Path, default=None,
                    help="the sample store (default $NEST_HOME/store)")
    args, run = harness.start(ap, argv)
    import torch

    torch.set_num_threads(int(os.environ.get("NEST_THREADS", "1")))  # 2 threads on 2 busy
    # cores made MiniLM 25x slower here (thread contention)
    if args.answers:
        return answers_main(args, run)
    from nest_integrations.embedders.minilm import shared_embedder

    rng = random.Random(args.seed)
    embedder = shared_embedder()
    t0 = time.perf_counter()
    items = (entity_items(args.per_corpus, rng) + wiki_items(args.per_corpus, rng, embedder)
             + pydoc_items(args.per_corpus, rng, embedder))
    dev = [i for i, it in enumerate(items) if it.split == "dev"]
    test = [i for i, it in enumerate(items) if it.split == "test"]
    print(f"{len(items)} items: {len(dev)} dev, {len(test)} test "
          f"({time.perf_counter() - t0:.1f} s to build)", flush=True)
    sweep = verbatim_sweep(items, range(3, 9))
    lm = key_store = None
    report: dict[str, Any] = {"items": len(items), "dev": len(dev), "test": len(test),
                              "verbatim_sweep": sweep, "scorers": {},
                              "dev_precision": args.dev_precision}
    for name in args.scorers.split(","):
        scorer, _, variant = name.partition("-")
        if scorer in ("keys", "combined") and lm is None:
            from nest_integrations import assembly
            from nest_integrations.index.in_memory_store import InMemoryKeyStore

            lm, key_store = assembly.shared_model(), InMemoryKeyStore()
        cfg = AttributionConfig(scorer=scorer, support_threshold=-1.0,
                                check_values="novalues" not in variant)
        cls = Attributor
        if "rapidfuzz" in variant:
            try:
                import rapidfuzz  # noqa: F401
            except ImportError:
                print("rapidfuzz is not installed (pip install '.[bench]'): skipped", flush=True)
                continue
            cls = RapidfuzzAttributor
        att = cls(cfg, embedder=embedder,
                  lm=lm if scorer in ("keys", "combined") else None, key_store=key_store)
        att.config = cfg.replace(tokenizer="words")  # the same verbatim runs for every scorer
        t1 = time.perf_counter()
        rows = run_scorer(att, items)
        wall = time.perf_counter() - t1
        d_items, d_rows = [items[i] for i in dev], [rows[i] for i in dev]
        t_items, t_rows = [items[i] for i in test], [rows[i] for i in test]
        thr, rule = choose_threshold(d_items, d_rows, args.dev_precision)
        res = {
            "threshold": thr,
            "rule": rule,
            "dev": metrics(d_items, d_rows, thr),
            "test": metrics(t_items, t_rows, thr),
            "test_by_corpus": {
                c: metrics([it for it in t_items if it.corpus == c],
                           [r for it, r in zip(t_items, t_rows) if it.corpus == c], thr)
                for c in CORPORA},
            "test_curve": pr_curve(t_items, t_rows),
            "ms_per_sentence": 1000 * sum(r["time"] for r in rows)
            / max(sum(r["n_units"] for r in rows), 1),
            "wall_s": wall,
            "verbatim_exact": all(r["exact"] for r in rows),
            "verbatim_citations": sum(r["n_verbatim"] for r in rows),
        }
        report["scorers"][name] = res
        m = res["test"]
        print(f"{name:20s} thr {thr:.3f}  test support P {m['support_precision']:.3f} "
              f"R {m['support_recall']:.3f}  unsupported P {m['unsupported_precision']:.3f} "
              f"R {m['unsupported_recall']:.3f}  {res['ms_per_sentence']:.1f} ms/sentence",
              flush=True)
    report["curve_comparison"] = curve_comparison(report["scorers"])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    plot_curves(report["scorers"], Path(args.out) / "attribution_pr.png")
    qa = Path(args.qa_records)
    if (qa.is_file() or qa.with_name(qa.name + ".gz").is_file()) and "embedding" in report[
            "scorers"]:
        cfg = AttributionConfig(support_threshold=report["scorers"]["embedding"]["threshold"])
        report["generators"] = generator_answers(qa, Attributor(cfg, embedder=embedder),
                                                 ("base", "rag"))
        report["generators_source"] = str(qa.relative_to(REPO) if qa.is_relative_to(REPO) else qa)
        for system, g in report["generators"].items():
            print(f"{system}: {g}", flush=True)
    harness.write_result(args.out, "attribution", report, render(report), run)
    return 0


def render(r: dict[str, Any]) -> str:
    lines = [
        "# Attribution of any text",
        "",
        "Written by `python -m benchmarks.attribution` (its docstring defines the items and "
        "metrics).",
        "",
        f"{r['items']} labelled answer sentences ({r['dev']} dev, {r['test']} test; split by "
        "document): per corpus (grounded-QA entities, Wikipedia leads and pydoc topics of the "
        "sample corpus) "
        "positives (the gold sentence paraphrased by templates) and negatives (wrong value, a "
        "sentence of an unrelated document, a fluent fabrication about the entity). Thresholds "
        f"are chosen on dev only: among those with dev support precision >= "
        f"{r['dev_precision']:.0%} (a margin over the 90% test target), the middle of the range "
        "with the highest dev recall, else the best dev F1 (`choose_threshold`; the rule used "
        "is in the table); reported on test.",
        "",
        "Test split, at the dev-chosen threshold (dev support P / R: what chose it):",
        "",
        "| scorer | threshold (rule) | dev P / R | support P | support R | unsupported P | "
        "unsupported R | ms / sentence |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in r["scorers"].items():
        m, d = s["test"], s["dev"]
        lines.append(
            f"| {name} | {s['threshold']:.3f} ({s.get('rule', '')}) | "
            f"{d['support_precision']:.1%} / {d['support_recall']:.1%} | "
            f"{m['support_precision']:.1%} | "
            f"{m['support_recall']:.1%} | {m['unsupported_precision']:.1%} | "
            f"{m['unsupported_recall']:.1%} | {s['ms_per_sentence']:.1f} |")
    lines += ["", "Test, per corpus (support P / R; unsupported P / R):", "",
              "| scorer | " + " | ".join(CORPORA) + " |", "|---" * (len(CORPORA) + 1) + "|"]
    for name, s in r["scorers"].items():
        cells = []
        for c in CORPORA:
            m = s["test_by_corpus"][c]
            cells.append(f"{m['support_precision']:.0%} / {m['support_recall']:.0%}; "
                         f"{m['unsupported_precision']:.0%} / {m['unsupported_recall']:.0%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Share of test items predicted supported, by item kind:", "",
              "| scorer | " + " | ".join(("positive",) + NEGATIVE_KINDS) + " |",
              "|---|---|---|---|---|"]
    for name, s in r["scorers"].items():
        k = s["test"]["supported_by_kind"]
        lines.append(f"| {name} | " + " | ".join(f"{k.get(x, 0):.0%}" for x in
                                                 ("positive",) + NEGATIVE_KINDS) + " |")
    comp = r.get("curve_comparison", {})
    for ref, cmp in comp.items():
        lines += ["", f"Precision-recall curves on test (thresholds swept on test: a comparison "
                  f"of the scorers, not an operating point anyone could choose), at the `{ref}` "
                  f"baseline's test point (P {cmp['precision']:.1%}, R {cmp['recall']:.1%} at its "
                  "dev threshold):", "",
                  f"| scorer | P at R >= {cmp['recall']:.1%} | R at P >= {cmp['precision']:.1%} | "
                  "R at P >= 90% |", "|---|---|---|---|"]
        for name, x in cmp["scorers"].items():
            cells = [x["precision_at_ref_recall"], x["recall_at_ref_precision"],
                     x["recall_at_p90"]]
            lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.1%}"
                                                     for v in cells) + " |")
    if comp:
        lines += ["", "Curves: `benchmarks/results/attribution_pr.png`."]
    exact = all(s["verbatim_exact"] for s in r["scorers"].values())
    n_verb = max((s["verbatim_citations"] for s in r["scorers"].values()), default=0)
    lines += ["", f"Verbatim precision: {'100%' if exact else 'NOT 100%'} ({n_verb} verbatim "
              "citations, every one checked: answer slice == cited text == passage slice).", "",
              "Minimum verbatim run (word tokens): share of items with any verbatim citation:", "",
              "| min tokens | unrelated | fabricated | positive |", "|---|---|---|---|"]
    for row in r["verbatim_sweep"]:
        lines.append(f"| {row['min_tokens']} | {row['unrelated']:.0%} | {row['fabricated']:.0%} | "
                     f"{row['positive']:.0%} |")
    if r.get("generators"):
        lines += ["", f"Answers of two generators (recorded in `{r['generators_source']}` by "
                  "the grounded-QA dev run: the embedded SmolLM2-135M without retrieval, `base`, "
                  "and RAG greedy, `rag`), attributed with the embedding scorer at its dev "
                  "threshold to the question's top-4 BM25 passages. Flagged: a sentence "
                  "unsupported, or every citation on another entity's document.", "",
                  "| generator | answers (right / wrong) | wrong answers flagged | right answers "
                  "flagged | supported sentences | attribution ms / answer | generation s / "
                  "answer (recorded) |", "|---|---|---|---|---|---|---|"]
        for name, g in r["generators"].items():
            wf = "n/a" if g["wrong_flagged"] is None else f"{g['wrong_flagged']:.0%}"
            rf = "n/a" if g["right_flagged"] is None else f"{g['right_flagged']:.0%}"
            lines.append(f"| {name} | {g['n']} ({g['right']} / {g['wrong']}) | {wf} | {rf} | "
                         f"{g['supported_sentences']:.0%} | {g['ms_per_answer']:.0f} | "
                         f"{g['gen_s_per_answer']:.1f} ({g['tokens_per_answer']:.0f} tokens) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
