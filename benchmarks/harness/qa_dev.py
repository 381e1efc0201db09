"""The grounded-QA dev loop: run questions through several systems, interleaved, and score them.

A **system** is ``(name, decoding, preset, overrides, context)``:

- ``decoding``: a ``nest_integrations.drafters.METHODS`` name passed as ``decoding=`` to
  ``engine.generate`` (None: the engine's default);
- ``preset`` + ``overrides``: the ``NestConfig`` of the call;
- ``context``: which of the question's retrieved passages the engine gets -- ``"memory"`` (all
  k, for the token memory; RA presets also put the top ``ra_passages`` in the prompt),
  ``"prompt"`` (the top ``ra_passages`` only, for in-context RAG and lossless copy modes) or
  ``"none"`` (the base LM).

Stage 1 runs once per question; every system gets the same passages. Systems run back to back
per question (the machine is noisy). Metrics per output: ``nest_integrations.evaluation.grounded``
(correct, wrong entity, gold-cited share, off-topic copied tokens, run-on tokens). ``summarize``
pools them per system, with bootstrap intervals and McNemar's exact test against a reference
system (in-context RAG by default).

Usage::

    engine = NestEngine.from_defaults(collection="entities", persist_dir=...)
    questions = generate_corpus(0).sample_questions(40)
    records = run_questions(engine, questions, [BUILTIN["rag"], BUILTIN["paper"]])
    print(markdown_table(summarize(records, reference="rag")))
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from benchmarks.sets.sample_questions import KeywordQuestion
from nest_integrations.config import NestConfig
from nest_integrations.evaluation import grounded, stats
from nest_integrations.evaluation.entities import EntityQuestion

LOG = logging.getLogger(__name__)

CONTEXTS = ("memory", "prompt", "none")

#: Overrides that make a config plain LM decoding (no kNN mass, no spans, no citations).
PLAIN = {"span_copying": False, "fixed_lm_weight": 1.0, "cite_token_mode": False}


@dataclass(frozen=True)
class SystemSpec:
    """One compared system (see the module docstring)."""

    name: str
    decoding: str | None = None
    preset: str = "paper"
    overrides: dict[str, Any] = field(default_factory=dict)
    context: str = "memory"

    def __post_init__(self) -> None:
        if self.context not in CONTEXTS:
            raise ValueError(f"context={self.context!r} is invalid: choose one of {CONTEXTS}")

    def config(self, base: dict[str, Any] | None = None) -> NestConfig:
        return NestConfig.from_preset(self.preset, **{**(base or {}), **self.overrides})

    def passages_for(self, passages: Sequence[Any], cfg: NestConfig) -> list[Any]:
        if self.context == "none":
            return []
        if self.context == "prompt":
            return list(passages[: max(cfg.ra_passages, 0)])
        return list(passages)


#: Built-in systems. ``rag``: greedy decoding with the top 3 passages in the prompt; ``base``:
#: the LM alone, greedy (the tokens/s reference); ``paper``/``paper-ra``: the NEST presets.
BUILTIN: dict[str, SystemSpec] = {
    "base": SystemSpec("base", "greedy", "paper", {**PLAIN, "ra_passages": 0}, "none"),
    "rag": SystemSpec("rag", "greedy", "paper", {**PLAIN, "ra_passages": 3}, "prompt"),
    "paper": SystemSpec("paper", None, "paper", {}, "memory"),
    "paper-ra": SystemSpec("paper-ra", None, "paper-ra", {}, "memory"),
}


def parse_system(text: str) -> SystemSpec:
    """A system from ``NAME`` (built-in or a decoding method: lossless methods get the RAG
    prompt, ``nest``-like ones the memory) or ``NAME=DECODING:PRESET[:k=v,k=v][@CONTEXT]``.

    Examples: ``rag``, ``paper-ra``, ``prompt-lookup``,
    ``g05=nest:paper:relaxation=0.05``, ``copy=rag-copy:paper:ra_passages=3@prompt``.
    """
    text = text.strip()
    if "=" not in text.split(":")[0]:
        if text in BUILTIN:
            return BUILTIN[text]
        try:
            from nest_integrations.drafters import METHODS
        except ImportError:  # pragma: no cover - the registry is part of the package
            METHODS = {}
        method = METHODS.get(text)
        if method is None:
            raise ValueError(
                f"unknown system {text!r}: use one of {sorted(BUILTIN)}, a decoding method "
                f"({sorted(METHODS)}) or NAME=DECODING:PRESET[:k=v,...][@CONTEXT]"
            )
        if getattr(method, "uses_memory", False):
            return SystemSpec(text, text, "paper", {}, "memory")
        return SystemSpec(text, text, "paper", {**PLAIN, "ra_passages": 3}, "prompt")
    name, rest = text.split("=", 1)
    context = "memory"
    if "@" in rest:
        rest, context = rest.rsplit("@", 1)
    parts = rest.split(":", 2)
    decoding = parts[0] or None
    preset = parts[1] if len(parts) > 1 and parts[1] else "paper"
    overrides: dict[str, Any] = {}
    if len(parts) > 2 and parts[2]:
        for kv in parts[2].split(","):
            k, _, v = kv.partition("=")
            overrides[k.strip()] = _value(v.strip())
    spec = SystemSpec(name.strip(), decoding, preset, overrides, context)
    spec.config()  # validate now, not mid-run
    return spec


def _value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


# ----------------------------------------------------------------------------- one output


def score_output(
    lm: Any, result: Any, question: EntityQuestion | KeywordQuestion, min_citation_tokens: int = 2
) -> dict[str, Any]:
    """The grounded metrics of one ``NestResult`` for one question (a flat dict)."""
    text = result.text
    gold = question.gold_doc_id
    if isinstance(question, EntityQuestion):
        correct = grounded.answer_correct(text, question.answer, question.distractors)
        wrong = grounded.wrong_entity(text, question.distractors)
        answer, distractors = question.answer, question.distractors
    else:
        correct = grounded.keyword_correct(text, question.must, question.must_not)
        wrong = bool(question.must_not) and grounded.wrong_entity(text, question.must_not)
        answer, distractors = None, ()
    ends = grounded.token_char_ends(lm, result.token_ids)
    cites = list(result.citations)
    cited = sum(len(c.text) for c in cites)
    gold_cited = sum(len(c.text) for c in cites if gold is not None and c.doc_id == gold)
    shown = grounded.meaningful_citations(cites, min_citation_tokens)
    st = result.stats
    return {
        "text": text,
        "correct": bool(correct),
        "wrong_entity": bool(wrong),
        "new_tokens": st.new_tokens,
        "attributed_tokens": sum(s is not None for s in result.token_sources),
        "off_topic_tokens": grounded.off_topic_tokens(result.token_sources, result.passages, gold),
        "run_on_tokens": grounded.run_on_tokens(text, ends, answer, distractors),
        "cited_chars": cited,
        "gold_cited_chars": gold_cited,
        "gold_cited_share": grounded.gold_cited_share(cites, gold),
        "n_citations": len(cites),
        "n_citations_shown": len(shown),
        "cited_docs": sorted({c.doc_id for c in cites}),
        "time_total": st.time_total,
        "forward_passes": st.forward_passes,
        "finish_reason": st.finish_reason,
    }


def generate(
    engine: Any,
    spec: SystemSpec,
    messages: Any,
    passages: Sequence[Any],
    max_new_tokens: int,
    base_overrides: dict[str, Any] | None = None,
) -> Any:
    """One generation of ``spec``: its preset's config and answer policy (the ``rag``, ``base``
    and method systems: no policy), ``decoding=`` only when the spec names one."""
    from nest_integrations.policy import AnswerPolicy

    cfg = spec.config(base_overrides)
    policy = (AnswerPolicy.from_preset(spec.preset) if spec.decoding is None
              else AnswerPolicy())  # a named method: plain, as the spec's context gives it
    kw: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "config": cfg,
        "policy": policy,
        "passages": spec.passages_for(passages, cfg),
    }
    if spec.decoding is not None:
        kw["decoding"] = spec.decoding
    return engine.generate(messages, **kw)


def run_questions(
    engine: Any,
    questions: Sequence[EntityQuestion | KeywordQuestion],
    systems: Sequence[SystemSpec],
    *,
    k: int = 8,
    max_new_tokens: int = 40,
    min_citation_tokens: int = 2,
    base_overrides: dict[str, Any] | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every question through every system, interleaved; one record per (question, system).

    Stage 1 (``engine.retrieve(question, k)``) runs once per question. A failing generation is
    recorded with ``error`` (and counted wrong) instead of stopping the run.
    """
    from tqdm.auto import tqdm

    names = [s.name for s in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names must be unique: {names}")
    records: list[dict[str, Any]] = []
    if questions:  # one untimed warm-up so first-call overheads land on no system
        q0 = questions[0]
        engine.generate([{"role": "user", "content": q0.question}], max_new_tokens=2,
                        passages=engine.retrieve(q0.question, k))
    bar = tqdm(total=len(questions) * len(systems), desc="qa-dev", unit="gen",
               disable=not progress, dynamic_ncols=True)
    for q in questions:
        t0 = time.perf_counter()
        passages = engine.retrieve(q.question, k)
        t_ret = time.perf_counter() - t0
        docs = [p.doc_id for p in passages]
        messages = [{"role": "user", "content": q.question}]
        for spec in systems:
            bar.set_postfix_str(spec.name, refresh=False)
            rec: dict[str, Any] = {
                "question_id": q.id,
                "question": q.question,
                "system": spec.name,
                "gold_doc_id": q.gold_doc_id,
                "gold_rank": docs.index(q.gold_doc_id) + 1 if q.gold_doc_id in docs else None,
                "time_retrieval": t_ret,
            }
            if isinstance(q, EntityQuestion):
                rec["answer"] = q.answer
            try:
                result = generate(engine, spec, messages, passages, max_new_tokens,
                                  base_overrides)
                rec.update(score_output(engine.lm, result, q, min_citation_tokens))
            except Exception as exc:  # noqa: BLE001 - one bad system must not stop the run
                LOG.warning("system %s failed on %s: %s", spec.name, q.id, exc)
                rec.update(error=f"{type(exc).__name__}: {exc}", correct=False)
            records.append(rec)
            if on_record:
                on_record(rec)
            bar.update(1)
    bar.close()
    return records


def run_open_questions(
    engine: Any,
    questions: Sequence[Any],
    systems: Sequence[SystemSpec],
    *,
    k: int = 8,
    max_new_tokens: int = 64,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every open-ended question (``benchmarks.sets.quality_set.OpenQuestion``) through every
    system, interleaved, with the same retrieved passages; one ``open_ended.score`` record each."""
    from nest_integrations.evaluation import open_ended
    from nest_integrations.evaluation.metrics import rouge_scorer

    scorer = rouge_scorer()
    records = []
    for q in questions:
        passages = engine.retrieve(q.question, k)
        docs = [p.doc_id for p in passages]
        messages = [{"role": "user", "content": q.question}]
        for spec in systems:
            result = generate(engine, spec, messages, passages, max_new_tokens)
            records.append({
                "question_id": q.id, "question": q.question, "system": spec.name,
                "source": q.source, "gold_doc_id": q.gold_doc_id,
                "gold_rank": docs.index(q.gold_doc_id) + 1 if q.gold_doc_id in docs else None,
                **open_ended.score(result, q, scorer),
            })
            if on_record is not None:
                on_record(records[-1])
    return records


# ----------------------------------------------------------------------------- summary


def summarize(
    records: Sequence[dict[str, Any]], reference: str = "rag", speed_reference: str = "base"
) -> list[dict[str, Any]]:
    """One row per system (in first-seen order): accuracy with a bootstrap interval,
    wrong-entity answers, pooled gold-cited share, off-topic and run-on shares of output
    tokens, tokens/s and its ratio to ``speed_reference`` (pooled over the same questions),
    and McNemar's exact test of correctness against ``reference``."""
    systems: list[str] = []
    for r in records:
        if r["system"] not in systems:
            systems.append(r["system"])
    by = {s: {r["question_id"]: r for r in records if r["system"] == s} for s in systems}

    def tok_s(rs: Sequence[dict[str, Any]]) -> float | None:
        t = sum(r.get("time_total", 0.0) for r in rs)
        return sum(r.get("new_tokens", 0) for r in rs) / t if t > 0 else None

    rows = []
    for s in systems:
        rs = list(by[s].values())
        ok = [1.0 if r.get("correct") else 0.0 for r in rs]
        acc, lo, hi = stats.bootstrap_ci(ok)
        new = sum(r.get("new_tokens", 0) for r in rs)
        cited = sum(r.get("cited_chars", 0) for r in rs)
        row: dict[str, Any] = {
            "system": s,
            "n": len(rs),
            "correct": int(sum(ok)),
            "accuracy": acc,
            "accuracy_ci": (lo, hi),
            "wrong_entity": sum(1 for r in rs if r.get("wrong_entity")),
            "gold_cited_share": (sum(r.get("gold_cited_chars", 0) for r in rs) / cited
                                 if cited else None),
            "gold_cited_any": sum(1 for r in rs if r.get("gold_cited_chars", 0) > 0),
            "off_topic_share": sum(r.get("off_topic_tokens", 0) for r in rs) / new if new else None,
            "run_on_share": sum(r.get("run_on_tokens", 0) for r in rs) / new if new else None,
            "attributed_share": (sum(r.get("attributed_tokens", 0) for r in rs) / new
                                 if new else None),
            "mean_new_tokens": new / len(rs) if rs else None,
            "tokens_per_s": tok_s(rs),
            "errors": sum(1 for r in rs if "error" in r),
        }
        if speed_reference in by and s != speed_reference:
            common = [q for q in by[s] if q in by[speed_reference]]
            a = tok_s([by[s][q] for q in common])
            b = tok_s([by[speed_reference][q] for q in common])
            row["speed_vs_base"] = a / b if a and b else None
        elif s == speed_reference:
            row["speed_vs_base"] = 1.0
        if reference in by and s != reference:
            common = [q for q in by[s] if q in by[reference]]
            row["vs_reference"] = stats.mcnemar(
                [bool(by[s][q].get("correct")) for q in common],
                [bool(by[reference][q].get("correct")) for q in common],
            )
        rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown_table(rows: Sequence[dict[str, Any]], reference: str = "rag",
                   speed_reference: str = "base") -> str:
    """The summary as a markdown table (McNemar: wins/losses vs the reference, and p; speed
    against ``speed_reference``, as ``summarize`` was given it)."""
    head = (
        "| system | correct | accuracy (95% CI) | wrong entity | gold-cited chars | "
        f"off-topic copied | run-on | tok/s | vs {speed_reference} | vs {reference} "
        "(+/-, McNemar p) |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lo, hi = r["accuracy_ci"]
        mc = r.get("vs_reference")
        vs = f"+{mc['a_only']}/-{mc['b_only']}, p={mc['p']:.3f}" if mc else "-"
        tps = r.get("tokens_per_s")
        sp = r.get("speed_vs_base")
        lines.append(
            f"| {r['system']} | {r['correct']}/{r['n']} | {100 * r['accuracy']:.0f}% "
            f"({100 * lo:.0f}-{100 * hi:.0f}) | {r['wrong_entity']} | "
            f"{_pct(r['gold_cited_share'])} | {_pct(r['off_topic_share'])} | "
            f"{_pct(r['run_on_share'])} | {'-' if tps is None else f'{tps:.1f}'} | "
            f"{'-' if sp is None else f'{sp:.2f}x'} | {vs} |"
        )
    return "\n".join(lines)


__all__ = [
    "BUILTIN",
    "CONTEXTS",
    "PLAIN",
    "SystemSpec",
    "generate",
    "markdown_table",
    "parse_system",
    "run_open_questions",
    "run_questions",
    "score_output",
    "summarize",
]
