"""The first answer of a process, as a user meets it: ``nest ask --json`` in a fresh process per
question and backend, and optionally the same for another checkout, side by side.

Each question runs once per (checkout, backend), in rotating order, each time in a new process
(model, store and embedder loaded there): the printed tok/s (``NestStats.tokens_per_second``:
the answer's own time, loading left out), the time to the first token
(``NestStats.time_to_first_token``: from the call, the engine built, to the first committed
token) and the whole command's wall time, with the answer's tokens, citations and flagged
sentences, and whether both checkouts gave the same text and citations. ``nest --help`` is timed
too (``--help-runs`` cold processes per checkout, the median).

Usage::

    NEST_THREADS=1 python -m benchmarks.first_answer --set sample --set held-out \\
        --compare /path/to/other/checkout --stem first_answer

``--set sample``: the README's sample questions (``benchmarks.sets.sample_questions``);
``--set held-out``: the "Tell me about X." / "Explain X." family below, topics of the sample
corpus that no sample question names; speed work was never tuned on them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.timing import rotated

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HELD_OUT = (
    "Tell me about Diego Maradona.",
    "Explain how the try statement handles exceptions.",
    "Tell me about the Atacama Desert.",
    "Explain what a lambda expression is in Python.",
    "Tell me about Omar Khayyam.",
    "Explain the while loop.",
    "Tell me about nucleosynthesis.",
    "Explain the nonlocal statement.",
)


def questions(name: str) -> list[str]:
    if name == "held-out":
        return list(HELD_OUT)
    if name == "sample":
        from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS

        return [q.question for q in SAMPLE_QUESTIONS]
    raise SystemExit(f"unknown set {name!r}: use sample or held-out")


def ask(checkout: Path, question: str, backend: str, max_new_tokens: int) -> dict:
    """One ``nest ask --json`` in a fresh process of ``checkout``'s package."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "ANONYMIZED_TELEMETRY": "False",
           "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "nest_integrations.cli", "ask", question, "--json",
         "--backend", backend, "--max-new-tokens", str(max_new_tokens)],
        capture_output=True, text=True, env=env, cwd=checkout, timeout=900, check=True)
    wall = time.perf_counter() - start
    d = json.loads(out.stdout)
    s = d["stats"]
    return {"tok_s": s["tokens_per_second"], "tokens": s["new_tokens"], "wall": wall,
            "ttft": s.get("time_to_first_token"),  # None: a checkout from before issue 63
            "text": d["text"], "cites": len(d["citations"]),
            "spans": [(c["text"], c["passage_id"]) for c in d["citations"]],
            "flagged": len(s.get("unsupported") or [])}


def help_seconds(checkout: Path, runs: int) -> list[float]:
    """Wall seconds of ``nest --help`` in ``runs`` fresh processes of ``checkout``'s package."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "nest_integrations.cli", "--help"], env=env,
                       cwd=checkout, capture_output=True, timeout=300, check=True)
        times.append(time.perf_counter() - start)
    return times


def _seconds(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", action="append", dest="sets", default=None,
                   choices=["sample", "held-out"])
    p.add_argument("--backend", action="append", dest="backends", default=None,
                   choices=["llama.cpp", "torch"])
    p.add_argument("--compare", type=Path, default=None, help="another checkout, run alike")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--stem", default=None, help="write benchmarks/results/<stem>.md")
    p.add_argument("--help-runs", type=int, default=5, help="cold `nest --help` runs per checkout")
    a = p.parse_args(argv)
    sets, backends = a.sets or ["sample", "held-out"], a.backends or ["llama.cpp", "torch"]
    checkouts = {"this": ROOT, **({"other": a.compare.resolve()} if a.compare else {})}
    commit = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=v,
                                capture_output=True, text=True).stdout.strip()
              for k, v in checkouts.items()}
    load0, t0 = os.getloadavg()[0], time.time()
    lines = [f"# The first answer of a process (`python -m benchmarks.first_answer`)", "",
             f"Command: `NEST_THREADS={os.environ.get('NEST_THREADS', '')} python -m "
             f"benchmarks.first_answer {' '.join(argv if argv is not None else sys.argv[1:])}`",
             ""]
    body = []
    if a.help_runs > 0:
        helps = {k: help_seconds(v, a.help_runs) for k, v in checkouts.items()}
        body += ["`nest --help`, median of " f"{a.help_runs} cold processes: " + ", ".join(
            f"{k} {statistics.median(t):.2f} s (of {', '.join(f'{x:.2f}' for x in t)})"
            for k, t in helps.items()), ""]
    for name in sets:
        qs = questions(name)
        for backend in backends:
            rows, names = [], list(checkouts)
            for turn, q in enumerate(qs):  # the checkouts in rotating order
                order = rotated(names, turn)
                res = {k: ask(checkouts[k], q, backend, a.max_new_tokens) for k in order}
                rows.append((q, res))
                print(name, backend, q, {k: round(v["tok_s"], 1) for k, v in res.items()},
                      flush=True)
            body += [f"## {name}, {backend} ({len(qs)} questions)", ""]
            head = ("| question | " + " | ".join(
                f"tok/s {k} | first token s {k} | command s {k}" for k in checkouts)
                    + " | tokens | citations | flagged |")
            if "other" in checkouts:
                head += " same text and citations |"
            body += [head, "|" + "---|" * (head.count("|") - 1)]
            for q, res in rows:
                cells = " | ".join(f"{res[k]['tok_s']:.1f} | {_seconds(res[k].get('ttft'))} | "
                                   f"{res[k]['wall']:.1f}" for k in checkouts)
                t = res["this"]
                line = f"| {q} | {cells} | {t['tokens']} | {t['cites']} | {t['flagged']} |"
                if "other" in checkouts:
                    same = (res["other"]["text"], res["other"].get("spans")) == (
                        t["text"], t.get("spans"))
                    line += f" {'yes' if same else 'NO'} |"
                body.append(line)
            med = " | ".join(
                f"{statistics.median(r[k]['tok_s'] for _, r in rows):.1f} | "
                f"{_seconds(_median([r[k].get('ttft') for _, r in rows]))} | "
                f"{statistics.median(r[k]['wall'] for _, r in rows):.1f}" for k in checkouts)
            body += [f"| **median** | {med} | | | |" + (" |" if "other" in checkouts else ""), ""]
    lines += [f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, "
              + ", ".join(f"{k} = `{commit[k]}`" for k in checkouts)
              + f"; load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; "
              f"{time.time() - t0:.0f} s. tok/s as `nest ask` prints it (the answer's own time: "
              "retrieval, evidence, decoding and citations; loading left out); first token s: from "
              "the call (model, store and embedder loaded) to the first committed token; "
              "command s: the whole process, loading included. Each cell is one cold process.",
              ""] + body
    if a.stem:
        (RESULTS / f"{a.stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
