"""Attributing a growing text one complete sentence at a time (the engine's stream)."""

from __future__ import annotations

from typing import Sequence

from nest_integrations.attribution.attributor import Attributor
from nest_integrations.attribution.results import Attribution, SentenceAttribution
from nest_integrations.attribution.splitting import split_sentences
from nest_integrations.types import Citation, Passage, UnsupportedSentence


class SentenceStream:
    """Attribute a growing text one complete sentence at a time (the engine's stream).

    ``feed(text)`` judges the sentences of ``text`` that are complete (a later sentence has
    begun, so their end is final) and not judged yet, against the text up to their end
    (``Attributor.__call__`` with ``span``); ``feed(text, final=True)`` judges the rest. Each
    sentence is judged once, and a sentence's verdict never depends on the text after it
    (verbatim runs stay inside a sentence), so feeding the text piece by piece gives the same
    ``support`` and verdicts as feeding it whole (raw scores may differ in the 7th digit: the
    embedder batches the units differently). ``support`` holds the support citations only
    (the engine cites its copies itself).
    """

    def __init__(self, attributor: Attributor, passages: Sequence[Passage | str]) -> None:
        self.attributor = attributor
        self.passages = list(passages)
        self.done = 0  # sentences starting before this char are judged
        self.support: list[Citation] = []
        self.unsupported: list[UnsupportedSentence] = []
        self.sentences: list[SentenceAttribution] = []
        self.time = 0.0

    def feed(self, text: str, final: bool = False) -> Attribution | None:
        """The attribution of the sentences completed by ``text`` (None when there are none;
        its ``citations`` are the new support citations)."""
        sentences = split_sentences(text)
        if not final:
            sentences = sentences[:-1]  # the last one may still grow
        new = [(s, e) for s, e in sentences if s >= self.done]
        if not new:
            return None
        end = len(text) if final else new[-1][1]
        found = self.attributor(text[:end], self.passages, span=(new[0][0], end))
        found.citations = [c for c in found.citations if c.kind == "support"]
        self.done = end
        self.support += found.citations
        self.unsupported += found.unsupported
        self.sentences += found.sentences
        self.time += found.time
        return found
