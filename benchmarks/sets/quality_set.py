"""The quality question set: a dev/test protocol that cannot overfit.

Three sources, every question tied to one gold document, split dev/test **by document** with a
deterministic seed, so no document (and no sentence frame of one entity) serves both splits:

- ``entities-hard``: the generated entity corpus (``evaluation.entities``) made harder.
  Every entity document gains a date sentence ("The registration date of X is 14 March
  1987."), so values are names, numbers **and dates**; and every entity gets a **distractor
  note**, a document that names it but states another entity's values in the same frames
  ("Korvanta Systems is often confused with Belmar Works. The founding year of Belmar Works
  is 1990. ..."). The note matches the question's entity, so it outranks the gold document for
  many questions and the gold one is not always first.
- ``wiki``: completion questions over the Wikipedia leads of the sample corpus
  (``nest_integrations/data/sample/wikipedia.jsonl``, shipped): the entry's title, a blank line
  and the opening of a lead sentence holding one year or number, cut just before that value,
  for the system to continue; the other numbers of the lead are the distractors.
- ``pydoc``: completion questions over the Python reference topics of the sample corpus
  (``data/sample/pydoc``): a sentence cut just before one content word.

An **open-ended split** asks "What is X?" (wiki), "Who was X?" (wiki leads of the People topic,
source ``open-who``, which showed the junk copies ``knn_temperature=0.25`` removed) and "Write
the reference entry for X" (pydoc); the gold passage is the document's opening text
(``OpenQuestion.gold_text``).

Closed questions are ``entities.EntityQuestion`` (answer, distractors, gold document), scored
with the strict metric of ``evaluation.grounded``; ``kind`` holds the source. ``corpus`` of a
question set says which collection each source is answered from: ``entities-hard`` from its own
generated documents (``EntityHardCorpus.write_jsonl``), ``wiki`` and ``pydoc`` from the sample
corpus (``nest ingest --sample``).

Usage::

    qs = build_question_set(seed=0)
    qs.closed("dev"), qs.open("test"), qs.counts()
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from nest_integrations.evaluation.entities import EntityQuestion, frame, generate_corpus
from nest_integrations.ingest.documents import sample_corpus_path

#: The builder's version; a change of the output for a given seed bumps it.
BUILDER_VERSION = 2
#: The entity corpus is unchanged since version 1; its seed string keeps that version.
_ENTITY_VERSION = 1
#: A completion question keeps at least this many words of its sentence before the answer.
MIN_PREFIX_WORDS = 4
SPLITS = ("dev", "test")
SOURCES = ("entities-hard", "wiki", "pydoc")
SAMPLE_DIR = sample_corpus_path()

_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_DATE_ATTR = {"company": "registration date", "drug": "patent date",
              "spacecraft": "maiden flight date", "lake": "protection date"}
_NUMBER = re.compile(r"(?<![\w.,-])(\d{1,3}(?:,\d{3})+|\d{3,4})(?![\w,.]\d)")
_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CONTENT = re.compile(r"[A-Za-z]{7,}")
_STOP = {"however", "because", "between", "another", "whether", "through", "without",
         "example", "following", "therefore", "otherwise", "described", "section"}


def split_of(doc_id: str, seed: int = 0, test_share: float = 0.5) -> str:
    """``"dev"`` or ``"test"`` for a gold document: a seeded hash, so a document and every
    question about it land in one split."""
    h = int(hashlib.sha1(f"quality:{seed}:{doc_id}".encode()).hexdigest()[:8], 16)
    return "test" if (h % 10_000) / 10_000 < test_share else "dev"


@dataclass(frozen=True)
class OpenQuestion:
    """An open-ended prompt whose reference is the gold document's opening text."""

    id: str
    question: str
    gold_doc_id: str
    gold_text: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "gold_doc_id": self.gold_doc_id,
                "gold_text": self.gold_text, "source": self.source}


