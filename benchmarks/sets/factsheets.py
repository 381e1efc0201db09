"""Fact sheets written as prose: a factoid corpus the package never saw (issue 60).

Two kinds of fictional entity, each a short prose document of one sentence per attribute
(shuffled, in two paragraphs), so that an answer can run on from the sentence that holds the
value into the neighbouring facts:

- ``country``: almanac entries ("Life expectancy at birth in Vorland is 71.4 years (2024
  est.).", "Vorland has a land area of 123,456 square kilometres."); new field names and a new
  seed string, unlike ``benchmarks.sets.profiles`` (``Field: value`` lines, which gave the
  evidence module its design example);
- ``product``: product sheets ("The Quillbook Slate 10 is priced at $349.", "The battery life
  of the Quillbook Slate 10 is 21.5 hours.").

Every attribute has its own sentence frame (which names the attribute, so a question "What is
the A of X?" shares words with it) and two **synonym** questions that ask for it without its
own words ("How long can someone born in X expect to live?"), written from how people ask, not
from any rule of the package.

Invariant (``generate_factsheets`` checks it): every gold value occurs, as normalised whole
words, in exactly one sentence of the whole corpus, the sentence that states it; so a gold value
in an answer means the answer carries that sentence's fact. Values are drawn from syllables and
ranges with a seeded RNG, so no model has seen them.

Usage::

    corpus = generate_factsheets(seed=0)         # 40 countries + 40 products, 2 questions each
    corpus.write_jsonl("facts.jsonl")             # `nest ingest facts.jsonl`
    q = corpus.questions[0]; q.attribute, q.answer, q.sentence, q.synonyms
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nest_integrations.evaluation.metrics import normalize_answer

#: The generator's version; a change of the output for a given seed bumps it.
GENERATOR_VERSION = 1

_ON = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "kr",
       "sh", "qu"]
_VO = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_LINES = ["Slate", "Note", "Tab", "Pad", "Pro", "Air", "Go", "Max", "Book", "Vista", "Edge"]
_CATEGORY = ["tablet", "laptop", "e-reader", "smartphone", "smartwatch", "portable speaker"]
_REGION = ["northern", "southern", "eastern", "western", "central"]


def _name(rng: random.Random, lo: int = 2, hi: int = 3) -> str:
    return "".join(rng.choice(_ON) + rng.choice(_VO)
                   for _ in range(rng.randint(lo, hi))).capitalize()


def _date(rng: random.Random, lo: int, hi: int) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(lo, hi)}"


@dataclass(frozen=True)
class Attribute:
    """One attribute: its name, its sentence frame (``{x}`` the entity, ``{v}`` the shown
    value), two synonym questions (``{x}``), and ``draw(rng) -> (shown, gold)``."""

    name: str
    frame: str
    synonyms: tuple[str, str]
    draw: Callable[[random.Random], tuple[str, str]]


def _num(lo: int, hi: int, unit: str = "") -> Callable[[random.Random], tuple[str, str]]:
    def draw(r: random.Random) -> tuple[str, str]:
        v = f"{r.randint(lo, hi):,}"
        return v + unit, v
    return draw


def _dec(lo: int, hi: int) -> Callable[[random.Random], tuple[str, str]]:
    def draw(r: random.Random) -> tuple[str, str]:
        v = f"{r.randint(lo, hi)}.{r.randint(0, 9)}"
        return v, v
    return draw


def _same(f: Callable[[random.Random], str]) -> Callable[[random.Random], tuple[str, str]]:
    return lambda r: (lambda v: (v, v))(f(r))


COUNTRY: tuple[Attribute, ...] = (
    Attribute("life expectancy at birth", "Life expectancy at birth in {x} is {v} years.",
              ("How long can someone born in {x} expect to live?",
               "To what age do people in {x} usually live?"), _dec(55, 84)),
    Attribute("population", "The population of {x} is {v}.",
              ("How many people live in {x}?", "How many inhabitants does {x} have?"),
              _num(1_200_000, 89_000_000)),
    Attribute("land area", "{x} has a land area of {v} square kilometres.",
              ("How big is {x}?", "How much territory does {x} cover?"),
              _num(12_000, 990_000)),
    Attribute("capital", "The capital of {x} is {v}.",
              ("Which city is the seat of {x}'s government?",
               "Where does the government of {x} sit?"), _same(lambda r: _name(r) + "burg")),
    Attribute("official language", "The official language of {x} is {v}.",
              ("What do people in {x} speak?", "Which tongue is used in the schools and courts "
               "of {x}?"), _same(lambda r: _name(r, 2, 2) + "ese")),
    Attribute("currency", "The currency of {x} is the {v}.",
              ("What money is used in {x}?", "What do you pay with when shopping in {x}?"),
              _same(lambda r: _name(r, 1, 2).lower() + "o")),
    Attribute("literacy rate", "The literacy rate of {x} is {v} percent.",
              ("What share of adults in {x} can read and write?",
               "How many people in {x} are able to read?"), _dec(85, 99)),
    Attribute("highest point", "The highest point of {x} is {v}.",
              ("What is the tallest mountain in {x}?", "Which peak rises above all others in "
               "{x}?"), _same(lambda r: f"Mount {_name(r)}")),
    Attribute("median age", "The median age in {x} is {v} years.",
              ("How old is the typical resident of {x}?",
               "Half of the people in {x} are younger than how many years?"), _dec(17, 49)),
    Attribute("independence day", "The independence day of {x} is {v}.",
              ("On what date did {x} become a sovereign nation?",
               "When does {x} celebrate breaking free from foreign rule?"),
              _same(lambda r: _date(r, 1800, 1990))),
)

PRODUCT: tuple[Attribute, ...] = (
    Attribute("price", "The {x} is priced at {v}.",
              ("How much does the {x} cost?", "How much do I have to pay for the {x}?"),
              lambda r: (lambda v: (f"${v}", f"${v}"))(f"{r.randint(49, 2999):,}")),
    Attribute("manufacturer", "The manufacturer of the {x} is {v}.",
              ("Which company builds the {x}?", "Who makes the {x}?"),
              _same(lambda r: _name(r) + " " + r.choice(["Labs", "Devices", "Works"]))),
    Attribute("battery life", "The battery life of the {x} is {v} hours.",
              ("How long does the {x} run on a single charge?",
               "For how many hours can the {x} be used unplugged?"), _dec(18, 39)),
    Attribute("weight", "The weight of the {x} is {v} grams.",
              ("How heavy is the {x}?", "How much does the {x} weigh in the hand?"),
              _num(150, 2990)),
    Attribute("release date", "The release date of the {x} was {v}.",
              ("When did the {x} come out?", "When could people first buy the {x}?"),
              _same(lambda r: _date(r, 2005, 2024))),
    Attribute("warranty", "The warranty of the {x} lasts {v}.",
              ("How long is the {x} covered against defects?",
               "For how long will the maker repair a faulty {x} for free?"),
              _same(lambda r: f"{r.randint(13, 72)} months")),
    Attribute("screen size", "The screen size of the {x} is {v} inches.",
              ("How large is the display of the {x}?", "How big is the {x}'s display, "
               "measured across?"), _dec(5, 17)),
    Attribute("storage capacity", "The storage capacity of the {x} is {v} gigabytes.",
              ("How much data can the {x} hold?", "How many files and apps fit on the {x}?"),
              _num(3000, 9000)),
    Attribute("place of assembly", "The place of assembly of the {x} is {v}.",
              ("Where is the {x} put together?", "In which city is the {x} built?"),
              _same(lambda r: _name(r) + "ville")),
    Attribute("operating system", "The operating system of the {x} is {v}.",
              ("What software platform does the {x} use?", "Which OS does the {x} boot into?"),
              _same(lambda r: _name(r, 1, 2) + "OS " + str(r.randint(2, 19)))),
)
KINDS: dict[str, tuple[Attribute, ...]] = {"country": COUNTRY, "product": PRODUCT}


@dataclass(frozen=True)
class FactQuestion:
    """One attribute of one document: the gold ``answer`` (as checked), the ``sentence`` that
    states it, the same attribute's values in the other documents of its kind
    (``distractors``) and the attribute's two ``synonyms`` (questions with ``{x}`` filled)."""

    id: str
    gold_doc_id: str
    kind: str
    entity: str
    attribute: str
    answer: str
    sentence: str
    distractors: tuple[str, ...]
    synonyms: tuple[str, ...]


