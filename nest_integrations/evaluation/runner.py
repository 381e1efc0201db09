"""Run the evaluation: build the datastore and tasks, generate with every system, aggregate.

Protocol (written into every report):

- Stage 1 runs **once per example** with the configured retriever (top ``n_passages``) and the
  same passages go to every system, so systems differ only in how they use them.
- Token keys of every retrieved passage are computed (or loaded from the on-disk key store
  ``$NEST_HOME/eval/keys``) **before** timing, so no system pays another's encoding. A
  system's time is ``NestStats.time_total`` of its generation: loading keys into the token
  memory + decoding (stage-1 retrieval is reported separately, per query).
- Systems are interleaved per example (the machine is noisy; each example runs every system
  back to back). One warm-up generation runs first.
- Every example is scored (E2); outputs are cut at EOS/stop strings (E3).
- Perplexity: teacher-forced over the reference tokens of every example in the task, corpus
  level ``exp(sum NLL / sum tokens)``, with the system's own prompt and distribution, T_LM = 1.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from nest_integrations.config import NestConfig
from nest_integrations.evaluation import metrics
from nest_integrations.evaluation.systems import SYSTEM_KEYS, System, make_systems, run_example
from nest_integrations.evaluation.tasks import Example, Task

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSettings:
    """One evaluation configuration (``SETTINGS`` holds ``small`` and ``full``).

    Attributes:
        name: configuration name (output files are ``eval_<name>.*``).
        n_completion: examples per completion setting (in-corpus and held-out each).
        n_qa: "What is X?" examples.
        prefix_tokens: completion prompt length in LM tokens.
        reference_tokens: completion reference length (= max new tokens) in LM tokens.
        qa_max_new_tokens: QA generation budget (paper: 128).
        jsonl_max_new_tokens: default budget of a JSONL task.
        n_passages: b, passages per query (paper: 40).
        retriever: ``"hybrid"`` (paper: dense + BM25), ``"bm25"`` or ``"dense"``.
        preset: the ``NestConfig`` preset of the NEST system (the others derive from it).
        gamma: NEST's relaxation gamma (None: the preset's).
        knn_temperature: mu of p_kNN for every memory system (None: the preset's, 1/sqrt(d)).
        systems: which systems to compare.
        gammas: the gamma sweep (NEST only); empty skips it.
        n_gamma: examples per completion setting in the gamma sweep.
        n_entity_qa: grounded QA questions over the generated entity corpus (added to the
            datastore; 0 = no such task).
        entity_seed: seed of the entity corpus and of the question sample.
        calibration_texts: documents held out / kept in by ``nest calibrate`` for ``nest-cal``.
    """

    name: str
    n_completion: int
    n_qa: int
    prefix_tokens: int = 32
    reference_tokens: int = 64
    qa_max_new_tokens: int = 48
    jsonl_max_new_tokens: int = 128
    n_passages: int = 40
    retriever: str = "hybrid"
    preset: str = "paper"
    gamma: float | None = None
    knn_temperature: float | None = None
    systems: tuple[str, ...] = SYSTEM_KEYS
    gammas: tuple[float, ...] = (5e-1, 5e-2, 5e-3, 5e-4, 5e-5)
    n_gamma: int = 3
    n_entity_qa: int = 0
    entity_seed: int = 0
    calibration_texts: int = 24

    def nest_config(self) -> NestConfig:
        cfg = NestConfig.from_preset(self.preset, n_passages=self.n_passages)
        if self.gamma is not None:
            cfg = cfg.replace(relaxation=self.gamma)
        if self.knn_temperature is not None:
            cfg = cfg.replace(knn_temperature=self.knn_temperature)
        return cfg

    def with_overrides(self, **changes: Any) -> "EvalSettings":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


#: ``small``: 18 examples x 5 systems + a 30-run gamma sweep, BM25 so that no corpus embedding
#: is needed; about 17 minutes on 2 idle CPU cores with cold caches (estimated: it took 40 min
#: on a shared machine where a 1-token step was 2.3x slower than idle).
#: ``full``: 600 examples, the paper's hybrid retrieval and QA budget (128 tokens), a 100 x 8
#: gamma sweep; about 15 hours on 2 CPU cores (estimate), so prefer ``--device cuda``.
#: See docs/evaluation.md.
SETTINGS: dict[str, EvalSettings] = {
    "small": EvalSettings(
        name="small",
        n_completion=6,
        n_qa=6,
        reference_tokens=48,
        qa_max_new_tokens=48,
        retriever="bm25",
        gammas=(5e-1, 5e-2, 5e-3, 5e-4, 5e-5),
        n_gamma=3,
    ),
    # ``medium``: >= 50 examples per task, the grounded entity-QA task and the calibrated NEST
    # system, with paired statistics in the report. 300 examples x 6 systems; a few hours on
    # 2 CPU cores (estimate), so it is a benchmark, never run in CI.
    "medium": EvalSettings(
        name="medium",
        n_completion=50,
        n_qa=50,
        reference_tokens=48,
        qa_max_new_tokens=40,
        retriever="bm25",
        systems=("base", "ra", "knn-lm", "nest", "ra-nest", "nest-cal"),
        gammas=(5e-1, 5e-2, 5e-3, 5e-4),
        n_gamma=10,
        n_entity_qa=100,
    ),
    "full": EvalSettings(
        name="full",
        n_completion=200,
        n_qa=200,
        reference_tokens=128,
        qa_max_new_tokens=128,
        retriever="hybrid",
        gammas=(5e-1, 1e-1, 5e-2, 1e-2, 5e-3, 5e-4, 5e-5, 1e-5),
        n_gamma=50,
    ),
}


@dataclass
class EvalRun:
    """Everything a report needs: records, aggregates and provenance."""

    settings: EvalSettings
    tasks: list[Task]
    systems: list[System]
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # task -> records
    gamma_records: list[dict[str, Any]] = field(default_factory=list)
    retrieval: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def table(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{task: {system: aggregate}}``."""
        return {
            t.name: {
                s.key: aggregate([r for r in self.records.get(t.name, []) if r["system"] == s.key])
                for s in self.systems
            }
            for t in self.tasks
        }

    def gamma_table(self) -> list[dict[str, Any]]:
        gammas = sorted({r["gamma"] for r in self.gamma_records}, reverse=True)
        return [
            {"gamma": g, **aggregate([r for r in self.gamma_records if r["gamma"] == g])}
            for g in gammas
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings),
            "provenance": self.provenance,
            "tasks": [t.summary() for t in self.tasks],
            "systems": [
                {"key": s.key, "name": s.name, "config": s.config.to_dict()} for s in self.systems
            ],
            "retrieval": self.retrieval,
            "results": self.table(),
            "gamma_sweep": self.gamma_table(),
        }


