"""Evidence first, then copy: the passage sentence that answers a question, chosen before decoding.

Attribute First, then Generate (ACL 2024) and FRONT (arXiv 2408.04568) pick the source sentences
first and generate from them; NEST then copies them, so the copied span *is* the evidence and its
citation points at the sentence that says the answer. This module holds the pure parts:

- ``sentence_spans``: the sentences of a passage, exact ``(start, end)`` spans. A sentence ends
  at ``.``/``!``/``?`` before whitespace, at ``:`` before a line break, at a blank line, or at a line break before a line
  that opens with an upper-case letter, a digit or a symbol (field lists such as
  ``Capital: Mapudo`` and wrapped prose both split right: a wrapped line goes on in lower case).
- ``overlap_scores``: how much of the question's content a sentence holds, each word weighted by
  its rarity among the candidate sentences (IDF over the candidates: the words every sentence of
  a document shares, such as its title, weigh little; the attribute asked for weighs most).
- ``EvidenceSpan`` and ``evidence_rows``: the chosen window as memory rows (``drafters.nest``
  copies from its first row and masks the rest of the memory).

No rule reads the question's wording: the scores depend only on which words a question and a
sentence share and on how rare they are among the candidates.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nest_integrations.core.sentences import PASSAGE, STOP_WORDS
from nest_integrations.core.sentences import sentence_spans as _sentence_spans

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class EvidenceSpan:
    """A window of one passage chosen as the answer's evidence: ``passage.text[start:end]``.

    ``sentence_end`` is where the best-scoring sentence ends (the window may go on past it).
    """

    passage_id: str
    start: int
    end: int
    score: float
    sentence_end: int | None = None


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as whitespace-trimmed ``(start, end)`` spans (see the module
    docstring: ``core.sentences.PASSAGE``); spans without a letter or digit are dropped."""
    return _sentence_spans(text, PASSAGE)


def content_words(text: str) -> list[str]:
    """Lower-cased, accent-folded words of ``text`` without function words, with a plural ``s``
    dropped (``statements`` counts as ``statement``)."""
    folded = unicodedata.normalize("NFKD", text.lower())
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    out = []
    for w in _WORD.findall(folded):
        if w in STOP_WORDS or w == "_" * len(w):
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


def overlap_scores(question: str, sentences: Sequence[str]) -> np.ndarray:
    """Per sentence, the IDF-weighted share of the question's content words it holds, in [0, 1].

    IDF is over ``sentences`` (``log(1 + n / df)``); a question word no sentence holds weighs as
    the rarest, so a question whose key word is missing everywhere scores low everywhere. A
    sentence whose content words are all the question's (a heading) scores 0: it holds no
    answer."""
    q = set(content_words(question))
    n = len(sentences)
    if not q or not n:
        return np.zeros(n)
    bags = [set(content_words(s)) for s in sentences]
    df = {w: sum(w in b for b in bags) for w in q}
    idf = {w: math.log(1.0 + n / max(df[w], 0.5)) for w in q}
    total = sum(idf.values())
    # a sentence with no word beyond the question's (a heading that restates it) answers nothing
    return np.array([sum(idf[w] for w in q & b) / total if b - q else 0.0 for b in bags])


def evidence_rows(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """The token positions ``[a, b)`` of a passage whose char ranges (``offsets``, ``(m, 2)``)
    overlap ``[start, end)``: the rows of the evidence window in that passage's memory."""
    if len(offsets) == 0:
        return 0, 0
    inside = (offsets[:, 1] > start) & (offsets[:, 0] < end)
    idx = np.flatnonzero(inside)
    if not len(idx):
        return 0, 0
    return int(idx[0]), int(idx[-1]) + 1


__all__ = ["STOP_WORDS", "EvidenceSpan", "content_words", "evidence_rows", "overlap_scores",
           "sentence_spans"]
