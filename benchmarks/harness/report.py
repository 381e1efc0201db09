"""The one result writer (``<stem>.md`` + ``<stem>.json``, both carrying the run record) and
Markdown table helpers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.harness.run import Run


def fmt(x: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals, ``-`` for None."""
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def pct(x: float | None, digits: int = 1) -> str:
    """A share as a percentage without the sign, ``-`` for None."""
    return "-" if x is None else f"{100.0 * x:.{digits}f}"


def row(*cells: Any) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table: header, rule, rows."""
    return [row(*header), "|" + "---|" * len(header)] + [row(*r) for r in rows]


def run_lines(record: dict[str, Any]) -> list[str]:
    """The header every summary carries: command, date, machine, load and commit."""
    m = {"cpu": "?", "cpus": "?", **record["machine"]}
    threads = f", {m['torch_threads']} torch thread(s)" if "torch_threads" in m else ""
    bf16 = f", native bf16: {m['native_bf16']}" if "native_bf16" in m else ""
    rerun = ([f"Re-run with: `{record['rerun']}` (the command above is the script this run "
              "used, since replaced)", ""] if record.get("rerun") else [])
    return [
        f"Command: `{record['command']}`",
        "",
        *rerun,
        f"Run: {record['when']}, commit `{record['commit']}`, {record['wall_s']:.0f} s wall. "
        f"Machine: {m['cpu']}, {m['cpus']} CPUs{threads}{bf16}; load average "
        f"{record['load_start'][0]:.2f} at start, {record['load_end'][0]:.2f} at end (a shared "
        "machine: compare ratios measured side by side, not absolute speeds)."
        + mapping_text(record.get("model_mappings")),
    ]


def mapping_text(maps: list[dict[str, Any]] | None) -> str:
    """`` Model files mapped (share in 2 MB pages, at the end of the run): <file> 43%, ...``
    for a run record's ``model_mappings`` (empty when there are none)."""
    if not maps:
        return ""
    return " Model files mapped (share in 2 MB pages, at the end of the run): " + ", ".join(
        f"{m['file']} {100 * m['pmd_kb'] / m['kb']:.0f}%" if m["kb"] else m["file"]
        for m in maps) + "."


def write_result(out: str | Path, stem: str, result: dict[str, Any], markdown: str,
                 run: Run, quiet: bool = False) -> tuple[Path, Path]:
    """Write ``<out>/<stem>.md`` (``markdown`` with the run record after its title) and
    ``<out>/<stem>.json`` (``result`` with ``"run"``); echo the Markdown unless ``quiet``."""
    record = result.get("run") or run.finish()
    result["run"] = record
    lines = markdown.rstrip("\n").split("\n")
    head = 1 if lines and lines[0].startswith("# ") else 0
    body = lines[:head] + ([""] if head else []) + run_lines(record) + [""] + lines[head:]
    text = "\n".join(body).replace("\n\n\n", "\n\n") + "\n"
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / f"{stem}.md", folder / f"{stem}.json"
    md.write_text(text, encoding="utf-8")
    js.write_text(json.dumps(result, indent=1, ensure_ascii=False, default=str) + "\n",
                  encoding="utf-8")
    if not quiet:
        sys.stdout.write(text)
    return md, js


def read_jsonl(path: str | Path) -> list[Any]:
    """The JSON values of a JSON Lines file, read gzipped when it ends in ``.gz`` or when only
    ``<path>.gz`` exists (raw records are kept compressed in ``benchmarks/results``)."""
    import gzip

    p = Path(path)
    if not p.exists() and p.with_name(p.name + ".gz").exists():
        p = p.with_name(p.name + ".gz")
    raw = gzip.decompress(p.read_bytes()).decode("utf-8") if p.suffix == ".gz" else \
        p.read_text(encoding="utf-8")
    return [json.loads(line) for line in raw.splitlines() if line.strip()]