@dataclass
class EntityHardCorpus:
    """The hardened entity documents (gold documents plus distractor notes)."""

    documents: list[dict[str, Any]]  # ``nest ingest`` JSONL records

    def write_jsonl(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            for d in self.documents:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        return p


@dataclass
class QuestionSet:
    """Every question, with its split; ``entities`` is the corpus the entity questions need."""

    seed: int
    questions: list[EntityQuestion]
    open_questions: list[OpenQuestion]
    split: dict[str, str]  # question id -> split
    entities: EntityHardCorpus
    sources: dict[str, str] = field(default_factory=dict)  # question id -> source

    def closed(self, split: str, source: str | None = None) -> list[EntityQuestion]:
        _check_split(split)
        return [q for q in self.questions if self.split[q.id] == split
                and (source is None or self.sources[q.id] == source)]

    def open(self, split: str) -> list[OpenQuestion]:
        _check_split(split)
        return [q for q in self.open_questions if self.split[q.id] == split]

    def counts(self) -> dict[str, dict[str, int]]:
        """``{split: {source: n}}`` for closed questions, plus ``open`` per split."""
        out: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
        for q in self.questions:
            d = out[self.split[q.id]]
            d[self.sources[q.id]] = d.get(self.sources[q.id], 0) + 1
        for q in self.open_questions:
            d = out[self.split[q.id]]
            d["open"] = d.get("open", 0) + 1
        return out

    def interleaved(self, questions: Sequence[Any], n: int | None, seed: int = 0) -> list[Any]:
        """``n`` of ``questions`` (all when None), shuffled by ``seed`` and spread over the
        sources round robin, so a small slice still holds every source."""
        rng = random.Random(f"slice:{seed}")
        by: dict[str, list[Any]] = {}
        for q in questions:
            by.setdefault(self.sources.get(q.id, getattr(q, "source", "")), []).append(q)
        for v in by.values():
            rng.shuffle(v)
        order: list[Any] = []
        keys = sorted(by)
        while any(by[k] for k in keys):
            for k in keys:
                if by[k]:
                    order.append(by[k].pop())
        return order if n is None else order[:n]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: choose one of {SPLITS}")


# ----------------------------------------------------------------------------- entities-hard


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1850, 2024)}"


def entity_hard(seed: int = 0, per_kind: int = 15) -> tuple[EntityHardCorpus, list[EntityQuestion]]:
    """The hardened entity corpus and its questions (see the module docstring)."""
    base = generate_corpus(seed, per_kind)
    rng = random.Random(f"entity-hard:v{_ENTITY_VERSION}:{seed}")
    by_kind: dict[str, list[Any]] = {}
    for d in base.documents:
        by_kind.setdefault(d.kind, []).append(d)
    dates: dict[str, str] = {}
    used: set[str] = set()
    for d in base.documents:
        while True:
            v = _date(rng)
            if v not in used:
                break
        used.add(v)
        dates[d.id] = v
    docs: list[dict[str, Any]] = []
    questions: list[EntityQuestion] = list(base.questions)
    for kind, members in by_kind.items():
        attr = _DATE_ATTR[kind]
        for d in members:
            rec = d.to_jsonl()
            rec["text"] = d.text + " " + frame(attr, d.name, dates[d.id])
            docs.append(rec)
            others = tuple(sorted(dates[o.id] for o in members if o.id != d.id))
            questions.append(EntityQuestion(
                id=f"{d.id}#{attr}", question=f"What is the {attr} of {d.name}?",
                answer=dates[d.id], answer_sentence=frame(attr, d.name, dates[d.id]),
                gold_doc_id=d.id, entity=d.name, kind=kind, attribute=attr, distractors=others,
            ))
        for i, d in enumerate(members):  # the distractor note: d's name, another's values
            other = members[(i + 1 + rng.randrange(len(members) - 1)) % len(members)]
            attrs = list(other.attributes.items()) + [(attr, dates[other.id])]
            rng.shuffle(attrs)
            text = (f"{d.name} is often confused with {other.name}, another {kind}. "
                    + " ".join(frame(a, other.name, v) for a, v in attrs[:4])
                    + f" Unlike {other.name}, {d.name} is described in its own entry.")
            docs.append({"id": f"{d.id}/note", "text": text,
                         "metadata": {"title": f"{d.name} (disambiguation)", "kind": kind,
                                      "dataset": "entities-hard"}})
    # distractors of the base questions: the attribute's other values (dates added above)
    return EntityHardCorpus(docs), questions


# ----------------------------------------------------------------------------- real corpora


