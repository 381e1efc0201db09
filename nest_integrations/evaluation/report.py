"""Reports: a markdown file shaped like the paper's Table 1 (plus attribution, speed and the
gamma sweep), the same numbers as JSON, per-example outputs as JSONL, and PNG plots.

Files written into ``out_dir`` for a configuration named ``name``:

- ``eval_<name>.md`` and ``eval_<name>.json``: tables and provenance;
- ``eval_<name>_examples.jsonl``: every generation with its scores;
- ``eval_<name>_gamma.png``: the gamma trade-off (like the paper's Fig. 2b);
- ``eval_<name>_speed.png``: tokens/s per system and task, and NEST's time breakdown.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from nest_integrations.evaluation.plots import plot_gamma, plot_speed
from nest_integrations.evaluation.runner import EvalRun
from nest_integrations.evaluation.tasks import TASK_TITLES

#: The per-example metric of the paired comparisons, per task (binary ones get McNemar).
PAIRED_METRIC = {
    "completion-in": ("rouge1_f", False),
    "completion-out": ("rouge1_f", False),
    "qa": ("alr", True),
    "entity-qa": ("correct", True),
}


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: ``-`` for missing values, fixed decimals otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _cells(row: dict[str, Any], keys: Sequence[tuple[str, int]]) -> str:
    return " / ".join(fmt(row.get(k), d) for k, d in keys)


def _has(table: dict[str, dict[str, Any]], key: str) -> bool:
    return any(row.get(key) is not None for row in table.values())


def _quality_columns(table: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    cols: list[tuple[str, int]] = []
    if _has(table, "ppl"):
        cols.append(("ppl", 2))
    if _has(table, "rouge1"):
        cols += [("rouge1", 1), ("rouge2", 1), ("rougeL", 1)]
    if _has(table, "alr"):
        cols += [("alr", 1), ("answer_token_recall", 1)]
    cols.append(("avg_len", 1))
    return cols


_LABELS = {
    "ppl": "PPL↓",
    "rouge1": "R-1",
    "rouge2": "R-2",
    "rougeL": "R-L",
    "alr": "ALR",
    "answer_token_recall": "AnsTokR",
    "avg_len": "AvgLen",
}


def markdown(run: EvalRun) -> str:
    """The whole report as markdown."""
    table = run.table()
    names = {s.key: s.name for s in run.systems}
    st = run.settings
    prov = run.provenance
    cfg = st.nest_config()
    lines = [
        f"# NEST evaluation: `{st.name}` configuration",
        "",
        f"Model: {prov.get('model', '?')}; "
        f"corpus: {prov.get('corpus', {}).get('description', '?')}; "
        f"retriever: {st.retriever}, b = {st.n_passages} passages per query; NEST preset "
        f"`{st.preset}` (gamma = {_nest_gamma(run)}, alpha = {cfg.rrc_offset:g}, tau = "
        f"{cfg.rrc_scale:g}, r = {cfg.n_neighbors}, mu = "
        f"{'1/sqrt(d)' if cfg.knn_temperature is None else f'{cfg.knn_temperature:g}'}); "
        f"RA-NEST gamma = {_gamma_of(run, 'ra-nest')}; greedy decoding.",
        "",
        "Numbers are **not comparable with the paper's** (different corpus, a 135M model). "
        "Systems share the corpus, prompts, retrieved passages and model.",
        "",
        *_calibration_lines(prov),
        "## Table 1: quality",
        "",
    ]
    header = ["System"]
    cols_by_task = {}
    for task in run.tasks:
        cols = _quality_columns(table[task.name])
        cols_by_task[task.name] = cols
        label = " / ".join(_LABELS[k] for k, _ in cols)
        header.append(f"{TASK_TITLES.get(task.name, task.name)}: {label}")
    lines += _system_table(run, table, names, header, cols_by_task)
    lines += [
        "",
        "PPL: corpus-level perplexity of the reference tokens under the system's distribution "
        "(p_LM for Base/RA, p_M for the others; RA systems see the passages in the prompt). "
        "R-1/2/L: ROUGE F1 x100 (rouge-score, stemming, `score(reference, output)`). ALR: "
        "answer-level recall x100 (any gold answer, normalised). AnsTokR: share of the best gold "
        "answer's words in the output x100. AvgLen: generated tokens. MAUVE is not computed.",
        "",
        "## Table 2: attribution and speed",
        "",
    ]
    header = ["System"] + [
        f"{TASK_TITLES.get(t.name, t.name)}: Attr% / SpanLen / CitPrec% / tok/s / acc/verify"
        for t in run.tasks
    ]
    keys = [
        ("attribution_ratio", 1),
        ("mean_span_length", 1),
        ("citation_precision", 1),
        ("tokens_per_s", 1),
        ("accepted_per_verify", 2),
    ]
    lines += _system_table(run, table, names, header, {t.name: keys for t in run.tasks})
    lines += [
        "",
        "Attr%: share of output tokens with a corpus source. SpanLen: mean length (tokens) of "
        "maximal cited runs. CitPrec%: citations whose document is the gold document (no gold "
        "document for held-out leads). tok/s: generated tokens / generation time (token-memory "
        "load + decoding; stage-1 retrieval is reported below). acc/verify: draft tokens "
        "accepted per verification forward pass.",
        "",
    ]
    lines += _grounded(run, table, names)
    lines += _paired(run, names)
    lines += _breakdown(run, table, names)
    sweep = run.gamma_table()
    if sweep:
        lines += [
            "## Gamma sweep (NEST, completion examples)",
            "",
            "| gamma | proposed span | accepted/verify | Attr% | SpanLen | R-1 | tok/s "
            "| forwards/token |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sweep:
            lines.append(
                f"| {r['gamma']:g} | {fmt(r['drafted_per_verify'], 1)} | "
                f"{fmt(r['accepted_per_verify'], 2)} | {fmt(r['attribution_ratio'])} | "
                f"{fmt(r['mean_span_length'])} | {fmt(r['rouge1'])} | {fmt(r['tokens_per_s'])} | "
                f"{fmt(r['forwards_per_token'], 2)} |"
            )
        lines += [
            "",
            f"Examples: the first {st.n_gamma} of each completion task. "
            "Smaller gamma is more lenient (accept iff p_M(w) > gamma/2 * max p_M).",
            "",
        ]
    lines += _protocol(run)
    return "\n".join(lines) + "\n"


def _system_table(
    run: EvalRun, table: dict, names: dict, header: list[str], cols_by_task: dict
) -> list[str]:
    """A markdown table of one row per system and one cell per task (``cols_by_task``: the
    columns of each task's cell)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in run.systems:
        row = [names[s.key]] + [_cells(table[t.name][s.key], cols_by_task[t.name])
                                for t in run.tasks]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _calibration_lines(prov: dict[str, Any]) -> list[str]:
    """What ``nest calibrate`` fitted for the ``nest-cal`` system (when it ran)."""
    cal = prov.get("calibration")
    if not cal:
        return []
    o, ppl = cal["overrides"], cal.get("ppl", {})
    inc, out = ppl.get("in_corpus", {}), ppl.get("held_out", {})
    return [
        f"+NEST (calibrated): `nest calibrate` on this datastore fitted mu = "
        f"{o.get('knn_temperature', 0):.4g}, alpha = {o.get('rrc_offset', 0):g}, tau = "
        f"{o.get('rrc_scale', 0):g} (calibration p_M perplexity in-corpus "
        f"{fmt(inc.get('calibrated'), 2)} vs base {fmt(inc.get('base'), 2)} and default "
        f"{fmt(inc.get('default'), 2)}; held-out {fmt(out.get('calibrated'), 2)} vs "
        f"{fmt(out.get('base'), 2)} and {fmt(out.get('default'), 2)}; other settings as NEST).",
        "",
    ]


def _grounded(run: EvalRun, table: dict, names: dict) -> list[str]:
    """The grounded-QA table (tasks whose records carry ``correct``)."""
    tasks = [t for t in run.tasks if any(r.get("correct") is not None
                                         for r in run.records.get(t.name, []))]
    if not tasks:
        return []
    lines = ["## Grounded QA", ""]
    for t in tasks:
        lines += [
            f"{TASK_TITLES.get(t.name, t.name)} ({len(t.examples)} questions):",
            "",
            "| System | correct % | wrong entity % | gold-cited chars % | off-topic copied % "
            "| run-on % | tok/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in run.systems:
            row = table[t.name][s.key]
            lines.append(
                f"| {names[s.key]} | {fmt(row.get('correct'))} | {fmt(row.get('wrong_entity'))} "
                f"| {fmt(row.get('gold_cited_share'))} | {fmt(row.get('off_topic_share'))} | "
                f"{fmt(row.get('run_on_share'))} | {fmt(row.get('tokens_per_s'))} |"
            )
        lines.append("")
    lines += [
        "correct: the gold value (normalised, whole words) and no other entity's value for the "
        "attribute. gold-cited chars: pooled share of cited characters on the gold document. "
        "off-topic copied / run-on: output tokens attributed to another document / after the "
        "first sentence end following the answer, as shares of all output tokens.",
        "",
    ]
    return lines


def paired_rows(run: EvalRun) -> list[dict[str, Any]]:
    """Per task and system: the mean of the task's per-example metric with a bootstrap 95%
    interval, and against the reference system (``ra`` for QA tasks when run, else ``base``)
    the paired mean difference with its interval, wins/ties/losses and, for binary metrics,
    McNemar's exact p."""
    from nest_integrations.evaluation import stats

    keys = [s.key for s in run.systems]
    out = []
    for t in run.tasks:
        metric, binary = PAIRED_METRIC.get(t.name, ("rouge1_f", False))
        ref = "ra" if "qa" in t.name and "ra" in keys else "base" if "base" in keys else keys[0]
        by = {
            k: {r["example"]: r.get(metric) for r in run.records.get(t.name, [])
                if r["system"] == k and r.get(metric) is not None}
            for k in keys
        }
        for k in keys:
            vals = list(by[k].values())
            if not vals:
                continue
            mean, lo, hi = stats.bootstrap_ci(vals)
            row: dict[str, Any] = {"task": t.name, "system": k, "metric": metric, "n": len(vals),
                                   "mean": mean, "ci": (lo, hi), "reference": ref}
            if k != ref:
                common = [e for e in by[k] if e in by[ref]]
                a = [float(by[k][e]) for e in common]
                b = [float(by[ref][e]) for e in common]
                if common:
                    d, dlo, dhi = stats.paired_bootstrap_diff(a, b)
                    row.update(diff=d, diff_ci=(dlo, dhi), **stats.win_rate(a, b))
                    if binary:
                        row["mcnemar_p"] = stats.mcnemar([x > 0 for x in a],
                                                         [y > 0 for y in b])["p"]
            out.append(row)
    return out


def _paired(run: EvalRun, names: dict) -> list[str]:
    rows = paired_rows(run)
    if not rows:
        return []
    lines = [
        "## Paired comparisons (95% bootstrap intervals over examples)",
        "",
        "| Task | System | metric | mean (95% CI) | vs reference: diff (95% CI) | wins/ties/losses "
        "| win rate | McNemar p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        scale = 100.0
        lo, hi = r["ci"]
        cell = f"{scale * r['mean']:.1f} ({scale * lo:.1f} to {scale * hi:.1f})"
        if "diff" in r:
            dlo, dhi = r["diff_ci"]
            vs = (f"{scale * r['diff']:+.1f} ({scale * dlo:+.1f} to {scale * dhi:+.1f}) vs "
                  f"{names.get(r['reference'], r['reference'])}")
            wtl = f"{r['wins']}/{r['ties']}/{r['losses']}"
            wr = f"{100 * r['win_rate']:.0f}%"
        else:
            vs, wtl, wr = "(reference)", "-", "-"
        p = r.get("mcnemar_p")
        lines.append(
            f"| {TASK_TITLES.get(r['task'], r['task'])} | {names.get(r['system'], r['system'])} | "
            f"{r['metric']} | {cell} | {vs} | {wtl} | {wr} | {'-' if p is None else f'{p:.3f}'} |"
        )
    lines += [
        "",
        "Metrics x100: rouge1_f (ROUGE-1 F1), alr (answer-level recall), correct (grounded "
        "answer correct). Differences are paired per example; an interval that contains 0 (or "
        "McNemar p >= 0.05) is not a real difference at this sample size.",
        "",
    ]
    return lines


def _nest_gamma(run: EvalRun) -> str:
    return f"{run.settings.nest_config().relaxation:g}"


def _gamma_of(run: EvalRun, key: str) -> str:
    for s in run.systems:
        if s.key == key:
            return f"{s.config.relaxation:g}"
    return "-"


def speedup_vs_base(run: EvalRun, key: str) -> float | None:
    """Geometric mean over examples of tokens/s(system) / tokens/s(base), paired per example
    (systems run back to back per example, so the ratio is robust to slow phases of a shared
    machine where pooled tokens/s are not)."""
    logs = []
    for t in run.tasks:
        by = {(r["example"], r["system"]): r for r in run.records.get(t.name, [])}
        for (ex, sk), r in by.items():
            b = by.get((ex, "base"))
            if sk != key or b is None:
                continue
            if r["new_tokens"] and b["new_tokens"] and r["time_total"] > 0 and b["time_total"] > 0:
                ratio = (r["new_tokens"] / r["time_total"]) / (b["new_tokens"] / b["time_total"])
                logs.append(math.log(ratio))
    return math.exp(sum(logs) / len(logs)) if logs else None


def _breakdown(run: EvalRun, table: dict, names: dict) -> list[str]:
    lines = [
        "## Speed details (all tasks pooled)",
        "",
        "| System | tok/s | median tok/s | vs Base (geo-mean, paired) | forwards/token "
        "| proposed span | acc/verify | kNN + key-load time % | mean lambda |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    from nest_integrations.evaluation.runner import aggregate

    for s in run.systems:
        recs = [r for t in run.tasks for r in run.records.get(t.name, []) if r["system"] == s.key]
        a = aggregate(recs)
        lines.append(
            f"| {names[s.key]} | {fmt(a['tokens_per_s'])} | {fmt(a['tokens_per_s_median'])} | "
            f"{fmt(speedup_vs_base(run, s.key), 2)} | {fmt(a['forwards_per_token'], 2)} | "
            f"{fmt(a['drafted_per_verify'])} | {fmt(a['accepted_per_verify'], 2)} | "
            f"{fmt(a['knn_time_share'])} | {fmt(a['mean_lambda'], 2)} |"
        )
    r = run.retrieval
    lines += [
        "",
        "tok/s pools tokens and seconds; the median is over examples. forwards/token (LM "
        "forward passes per generated token) does not depend on machine load.",
        "",
        f"Stage 1: {fmt(r.get('mean_ms_per_query'))} ms per query ({r.get('queries')} queries); "
        f"gold document in the top {r.get('k')}: {fmt(r.get('gold_doc_recall_at_k'))}% of the "
        f"examples that have one. Keys of {r.get('unique_passages')} passages were loaded or "
        f"encoded beforehand in {fmt(r.get('key_precompute_s'))} s.",
        "",
    ]
    return lines


def _protocol(run: EvalRun) -> list[str]:
    prov = run.provenance
    lines = ["## Protocol and provenance", ""]
    for task in run.tasks:
        lines.append(
            f"- **{task.name}** ({len(task.examples)} examples, max {task.max_new_tokens} "
            f"new tokens): {task.description}. Filters: {'; '.join(task.filters)}."
        )
    corpus = prov.get("corpus", {})
    if corpus:
        lines.append(f"- Corpus: {json.dumps(corpus, ensure_ascii=False)}")
    lines += [
        "- Every example is scored (none skipped); outputs are cut at EOS and stop strings; "
        "ROUGE arguments in the library's order; ALR checks every gold answer.",
        "- Perplexity: one teacher-forced forward pass over prompt + reference per example and "
        "system; p_M uses the unmasked memory of the same retrieved passages, mixed in log "
        "space; T_LM = 1 (the official code's hidden 0.7 is not used).",
        "- Systems are interleaved per example; timings include contention from other processes "
        f"on the machine (load average at start {prov.get('machine_start', {}).get('loadavg')}, "
        f"at end {prov.get('machine_end', {}).get('loadavg')}).",
        f"- Machine: {json.dumps(prov.get('machine_start', {}))}",
        f"- Wall time of the whole run: {fmt(prov.get('wall_s'))} s.",
        "",
    ]
    return lines


# ----------------------------------------------------------------------------- files


def write_outputs(run: EvalRun, out_dir: str | Path, plots: bool = True) -> list[Path]:
    """Write the markdown, JSON, JSONL and (optionally) PNG outputs; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"eval_{run.settings.name}"
    paths = [out / f"{stem}.md", out / f"{stem}.json", out / f"{stem}_examples.jsonl"]
    paths[0].write_text(markdown(run), encoding="utf-8")
    paths[1].write_text(
        json.dumps(run.to_dict(), indent=2, default=_json_default) + "\n", encoding="utf-8"
    )
    with open(paths[2], "w", encoding="utf-8") as f:
        for task, recs in run.records.items():
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n")
        for r in run.gamma_records:
            f.write(
                json.dumps(
                    {**r, "task": f"gamma-sweep/{r['task']}"},
                    ensure_ascii=False,
                    default=_json_default,
                )
                + "\n"
            )
    if plots:
        if run.gamma_records:
            paths.append(plot_gamma(run.gamma_table(), out / f"{stem}_gamma.png"))
        paths.append(plot_speed(run, out / f"{stem}_speed.png"))
    return paths


def load_run(out_dir: str | Path, name: str) -> EvalRun:
    """Rebuild an ``EvalRun`` from ``eval_<name>.json`` and ``eval_<name>_examples.jsonl`` (to
    re-render the report and plots without generating again)."""
    from nest_integrations.evaluation.runner import EvalSettings
    from nest_integrations.evaluation.systems import make_systems
    from nest_integrations.evaluation.tasks import Example, Task

    out = Path(out_dir)
    data = json.loads((out / f"eval_{name}.json").read_text(encoding="utf-8"))
    st = dict(data["settings"])
    for k in ("systems", "gammas"):
        st[k] = tuple(st[k])
    settings = EvalSettings(**st)
    records: dict[str, list[dict[str, Any]]] = {}
    gamma: list[dict[str, Any]] = []
    with open(out / f"eval_{name}_examples.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["task"].startswith("gamma-sweep/"):
                gamma.append({**r, "task": r["task"].split("/", 1)[1]})
            else:
                records.setdefault(r["task"], []).append(r)
    tasks = []
    for t in data["tasks"]:
        ids = list(dict.fromkeys(r["example"] for r in records.get(t["name"], [])))
        examples = [Example(id=i, prompt="") for i in ids]
        tasks.append(Task(t["name"], examples, t["max_new_tokens"], t["description"], t["filters"]))
    calibration = (data["provenance"].get("calibration") or {}).get("overrides")
    run = EvalRun(
        settings, tasks,
        make_systems(settings.nest_config(), settings.systems, calibration=calibration),
    )
    run.records, run.gamma_records = records, gamma
    run.retrieval, run.provenance = data["retrieval"], data["provenance"]
    return run


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


__all__ = ["load_run", "markdown", "plot_gamma", "plot_speed", "speedup_vs_base", "write_outputs"]
