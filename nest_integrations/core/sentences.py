"""Sentences and words: the package's one sentence-end rule, and its one list of function words.

A sentence ends (``SENTENCE_END``, the only sentence-end expression of the package):

- at ``.``, ``!`` or ``?`` (a run of them, closing quotes and brackets kept) before whitespace;
- at a blank line.

Three readers split different texts, and differ only in what else ends a sentence (a
``SentenceRule``; the measured differences are in ``docs/decisions.md``):

- ``PASSAGE`` (the evidence sentences of passages, ``core.evidence``): also ``:`` before a line
  break, and a line break before a line that does not go on in lower case (field lists such as
  ``Capital: Mapudo`` and wrapped prose both split right);
- ``OUTPUT`` (the units ``attribution`` judges in an answer): also the CJK full stops, and a
  line break before a list item; a period after an abbreviation or an initial, or before a
  lower-case word, ends none; stray punctuation joins the sentence before it;
- ``LINES`` (the output guards, ``core.guards``): also every line break. A guard reads a
  growing text, so every end it sees is final once the next character has come (a period
  whose sentence end depends on the next word would move under it); its units are lines,
  because the list items a small model repeats are lines.

The chunker (``ingest.splitter``) splits at the gap after a sentence instead
(``CHUNK_SENTENCE_GAP``), kept here beside the sentence end it mirrors: passage boundaries, and
so every store, follow from it.

``STOP_WORDS``: the function words of the corpus languages (English, French, Spanish), and the
verbs of a request ("tell", "explain"): they carry no content, so they never make a sentence a
question's evidence (``core.evidence.content_words``) nor a title a document's name
(``retrieval.titles``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from nest_integrations.core.citations import trim_span

#: A sentence end; the kinds past ``stop`` and ``blank`` count only under a rule that names them.
SENTENCE_END = re.compile(
    r"(?P<stop>[.!?]+[\"')\]»”’]*(?=\s))"
    r"|(?P<cjk>[。！？]+[」』）]*)"
    r"|(?P<colon>:(?=[ \t]*\n))"
    r"|(?P<blank>\n[ \t]*\n)"
    r"|(?P<line>\n)"
)
#: The chunker's sentence separator (``ingest.splitter``): the whitespace after a sentence's
#: ``.``, ``!`` or ``?`` and its closing quotes or brackets. It matches what lies *between* two
#: units, where ``SENTENCE_END`` matches a sentence's end, and takes no line or blank-line rule
#: (the chunker splits at paragraphs and lines on levels of its own). Every store's passage
#: boundaries follow from it: changing it re-chunks every corpus.
CHUNK_SENTENCE_GAP = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+")
_CAPITAL_LINE = re.compile(r"[ \t]*[^\W_a-z\u00df-\u00ff]")
_LIST_ITEM = re.compile(r"\s*(?:[-*•]|\d+\.)\s")
_LAST_WORD = re.compile(r"([\w.]+)$")
#: Words whose trailing period does not end a sentence (``OUTPUT``).
ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al mr mrs ms dr prof st jr sr no fig approx ca c inc ltd co".split()
)


@dataclass(frozen=True)
class SentenceRule:
    """What ends a sentence besides terminal punctuation and a blank line.

    ``lines``: which line breaks end one: ``"all"``, ``"capital"`` (before a line that opens
    with an upper-case letter or a digit) or ``"list"`` (before a list item: ``-``, ``*``,
    ``•`` or ``1.``). ``colon``: ``:`` before a line break. ``cjk``: ``。！？``.
    ``abbreviations``: a period after an abbreviation or an initial, or before a lower-case
    word, ends none. ``join_stray``: a piece without a letter or digit joins the sentence
    before it (stray punctuation: ``sentence_spans``); else it is dropped (in a passage such a
    piece is a term of its own, ``"_*"`` in the Python docs' list of identifier classes)."""

    lines: str
    colon: bool = False
    cjk: bool = False
    abbreviations: bool = False
    join_stray: bool = False

    def __post_init__(self) -> None:
        if self.lines not in ("all", "capital", "list"):
            raise ValueError(f"SentenceRule.lines is {self.lines!r}: use 'all', 'capital' or "
                             "'list'")


PASSAGE = SentenceRule(lines="capital", colon=True)
OUTPUT = SentenceRule(lines="list", cjk=True, abbreviations=True, join_stray=True)
LINES = SentenceRule(lines="all")


def sentence_ends(text: str, rule: SentenceRule, pos: int = 0) -> Iterator[int]:
    """Where the sentences of ``text[pos:]`` end (the char after each end mark), in order."""
    for m in SENTENCE_END.finditer(text, pos):
        kind = m.lastgroup
        if kind == "line" and not _line_ends(text, m.end(), rule.lines):
            continue
        if (kind == "colon" and not rule.colon) or (kind == "cjk" and not rule.cjk):
            continue
        if kind == "stop" and rule.abbreviations and m.group().startswith(".") \
                and _abbreviation(text, m.start()):
            continue
        if kind == "blank" and rule.lines == "all":
            yield m.start() + 1  # every line ends one: the blank line's first break too
        yield m.end()


def _line_ends(text: str, after: int, lines: str) -> bool:
    if lines == "all":
        return True
    pattern = _CAPITAL_LINE if lines == "capital" else _LIST_ITEM
    return pattern.match(text, after) is not None


def _abbreviation(text: str, dot: int) -> bool:
    """Whether the period at ``dot`` ends an abbreviation or an initial (no sentence end)."""
    m = _LAST_WORD.search(text[:dot])
    if not m:
        return False
    word = m.group(1).lower().rstrip(".")
    if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return True
    nxt = text[dot + 1 :].lstrip()
    return bool(nxt) and nxt[0].islower()  # "... approx. three" / lowercase goes on


def sentence_spans(text: str, rule: SentenceRule) -> list[tuple[int, int]]:
    """The sentences of ``text`` under ``rule`` as whitespace-trimmed ``(start, end)`` spans
    (``text[start:end]`` is the sentence); a piece without a letter or digit is dropped, or
    joins the sentence before it under ``rule.join_stray``."""
    out: list[tuple[int, int]] = []
    start = 0
    for end in [*sentence_ends(text, rule), len(text)]:
        s, e = trim_span(text, start, end)
        start = end
        if s < e and any(ch.isalnum() for ch in text[s:e]):
            out.append((s, e))
        elif s < e and out and rule.join_stray:
            out[-1] = (out[-1][0], e)
    return out


#: Function words (see the module docstring); compared with lower-cased, accent-folded words.
STOP_WORDS = frozenset("""
a an the and or but nor not no yes if then than so such very as of in on at to for from by
with without about into onto over under is are was were be been being am do does did done has
have had having can could will would shall should may might must it its it's this that these
those there here what which who whom whose when where why how i me my we our us you your he
him his she her they them their also all any each every some more most other same just only
tell explain describe give show please say said
le la les un une des du de d l et ou en au aux dans sur pour par avec sans est sont qui que qu
quoi quel quelle quels quelles ce cet cette ces son sa ses leur leurs il elle ils elles on
el los las una unos unas del al y o con sin por para es son quien cual cuales como cuando donde
este esta estos estas ese esa su sus se lo
""".split())

__all__ = ["ABBREVIATIONS", "LINES", "OUTPUT", "PASSAGE", "SENTENCE_END", "STOP_WORDS",
           "SentenceRule", "sentence_ends", "sentence_spans"]
