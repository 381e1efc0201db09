"""Phrasing families: every question asked several ways, so that no answer rule can be tuned to
one surface form (the robust-answers benchmark), and the wrong-attribute metric.

The templates were written from how people ask (search boxes, chat, data-set questions), not
from any rule of the package; nothing in the package reads them.

- ``CLOSED_FAMILIES``: an attribute A of an entity X, five families of two templates.
  ``"terse"`` is the **held-out family**: no dev decision looks at it, and it is reported apart.
- ``OPEN_FAMILIES``: an open-ended request about X (gold: X's lead), five families of one
  template; ``"meaning"`` names a domain ("What does X mean in Python?").
- ``closed_phrasings(question)``: the question in one template of each family but the held-out
  one (rotating through each family's templates by the question's id) and in both held-out
  templates: 6 phrasings from 5 families.
- ``wrong_attribute(...)``: the first sentence states another attribute or another entity than
  the one asked (see its docstring).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from nest_integrations.evaluation.metrics import normalize_answer

#: family -> templates with ``{a}`` (attribute), ``{x}`` (entity) and their lower-case forms.
CLOSED_FAMILIES: dict[str, tuple[str, ...]] = {
    "of": ("What is the {a} of {x}?", "Tell me the {a} of {x}."),
    "in": ("What is the {a} in {x}?", "What's the {a} in {x}?"),
    "possessive": ("What is {x}'s {a}?", "Tell me {x}'s {a}."),
    "topic-first": ("{x}: what is the {a}?", "{x} - {a}?"),
    "terse": ("{a} of {x}?", "{lx} {la}"),
}
#: The family no dev decision looks at.
HELD_OUT = "terse"
OPEN_FAMILIES: dict[str, str] = {
    "what-is": "What is {x}?",
    "tell-me": "Tell me about {x}",
    "bare": "{x}?",
    "define": "Define {x}",
    "meaning": "What does {x} mean in {domain}?",
}


@dataclass(frozen=True)
class Phrasing:
    """One way of asking: the family and template index, and the text."""

    family: str
    template: int
    text: str


def _rotation(key: str) -> int:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)


def closed_phrasings(qid: str, attribute: str, entity: str) -> list[Phrasing]:
    """6 phrasings from 5 families (module docstring)."""
    out = []
    fields = {"a": attribute, "x": entity, "la": attribute.lower(), "lx": entity.lower()}
    for family, templates in CLOSED_FAMILIES.items():
        picks = range(len(templates)) if family == HELD_OUT else [_rotation(qid + family) % len(templates)]
        for i in picks:
            out.append(Phrasing(family, i, templates[i].format(**fields)))
    return out


def open_phrasings(entity: str, domain: str) -> list[Phrasing]:
    """One phrasing per open-ended family."""
    return [Phrasing(f, 0, t.format(x=entity, domain=domain)) for f, t in OPEN_FAMILIES.items()]


_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s|\n")


def first_sentence(text: str) -> str:
    """The text up to its first sentence end (``.``, ``!``, ``?`` then whitespace) or newline,
    leading whitespace and list markers aside."""
    text = text.lstrip()
    m = _SENTENCE.search(text)
    return text[: m.start()] if m else text


def _has(norm: str, phrase: str) -> bool:
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {norm} "


def wrong_attribute(
    text: str,
    answer: str,
    attribute: str,
    other_attributes: Sequence[tuple[str, str]] = (),
    distractors: Iterable[str] = (),
    other_entities: Iterable[str] = (),
) -> bool:
    """Whether the answer's first sentence states another attribute or another entity than the
    one asked, instead of the gold value: it lacks the gold ``answer`` and holds another
    attribute's value or name (``other_attributes``: the gold entity's other
    ``(name, value)`` pairs), another entity's value of this attribute (``distractors``), or
    another entity's name. A first sentence with the gold answer, or that states nothing
    checkable ("I don't know."), is not a wrong-attribute answer (it may still be wrong)."""
    norm = normalize_answer(first_sentence(text))
    if _has(norm, answer):
        return False
    if any(_has(norm, value) for _, value in other_attributes):
        return True
    if any(_has(norm, name) for name, _ in other_attributes) and not _has(norm, attribute):
        return True
    return any(_has(norm, d) for d in distractors) or any(_has(norm, e) for e in other_entities)


__all__ = ["CLOSED_FAMILIES", "HELD_OUT", "OPEN_FAMILIES", "Phrasing", "closed_phrasings",
           "first_sentence", "open_phrasings", "wrong_attribute"]
