"""Where a decode step's time goes: our rows on llama.cpp, per prompt set (issue 35)

The speed benchmark (``benchmarks.speed``) gives each row's rate; this one says why two rows
differ per step. For each row on each prompt of a set (the speed benchmark's prompts, rows
interleaved in a rotating order per prompt, ``--rounds`` times), after the first token:

- **ms a token**: the decode's seconds over the tokens after the first, pooled;
- **LM passes by rows**: llama.cpp decodes of T rows (T = 1: a step; T > 1: a verify pass),
  how many and their mean milliseconds, prefills left out;
- **engine parts**: the engine's own timers per token (the kNN search and mixture, drafting)
  and what is left besides the LM and those ("other": the loop's Python, the guards, the
  output text);
- **verified drafts**: the drafts verified in one multi-row pass and how many of their rows
  were accepted (``DraftPlanner.observe``);
- **outside llama_decode**: the decode's seconds less those inside ``llama_decode`` itself
  (llama.cpp's C), per token decoded: the loop's own Python and the copies around each step;
- **cut**: tokens decoded and then dropped from the answer (``OutputText._cut``: the repeat
  guard's repeated sentence or loop, an unfinished sentence held back as a possible repeat
  when the budget ends, a stop string). The rate counts the tokens kept, as the speed
  benchmark does; **ms a decoded token** counts these too, so it compares the steps alone.

The LM decodes, the planner and the cuts are observed by wrapping three methods for the run (as the
harness's ``PrefillTimer`` does), and ``llama_decode`` by wrapping llama-cpp-python's function;
the engine's code is unchanged. A row named ``ROW@logits`` is ``ROW`` with the loop reading
each pass's logits where it would read their argmaxes (``DecodeLoop.target.argmax`` off, as
before ``forward_argmax``): interleaved with ``ROW``, the pair measures that path.

Usage: NEST_THREADS=1 python -m benchmarks.step_profile --set held-out --per-set 10 --rounds 3
(about 3 minutes at 1 thread; needs the ``llamacpp`` extra and ``nest ingest --sample``).
Results: ``--out`` (default: ``step_profile/`` in the temp folder, since benchmarks/results
holds at most 40 files); the run docs/history/llama_cpp.md quotes is appended to
benchmarks/results/speed_llama_cpp.md.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from benchmarks import harness

DEFAULT_ROWS = "llama.cpp:greedy+psg,llama.cpp:grounded"
#: A row-name suffix: the row with the loop reading logits instead of argmaxes.
LOGITS = "@logits"


def base_row(name: str) -> str:
    """The speed benchmark's row a ``--rows`` name runs (``ROW@logits``: ``ROW``)."""
    return name[: -len(LOGITS)] if name.endswith(LOGITS) else name


