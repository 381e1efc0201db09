"""Pooling the per-answer metrics of ``python -m benchmarks.answers`` into rates with 95%
intervals, and paired comparisons that respect phrasing clusters (issue 60; tests:
``tests/benchmarks/test_answer_metrics.py``).

- ``rate_ci``: a rate over prompts with its 95% **Wilson** interval (``evaluation.stats``).
  When some question has several phrasings in the group, they are not independent: the
  interval is then Wilson's at the rate over prompts but with **one observation per question**
  (n = questions, k = rate x questions: the design effect of fully correlated phrasings, so
  the interval is conservative). A percentile cluster bootstrap was tried first and gave
  [0, 0] for 0 of 16 prompts on 8 questions, too tight to report.
- ``paired``: system A against B on the same prompts, **clustered by question**: a question is
  won by A when A is right on more of its phrasings than B, lost when on fewer, tied
  otherwise; p is the exact two-sided sign test over won and lost questions (with one phrasing
  per question this is McNemar's exact test).
- ``summarize``: one row per (family, system) with n prompts, n questions and each metric of
  ``answer_metrics`` over its denominator (right answers for cited-on-gold and run-on, wrong
  answers for cited-wrong, answers that ended on their own, ``answer_metrics.ENDED``, for
  mid-clause); ``markdown``
  shows them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from benchmarks.harness.answer_metrics import ENDED
from nest_integrations.evaluation import stats

#: (metric, which answers it is a rate over, label) per family kind.
FACTOID_RATES = (("right", None, "right"),
                 ("cited_on_gold", "right", "right answers cited on gold"),
                 ("cited_wrong", "wrong", "wrong answers cited"),
                 ("run_on", "right", "right answers that run on"),
                 ("mid_clause", "stopped", "answers that ended on their own ending mid-clause"))
LEAD_RATES = (("opens_with_lead", None, "opens with the lead"),
              ("cited_on_gold", None, "cited on gold"),
              ("mid_clause", "stopped", "answers that ended on their own ending mid-clause"))


def rate_ci(pairs: Sequence[tuple[str, bool]]) -> dict[str, Any]:
    """``{"k", "n", "rate", "lo", "hi", "method"}`` for ``(question id, success)`` pairs
    (module docstring); NaNs for no pairs."""
    k, n = sum(bool(s) for _, s in pairs), len(pairs)
    clusters: dict[str, list[bool]] = {}
    for q, s in pairs:
        clusters.setdefault(q, []).append(bool(s))
    if n == 0:
        return {"k": 0, "n": 0, "rate": math.nan, "lo": math.nan, "hi": math.nan,
                "method": "wilson"}
    if all(len(v) == 1 for v in clusters.values()):
        lo, hi = stats.wilson_ci(k, n)
        return {"k": k, "n": n, "rate": k / n, "lo": lo, "hi": hi, "method": "wilson"}
    q = len(clusters)
    lo, hi = stats.wilson_ci(k / n * q, q)
    return {"k": k, "n": n, "rate": k / n, "lo": lo, "hi": hi, "method": "wilson per question"}


def paired(a: Sequence[tuple[str, bool]], b: Sequence[tuple[str, bool]]) -> dict[str, Any]:
    """A against B clustered by question (module docstring): ``{"questions", "won", "lost",
    "tied", "p"}``. ``a`` and ``b`` are ``(question id, right)`` pairs over the same prompts."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    per: dict[str, list[int]] = {}
    for (qa, x), (qb, y) in zip(a, b):
        if qa != qb:
            raise ValueError(f"prompts are not paired: question {qa!r} against {qb!r}")
        per.setdefault(qa, [0, 0])
        per[qa][0] += bool(x)
        per[qa][1] += bool(y)
    won = sum(x > y for x, y in per.values())
    lost = sum(x < y for x, y in per.values())
    return {"questions": len(per), "won": won, "lost": lost, "tied": len(per) - won - lost,
            "p": stats.binom_two_sided(won, won + lost)}


