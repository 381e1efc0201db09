"""A held-out corpus of fictional country profiles, for checks no rule was tuned on.

Written after the answer policy was chosen, in a form unlike the entity corpus
(``evaluation.entities``: one prose sentence per attribute, "The founding year of X is 1987."):
reference-book profiles titled by country, with sections of ``Field: value`` lines, numbers
with units and estimate years, and neighbours named in the location line, so a profile
mentions other countries and every profile shares the same field names. The values are drawn
from syllables and ranges with a seeded RNG, so no model has seen them.

Usage::

    corpus = generate_profiles(seed=0)          # 40 profiles, 2 questions each
    corpus.write_jsonl("profiles.jsonl")         # `nest ingest profiles.jsonl`
    corpus.questions[0].attribute, corpus.questions[0].answer
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The generator's version; a change of the output for a given seed bumps it.
GENERATOR_VERSION = 1

_ON = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "kr"]
_VO = ["a", "e", "i", "o", "u", "ai", "ou"]


def _name(rng: random.Random, lo: int = 2, hi: int = 3) -> str:
    return "".join(rng.choice(_ON) + rng.choice(_VO) for _ in range(rng.randint(lo, hi))).capitalize()


@dataclass(frozen=True)
class ProfileQuestion:
    """One attribute of one profile: ``attribute`` as a person names it, the gold ``answer``
    (the value as it is checked), the profile's other ``(attribute, value)`` pairs, the same
    attribute's values in the other profiles (``distractors``) and the other countries."""

    id: str
    gold_doc_id: str
    entity: str
    attribute: str
    answer: str
    other_attributes: tuple[tuple[str, str], ...]
    distractors: tuple[str, ...]
    other_entities: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class ProfileCorpus:
    documents: list[dict[str, Any]]
    questions: list[ProfileQuestion]
    seed: int

    def write_jsonl(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w", encoding="utf-8") as f:
            for d in self.documents:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        return path


#: (attribute as asked, how the line names it, draw(rng, country) -> (shown text, gold value))
def _fields() -> list[tuple[str, str, Any]]:
    return [
        ("area", "Area", lambda r, c: (lambda v: (f"{v} sq km", v))(
            f"{r.randint(8, 990) * 1000 + r.randint(1, 999):,}")),
        ("population", "Population", lambda r, c: _est(f"{r.randint(300, 99000) * 1000 + r.randint(1, 999):,}", r)),
        ("life expectancy at birth", "Life expectancy at birth",
         lambda r, c: (lambda v: (f"{v} years", v))(f"{r.randint(55, 84)}.{r.randint(0, 9)}")),
        ("official language", "Official language", lambda r, c: (f"{_name(r)}ic",) * 2),
        ("capital", "Capital", lambda r, c: (_name(r),) * 2),
        ("currency", "Currency", lambda r, c: (lambda n: (f"{n} dral ({n[:3].upper()}D)", f"{n} dral"))(_name(r, 2, 2))),
        ("GDP per capita", "GDP per capita (PPP)", lambda r, c: _est(f"${r.randint(12, 95)},{r.randint(100, 999)}", r)),
        ("highest point", "Highest point", lambda r, c: (lambda n, h: (f"Mount {n} {h:,} m", f"Mount {n}"))(_name(r), r.randint(900, 7900))),
        ("national holiday", "National holiday",
         lambda r, c: (f"Founding Day, {r.randint(1, 28)} {r.choice(_MONTHS)} ({r.randint(1800, 1990)})",) * 2),
        ("head of government", "Head of government",
         lambda r, c: (lambda n: (f"Prime Minister {n} (since {r.randint(2010, 2024)})", n))(f"{_name(r)} {_name(r)}")),
    ]


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]


def _est(value: str, rng: random.Random) -> tuple[str, str]:
    return f"{value} ({rng.randint(2019, 2024)} est.)", value


_SECTIONS = {"Geography": ("area", "highest point"),
             "People and society": ("population", "life expectancy at birth", "official language"),
             "Government": ("capital", "head of government", "national holiday"),
             "Economy": ("currency", "GDP per capita")}


def generate_profiles(seed: int = 0, n: int = 40, per_profile: int = 2) -> ProfileCorpus:
    """``n`` profiles with unique values per field, and ``per_profile`` questions each."""
    rng = random.Random(f"profiles:{GENERATOR_VERSION}:{seed}")
    names: list[str] = []
    while len(names) < n:
        name = _name(rng, 2, 3) + rng.choice(["ia", "land", "stan", "ora", ""])
        if name not in names:
            names.append(name)
    fields = _fields()
    values: dict[str, dict[str, tuple[str, str]]] = {c: {} for c in names}
    for attr, _, draw in fields:
        used: set[str] = set()
        for c in names:
            while True:
                shown, gold = draw(rng, c)
                if gold not in used:
                    break
            used.add(gold)
            values[c][attr] = (shown, gold)
    label = {attr: line for attr, line, _ in fields}
    documents, questions = [], []
    for i, c in enumerate(names):
        near = rng.sample([m for m in names if m != c], 2)
        lines = [c, "", "Geography", f"Location: a country bordering {near[0]} and {near[1]}."]
        for section, attrs in _SECTIONS.items():
            if section != "Geography":
                lines += ["", section]
            lines += [f"{label[a]}: {values[c][a][0]}" for a in attrs]
        doc_id = f"profile/{c.lower()}"
        documents.append({"id": doc_id, "text": "\n".join(lines),
                          "metadata": {"title": c, "kind": "profile"}})
        for attr in rng.sample([a for a, _, _ in fields], per_profile):
            questions.append(ProfileQuestion(
                id=f"{doc_id}#{attr}", gold_doc_id=doc_id, entity=c, attribute=attr,
                answer=values[c][attr][1],
                other_attributes=tuple((a, values[c][a][1]) for a, _, _ in fields if a != attr),
                distractors=tuple(values[m][attr][1] for m in names if m != c),
                other_entities=tuple(m for m in names if m != c),
            ))
    return ProfileCorpus(documents, questions, seed)


__all__ = ["GENERATOR_VERSION", "ProfileCorpus", "ProfileQuestion", "generate_profiles"]
