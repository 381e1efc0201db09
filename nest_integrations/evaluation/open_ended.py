"""Open-ended answer metrics: content, degeneration, run-on into other documents, and where the
citations point. Pure functions (hand-computed cases in tests/evaluation/test_quality.py).

- **ROUGE-L** (``rouge_l``): F-measure of the answer against the gold passage (``metrics.rouge``).
- **degenerate** (``degenerate``): the answer is empty, mostly punctuation (under half of its
  non-space characters are letters or digits), repeats a sentence or line, or loops on a phrase
  (``core.guards.repeat_start`` / ``loop_start``, with the text taken as ended), runs into junk
  (``core.guards.junk_start``: 4+ separators or 4+ empty lines in a row), or repeats one short
  line ``LINE_REPEATS`` times (a line the guards' 12-character minimum lets through).
- **junk** (``junky``): a rough pattern count of broken text that ``degenerate`` lets through:
  two commas with nothing between, a function word right before a comma ("was a, and"), a
  sentence that opens with punctuation, or a word doubled ("the the"); ROUGE-L against the
  lead rewards such copies.
- **run-on** (``other_document_tokens``): output tokens attributed to a passage of another
  document than the gold one: text that belongs to another document.
- **gold-cited share**: as in ``grounded.gold_cited_share``; **substantial citation**: the
  answer shows a citation of at least ``SUBSTANTIAL_WORDS`` words.

``score`` turns one answer into a record of these; ``summarize`` pools records per system
(ROUGE-L with a bootstrap interval, paired difference to a reference system), and
``markdown_table`` shows the summary.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from nest_integrations.core.guards import citation_words, junk_start, loop_start, repeat_start

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


def score(result: Any, question: Any, scorer: Any = None) -> dict[str, Any]:
    """The open-ended metrics of one answer (a ``NestResult``) to an ``OpenQuestion``."""
    from nest_integrations.evaluation.grounded import gold_cited_share

    cites = list(result.citations)
    return {
        "text": result.text,
        "rouge_l": rouge_l(result.text, question.gold_text, scorer),
        "degenerate": degenerate(result.text),
        "junk": junky(result.text),
        "other_doc_tokens": other_document_tokens(result.token_sources, result.passages,
                                                  question.gold_doc_id),
        "substantial_citation": substantial_citation(cites),
        "cited_chars": sum(len(c.text) for c in cites),
        "gold_cited_chars": sum(len(c.text) for c in cites if c.doc_id == question.gold_doc_id),
        "gold_cited_share": gold_cited_share(cites, question.gold_doc_id),
        "new_tokens": result.stats.new_tokens, "time_total": result.stats.time_total,
        "finish_reason": result.stats.finish_reason,
    }


def summarize(records: Sequence[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    """One row per system (first-seen order): ROUGE-L (bootstrap 95% CI) and its paired
    difference to ``reference``, degenerate and junk counts, run-on and gold-cited shares,
    substantial citations, tokens/s."""
    from nest_integrations.evaluation import stats

    systems = list(dict.fromkeys(r["system"] for r in records))
    ref = {r["question_id"]: r for r in records if r["system"] == reference}
    rows = []
    for s in systems:
        rs = [r for r in records if r["system"] == s]
        new = sum(r["new_tokens"] for r in rs)
        cited = sum(r["cited_chars"] for r in rs)
        t = sum(r["time_total"] for r in rs)
        rl, lo, hi = stats.bootstrap_ci([r["rouge_l"] for r in rs])
        row = {
            "system": s, "n": len(rs), "rouge_l": rl, "rouge_l_ci": (lo, hi),
            "degenerate": sum(r["degenerate"] for r in rs),
            "junk": sum(r["junk"] for r in rs),
            "run_on_share": sum(r["other_doc_tokens"] for r in rs) / new if new else None,
            "substantial": sum(r["substantial_citation"] for r in rs),
            "gold_cited_share": (sum(r["gold_cited_chars"] for r in rs) / cited
                                 if cited else None),
            "tokens_per_s": new / t if t else None,
        }
        if s != reference and ref:
            common = [r for r in rs if r["question_id"] in ref]
            row["rouge_l_diff"] = stats.paired_bootstrap_diff(
                [r["rouge_l"] for r in common], [ref[r["question_id"]]["rouge_l"] for r in common])
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[dict[str, Any]], reference: str) -> str:
    """``summarize``'s rows as a Markdown table."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    lines = ["| system | n | ROUGE-L (95% CI) | vs " + reference + " (diff, 95% CI) | "
             "degenerate | junk | run-on (other-doc tokens) | >= 4-word citation | "
             "gold-cited chars | tok/s | vs " + reference + " speed |", "|" + "---|" * 11]
    ref_tps = next((r["tokens_per_s"] for r in rows if r["system"] == reference), None)
    for r in rows:
        lo, hi = r["rouge_l_ci"]
        d = r.get("rouge_l_diff")
        diff = f"{100 * d[0]:+.1f} ({100 * d[1]:+.1f}, {100 * d[2]:+.1f})" if d else "-"
        tps = r["tokens_per_s"]
        sp = f"{tps / ref_tps:.2f}x" if tps and ref_tps else "-"
        lines.append(
            f"| {r['system']} | {r['n']} | {100 * r['rouge_l']:.1f} ({100 * lo:.1f}-"
            f"{100 * hi:.1f}) | {diff} | {r['degenerate']}/{r['n']} | {r['junk']}/{r['n']} "
            f"| {pct(r['run_on_share'])} | {r['substantial']}/{r['n']} | "
            f"{pct(r['gold_cited_share'])} | {'-' if tps is None else f'{tps:.1f}'} | {sp} |")
    return "\n".join(lines)


__all__ = ["JUNK_PATTERN", "LINE_REPEATS", "SUBSTANTIAL_WORDS", "degenerate", "junky",
           "markdown_table", "score", "summarize",
           "other_document_tokens", "rouge_l", "substantial_citation"]