@dataclass
class FactCorpus:
    documents: list[dict[str, Any]]  # ``nest ingest`` JSONL records
    questions: list[FactQuestion]
    seed: int

    def write_jsonl(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for d in self.documents:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        return path


def _entities(rng: random.Random, kind: str, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        if kind == "country":
            name = _name(rng, 2, 3) + rng.choice(["ia", "land", "stan", "ora", "esh"])
        else:  # brands repeat, so two products share a word
            name = (f"{_name(rng, 2, 3)}{rng.choice(['book', 'tek', 'ix'])}" if len(out) % 3 == 0
                    else out[-1].split()[0]) + f" {rng.choice(_LINES)} {rng.randint(2, 20)}"
        if name not in out:
            out.append(name)
    return out


def _inside(norm: str, text_norm: str) -> bool:
    return f" {norm} " in f" {text_norm} "


def generate_factsheets(seed: int = 0, n: int = 40, per_doc: int = 2) -> FactCorpus:
    """``n`` documents of each kind, ``per_doc`` questions each (module docstring)."""
    rng = random.Random(f"factsheets:{GENERATOR_VERSION}:{seed}")
    documents: list[dict[str, Any]] = []
    questions: list[FactQuestion] = []
    shown_norms: list[str] = []  # every sentence drawn so far, normalised
    gold_norms: list[str] = []
    for kind, attrs in KINDS.items():
        names = _entities(rng, kind, n)
        sentences: dict[str, dict[str, tuple[str, str]]] = {x: {} for x in names}
        for a in attrs:
            for x in names:
                for _ in range(1000):  # redraw until the invariant of the module docstring holds
                    shown, gold = a.draw(rng)
                    sent = a.frame.format(x=x, v=shown)
                    g, s = normalize_answer(gold), normalize_answer(sent)
                    if (not _inside(g, normalize_answer(x))
                            and not any(_inside(g, o) for o in shown_norms)
                            and not any(_inside(o, s) for o in gold_norms)):
                        break
                else:
                    raise RuntimeError(f"no unique value for {a.name!r} of {x!r}")
                shown_norms.append(s)
                gold_norms.append(g)
                sentences[x][a.name] = (sent, gold)
        for x in names:
            order = list(attrs)
            rng.shuffle(order)
            intro = (f"{x} is a country in the {rng.choice(_REGION)} part of its continent."
                     if kind == "country" else
                     (lambda c: f"The {x} is {'an' if c[0] in 'aeiou' else 'a'} {c} sold "
                      "worldwide.")(rng.choice(_CATEGORY)))
            half = len(order) // 2
            paras = [" ".join([intro] + [sentences[x][a.name][0] for a in order[:half]]),
                     " ".join(sentences[x][a.name][0] for a in order[half:])]
            doc_id = f"{kind}/{x.lower().replace(' ', '-')}"
            documents.append({"id": doc_id, "text": x + "\n\n" + "\n\n".join(paras),
                              "metadata": {"title": x, "kind": kind, "dataset": "factsheets"}})
            for a in rng.sample(list(attrs), per_doc):
                sent, gold = sentences[x][a.name]
                questions.append(FactQuestion(
                    id=f"{doc_id}#{a.name}", gold_doc_id=doc_id, kind=kind, entity=x,
                    attribute=a.name, answer=gold, sentence=sent,
                    distractors=tuple(sentences[o][a.name][1] for o in names if o != x),
                    synonyms=tuple(t.format(x=x) for t in a.synonyms)))
    return FactCorpus(documents, questions, seed)


__all__ = ["COUNTRY", "GENERATOR_VERSION", "KINDS", "PRODUCT", "Attribute", "FactCorpus",
           "FactQuestion", "generate_factsheets"]