def _wiki_leads(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or SAMPLE_DIR / "wikipedia.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _pydoc_topics(folder: Path | None = None) -> list[tuple[str, str]]:
    folder = folder or SAMPLE_DIR / "pydoc"
    return [(f"pydoc/{p.name}", p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]


def _clean(text: str) -> str:
    return " ".join(text.split())


def _completion(title: str, prefix: str) -> str:
    """The prompt of a completion question: the document's title, a blank line, the prefix.
    (Chosen on 8 dev questions over two instruction forms, "continue this sentence ..." and
    "quote the sentence that begins ...", which the 135M chat model answered 0-3/8 for RAG.)"""
    return f"{title}\n\n{prefix}"


def wiki_questions(leads: Sequence[dict[str, Any]], per_doc: int = 2) -> list[EntityQuestion]:
    """Completion questions: the opening of a lead sentence that holds exactly one number (a
    year, a count), cut just before that number; the answer is the number, and the lead's
    other numbers are the distractors. (Version 1 blanked the number mid-sentence, a cloze
    form the 135M model answered at the floor: 1/10 on dev for every system.)"""
    out = []
    for rec in leads:
        text = _clean(rec["text"])
        title = rec.get("metadata", {}).get("title") or rec["id"]
        numbers = sorted({m.group(1) for m in _NUMBER.finditer(text)})
        n = 0
        for sent in _SENT.split(text):
            found = [m for m in _NUMBER.finditer(sent)]
            if len(found) != 1 or not 6 <= len(sent.split()) <= 40:
                continue
            value = found[0].group(1)
            prefix = sent[: found[0].start()].rstrip()
            if value in title or len(prefix.split()) < MIN_PREFIX_WORDS:
                continue
            out.append(EntityQuestion(
                id=f"wiki/{rec['id']}#{n}",
                question=_completion(title, prefix),
                answer=value, answer_sentence=sent, gold_doc_id=rec["id"], entity=title,
                kind="wiki", attribute="number",
                distractors=tuple(v for v in numbers if v != value),
            ))
            n += 1
            if n >= per_doc:
                break
    return out


def pydoc_questions(topics: Sequence[tuple[str, str]], per_doc: int = 3) -> list[EntityQuestion]:
    """Completion questions: the opening of a prose sentence of a topic, cut just before its
    longest content word after the first ``MIN_PREFIX_WORDS`` words; the answer is that word."""
    out = []
    for doc_id, raw in topics:
        name = doc_id.split("/", 1)[1].rsplit(".", 1)[0]
        paras = [p for p in raw.split("\n\n") if p.strip() and not p.startswith("   ")]
        n = 0
        for para in paras:
            for sent in _SENT.split(_clean(para)):
                if not 8 <= len(sent.split()) <= 35 or "::=" in sent:
                    continue
                words = [m for m in _CONTENT.finditer(sent)
                         if m.group().lower() not in _STOP
                         and m.group().lower() not in name.lower()
                         and len(sent[: m.start()].split()) >= MIN_PREFIX_WORDS]
                if not words:
                    continue
                best = max(words, key=lambda m: (len(m.group()), m.group()))
                word = best.group()
                prefix = sent[: best.start()].rstrip()
                if word in prefix or not prefix:
                    continue
                out.append(EntityQuestion(
                    id=f"{doc_id}#{n}",
                    question=_completion(name, prefix),
                    answer=word, answer_sentence=sent, gold_doc_id=doc_id, entity=name,
                    kind="pydoc", attribute="word", distractors=(),
                ))
                n += 1
                if n >= per_doc:
                    break
            if n >= per_doc:
                break
    return out


def open_questions(
    leads: Sequence[dict[str, Any]], topics: Sequence[tuple[str, str]], gold_chars: int = 600
) -> list[OpenQuestion]:
    """"What is X?" per Wikipedia lead (and "Who was X?" per lead of the People topic),
    "Write the reference entry" per pydoc topic; the gold text is the document's first
    ``gold_chars`` characters."""
    out = []
    for rec in leads:
        title = rec.get("metadata", {}).get("title") or rec["id"]
        out.append(OpenQuestion(f"open/wiki/{rec['id']}", f"What is {title}?", rec["id"],
                                _clean(rec["text"])[:gold_chars], "open-wiki"))
    for rec in leads:
        if rec.get("metadata", {}).get("topic") == "People":
            title = rec["metadata"].get("title") or rec["id"]
            out.append(OpenQuestion(f"open/who/{rec['id']}", f"Who was {title}?", rec["id"],
                                    _clean(rec["text"])[:gold_chars], "open-who"))
    for doc_id, raw in topics:
        name = doc_id.split("/", 1)[1].rsplit(".", 1)[0]
        out.append(OpenQuestion(
            f"open/{doc_id}", f"Write the Python reference entry for \"{name}\".", doc_id,
            _clean(raw)[:gold_chars], "open-pydoc"))
    return out


def build_question_set(
    seed: int = 0, per_kind: int = 15, test_share: float = 0.5,
    sample_dir: Path | None = None,
) -> QuestionSet:
    """Every source's questions, split dev/test by gold document (see the module docstring)."""
    folder = sample_dir or SAMPLE_DIR
    entities, eq = entity_hard(seed, per_kind)
    leads = _wiki_leads(folder / "wikipedia.jsonl")
    topics = _pydoc_topics(folder / "pydoc")
    wq, pq = wiki_questions(leads), pydoc_questions(topics)
    oq = open_questions(leads, topics)
    sources = {q.id: "entities-hard" for q in eq}
    sources.update({q.id: "wiki" for q in wq})
    sources.update({q.id: "pydoc" for q in pq})
    split = {q.id: split_of(q.gold_doc_id, seed, test_share) for q in eq + wq + pq}
    split.update({q.id: split_of(q.gold_doc_id, seed, test_share) for q in oq})
    return QuestionSet(seed, eq + wq + pq, oq, split, entities, sources)


__all__ = [
    "BUILDER_VERSION",
    "EntityHardCorpus",
    "OpenQuestion",
    "QuestionSet",
    "SOURCES",
    "SPLITS",
    "build_question_set",
    "entity_hard",
    "open_questions",
    "pydoc_questions",
    "split_of",
    "wiki_questions",
]
