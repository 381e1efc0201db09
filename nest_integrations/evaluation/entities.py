"""A seeded grounded-QA dev set: fictional entities whose documents share sentence frames.

Every entity (a company, a drug, a spacecraft, a lake) has a few attributes, and its document
states each one in the same frame as every other entity of its kind::

    The founding year of Korvanta Systems is 1987.

so the token memory holds many near-identical frames ("The founding year of X is ...") and a
wrong-entity copy is easy to make and easy to detect. The names and values are generated from
syllables with a seeded RNG, so the answers are in no model's memory: only the corpus holds them.

Questions ask one attribute of one entity ("What is the founding year of Korvanta Systems?");
each carries the gold document id, the answer string, the answer sentence and the **distractors**:
the values the same attribute takes for the other entities of the kind. Values are unique per
attribute, so an answer naming a distractor names another entity's value.

Usage::

    from nest_integrations.evaluation.entities import generate_corpus
    corpus = generate_corpus(seed=0)                 # ~300 questions over 60 documents
    corpus.documents[0].text, corpus.questions[0].question
    corpus.write_jsonl("entities.jsonl")             # `nest ingest entities.jsonl`
    corpus.sample_questions(40, seed=1)              # a deterministic subset

``python -m nest_integrations.evaluation.entities --out DIR --n 300`` writes ``corpus.jsonl``
and ``questions.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

#: The generator's version; a change of the output for a given seed bumps it.
GENERATOR_VERSION = 1

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr",
           "r", "s", "st", "t", "tr", "v", "z", "th", "sh", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "x", "m", "nd", "rt"]


def _syllables(rng: random.Random, n: int) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if i == n - 1 else "")
        for i in range(n)
    )


def _word(rng: random.Random, lo: int = 2, hi: int = 3) -> str:
    return _syllables(rng, rng.randint(lo, hi)).capitalize()


def _person(rng: random.Random) -> str:
    return f"{_word(rng, 2, 2)} {_word(rng, 2, 3)}"


def _roman(n: int) -> str:
    return ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X"][n - 1]


@dataclass(frozen=True)
class Attribute:
    """One attribute of a kind: its name in the frame and how its values are drawn."""

    name: str
    draw: Callable[[random.Random], str]


@dataclass(frozen=True)
class Kind:
    """A kind of entity: how names are made, the intro sentence, and the attributes."""

    kind: str
    make_name: Callable[[random.Random], str]
    intro: Callable[[str, random.Random], str]
    attributes: tuple[Attribute, ...]


_INDUSTRIES = ["industrial robots", "water filters", "solar inverters", "medical scanners",
               "farm software", "bicycle parts", "ceramic tiles", "marine engines"]
_CLASSES = ["an antiviral drug", "a pain medication", "an antibiotic", "a blood pressure drug",
            "an antifungal drug", "a sleep aid"]
_PROBES = ["a crewed orbital spacecraft", "a cargo spacecraft", "a lunar lander",
           "a deep space probe", "a crewed research vessel"]
_REGIONS = ["a freshwater lake", "a glacial lake", "a salt lake", "a crater lake"]


KINDS: tuple[Kind, ...] = (
    Kind(
        "company",
        lambda r: f"{_word(r)} {r.choice(['Systems', 'Industries', 'Holdings', 'Labs', 'Works'])}",
        lambda n, r: f"{n} is a company that makes {r.choice(_INDUSTRIES)}.",
        (
            Attribute("founding year", lambda r: str(r.randint(1850, 2015))),
            Attribute("headquarters city", lambda r: _word(r, 2, 3)),
            Attribute("chief executive", _person),
            Attribute("number of employees", lambda r: str(r.randint(120, 98000))),
            Attribute("stock ticker", lambda r: "".join(r.choice("BCDFGHJKLMNPQRSTVWXZ")
                                                        for _ in range(4))),
        ),
    ),
    Kind(
        "drug",
        lambda r: _word(r, 2, 3) + r.choice(["ine", "ol", "ex", "ane", "ide"]),
        lambda n, r: f"{n} is {r.choice(_CLASSES)}.",
        (
            Attribute("approval year", lambda r: str(r.randint(1955, 2022))),
            Attribute("active ingredient", lambda r: _syllables(r, 3) + r.choice(
                ["azole", "amine", "ostat", "ifen", "oxin"])),
            Attribute("standard dose", lambda r: f"{r.randint(2, 95) * 5} milligrams"),
            Attribute("manufacturer", lambda r: f"{_word(r)} Pharma"),
            Attribute("half-life", lambda r: f"{r.randint(2, 96)} hours"),
        ),
    ),
    Kind(
        "spacecraft",
        lambda r: f"{_word(r)} {_roman(r.randint(1, 10))}",
        lambda n, r: f"{n} is {r.choice(_PROBES)}.",
        (
            Attribute("launch year", lambda r: str(r.randint(1961, 2030))),
            Attribute("launch site", lambda r: f"{_word(r)} Spaceport"),
            Attribute("mission commander", _person),
            Attribute("crew size", lambda r: str(r.randint(2, 60))),
            Attribute("destination", lambda r: f"{_word(r, 2, 2)}-{r.randint(2, 99)}"),
        ),
    ),
    Kind(
        "lake",
        lambda r: f"Lake {_word(r)}",
        lambda n, r: f"{n} is {r.choice(_REGIONS)}.",
        (
            Attribute("maximum depth", lambda r: f"{r.randint(4, 900)} metres"),
            Attribute("surface area", lambda r: f"{r.randint(3, 9000)} square kilometres"),
            Attribute("shore town", lambda r: _word(r, 2, 3)),
            Attribute("main inflow", lambda r: f"the {_word(r)} River"),
            Attribute("year of first survey", lambda r: str(r.randint(1700, 1990))),
        ),
    ),
)


@dataclass(frozen=True)
class EntityDocument:
    """One entity's document: ``id`` is its document id in the datastore."""

    id: str
    kind: str
    name: str
    text: str
    attributes: dict[str, str]

    def to_jsonl(self) -> dict[str, Any]:
        """The ``nest ingest`` JSONL record."""
        return {"id": self.id, "text": self.text,
                "metadata": {"title": self.name, "kind": self.kind, "dataset": "entities"}}


