"""Choosing the evidence of an answer before decoding (``core.evidence``): the sentence of the
prompt's passages that best answers the question, and the window NEST copies from.

Scorers (``EVIDENCE_SCORERS``):

- ``"overlap"``: the IDF-weighted share of the question's content words the sentence holds
  (``core.evidence.overlap_scores``);
- ``"embedding"``: the cosine of question and sentence under the retriever's embedder (the
  packaged MiniLM when it has none), the sentence read after its document's title (a sentence
  that names its subject by a pronoun is still about it);
- ``"combined"``: their mean.

The window runs from the best sentence to the end of its passage (at most ``window_chars``
characters, cut at a sentence end): an explanation goes on where the passage goes on, and the
model's own end-of-answer decides where a short answer stops (``Guards.eos_guard``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from nest_integrations.core.evidence import EvidenceSpan, overlap_scores, sentence_spans
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

EVIDENCE_SCORERS = ("overlap", "embedding", "combined")
#: Scores this close to the best, in the best sentence's passage, are a tie (chosen on the dev
#: split: ``docs/decisions.md``, 'Evidence first, then copy').
EVIDENCE_TIE = 0.02


def choose_evidence(
    question: str,
    passages: Sequence[Passage],
    scorer: str = "overlap",
    retriever: Any = None,
    window_chars: int = 1200,
    tie: float = EVIDENCE_TIE,
) -> EvidenceSpan | None:
    """The evidence window for ``question`` in ``passages`` (the RA prompt's), or None when no
    passage has a sentence. Ties go to the earlier sentence (stage-1 order, then text order);
    within one passage, a sentence within ``tie`` of the best counts as tied."""
    if scorer not in EVIDENCE_SCORERS:
        raise ValueError(f"evidence scorer {scorer!r} is unknown: choose one of "
                         f"{EVIDENCE_SCORERS}")
    cands = [(p, s, e) for p in passages for s, e in sentence_spans(p.text)]
    if not cands:
        return None
    texts = [p.text[s:e] for p, s, e in cands]
    scores = np.zeros(len(cands))
    if scorer in ("overlap", "combined"):
        scores += overlap_scores(question, texts)
    if scorer in ("embedding", "combined"):  # each sentence read under its document's title
        scores += _cosines(question, [_titled(p, p.text[s:e]) for p, s, e in cands], retriever)
    if scorer == "combined":
        scores /= 2.0
    best = int(np.argmax(scores))  # the first of equal maxima
    first = _earliest_near_tie(cands, scores, best, tie, window_chars)
    p, s, e = cands[first]
    end = _window_end(p.text, s, max(e, cands[best][2]), window_chars)
    LOG.debug("evidence (%s %.3f): %r", scorer, scores[best], p.text[s:e][:80])
    return EvidenceSpan(p.id, s, end, float(scores[best]), sentence_end=e)


def _earliest_near_tie(cands: Sequence[tuple[Passage, int, int]], scores: np.ndarray,
                       best: int, tie: float, window_chars: int) -> int:
    """The earliest sentence of the best one's passage that scores within ``tie`` of it and
    whose window still holds it (else ``best``): the window starts there and runs on through
    the best sentence, so nothing the best sentence says is lost, and what the passage says
    before it (the definition a later "Today, ..." sentence builds on) is kept."""
    p_best, _, e_best = cands[best]
    for i, (p, s, _) in enumerate(cands[:best]):
        if p is p_best and scores[i] >= scores[best] - tie and e_best - s <= window_chars:
            return i
    return best


def _window_end(text: str, start: int, first_end: int, window_chars: int) -> int:
    """The end of the window that starts at ``start``: the last sentence end within
    ``window_chars`` of it (at least the first sentence's)."""
    end = first_end
    for s, e in sentence_spans(text):
        if s >= first_end and e - start <= window_chars:
            end = e
    return end


def _titled(passage: Passage, sentence: str) -> str:
    """``sentence`` as the embedder reads it: after its document's title, so that a sentence
    that names its subject only by a pronoun ("Its capital is Lilongwe.") is still about it."""
    title = str((passage.metadata or {}).get("title") or "").strip()
    return f"{title}: {sentence}" if title and title.lower() not in sentence.lower() else sentence


def _cosines(question: str, texts: Sequence[str], retriever: Any) -> np.ndarray:
    from nest_integrations.embedders.port import default_embedder, embed
    from nest_integrations.retrieval.relevance import embedder_of

    embedder = embedder_of(retriever) or default_embedder()
    m = embed(embedder, [question, *texts])
    return np.clip(m[1:] @ m[0], 0.0, 1.0)


__all__ = ["EVIDENCE_SCORERS", "choose_evidence"]
