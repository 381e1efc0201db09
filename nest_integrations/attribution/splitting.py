"""Splitting text into the units ``attribute`` judges: sentences, clauses of long ones, word
tokens for verbatim runs, and the candidate sentences of passages. Every span is exact:
``text[start:end]`` is the unit."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from nest_integrations.core.citations import trim_span
from nest_integrations.core.sentences import OUTPUT, sentence_spans
from nest_integrations.types import Passage

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CLAUSE = re.compile(
    r"[;:](?=\s)|,(?=\s+(?:and|but|or|which|while|who|whose|where|although|whereas|because|"
    r"so|yet|then|when)\b)|\s[–—-]\s"
)
_WORD_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def split_units(
    text: str, max_clause_chars: int = 160, min_clause_chars: int = 25
) -> list[tuple[int, int]]:
    """Sentences of ``text`` as ``(start, end)`` spans (whitespace-trimmed, exact), with
    sentences longer than ``max_clause_chars`` split into clauses (at ``;``, ``:``, dashes and
    ", and/but/which/..."); clauses shorter than ``min_clause_chars`` join a neighbour."""
    units = []
    for s, e in split_sentences(text):
        if e - s <= max_clause_chars:
            units.append((s, e))
        else:
            units.extend(_clauses(text, s, e, min_clause_chars))
    return units


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentences of ``text`` as whitespace-trimmed ``(start, end)`` spans (no clause split), by
    the package's sentence rule for answers (``core.sentences.OUTPUT``: a period after an
    abbreviation or an initial, or before a lower-case word, ends none; CJK full stops and list
    items do)."""
    return sentence_spans(text, OUTPUT)


def _clauses(text: str, s: int, e: int, min_chars: int) -> list[tuple[int, int]]:
    cuts = [s] + [s + m.end() for m in _CLAUSE.finditer(text[s:e])] + [e]
    pieces = [trim_span(text, a, b) for a, b in zip(cuts, cuts[1:])]
    pieces = [(a, b) for a, b in pieces if a < b]
    merged: list[tuple[int, int]] = []
    for a, b in pieces:
        if merged and (b - a < min_chars or merged[-1][1] - merged[-1][0] < min_chars):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged or [(s, e)]


def word_tokens(text: str) -> tuple[list[str], np.ndarray]:
    """The word tokenizer of verbatim runs: tokens and their ``(m, 2)`` char ranges."""
    found = [(m.group(), m.start(), m.end()) for m in _WORD_TOKEN.finditer(text)]
    offsets = np.array([(s, e) for _, s, e in found], dtype=np.int64).reshape(-1, 2)
    return [t for t, _, _ in found], offsets


@dataclass
class Candidate:
    """A sentence (or clause) of passage ``passage``: ``passages[passage].text[start:end]``."""

    passage: int
    start: int
    end: int
    text: str


def candidates(
    passages: Sequence[Passage], max_clause_chars: int, min_clause_chars: int
) -> list[Candidate]:
    """Every sentence of every passage, and the clauses of its long sentences."""
    out, seen = [], set()
    for pi, p in enumerate(passages):
        spans = split_sentences(p.text) + split_units(p.text, max_clause_chars, min_clause_chars)
        for s, e in spans:
            if (pi, s, e) not in seen:
                seen.add((pi, s, e))
                out.append(Candidate(pi, s, e, p.text[s:e]))
    return out