@dataclass(frozen=True)
class EntityQuestion:
    """One grounded question.

    Attributes:
        id: unique (``<doc id>#<attribute>``).
        question: the user message.
        answer: the gold answer string (the attribute's value).
        answer_sentence: the sentence of the gold document that states it.
        gold_doc_id: the entity's document id.
        entity, kind, attribute: what is asked.
        distractors: the attribute's values for the other entities of the kind.
    """

    id: str
    question: str
    answer: str
    answer_sentence: str
    gold_doc_id: str
    entity: str
    kind: str
    attribute: str
    distractors: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["distractors"] = list(self.distractors)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EntityQuestion":
        return cls(**{**d, "distractors": tuple(d.get("distractors", ()))})


@dataclass
class EntityCorpus:
    """The generated documents and every question over them."""

    seed: int
    documents: list[EntityDocument]
    questions: list[EntityQuestion]

    def sample_questions(self, n: int | None, seed: int = 0) -> list[EntityQuestion]:
        """``n`` questions (all when None or n >= len), deterministically shuffled by ``seed``,
        spread over kinds and attributes (one per entity before a second per entity)."""
        rng = random.Random(f"questions:{seed}")
        by_doc: dict[str, list[EntityQuestion]] = {}
        for q in self.questions:
            by_doc.setdefault(q.gold_doc_id, []).append(q)
        for qs in by_doc.values():
            rng.shuffle(qs)
        docs = sorted(by_doc)
        rng.shuffle(docs)
        ordered: list[EntityQuestion] = []
        depth = max((len(v) for v in by_doc.values()), default=0)
        for i in range(depth):
            ordered += [by_doc[d][i] for d in docs if i < len(by_doc[d])]
        return ordered if n is None else ordered[:n]

    def write_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """The corpus as ``nest ingest`` JSONL (one document per line)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            for d in self.documents:
                f.write(json.dumps(d.to_jsonl(), ensure_ascii=False) + "\n")
        return p

    def write_questions(
        self, path: str | os.PathLike[str], questions: Sequence[EntityQuestion] | None = None
    ) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            for q in self.questions if questions is None else questions:
                f.write(json.dumps(q.to_dict(), ensure_ascii=False) + "\n")
        return p


def frame(attribute: str, name: str, value: str) -> str:
    """The shared sentence frame."""
    return f"The {attribute} of {name} is {value}."


def generate_corpus(seed: int = 0, per_kind: int = 15) -> EntityCorpus:
    """``per_kind`` entities of each of the four kinds (5 attributes each): with the default
    15, 60 documents and 300 questions. Names are unique across the corpus and no name contains
    another; values are unique per attribute (so a distractor is never the gold answer)."""
    if per_kind < 2:
        raise ValueError(f"per_kind={per_kind} is invalid: use at least 2 (distractors need two)")
    rng = random.Random(f"entities:v{GENERATOR_VERSION}:{seed}")
    names: set[str] = set()
    documents: list[EntityDocument] = []
    questions: list[EntityQuestion] = []
    for kind in KINDS:
        values: dict[str, set[str]] = {a.name: set() for a in kind.attributes}
        entities: list[tuple[str, dict[str, str], str]] = []
        while len(entities) < per_kind:
            name = kind.make_name(rng)
            low = name.lower()
            if any(low in n or n in low for n in names):
                continue
            attrs: dict[str, str] = {}
            for a in kind.attributes:
                for _ in range(1000):
                    v = a.draw(rng)
                    if v not in values[a.name] and v.lower() not in low:
                        break
                else:  # pragma: no cover - value spaces are far larger than per_kind
                    raise RuntimeError(f"cannot draw a unique {a.name}")
                values[a.name].add(v)
                attrs[a.name] = v
            names.add(low)
            entities.append((name, attrs, kind.intro(name, rng)))
        for name, attrs, intro in entities:
            doc_id = f"entities/{kind.kind}/{name.lower().replace(' ', '-')}"
            order = list(kind.attributes)
            rng.shuffle(order)
            sentences = [intro] + [frame(a.name, name, attrs[a.name]) for a in order]
            documents.append(EntityDocument(doc_id, kind.kind, name, " ".join(sentences), attrs))
            for a in kind.attributes:
                others = tuple(sorted(v for v in values[a.name] if v != attrs[a.name]))
                questions.append(
                    EntityQuestion(
                        id=f"{doc_id}#{a.name}",
                        question=f"What is the {a.name} of {name}?",
                        answer=attrs[a.name],
                        answer_sentence=frame(a.name, name, attrs[a.name]),
                        gold_doc_id=doc_id,
                        entity=name,
                        kind=kind.kind,
                        attribute=a.name,
                        distractors=others,
                    )
                )
    return EntityCorpus(seed, documents, questions)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the generated entity corpus and questions.")
    ap.add_argument("--out", required=True, help="folder for corpus.jsonl and questions.jsonl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-kind", type=int, default=15, help="entities per kind (4 kinds)")
    ap.add_argument("--n", type=int, default=None, help="questions to write (default: all)")
    args = ap.parse_args(argv)
    corpus = generate_corpus(args.seed, args.per_kind)
    out = Path(args.out)
    corpus.write_jsonl(out / "corpus.jsonl")
    qs = corpus.sample_questions(args.n, seed=args.seed)
    corpus.write_questions(out / "questions.jsonl", qs)
    sys.stdout.write(f"{len(corpus.documents)} documents, {len(qs)} questions in {out}\n")
    return 0


__all__ = [
    "GENERATOR_VERSION",
    "KINDS",
    "EntityCorpus",
    "EntityDocument",
    "EntityQuestion",
    "frame",
    "generate_corpus",
]

if __name__ == "__main__":
    raise SystemExit(main())
