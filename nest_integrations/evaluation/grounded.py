"""Grounded-QA metrics: is the answer right, are its citations on the right document, does it
copy off-topic text, does it run on past the answer? Pure functions (hand-computed cases in
tests/evaluation/test_evaluation.py).

Definitions (one question, one output):

- **correct** (``answer_correct``): the normalised output (``metrics.normalize_answer``: lower
  case, no punctuation or articles) contains the normalised gold answer as whole words, AND
  contains none of the distractors -- the values the same attribute takes for the other
  entities -- as whole words. "The founding year of B is 1990" for A's 1987 is wrong; so is
  "1987 or 1990". Keyword questions (``keyword_correct``): every ``must`` word and no
  ``must_not`` phrase.
- **gold-cited share** (``gold_cited_share``): characters of ``result.citations`` whose
  document is the gold one, over all cited characters (None without citations).
- **off-topic copied tokens** (``off_topic_tokens``): output tokens with a corpus source
  (``result.token_sources`` not None: copied spans and token-mode attributions) whose passage
  belongs to another document than the gold one.
- **run-on tokens** (``run_on_tokens``): output tokens that start after the first sentence end
  (``.``, ``!``, ``?`` followed by whitespace or the end, or a newline) that follows the answer.
  The answer is found case-insensitively: the gold answer's first occurrence, else the first
  distractor's, else the start of the output. With no such sentence end there is no run-on.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from nest_integrations.core.sentences import LINES, sentence_ends
from nest_integrations.evaluation.metrics import normalize_answer


def _contains(norm_text: str, phrase: str) -> bool:
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {norm_text} "


def answer_correct(text: str, answer: str, distractors: Iterable[str] = ()) -> bool:
    """Gold answer present (normalised, whole words) and no distractor present."""
    norm = normalize_answer(text)
    if not _contains(norm, answer):
        return False
    return not any(_contains(norm, d) for d in distractors)


def keyword_correct(text: str, must: Iterable[str], must_not: Iterable[str] = ()) -> bool:
    """Every ``must`` phrase present and no ``must_not`` phrase present (normalised)."""
    norm = normalize_answer(text)
    return all(_contains(norm, w) for w in must) and not any(_contains(norm, w) for w in must_not)


def wrong_entity(text: str, distractors: Iterable[str]) -> bool:
    """The output names another entity's value for the attribute."""
    norm = normalize_answer(text)
    return any(_contains(norm, d) for d in distractors)


def gold_cited_share(citations: Sequence[Any], gold_doc_id: str | None) -> float | None:
    """Share of cited characters whose citation's ``doc_id`` is the gold document."""
    total = sum(len(c.text) for c in citations)
    if total == 0 or gold_doc_id is None:
        return None
    return sum(len(c.text) for c in citations if c.doc_id == gold_doc_id) / total


def off_topic_tokens(
    token_sources: Sequence[Any], passages: Sequence[Any], gold_doc_id: str | None
) -> int:
    """Output tokens attributed to a passage of another document than ``gold_doc_id`` (all
    attributed tokens when there is no gold document)."""
    doc_of = {p.id: p.doc_id for p in passages}
    n = 0
    for src in token_sources:
        if src is None:
            continue
        if gold_doc_id is None or doc_of.get(src[0]) != gold_doc_id:
            n += 1
    return n


def token_char_ends(lm: Any, token_ids: Sequence[int]) -> list[int]:
    """End character of each token in ``lm.detokenize(token_ids)`` (prefix decoding)."""
    return [len(lm.detokenize(list(token_ids[: i + 1]))) for i in range(len(token_ids))]


def answer_end(text: str, answer: str | None, distractors: Iterable[str] = ()) -> int:
    """Where the answer ends in ``text`` (see the module docstring); 0 when not found."""
    low = text.lower()
    for cand in ([answer] if answer else []) + list(distractors):
        i = low.find(cand.lower())
        if i >= 0:
            return i + len(cand)
    return 0


def run_on_start(text: str, answer: str | None, distractors: Iterable[str] = ()) -> int | None:
    """Character position after the first sentence end that follows the answer (None: none)."""
    # a space after the text lets a sentence end at its very end (``core.sentences.LINES``)
    return next(sentence_ends(text + " ", LINES, answer_end(text, answer, distractors)), None)


def run_on_tokens(
    text: str,
    token_ends: Sequence[int],
    answer: str | None,
    distractors: Iterable[str] = (),
) -> int:
    """Output tokens that start at or after ``run_on_start`` (token ``i`` starts at
    ``token_ends[i-1]``). Whitespace-only tail tokens count too: they are output."""
    cut = run_on_start(text, answer, distractors)
    if cut is None or cut >= len(text):
        return 0
    starts = [0] + list(token_ends[:-1])
    return sum(1 for s in starts if s >= cut)


def meaningful_citations(citations: Sequence[Any], min_tokens: int) -> list[Any]:
    """The citations a user should see: spans of at least ``min_tokens`` tokens (order kept).

    One-token token-mode attributions (" at" cited to an unrelated page) are provenance, not
    citations; they stay in ``token_sources`` and the stats. ``min_tokens <= 1`` keeps all.
    """
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise ValueError(f"min_tokens={min_tokens!r} is invalid: use an integer >= 0")
    return [c for c in citations if int(c.n_tokens) >= min_tokens]


__all__ = [
    "answer_correct",
    "answer_end",
    "gold_cited_share",
    "keyword_correct",
    "meaningful_citations",
    "off_topic_tokens",
    "run_on_start",
    "run_on_tokens",
    "token_char_ends",
    "wrong_entity",
]