def _denominator(rec: dict[str, Any], over: str | None) -> bool:
    if over is None:
        return True
    if over == "right":
        return bool(rec.get("right"))
    if over == "wrong":
        return not rec.get("right")
    if over == "stopped":
        return rec.get("finish") in ENDED
    raise ValueError(f"unknown denominator {over!r}")


def summarize(records: Sequence[dict[str, Any]], systems: Sequence[str],
              reference: str = "rag", held_out: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per (family, system) over the prompts every system answered."""
    rows = []
    for fam in dict.fromkeys(r["family"] for r in records):
        by = {s: {(r["qid"], r["prompt"]): r for r in records
                  if r["family"] == fam and r["system"] == s} for s in systems}
        keys = sorted(set.intersection(*(set(v) for v in by.values()))) if by else []
        if not keys:
            continue
        kind = by[systems[0]][keys[0]]["kind"]
        for s in systems:
            rr = [by[s][k] for k in keys]
            row: dict[str, Any] = {"family": fam, "held_out": fam in held_out, "system": s,
                                   "kind": kind, "n": len(rr),
                                   "questions": len({r["qid"] for r in rr}),
                                   "seconds": sum(r["seconds"] for r in rr) / len(rr),
                                   "tok_s": sum(r["tokens"] for r in rr)
                                   / max(1e-9, sum(r["seconds"] for r in rr))}
            for metric, over, _ in (FACTOID_RATES if kind == "factoid" else LEAD_RATES):
                row[metric] = rate_ci([(r["qid"], bool(r.get(metric))) for r in rr
                                       if _denominator(r, over)])
            if kind == "lead":
                row["rouge_l"] = 100 * sum(r.get("rouge_l", 0.0) for r in rr) / len(rr)
            head = "right" if kind == "factoid" else "opens_with_lead"
            if s != reference and reference in by:
                row["vs_reference"] = paired([(k[0], bool(by[s][k].get(head))) for k in keys],
                                             [(k[0], bool(by[reference][k].get(head)))
                                              for k in keys])
            rows.append(row)
    return rows


def _cell(x: dict[str, Any]) -> str:
    if not x["n"]:
        return "-"
    return (f"{x['k']}/{x['n']} = {100 * x['rate']:.0f}% "
            f"[{100 * x['lo']:.0f}, {100 * x['hi']:.0f}]{'' if x['method'] == 'wilson' else '*'}")


def markdown(rows: Sequence[dict[str, Any]], reference: str = "rag") -> list[str]:
    """The result tables (factoid and lead families apart); ``*`` marks an interval with one
    observation per question (``rate_ci``)."""
    out: list[str] = []
    for kind, rates, head in (("factoid", FACTOID_RATES, "right"),
                              ("lead", LEAD_RATES, "opens with the lead")):
        rr = [r for r in rows if r["kind"] == kind]
        if not rr:
            continue
        extra = ["ROUGE-L (whole answer vs gold)"] if kind == "lead" else []
        out += ["", f"### {'Factoid' if kind == 'factoid' else 'Definitional and explanatory'}"
                " families", "",
                "| family | system | prompts (questions) | " + " | ".join(
                    label for _, _, label in rates) + " | " + " | ".join(extra)
                + (" | " if extra else "") + f"{head}: won/lost/tied questions vs {reference}"
                " (sign test p) | s/answer | tok/s |",
                "|" + "---|" * (len(rates) + len(extra) + 6)]
        for r in rr:
            fam = r["family"] + (" (held out)" if r["held_out"] else "")
            vs = r.get("vs_reference")
            vs_cell = (f"{vs['won']}/{vs['lost']}/{vs['tied']} (p = {vs['p']:.3g})"
                       if vs else "")
            cells = [_cell(r[m]) for m, _, _ in rates]
            cells += [f"{r['rouge_l']:.1f}"] if kind == "lead" else []
            out.append(f"| {fam} | {r['system']} | {r['n']} ({r['questions']}) | "
                       + " | ".join(cells) + f" | {vs_cell} | {r['seconds']:.1f} | "
                       f"{r['tok_s']:.1f} |")
    return out


__all__ = ["FACTOID_RATES", "LEAD_RATES", "markdown", "paired", "rate_ci", "summarize"]
