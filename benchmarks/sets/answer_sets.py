"""The question families of ``python -m benchmarks.answers`` (issue 60), split dev/test by
document.

Families (``FAMILIES``; each question is asked once per family unless said otherwise):

- ``factoid``: an attribute of a fact sheet (``benchmarks.sets.factsheets``: prose country and
  product sheets, 80 documents, 160 questions), asked the way a data set asks: one template of
  the non-held-out ``phrasings.CLOSED_FAMILIES``, rotating by question id;
- ``synonym`` (**held out**: reported apart, never used for a dev decision): the same questions
  asked without the attribute's own words (``factsheets.Attribute.synonyms``, one of two,
  rotating);
- ``definition``: "What is X?" over FOLDOC (``benchmarks.sets.glossary``: 160 entries asked,
  240 more in the store); gold: the entry's first sentence;
- ``explanation``: "How does X work?", "What is the X statement for?", "Explain X.", "What
  happens when ..." over the 40 shipped pydoc topics (``nest_integrations/data/sample/pydoc``),
  **two** phrasings per topic (``EXPLAIN_TEMPLATES``, a rotating pair); gold: the topic's lead
  paragraph, the first paragraph after the heading that is prose (not an indented grammar or
  code block), and its first sentence.

Splits: ``split_of(doc_id)``, a seeded hash of the gold document, so every question about a
document, in every family, lands in one split (fact sheets, dictionary entries and topics alike).
``Item.qid`` names the question (the cluster for paired tests); ``Item.collection`` the store it
is answered from: ``answers-facts``, ``answers-foldoc``, or ``nest`` (the sample corpus, as
``nest ingest --sample``). ``Item.messages`` is the chat sent: one user turn here; a multi-turn
family puts the earlier turns in front.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.harness.answer_metrics import first_sentence
from benchmarks.sets.phrasings import CLOSED_FAMILIES, HELD_OUT

SPLITS = ("dev", "test")
#: Families no dev decision may look at (reported apart).
HELD_OUT_FAMILIES = ("synonym",)
EXPLAIN_TEMPLATES: dict[str, tuple[str, ...]] = {
    "statement": ("What is the {kw} statement for?", "How does the {kw} statement work?",
                  "Explain the {kw} statement.",
                  "What happens when Python executes {a} {kw} statement?"),
    "other": ("How does Python handle {s}?", "Explain {s} in Python.",
              "What should I know about {s} in Python?", "Describe {s} in Python."),
}
_STATEMENT = re.compile(r'^The "(\w+)" statement$')


@dataclass
class Item:
    """One prompt of one question in one family; ``kind`` says how it is scored
    (``answer_metrics.score``)."""

    family: str
    qid: str
    template: int
    messages: list[dict[str, str]]
    collection: str
    gold_doc_id: str
    kind: str  # "factoid" | "lead"
    answer: str = ""
    distractors: list[str] = field(default_factory=list)
    gold_sentence: str = ""
    gold_text: str = ""

    @property
    def prompt(self) -> str:
        return self.messages[-1]["content"]


def split_of(doc_id: str, seed: int = 0) -> str:
    """``"dev"`` or ``"test"`` for a gold document (a seeded hash: half each, in expectation)."""
    h = int(hashlib.sha1(f"answers:{seed}:{doc_id}".encode()).hexdigest()[:8], 16)
    return "test" if h % 2 else "dev"


def _check(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: choose one of {SPLITS}")


def _turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _rot(key: str, n: int) -> int:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16) % n


# ----------------------------------------------------------------------------- fact sheets


def fact_items(corpus: Any, family: str, split: str, seed: int = 0) -> list[Item]:
    """The ``factoid`` or ``synonym`` items of ``split`` over a ``FactCorpus``."""
    _check(split)
    out = []
    fams = [f for f in CLOSED_FAMILIES if f != HELD_OUT]
    for q in corpus.questions:
        if split_of(q.gold_doc_id, seed) != split:
            continue
        x = q.entity if q.kind == "country" else f"the {q.entity}"
        if family == "factoid":
            fam = fams[_rot(q.id + "family", len(fams))]
            i = _rot(q.id + fam, len(CLOSED_FAMILIES[fam]))
            text = CLOSED_FAMILIES[fam][i].format(a=q.attribute, x=x, la=q.attribute,
                                                  lx=x.lower())
            text = text[0].upper() + text[1:]
            tmpl = fams.index(fam) * 2 + i
        elif family == "synonym":
            tmpl = _rot(q.id + "synonym", len(q.synonyms))
            text = q.synonyms[tmpl]
        else:
            raise ValueError(f"family={family!r} is not a fact-sheet family")
        out.append(Item(family, q.id, tmpl, _turn(text), "answers-facts", q.gold_doc_id,
                        "factoid", q.answer, list(q.distractors), q.sentence))
    return out


# ----------------------------------------------------------------------------- dictionary


def definition_items(gold: Sequence[Any], split: str, seed: int = 0) -> list[Item]:
    """"What is X?" for each ``glossary.Entry`` of ``gold`` in ``split``."""
    _check(split)
    return [Item("definition", e.doc_id, 0, _turn(f"What is {e.headword}?"), "answers-foldoc",
                 e.doc_id, "lead", gold_sentence=e.definition, gold_text=e.definition)
            for e in gold if split_of(e.doc_id, seed) == split]


def foldoc_documents(gold: Sequence[Any], distractors: Sequence[Any]) -> list[dict[str, Any]]:
    """The dictionary's ``nest ingest`` JSONL records (gold and distractor entries)."""
    return [{"id": e.doc_id, "text": e.text,
             "metadata": {"title": e.headword, "dataset": "foldoc"}}
            for e in [*gold, *distractors]]


