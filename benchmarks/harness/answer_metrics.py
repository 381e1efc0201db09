"""What a person reading one answer sees, as pure functions (issue 60; tests:
``tests/benchmarks/test_answer_metrics.py``). ``python -m benchmarks.answers`` scores every
answer with ``score``; ``benchmarks.harness.answer_summary`` pools them.

Sentences (``sentence_spans``): a blank line ends a paragraph; inside one, ``.``, ``!`` or
``?`` (closing quotes and brackets after it) followed by whitespace and then not a lower-case
letter ends a sentence, except after ``e.g.``, ``i.e.``, ``etc.``, ``cf.``, ``vs.`` and a
single capital's initial ("P."). A single newline does not end a sentence: the shipped pydoc
topics and FOLDOC wrap their lines. ``first_sentence`` joins the first sentence's lines.

Per answer (``score``):

- **right** (factoid families): the gold value occurs in the normalised answer as whole words
  and no distractor does (``evaluation.grounded.answer_correct``, over
  ``evaluation.metrics.normalize_answer``);
- **cited**: the answer shows a quote, a citation of kind ``copy`` or ``verbatim``
  (``CITED_KINDS``; ``support`` citations, a passage that backs a sentence written in other
  words, are counted apart in ``n_support``);
- **cited on gold**: a quote from the gold document; for a factoid it must hold the gold value;
- **cited wrong**: a wrong factoid answer that shows a quote;
- **run-on** (right factoid answers): text past the end of the sentence that holds the value,
  beyond whitespace and punctuation (``run_on``);
- **opens with lead** (definitional and explanatory families): ROUGE-L F1
  (``evaluation.open_ended.rouge_l``: ``rouge_score`` with its stemmer) of the answer's first
  sentence against the gold sentence (the entry's definition, the topic's lead sentence) is at
  least ``LEAD_THRESHOLD``; why 0.5 is in ``benchmarks/results/answers_dev.md`` (10 answers
  checked by hand);
- **ends mid-clause**: the answer ended on its own (``finish_reason`` ``"stop"``, or
  ``"repeat"``: the engine's repeat guard ended it, not the token budget) and its last
  character is not a sentence end, a closing quote or the end of a code block
  (``ends_mid_clause``). ``ENDED`` names those finish reasons.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from nest_integrations.evaluation.grounded import answer_correct
from nest_integrations.evaluation.metrics import normalize_answer

#: Finish reasons of an answer that ended on its own (not at ``max_new_tokens``).
ENDED = ("stop", "repeat")
#: Citation kinds that show the answer's text as a quote of the corpus.
CITED_KINDS = ("copy", "verbatim")
#: ROUGE-L F1 of the first sentence against the gold sentence from which an answer "opens with
#: the lead" (module docstring).
LEAD_THRESHOLD = 0.5

_PARA = re.compile(r"\n[ \t]*\n\s*")
_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s+[^a-z\s]|\s*$)")
_ABBREV = re.compile(r"(\b(e\.g|i\.e|etc|cf|vs)|(?<![\w.])[A-Z])\.$")
_CLOSERS = "\"'\u201d\u2019)]"
_QUOTES = "\"'\u201d\u2019"


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every sentence of ``text`` (module docstring), whitespace around
    them left out."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for para in [*_PARA.finditer(text), None]:
        stop = para.start() if para else len(text)
        start = pos
        for m in _END.finditer(text, pos, stop):
            if _ABBREV.search(text, start, m.start() + 1):
                continue
            spans.append((start, m.end()))
            start = m.end()
        spans.append((start, stop))
        pos = para.end() if para else len(text)
    out = []
    for a, b in spans:
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, each with its lines joined by single spaces."""
    return [" ".join(text[a:b].split()) for a, b in sentence_spans(text)]


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` ("" for none)."""
    found = sentences(text)
    return found[0] if found else ""


def right(text: str, answer: str, distractors: Iterable[str] = ()) -> bool:
    """The gold value in the answer, no distractor (``grounded.answer_correct``)."""
    return answer_correct(text, answer, distractors)


def _get(c: Any, key: str) -> Any:
    return c.get(key) if isinstance(c, dict) else getattr(c, key)


def quotes(citations: Sequence[Any]) -> list[Any]:
    """The citations of ``CITED_KINDS`` (dicts or ``Citation``s)."""
    return [c for c in citations if _get(c, "kind") in CITED_KINDS]


def cited_on_gold(citations: Sequence[Any], gold_doc_id: str, answer: str | None = None
                  ) -> bool:
    """Some quote is from ``gold_doc_id`` (and holds ``answer``, when given, as normalised
    whole words)."""
    for c in quotes(citations):
        if _get(c, "doc_id") != gold_doc_id:
            continue
        if answer is None or f" {normalize_answer(answer)} " in \
                f" {normalize_answer(_get(c, 'text'))} ":
            return True
    return False


def value_span(text: str, answer: str) -> tuple[int, int] | None:
    """Where ``answer`` first occurs in ``text``: case-insensitively as written, else the
    first sentence whose normalised text holds it (None when neither)."""
    i = text.lower().find(answer.lower())
    if i >= 0:
        return i, i + len(answer)
    norm = normalize_answer(answer)
    for a, b in sentence_spans(text):
        if norm and f" {norm} " in f" {normalize_answer(text[a:b])} ":
            return a, b
    return None


def run_on(text: str, answer: str) -> bool:
    """Text past the end of the sentence that holds ``answer``, beyond whitespace and
    punctuation (False when the answer is not in ``text``)."""
    where = value_span(text, answer)
    if where is None:
        return False
    end = next((b for a, b in sentence_spans(text) if b >= where[1]), len(text))
    return any(ch.isalnum() for ch in text[end:])


def lead_overlap(text: str, gold_sentence: str) -> float:
    """ROUGE-L F1 of ``text``'s first sentence against ``gold_sentence`` (0 for no text)."""
    from nest_integrations.evaluation.open_ended import rouge_l

    first = first_sentence(text)
    return rouge_l(first, gold_sentence) if first else 0.0


def opens_with_lead(text: str, gold_sentence: str, threshold: float = LEAD_THRESHOLD) -> bool:
    """``lead_overlap`` at least ``threshold``."""
    return lead_overlap(text, gold_sentence) >= threshold


def ends_mid_clause(text: str, finish_reason: str) -> bool:
    """The answer ended on its own (``ENDED``) and stops inside a clause: its last character
    (trailing whitespace aside) is none of a sentence end (``.!?…``, closing brackets after it
    allowed), a closing quote, the end of a fenced code block or a line of an indented code
    block."""
    if finish_reason not in ENDED:
        return False
    body = text.rstrip()
    if not body or body.endswith("```"):
        return False
    last_line = body.rsplit("\n", 1)[-1]
    if "\n" in body and last_line[:1] in (" ", "\t"):
        return False
    core = body.rstrip(_CLOSERS)
    if len(core) < len(body) and any(ch in _QUOTES for ch in body[len(core):]):
        return False
    return core[-1:] not in (".", "!", "?", "\u2026")