# ----------------------------------------------------------------------------- aggregation


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Task-level metrics from per-example records (None where a metric does not apply).

    ROUGE, ALR and answer-token recall are means over examples (x100); perplexity is corpus
    level; attribution ratio, mean cited-span length, citation precision, tokens/s and
    accepted tokens per verify step are micro-averages over all tokens/spans/steps.
    """
    recs = list(records)

    def tot(key: str) -> float:
        return float(sum(r.get(key, 0) or 0 for r in recs))

    def pct(values: list[float]) -> float | None:
        m = metrics.mean(values)
        return None if m is None else 100.0 * m

    nll = [r for r in recs if "nll_sum" in r]
    out: dict[str, Any] = {"n": len(recs)}
    out["ppl"] = (
        metrics.perplexity(sum(r["nll_sum"] for r in nll), int(sum(r["ref_tokens"] for r in nll)))
        if nll
        else None
    )
    for k in metrics.ROUGE_TYPES:
        out[k] = pct([r[f"{k}_f"] for r in recs if f"{k}_f" in r])
    out["alr"] = pct([r["alr"] for r in recs if "alr" in r])
    out["answer_token_recall"] = pct(
        [r["answer_token_recall"] for r in recs if "answer_token_recall" in r]
    )
    out["avg_len"] = metrics.mean([r["new_tokens"] for r in recs])
    new = tot("new_tokens")
    ar = metrics.ratio(tot("attributed_tokens"), new)
    out["attribution_ratio"] = None if ar is None else 100.0 * ar
    out["mean_span_length"] = metrics.ratio(tot("cited_run_tokens"), tot("cited_runs"))
    cp = metrics.ratio(tot("citations_correct"), tot("citations_total"))
    out["citation_precision"] = None if cp is None else 100.0 * cp
    out["tokens_per_s"] = metrics.ratio(new, tot("time_total"))
    per = sorted(r["new_tokens"] / r["time_total"] for r in recs if r.get("time_total", 0) > 0)
    out["tokens_per_s_median"] = (
        (per[(len(per) - 1) // 2] + per[len(per) // 2]) / 2 if per else None
    )
    out["accepted_per_verify"] = metrics.ratio(tot("accepted_tokens"), tot("verify_steps"))
    out["drafted_per_verify"] = metrics.ratio(tot("drafted_tokens"), tot("verify_steps"))
    out["forwards_per_token"] = metrics.ratio(tot("forward_passes"), new)
    share = metrics.ratio(tot("time_knn") + tot("time_keys"), tot("time_total"))
    out["knn_time_share"] = None if share is None else 100.0 * share
    out["mean_lambda"] = metrics.mean([r["mean_lambda"] for r in recs if "mean_lambda" in r])
    grounded = [r for r in recs if "correct" in r]
    if grounded:
        gnew = float(sum(r["new_tokens"] for r in grounded))
        out["correct"] = pct([r["correct"] for r in grounded])
        out["wrong_entity"] = pct([r["wrong_entity"] for r in grounded])
        gcs = metrics.ratio(
            sum(r["gold_cited_chars"] for r in grounded), sum(r["cited_chars"] for r in grounded)
        )
        out["gold_cited_share"] = None if gcs is None else 100.0 * gcs
        ot = metrics.ratio(sum(r["off_topic_tokens"] for r in grounded), gnew)
        out["off_topic_share"] = None if ot is None else 100.0 * ot
        ro = metrics.ratio(sum(r["run_on_tokens"] for r in grounded), gnew)
        out["run_on_share"] = None if ro is None else 100.0 * ro
    return out


# ----------------------------------------------------------------------------- running


def _bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="gen", disable=not enabled, dynamic_ncols=True)


def retrieve_all(
    retriever: Any, tasks: Sequence[Task], k: int, progress: bool = True
) -> tuple[dict[tuple[str, str], list[Any]], dict[str, Any]]:
    """Stage 1 for every example: ``{(task, example id): passages}`` and timing stats."""
    from tqdm.auto import tqdm

    out: dict[tuple[str, str], list[Any]] = {}
    times = []
    todo = [(t, ex) for t in tasks for ex in t.examples]
    for task, ex in tqdm(todo, desc="retrieving", unit="query", disable=not progress):
        t0 = time.perf_counter()
        out[(task.name, ex.id)] = (
            list(retriever.retrieve(ex.retrieval_query, k)) if retriever else []
        )
        times.append(time.perf_counter() - t0)
    hits = [
        any(p.doc_id == ex.gold_doc_id for p in out[(t.name, ex.id)])
        for t, ex in todo
        if ex.gold_doc_id is not None
    ]
    stats = {
        "queries": len(todo),
        "mean_ms_per_query": 1000.0 * (metrics.mean(times) or 0.0),
        "gold_doc_recall_at_k": 100.0 * metrics.mean(hits) if hits else None,
        "k": k,
    }
    return out, stats


def run_eval(
    engine: Any,
    tasks: Sequence[Task],
    settings: EvalSettings,
    retriever: Any,
    *,
    progress: bool = True,
    on_record: Callable[[str, dict[str, Any]], None] | None = None,
    calibration: dict[str, Any] | None = None,
) -> EvalRun:
    """Evaluate every system of ``settings`` on ``tasks`` (and the gamma sweep).

    ``engine`` is a ``NestEngine`` whose key store caches passage keys; stage 1 uses
    ``retriever`` once per example. ``calibration``: the NestConfig overrides of ``nest-cal``.
    """
    from nest_integrations.index.keys import ensure_keys

    cfg = engine.check_config(settings.nest_config())  # an unset key source: the model's
    systems = make_systems(cfg, settings.systems, calibration=calibration)
    run = EvalRun(settings=settings, tasks=list(tasks), systems=systems)
    passages, run.retrieval = retrieve_all(retriever, tasks, settings.n_passages, progress)

    # Stage 2 ahead of timing: every retrieved passage gets keys in the store once.
    unique = {p.id: p for ps in passages.values() for p in ps}
    t0 = time.perf_counter()
    ensure_keys(engine.key_store, engine.lm, list(unique.values()), progress=progress)
    run.retrieval["key_precompute_s"] = time.perf_counter() - t0
    run.retrieval["unique_passages"] = len(unique)

    scorer = metrics.rouge_scorer()
    _warm_up(engine, tasks, passages, cfg)
    sweep = _sweep_examples(tasks, settings.n_gamma) if settings.gammas else []
    total = sum(len(t.examples) for t in tasks) * len(systems) + len(sweep) * len(settings.gammas)
    bar = _bar(total, f"eval {settings.name}", progress)
    for task in tasks:
        recs = run.records.setdefault(task.name, [])
        for ex in task.examples:
            ps = passages[(task.name, ex.id)]
            for system in systems:  # interleaved per example
                bar.set_postfix_str(f"{task.name} {system.key}", refresh=False)
                rec = run_example(
                    engine, ex, system, ps, max_new_tokens=task.budget(ex), scorer=scorer
                )
                rec["task"] = task.name
                recs.append(rec)
                if on_record:
                    on_record(task.name, rec)
                bar.update(1)
    for task, ex in sweep:
        ps = passages[(task.name, ex.id)]
        for g in settings.gammas:
            nest = make_systems(cfg.replace(relaxation=g), ("nest",))[0]
            bar.set_postfix_str(f"gamma {g:g}", refresh=False)
            rec = run_example(
                engine,
                ex,
                nest,
                ps,
                max_new_tokens=task.budget(ex),
                scorer=scorer,
                score_perplexity=False,
            )
            rec.update(task=task.name, gamma=g)
            run.gamma_records.append(rec)
            if on_record:
                on_record("gamma-sweep", rec)
            bar.update(1)
    bar.close()
    return run


def _sweep_examples(tasks: Sequence[Task], n: int) -> list[tuple[Task, Example]]:
    """The gamma sweep's examples: the first ``n`` of each completion task."""
    return [(t, ex) for t in tasks if t.name.startswith("completion") for ex in t.examples[:n]]


def _warm_up(engine: Any, tasks: Sequence[Task], passages: dict, cfg: NestConfig) -> None:
    """One short untimed generation so first-call overheads do not land on a system."""
    for task in tasks:
        for ex in task.examples[:1]:
            engine.generate(
                ex.engine_prompt(),
                max_new_tokens=4,
                config=cfg,
                passages=passages[(task.name, ex.id)],
            )
            return


def machine_info() -> dict[str, Any]:
    """Where and when the numbers were measured (CPU load included: the machine is shared)."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "process_cpu_s": round(time.process_time(), 1),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if hasattr(os, "getloadavg"):
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return info


__all__ = [
    "SETTINGS",
    "EvalRun",
    "EvalSettings",
    "aggregate",
    "machine_info",
    "retrieve_all",
    "run_eval",
]
