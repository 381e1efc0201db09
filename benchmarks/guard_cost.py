"""What the output guards cost a token as an answer grows: the functions on the whole text
against the incremental scan (``core.guards.GuardScan``), paired in one process.

After every committed token the output stream (``decoding.text_stream.OutputText``) asks the
repeat, loop and junk guards whether to cut, and what a stream must hold back. The functions
of ``core.guards`` rescan the whole text for that, so a token's guard work grows with the
answer; the scan reads only the new text (a few characters before it for the junk guard).
For each budget the benchmark grows one
answer token by token (Wikipedia text of the sample corpus, with the embedded model's
tokenizer) and times, on every prefix, the calls the stream makes: ``rescan`` (the functions,
as the stream called them before the scan) and ``scan`` (as it calls them now), alternating
per token. Both give the same answers on every prefix (checked here too; and in
``tests/core/test_output_guards.py``). Microseconds per token, mean over the answer, and over its
last 48.

    python -m benchmarks.guard_cost [--budgets 48,256,1024] [--repeats 3] [--quiet]

Results: ``--out`` (default: ``guard_cost/`` in the temp folder, since benchmarks/results holds
at most 40 files); the run docs/history/llama_cpp.md quotes is appended to
benchmarks/results/speed_llama_cpp.md. A few seconds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks import harness

REPO = harness.REPO


def _rescan(text: str, checked: int) -> tuple:
    from nest_integrations.core import guards as t

    cut = (t.repeat_start(text), t.loop_start(text, first_end=checked + 1), t.junk_start(text))
    held = (t.open_repeat_start(text), t.open_loop_start(text), t.open_junk_start(text),
            t.open_guarded_start(text))
    return cut, held, t.complete_words(text)


def _scan(scan, text: str, checked: int) -> tuple:  # type: ignore[no-untyped-def]
    from nest_integrations.core import guards as t

    scan.update(text)
    cut = (scan.repeat_start(text), scan.loop_start(first_end=checked + 1), scan.junk_start())
    held = (scan.open_repeat_start(text), scan.open_loop_start(), scan.open_junk_start(),
            t.open_guarded_start(text))
    return cut, held, scan.complete_words()


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.guard_cost", __doc__)
    ap.set_defaults(out=Path(tempfile.gettempdir()) / "guard_cost")
    ap.add_argument("--budgets", default="48,256,1024", help="answer lengths in tokens")
    ap.add_argument("--repeats", type=int, default=3, help="runs per budget (the fastest kept)")
    ap.add_argument("--quiet", action="store_true", help="do not echo the result")
    args, run = harness.start(ap, argv)

    import json

    from transformers import AutoTokenizer

    from nest_integrations.core.guards import GuardScan
    from nest_integrations.lm.default import default_model_path

    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    corpus = REPO / "nest_integrations" / "data" / "sample" / "wikipedia.jsonl"
    articles = [json.loads(line)["text"] for line in corpus.read_text("utf-8").splitlines()[:40]]
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    ids = tok.encode("\n\n".join(articles), add_special_tokens=False)[: max(budgets)]
    texts = [tok.decode(ids[:k + 1]) for k in range(len(ids))]
    rows = []
    for budget in budgets:
        best: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            scan, per = GuardScan(), {"rescan": [], "scan": []}
            checked = {"rescan": 0, "scan": 0}
            for k in range(budget):
                text = texts[k]
                for name in (("rescan", "scan") if k % 2 else ("scan", "rescan")):
                    t0 = time.perf_counter()
                    out = _rescan(text, checked[name]) if name == "rescan" else _scan(
                        scan, text, checked[name])
                    per[name].append(time.perf_counter() - t0)
                    checked[name] = out[2]
                    if name == "rescan":
                        want = out
                    else:
                        got = out
                if got != want:
                    raise SystemExit(f"scan and rescan differ at token {k}: {got} != {want}")
            for name, v in per.items():
                if name not in best or sum(v) < sum(best[name]):
                    best[name] = v
        rows.append({"budget": budget, **{
            f"{name}_mean_us": 1e6 * sum(v) / len(v) for name, v in best.items()}, **{
            f"{name}_last_us": 1e6 * sum(v[-48:]) / len(v[-48:]) for name, v in best.items()}})
    lines = ["# What the output guards cost a token (`python -m benchmarks.guard_cost`)", "",
             f"Wikipedia text of the sample corpus, the embedded tokenizer; each budget's answer "
             f"grown token by token, both ways timed on every prefix, alternating; the fastest "
             f"of {args.repeats} runs. Microseconds per token (warm caches: in a decode loop "
             f"each step's weights evict them, so the loop pays more).", ""]
    lines += harness.table(
        ["answer tokens", "rescan: mean", "scan: mean", "rescan: last 48", "scan: last 48"],
        [[r["budget"], f"{r['rescan_mean_us']:.0f}", f"{r['scan_mean_us']:.0f}",
          f"{r['rescan_last_us']:.0f}", f"{r['scan_last_us']:.0f}"] for r in rows])
    harness.write_result(args.out, "guard_cost", {"rows": rows}, "\n".join(lines) + "\n", run,
                         args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
