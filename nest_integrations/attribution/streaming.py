"""Attributing a growing text one complete sentence at a time (the engine's stream), and the
check that every sentence of an answer is cited or flagged (``unaccounted``)."""

from __future__ import annotations

from typing import Callable, Sequence, Union

from nest_integrations.attribution.attributor import Attributor
from nest_integrations.attribution.results import Attribution, SentenceAttribution
from nest_integrations.attribution.splitting import split_sentences, split_units
from nest_integrations.core.citations import make_citation
from nest_integrations.types import Citation, Passage, UnsupportedSentence

#: The answer's own citations so far, or a function that gives them (called only when needed).
Cited = Union[Sequence[Citation], Callable[[], Sequence[Citation]]]


class SentenceStream:
    """Attribute a growing text one complete sentence at a time (the engine's stream).

    ``feed(text)`` judges the sentences of ``text`` that are complete (a later sentence has
    begun, so their end is final) and not judged yet, against the text up to their end
    (``Attributor.__call__`` with ``span``); ``feed(text, final=True)`` judges the rest. Each
    sentence is judged once, and a sentence's verdict never depends on the text after it
    (verbatim runs stay inside a sentence), so feeding the text piece by piece gives the same
    ``support`` and verdicts as feeding it whole (raw scores may differ in the 7th digit: the
    embedder batches the units differently).

    ``support`` holds what it adds to the answer's own citations (the engine cites its copies
    itself): the support citations, and one for each sentence judged verbatim that none of the
    answer's own citations (``cited``, given to ``feed``) overlaps (score 1.0: the passage
    sentences holding its verbatim runs). So every sentence ends up cited or in
    ``unsupported`` (``unaccounted`` is empty).
    """

    def __init__(self, attributor: Attributor, passages: Sequence[Passage | str]) -> None:
        self.attributor = attributor
        self.passages = list(passages)
        self.done = 0  # sentences starting before this char are judged
        self.support: list[Citation] = []
        self.unsupported: list[UnsupportedSentence] = []
        self.sentences: list[SentenceAttribution] = []
        self.time = 0.0

    def feed(self, text: str, final: bool = False, cited: Cited = ()) -> Attribution | None:
        """The attribution of the sentences completed by ``text`` (None when there are none;
        its ``citations`` are the new ``support`` citations)."""
        sentences = split_sentences(text)
        if not final:
            sentences = sentences[:-1]  # the last one may still grow
        new = [(s, e) for s, e in sentences if s >= self.done]
        if not new:
            return None
        end = len(text) if final else new[-1][1]
        found = self.attributor(text[:end], self.passages, span=(new[0][0], end))
        support = [c for c in found.citations if c.kind == "support"]
        bare = [u for u in found.sentences if u.verdict == "verbatim"]
        if bare:
            own = cited() if callable(cited) else cited
            bare = [u for u in bare if not _overlapped(u.start, u.end, own)]
        runs = [c for c in found.citations if c.kind == "verbatim"]
        by_id = {p.id: p for p in found.passages}
        support += [c for c in (_verbatim_support(u, runs, by_id) for u in bare) if c is not None]
        found.citations = sorted(support, key=lambda c: (c.start, c.end))
        self.done = end
        self.support += found.citations
        self.unsupported += found.unsupported
        self.sentences += found.sentences
        self.time += found.time
        return found


def unaccounted(text: str, citations: Sequence[Citation],
                unsupported: Sequence[UnsupportedSentence]) -> list[tuple[int, int]]:
    """The units of ``text`` (``split_units``) that no citation overlaps and that are not
    flagged in ``unsupported``: empty for an answer the engine attributed
    (``NestConfig.attribute``), whatever its method."""
    flagged = {(u.start, u.end) for u in unsupported}
    return [(s, e) for s, e in split_units(text)
            if (s, e) not in flagged and not _overlapped(s, e, citations)]


def _verbatim_support(unit: SentenceAttribution, runs: Sequence[Citation],
                      passages: dict[str, Passage]) -> Citation | None:
    """The support citation of a verbatim ``unit`` that the answer's citations miss: the
    sentences of its main passage that hold the unit's verbatim runs from that passage (None
    without runs: a verbatim verdict always has some)."""
    mine = [c for c in runs if c.passage_id == unit.passage_id
            and c.start < unit.end and unit.start < c.end]
    if not mine:
        return None
    passage = passages[mine[0].passage_id]
    lo, hi = min(c.passage_start for c in mine), max(c.passage_end for c in mine)
    spans = [(s, e) for s, e in split_sentences(passage.text) if s < hi and lo < e]
    if spans:
        lo, hi = min(lo, spans[0][0]), max(hi, spans[-1][1])
    return make_citation(passage, unit.start, unit.end, lo, hi,
                         max(sum(c.n_tokens for c in mine), 1), "support", 1.0)


def _overlaps(c: Citation, s: int, e: int) -> bool:
    return c.start < e and s < c.end


def _overlapped(s: int, e: int, citations: Sequence[Citation]) -> bool:
    return any(_overlaps(c, s, e) for c in citations)
