"""Open-ended answer metrics (issue 22): content, degeneration, run-on into other documents,
and where the citations point. Pure functions (hand-computed cases in tests/test_quality.py).

- **ROUGE-L** (``rouge_l``): F-measure of the answer against the gold passage (``metrics.rouge``).
- **degenerate** (``degenerate``): the answer is empty, mostly punctuation (under half of its
  non-space characters are letters or digits), repeats a sentence or line, or loops on a phrase
  (``core.topic.repeat_start`` / ``loop_start``, with the text taken as ended), runs into junk
  (``core.topic.junk_start``: 4+ separators or 4+ empty lines in a row, what the relaxed modes'
  guard now cuts), or repeats one short line ``LINE_REPEATS`` times ("Python" line after line:
  the guards' 12-character line minimum lets it through; added after the first test-split run
  showed it, for every system alike).
- **junk** (``junky``): a rough pattern count of broken text that ``degenerate`` lets through:
  two commas with nothing between, a function word right before a comma ("was a, and"), a
  sentence that opens with punctuation, or a word doubled ("the the"). Added after the
  ``open-who`` prompts showed "Fred Rogers was a, and author,, Presbyterian minister", which
  ROUGE-L against the lead rewards.
- **run-on** (``other_document_tokens``): output tokens attributed to a passage of another
  document than the gold one: text that belongs to another document.
- **gold-cited share**: as in ``grounded.gold_cited_share``; **substantial citation**: the
  answer shows a citation of at least ``SUBSTANTIAL_WORDS`` words.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from nest_integrations.core.topic import citation_words, junk_start, loop_start, repeat_start

#: Words of a citation counted as a substantial copy (the issue's ">= 4-word citation").
SUBSTANTIAL_WORDS = 4


#: Times one non-empty line may occur before the answer is degenerate.
LINE_REPEATS = 3


def degenerate(text: str) -> bool:
    """Empty, mostly punctuation, a repeated sentence or line, a phrase loop, junk, or a short
    line repeated (see the module docstring)."""
    chars = [ch for ch in text if not ch.isspace()]
    if not chars:
        return True
    if sum(ch.isalnum() for ch in chars) < 0.5 * len(chars):
        return True
    if junk_start(text) is not None:
        return True
    lines = [ln.strip().lower() for ln in text.splitlines() if ln.strip()]
    if lines and max(lines.count(ln) for ln in set(lines)) >= LINE_REPEATS:
        return True
    return repeat_start(text, final=True) is not None or loop_start(text, final=True) is not None


#: See ``junky``: ",," / "a," / an opening "," / a doubled word.
JUNK_PATTERN = re.compile(r",\s*,|\b(a|an|the|of|and|was|is)\s*,|^\s*[,.;]|\b(\w+) \2\b",
                          re.IGNORECASE)


def junky(text: str) -> bool:
    """Whether ``text`` holds junk (``JUNK_PATTERN``; see the module docstring)."""
    return JUNK_PATTERN.search(text) is not None


def other_document_tokens(
    token_sources: Sequence[Any], passages: Sequence[Any], gold_doc_id: str | None
) -> int:
    """Output tokens attributed to a passage whose document is not ``gold_doc_id``."""
    doc_of = {p.id: p.doc_id for p in passages}
    return sum(1 for s in token_sources if s is not None and doc_of.get(s[0]) != gold_doc_id)


def substantial_citation(citations: Sequence[Any], min_words: int = SUBSTANTIAL_WORDS) -> bool:
    """Whether some citation holds at least ``min_words`` words."""
    return any(citation_words(c.text) >= min_words for c in citations)


def rouge_l(prediction: str, reference: str, scorer: Any = None) -> float:
    """ROUGE-L F-measure of ``prediction`` against ``reference`` (0 for an empty answer)."""
    if not prediction.strip():
        return 0.0
    from nest_integrations.evaluation.metrics import rouge

    return rouge(prediction, reference, scorer)["rougeL"]["f"]


__all__ = ["JUNK_PATTERN", "LINE_REPEATS", "SUBSTANTIAL_WORDS", "degenerate", "junky",
           "other_document_tokens", "rouge_l", "substantial_citation"]