class Observer:
    """LM decodes by rows per pass (outside prefills) and the verified drafts of one run."""

    def __init__(self) -> None:
        self.passes: dict[int, list[float]] = defaultdict(list)
        self.drafts: list[tuple[int, int]] = []
        self.cut = 0
        self.c_seconds = 0.0  # inside llama_decode, outside prefills
        self.in_prefill = False
        self.logits_rows = False  # the row reads logits (``@logits``)

    def take(self) -> dict[str, Any]:
        out = {"passes": {t: list(v) for t, v in self.passes.items()},
               "drafts": list(self.drafts), "cut": self.cut, "c_seconds": self.c_seconds}
        self.passes.clear()
        self.drafts.clear()
        self.cut = 0
        self.c_seconds = 0.0
        return out

    @contextmanager
    def installed(self) -> Iterator[None]:
        from nest_integrations.decoding.loop import DecodeLoop
        from nest_integrations.decoding.text_stream import OutputText
        from nest_integrations.lm.cost import DraftPlanner
        from nest_integrations.lm.llama_cpp import LlamaCppRuntime, llama_cpp_module

        decode, prefill, observe = LlamaCppRuntime.decode, DecodeLoop.prefill, DraftPlanner.observe
        cut, init = OutputText._cut, DecodeLoop.__init__
        lib = llama_cpp_module()
        c_decode = lib.llama_decode
        me = self

        def timed_c(ctx: Any, batch: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return c_decode(ctx, batch)
            finally:
                if not me.in_prefill:
                    me.c_seconds += time.perf_counter() - t0

        def init_loop(loop: Any, *a: Any, **kw: Any) -> None:
            init(loop, *a, **kw)
            if me.logits_rows:
                loop.target.argmax = False

        def timed_decode(rt: Any, tokens: Sequence[int], *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return decode(rt, tokens, *a, **kw)
            finally:
                if not me.in_prefill:
                    me.passes[len(tokens)].append(time.perf_counter() - t0)

        def flagged_prefill(loop: Any, *args: Any, **kwargs: Any) -> Any:
            me.in_prefill = True
            try:
                return prefill(loop, *args, **kwargs)
            finally:
                me.in_prefill = False

        def observed(planner: Any, drafted: int, accepted: int) -> None:
            if drafted > 1:
                me.drafts.append((int(drafted), int(accepted)))
            observe(planner, drafted, accepted)

        def counted_cut(text: Any, at: int) -> None:
            before = len(text.ids)
            cut(text, at)
            me.cut += before - len(text.ids)

        LlamaCppRuntime.decode = timed_decode  # type: ignore[method-assign]
        lib.llama_decode = timed_c
        DecodeLoop.__init__ = init_loop  # type: ignore[method-assign]
        DecodeLoop.prefill = flagged_prefill  # type: ignore[method-assign]
        DraftPlanner.observe = observed  # type: ignore[method-assign]
        OutputText._cut = counted_cut  # type: ignore[method-assign]
        try:
            yield
        finally:
            LlamaCppRuntime.decode = decode  # type: ignore[method-assign]
            lib.llama_decode = c_decode
            DecodeLoop.__init__ = init  # type: ignore[method-assign]
            DecodeLoop.prefill = prefill  # type: ignore[method-assign]
            DraftPlanner.observe = observe  # type: ignore[method-assign]
            OutputText._cut = cut  # type: ignore[method-assign]


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's figures over its runs (each a ``run_nest`` record with ``observed``)."""
    runs = [r for r in runs if harness.decode_timed({"x": r}, "x")]
    tokens = sum(r["tokens"] - 1 for r in runs)
    decode_s = sum(r["seconds"] - r["first_s"] for r in runs)
    passes: dict[int, list[float]] = defaultdict(list)
    drafts: list[tuple[int, int]] = []
    for r in runs:
        for t, v in r["observed"]["passes"].items():
            passes[int(t)].extend(v)
        drafts.extend(tuple(d) for d in r["observed"]["drafts"])
    lm_s = sum(sum(v) for v in passes.values())
    knn_s = sum(r["time"]["knn"] for r in runs)
    draft_s = sum(r["time"]["draft"] for r in runs)
    cut = sum(r["observed"].get("cut", 0) for r in runs)
    c_s = sum(r["observed"].get("c_seconds", 0.0) for r in runs)
    per = (lambda s: 1000.0 * s / tokens) if tokens else (lambda s: None)
    return {
        "runs": len(runs), "tokens": tokens, "ms_per_token": per(decode_s), "cut": cut,
        "ms_per_decoded_token": 1000.0 * decode_s / (tokens + cut) if tokens + cut else None,
        "outside_c_ms_per_decoded_token": (1000.0 * (decode_s - c_s) / (tokens + cut)
                                           if tokens + cut else None),
        "lm_ms_per_token": per(lm_s), "knn_ms_per_token": per(knn_s),
        "draft_ms_per_token": per(draft_s),
        "other_ms_per_token": per(max(0.0, decode_s - lm_s - knn_s - draft_s)),
        "passes": {t: {"n": len(v), "mean_ms": 1000.0 * sum(v) / len(v)}
                   for t, v in sorted(passes.items())},
        "drafts": {"n": len(drafts), "drafted": sum(d for d, _ in drafts),
                   "accepted": sum(a for _, a in drafts)},
    }


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    ref = next(iter(rows), None)
    lines = [f"# Where a decode step's time goes ({result['set']} prompts)", "",
             f"{result['prompts']} prompts x {result['rounds']} rounds, {result['threads']} "
             f"thread(s), rows interleaved per prompt; milliseconds per token after the first, "
             f"pooled; the parts (LM, kNN + mixture, drafting, other) per token kept. The "
             f"ratios are the reference row's ms over the row's (`{ref}`: 1.00); **cut**: tokens "
             f"decoded and then dropped by the output's guards (see the module docstring), "
             f"counted in **ms a decoded token**; **outside llama_decode**: ms a decoded token "
             f"outside llama.cpp's C decode (a `@logits` row reads logits where its row reads "
             f"argmaxes).", ""]
    ref_ms = rows[ref]["ms_per_token"] if ref else None
    ref_dec = rows[ref]["ms_per_decoded_token"] if ref else None
    lines += harness.table(
        ["row", "tokens", "ms a token", "rate vs ref", "cut", "ms a decoded token",
         "step rate vs ref", "outside llama_decode", "LM", "kNN + mixture", "drafting",
         "other"],
        [[n, s["tokens"], harness.fmt(s["ms_per_token"]),
          harness.fmt(harness.ratio(ref_ms, s["ms_per_token"])), s["cut"],
          harness.fmt(s["ms_per_decoded_token"]),
          harness.fmt(harness.ratio(ref_dec, s["ms_per_decoded_token"])),
          harness.fmt(s.get("outside_c_ms_per_decoded_token")),
          harness.fmt(s["lm_ms_per_token"]),
          harness.fmt(s["knn_ms_per_token"]), harness.fmt(s["draft_ms_per_token"]),
          harness.fmt(s["other_ms_per_token"])] for n, s in rows.items()])
    lines += ["", "LM passes after the prefill (rows per pass: count, mean ms) and the drafts "
              "verified in one multi-row pass (accepted of drafted rows):", ""]
    lines += harness.table(
        ["row", "passes", "multi-row drafts"],
        [[n, "; ".join(f"T={t}: {p['n']} x {p['mean_ms']:.2f}" for t, p in s["passes"].items()),
          f"{s['drafts']['n']} ({s['drafts']['accepted']} of {s['drafts']['drafted']})"]
         for n, s in rows.items()])
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.step_profile", __doc__)
    ap.set_defaults(out=Path(tempfile.gettempdir()) / "step_profile")
    ap.add_argument("--rows", default=DEFAULT_ROWS,
                    help=f"speed-benchmark rows on llama.cpp, the first the reference "
                    f"(default {DEFAULT_ROWS})")
    ap.add_argument("--set", default="held-out", choices=("grounded", "held-out", "qa"))
    ap.add_argument("--per-set", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prefix-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None,
                    help="compute threads (default $NEST_THREADS, else the physical cores)")
    ap.add_argument("--stem", default="step_profile")
    ap.add_argument("--quiet", action="store_true")
    args, run = harness.start(ap, argv)

    from benchmarks.harness.prompts import sample_passages, speed_sets
    from benchmarks.harness.systems import Parts, run_row
    from benchmarks.speed import ROWS
    from nest_integrations.lm import backend

    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    for n in names:
        b = base_row(n)
        if b not in ROWS or ROWS[b].backend != "llama.cpp" or ROWS[b].engine != "nest":
            ap.error(f"--rows: {n!r} is not one of our rows on llama.cpp, or one with "
                     f"{LOGITS!r} "
                     f"({', '.join(k for k, r in ROWS.items() if r.backend == 'llama.cpp' and r.engine == 'nest')})")
    threads = backend.configure_threads(args.threads)
    parts = Parts("bf16", threads)  # the torch engine only cuts the prompts, as in speed
    if parts.llama_engine() is None:
        raise SystemExit(f"llama.cpp: {parts.llama_info['status']}")
    engine = parts.engine()
    prompts, _ = speed_sets(engine.lm, sample_passages(), args.per_set, args.prefix_tokens,
                            args.max_new_tokens)
    prompts = [q for q in prompts if q["set"] == args.set]
    rows = [dataclasses.replace(ROWS[base_row(n)], name=n) for n in names]
    obs = Observer()
    parts.prefill.install()  # the harness's prefill timer first, so the observer's wrapper,
    # put on top of it and taken off after the run, leaves it in place
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with obs.installed():
        for r in rows:  # warm: the cost curve, the first generation's allocations
            obs.logits_rows = r.name.endswith(LOGITS)
            run_row(parts, r, prompts[0], args.max_new_tokens)
            obs.take()
        for rd in range(args.rounds):
            for i, q in enumerate(prompts):
                for r in harness.rotated(rows, i + rd):
                    obs.logits_rows = r.name.endswith(LOGITS)
                    out = run_row(parts, r, q, args.max_new_tokens)
                    out["observed"] = obs.take()
                    runs[r.name].append(out)
                if not args.quiet:
                    print(f"round {rd + 1}/{args.rounds}, prompt {i + 1}/{len(prompts)}",
                          file=sys.stderr, flush=True)
    result = {"set": args.set, "prompts": len(prompts), "rounds": args.rounds,
              "threads": threads, "rows": {n: summarise(v) for n, v in runs.items()}}
    harness.write_result(args.out, args.stem, result, markdown(result), run, args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
