"""PNG figures of an evaluation run: the gamma trade-off (like the paper's Fig. 2b) and the
speed plot (tokens/s per system and task, and NEST's time per token). ``report.write_outputs``
writes them next to the markdown; both functions are re-exported from ``report``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from nest_integrations.evaluation.runner import EvalRun
from nest_integrations.evaluation.tasks import TASK_TITLES


def _pyplot() -> Any:
    from nest_integrations._optional import require

    mpl = require("matplotlib", extra="eval")
    mpl.use("Agg")
    return require("matplotlib.pyplot", extra="eval")


def plot_gamma(sweep: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Fig. 2b-style trade-off: span lengths (left), quality and speed (right) vs gamma."""
    plt = _pyplot()
    rows = sorted(sweep, key=lambda r: -r["gamma"])
    g = [r["gamma"] for r in rows]

    def col(key: str) -> list[float]:
        return [r[key] if r[key] is not None else float("nan") for r in rows]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(g, col("drafted_per_verify"), "o-", label="proposed span (tokens/draft)")
    ax1.plot(g, col("accepted_per_verify"), "s-", label="accepted per verify step")
    ax1.plot(g, col("mean_span_length"), "^--", label="mean cited span")
    ax1.set_xscale("log")
    ax1.invert_xaxis()
    ax1.set_xlabel("relaxation gamma (more lenient →)")
    ax1.set_ylabel("tokens")
    ax1.set_title("Span length vs gamma")
    ax1.legend(fontsize=8)
    ax2.plot(g, col("rouge1"), "o-", color="tab:green", label="ROUGE-1")
    ax2.plot(g, col("attribution_ratio"), "d--", color="tab:olive", label="attribution %")
    ax2.set_xscale("log")
    ax2.invert_xaxis()
    ax2.set_xlabel("relaxation gamma (more lenient →)")
    ax2.set_ylabel("ROUGE-1 / attribution %")
    ax3 = ax2.twinx()
    ax3.plot(g, col("tokens_per_s"), "s-", color="tab:red", label="tokens/s")
    ax3.set_ylabel("tokens/s", color="tab:red")
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
    ax2.set_title("Quality and speed vs gamma")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_speed(run: EvalRun, path: str | Path) -> Path:
    """Tokens/s per system and task (left) and where generation time goes (right)."""
    plt = _pyplot()
    table = run.table()
    systems = run.systems
    tasks = run.tasks
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(1, len(tasks))
    for i, t in enumerate(tasks):
        xs = [j + i * width for j in range(len(systems))]
        ys = [table[t.name][s.key]["tokens_per_s_median"] or 0.0 for s in systems]
        ax1.bar(xs, ys, width, label=TASK_TITLES.get(t.name, t.name))
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(systems))])
    ax1.set_xticklabels([s.name for s in systems], fontsize=8)
    ax1.set_ylabel("generated tokens / s (median over examples)")
    ax1.set_title("Decoding speed (same machine, interleaved)")
    ax1.legend(fontsize=7)
    parts = [("time_lm", "LM forward"), ("time_knn", "kNN + mixture"), ("time_keys", "key load")]
    bottoms = [0.0] * len(systems)
    for key, label in parts:
        vals = []
        for s in systems:
            recs = [r for t in tasks for r in run.records.get(t.name, []) if r["system"] == s.key]
            toks = sum(r["new_tokens"] for r in recs) or 1
            vals.append(1000.0 * sum(r[key] for r in recs) / toks)
        ax2.bar(range(len(systems)), vals, 0.6, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    other = []
    for j, s in enumerate(systems):
        recs = [r for t in tasks for r in run.records.get(t.name, []) if r["system"] == s.key]
        toks = sum(r["new_tokens"] for r in recs) or 1
        other.append(max(0.0, 1000.0 * sum(r["time_total"] for r in recs) / toks - bottoms[j]))
    ax2.bar(range(len(systems)), other, 0.6, bottom=bottoms, label="other")
    ax2.set_xticks(range(len(systems)))
    ax2.set_xticklabels([s.name for s in systems], fontsize=8)
    ax2.set_ylabel("ms per generated token")
    ax2.set_title("Time per token")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


__all__ = ["plot_gamma", "plot_speed"]