# ----------------------------------------------------------------------------- pydoc topics


@dataclass(frozen=True)
class Topic:
    """A pydoc topic: its document id, heading, lead paragraph and what a question calls it."""

    doc_id: str
    heading: str
    lead: str
    keyword: str | None  # "assert" for 'The "assert" statement'
    subject: str  # the heading in lower case: "the null object", "truth value testing"


def lead_paragraph(text: str) -> tuple[str, str]:
    """``(heading, lead)``: a topic's first line, and its first paragraph after the heading
    that is prose (not indented, not an underline), lines joined."""
    lines = text.splitlines()
    heading = lines[0].strip() if lines else ""
    for para in re.split(r"\n[ \t]*\n", text)[1:]:
        if para.strip() and not para[:1].isspace() and not set(para.strip()) <= set("*=-"):
            return heading, " ".join(para.split())
    return heading, ""


def load_topics(folder: Path | None = None) -> list[Topic]:
    """The shipped pydoc topics (``data/sample/pydoc``), sorted by file name."""
    from nest_integrations.ingest.documents import sample_corpus_path

    folder = folder or sample_corpus_path() / "pydoc"
    out = []
    for p in sorted(folder.glob("*.txt")):
        heading, lead = lead_paragraph(p.read_text(encoding="utf-8"))
        m = _STATEMENT.match(heading)
        subject = heading.lower()
        out.append(Topic(f"pydoc/{p.name}", heading, lead, m.group(1) if m else None, subject))
    return out


def explanation_items(topics: Sequence[Topic], split: str, seed: int = 0) -> list[Item]:
    """Two phrasings per topic of ``split`` (module docstring)."""
    _check(split)
    out = []
    for t in topics:
        if split_of(t.doc_id, seed) != split or not t.lead:
            continue
        templates = EXPLAIN_TEMPLATES["statement" if t.keyword else "other"]
        first = _rot(t.doc_id, len(templates))
        for i in (first, (first + 2) % len(templates)):
            article = "an" if (t.keyword or "x")[0] in "aeiou" else "a"
            text = templates[i].format(kw=t.keyword, s=t.subject, a=article)
            out.append(Item("explanation", t.doc_id, i, _turn(text), "nest", t.doc_id, "lead",
                            gold_sentence=first_sentence(t.lead), gold_text=t.lead))
    return out


# ----------------------------------------------------------------------------- all families


@dataclass
class Sources:
    """What the families are built from (``load_sources``)."""

    facts: Any = None  # factsheets.FactCorpus
    foldoc_gold: list[Any] = field(default_factory=list)
    foldoc_distractors: list[Any] = field(default_factory=list)
    topics: list[Topic] = field(default_factory=list)


FAMILIES: dict[str, Callable[[Sources, str, int], list[Item]]] = {
    "factoid": lambda s, split, seed: fact_items(s.facts, "factoid", split, seed),
    "synonym": lambda s, split, seed: fact_items(s.facts, "synonym", split, seed),
    "definition": lambda s, split, seed: definition_items(s.foldoc_gold, split, seed),
    "explanation": lambda s, split, seed: explanation_items(s.topics, split, seed),
}


def load_sources(families: Sequence[str], foldoc: Path | None = None, seed: int = 0
                 ) -> Sources:
    """The corpora ``families`` need (``foldoc``: the ``dict-foldoc`` .deb or folder)."""
    from benchmarks.sets import factsheets, glossary

    src = Sources()
    if {"factoid", "synonym"} & set(families):
        src.facts = factsheets.generate_factsheets(seed)
    if "definition" in families:
        if foldoc is None:
            raise ValueError("the definition family needs FOLDOC: `apt-get download "
                             "dict-foldoc`, then pass --foldoc dict-foldoc_*.deb")
        src.foldoc_gold, src.foldoc_distractors = glossary.choose(
            glossary.load_foldoc(foldoc), seed=seed)
    if "explanation" in families:
        src.topics = load_topics()
    return src


def build_items(src: Sources, families: Sequence[str], split: str, seed: int = 0,
                limit: int | None = None) -> list[Item]:
    """Every family's items of ``split``; ``limit``: the first ``limit`` questions of each
    family after a seeded shuffle of its questions (all of a question's phrasings kept)."""
    out = []
    for fam in families:
        if fam not in FAMILIES:
            raise ValueError(f"unknown family {fam!r}: choose from {sorted(FAMILIES)}")
        items = FAMILIES[fam](src, split, seed)
        qids = sorted({i.qid for i in items})
        random.Random(f"answers:{fam}:{seed}").shuffle(qids)
        keep = set(qids[:limit] if limit else qids)
        order = {q: n for n, q in enumerate(qids)}
        out += sorted((i for i in items if i.qid in keep), key=lambda i: (order[i.qid],
                                                                          i.template))
    return out


__all__ = ["EXPLAIN_TEMPLATES", "FAMILIES", "HELD_OUT_FAMILIES", "Item", "SPLITS", "Sources",
           "Topic", "build_items", "definition_items", "explanation_items", "fact_items",
           "foldoc_documents", "lead_paragraph", "load_sources", "load_topics", "split_of"]