def score(kind: str, text: str, finish_reason: str, citations: Sequence[Any],
          gold_doc_id: str, answer: str = "", distractors: Iterable[str] = (),
          gold_sentence: str = "") -> dict[str, Any]:
    """The metrics of one answer (module docstring): ``kind`` ``"factoid"`` (``answer``,
    ``distractors``) or ``"lead"`` (``gold_sentence``)."""
    shown = quotes(citations)
    out: dict[str, Any] = {
        "cited": bool(shown), "n_quotes": len(shown),
        "n_support": sum(_get(c, "kind") == "support" for c in citations),
        "first_sentence": first_sentence(text),
        "mid_clause": ends_mid_clause(text, finish_reason),
    }
    if kind == "factoid":
        ok = right(text, answer, distractors)
        out.update(right=ok, cited_on_gold=ok and cited_on_gold(citations, gold_doc_id, answer),
                   cited_wrong=not ok and bool(shown), run_on=ok and run_on(text, answer))
    elif kind == "lead":
        overlap = lead_overlap(text, gold_sentence)
        out.update(lead_overlap=round(overlap, 4), opens_with_lead=overlap >= LEAD_THRESHOLD,
                   cited_on_gold=cited_on_gold(citations, gold_doc_id))
    else:
        raise ValueError(f"kind={kind!r} is invalid: use 'factoid' or 'lead'")
    return out


__all__ = ["CITED_KINDS", "ENDED", "LEAD_THRESHOLD", "cited_on_gold", "ends_mid_clause",
           "first_sentence", "lead_overlap", "opens_with_lead", "quotes", "right", "run_on",
           "score", "sentence_spans", "sentences", "value_span"]
