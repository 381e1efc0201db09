"""The value check: a sentence is supported only by a passage holding its values (numbers and
names) and quoted terms, so "in 1912" is not supported by "in 1921"."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from nest_integrations.attribution.splitting import Candidate
from nest_integrations.types import Citation, Passage

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NAME = re.compile(r"(?<![\w])[A-Z][\w'’-]*")
#: Capitalised at the start of a sentence without being a name: English function words and
#: sentence adverbs (a closed class; what an answer sentence commonly opens with).
_OPENERS = frozenset("""
a an the this that these those it its it's they their them he his him she her we our you your
i my there here what which who whom whose when where why how whether if unless although though
while because since as so thus hence therefore however moreover furthermore also additionally
overall indeed instead still yet but and or nor not no yes both either neither each every all
some many most much more few several any such one two three first second then today now
in on at by for from with without within into onto of to about above after against among
around before behind below beneath between beyond during except inside like near off over
through throughout toward towards under until unlike upon via according despite
""".split())
_LEAD_IN = re.compile(r"\W*\w+(?:\s+\w+){0,2},")  # "Put simply," / "In 1912," / "Rome,"


def value_spans(text: str) -> list[tuple[int, int]]:
    """Where the *values* of ``text`` are: numbers, and capitalised words. The first word
    counts when it is not an opener (``_OPENERS``) nor the start of a short lead-in phrase
    ending in a comma ("Broadly speaking, ..."): in "Brouthort is the headquarters city of
    Biziom Labs." the value is the first word."""
    spans = [m.span() for m in _NUMBER.finditer(text)]
    first = re.match(r"\W*(\w+)", text)
    for m in _NAME.finditer(text):
        if first and m.start() == first.start(1) and (
                m.group().lower() in _OPENERS or _LEAD_IN.match(text)):
            continue
        spans.append(m.span())
    return spans


#: A quoted or back-ticked term: in technical text, a code name ("assert", `__debug__`).
_QUOTED_TERM = re.compile(r'["“`]([^"”`\n]{1,40})["”`]')


def quoted_terms(text: str) -> set[str]:
    """The quoted terms of ``text``, lower-cased."""
    return {m.group(1).lower() for m in _QUOTED_TERM.finditer(text)}


def values(text: str) -> set[str]:
    """The values of ``text`` (``value_spans``), names lower-cased."""
    return {text[a:b].lower() for a, b in value_spans(text)}


def value_overlap(
    units: Sequence[str], cands: Sequence[Candidate], passages: Sequence[Passage]
) -> np.ndarray:
    """Per (unit, candidate): 1 when the candidate's passage holds every value of the unit
    and the candidate sentence itself every quoted term (or the unit has none), else 0. All
    or nothing: with a share, one wrong value among a long sentence's many names lowered the
    score by too little to matter (dev split of ``benchmarks/attribution.py``). Numbers must
    appear as they are; a name may differ in its ending ("Persian" / "Persia": the first
    ``max(5, len - 3)`` letters). A quoted term must be in the sentence, not just the passage:
    a topic that lists "|" and "^" does not support "the "|" operator yields the XOR"."""
    out = np.ones((len(units), len(cands)), dtype=np.float32)
    texts = [p.text.lower() for p in passages]
    found: dict[tuple[str, int], bool] = {}

    def holds(v: str, pi: int) -> bool:
        if (v, pi) not in found:
            stem = v if v[:1].isdigit() else v[: max(5, len(v) - 3)]
            tail = r"(?!\w)" if v[:1].isdigit() or stem == v else r""
            found[(v, pi)] = re.search(rf"(?<!\w){re.escape(stem)}{tail}", texts[pi]) is not None
        return found[(v, pi)]

    for i, u in enumerate(units):
        vals, terms = values(u), quoted_terms(u)
        if not vals and not terms:
            continue
        for j, c in enumerate(cands):
            ct = c.text.lower()
            out[i, j] = float(all(holds(v, c.passage) for v in vals)
                              and all(t in ct for t in terms))
    return out


def uncovered_value(text: str, s: int, e: int, cites: Sequence[Citation]) -> bool:
    """Whether a value of ``text[s:e]`` (``value_spans``: a number, a name) lies outside
    every verbatim citation: a copied sentence with a changed year is not a verbatim one."""
    unit = text[s:e]
    spans = value_spans(unit) + [m.span(1) for m in _QUOTED_TERM.finditer(unit)]
    for a, b in spans:
        if not any(c.start <= s + a and s + b <= c.end for c in cites):
            return True
    return False
