"""What support citations (``NestConfig.attribute``, on in the default ``grounded`` preset
since issue 53) add to the wall time of a default answer (issue 23: target at most +15% on a
64-token default answer).

The default engine (``NestEngine.from_defaults`` over the sample store, ``nest ingest
--sample``; it attributes against all its ``n_passages`` retrieved passages) answers the first
``--questions`` questions of ``benchmarks.sets.sample_questions`` as a chat user message
(what ``nest ask`` sends), with ``max_new_tokens=64``, with attribution off and on,
interleaved (the order alternates per repetition, so drift and caches hit both alike). One
warm-up answer per setting comes first, off then on (the off one loads the model, the passage
keys and the MiniLM embedder the answer policy's evidence scorer uses; the on one adds what
attribution builds on first use) and is reported apart. Both settings must give the same token
ids, and every sentence of an attributed answer must be cited or flagged unsupported
(``attribution.unaccounted``). Also timed: the attribution alone (``SentenceStream`` over the
answer, warm embedder and embedding cache), per answer, at once and sentence by sentence as the
stream calls it (which must give the same verdicts).

    NEST_THREADS=1 python -m benchmarks.attribution_overhead --persist-dir .nest/store

Writes ``benchmarks/results/attribution_overhead.md`` and ``.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Sequence

from benchmarks import harness


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.attribution_overhead", __doc__)
    ap.add_argument("--persist-dir", default=None,
                    help="the nest ingest store (default: NEST_HOME's)")
    ap.add_argument("--collection", default=None)
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args, run = harness.start(ap, argv)

    import torch

    torch.set_num_threads(int(os.environ.get("NEST_THREADS", "1")))
    from nest_integrations import NestEngine
    from nest_integrations.assembly import DEFAULT_PRESET
    from nest_integrations.attribution import split_sentences, unaccounted
    from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    engine = NestEngine.from_defaults(collection=args.collection, persist_dir=args.persist_dir)
    t_engine = time.perf_counter() - t0
    off = engine.config.replace(attribute=False)
    on = engine.config.replace(attribute=True)
    questions = [q.question for q in SAMPLE_QUESTIONS[: args.questions]]
    n = args.max_new_tokens

    def answer(q: str, cfg):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        res = engine.generate([{"role": "user", "content": q}], max_new_tokens=n, config=cfg)
        return time.perf_counter() - t, res

    warm = {"off": answer(questions[0], off)[0], "on": answer(questions[0], on)[0]}
    rows = []
    for rep in range(args.reps):
        for i, q in enumerate(questions):
            order = [("off", off), ("on", on)] if (rep + i) % 2 == 0 else [("on", on), ("off", off)]
            got = {name: answer(q, cfg) for name, cfg in order}
            (t_off, r_off), (t_on, r_on) = got["off"], got["on"]
            if r_off.token_ids != r_on.token_ids:
                raise SystemExit(f"attribution changed the answer to {q!r}")
            if unaccounted(r_on.text, r_on.citations, r_on.unsupported):
                raise SystemExit(f"a sentence neither cited nor flagged in the answer to {q!r}")
            own = [c for c in r_on.citations if c.kind != "support"]  # the answer's copies
            live = engine.sentence_stream(on, r_on.passages)
            t = time.perf_counter()
            live.feed(r_on.text, final=True, cited=own)
            t_attr = time.perf_counter() - t
            live2 = engine.sentence_stream(on, r_on.passages)  # as the stream calls it
            t = time.perf_counter()
            for start, _ in split_sentences(r_on.text)[1:]:
                live2.feed(r_on.text[: start + 1], cited=own)
            live2.feed(r_on.text, final=True, cited=own)
            t_stream = time.perf_counter() - t
            if _verdicts(live2) != _verdicts(live):  # scores may differ by float rounding
                raise SystemExit(f"sentence by sentence != at once for {q!r}")
            rows.append({"rep": rep, "question": q, "off_s": t_off, "on_s": t_on,
                         "attribution_s": t_attr, "attribution_stream_s": t_stream,
                         "new_tokens": r_on.stats.new_tokens,
                         "decoding": r_on.stats.decoding,
                         "sentences": len(live.sentences),
                         "cited": sum(c.kind != "support" for c in r_on.citations),
                         "support": sum(c.kind == "support" for c in r_on.citations),
                         "unsupported": len(r_on.unsupported)})
            print(f"{q[:40]:40s} off {t_off:6.2f}s on {t_on:6.2f}s attr {t_attr * 1e3:6.0f} ms "
                  f"stream {t_stream * 1e3:6.0f} ms", file=sys.stderr)
    load1 = os.getloadavg()[0]
    total_off = sum(r["off_s"] for r in rows)
    total_on = sum(r["on_s"] for r in rows)
    summary = {
        "questions": len(questions), "reps": args.reps, "max_new_tokens": n,
        "threads": torch.get_num_threads(), "load_before": load0, "load_after": load1,
        "engine_load_s": t_engine, "warmup_off_s": warm["off"], "warmup_on_s": warm["on"],
        "total_off_s": total_off, "total_on_s": total_on,
        "overhead": total_on / total_off - 1,
        "median_pair_overhead": statistics.median(r["on_s"] / r["off_s"] - 1 for r in rows),
        "attribution_ms_per_answer": 1e3 * statistics.mean(r["attribution_s"] for r in rows),
        "mean_new_tokens": statistics.mean(r["new_tokens"] for r in rows),
        "attribution_stream_ms_per_answer":
            1e3 * statistics.mean(r["attribution_stream_s"] for r in rows),
        "attribution_share": sum(r["attribution_s"] for r in rows) / total_off,
        "first_off_s": statistics.mean(r["off_s"] for r in rows if r["question"] == questions[0]),
        "sentences": sum(r["sentences"] for r in rows),
        "sentences_unsupported": sum(r["unsupported"] for r in rows),
    }
    s = summary
    lines = [
        "# Attribution overhead",
        "",
        f"{len(questions)} sample questions x {args.reps} as chat messages (the default preset "
        f"`{DEFAULT_PRESET}`), interleaved, max_new_tokens={n}, {s['threads']} torch "
        "thread(s).",
        "",
        "| attribute | total s | s / answer |",
        "|---|---|---|",
        f"| off | {total_off:.1f} | {total_off / len(rows):.2f} |",
        f"| on | {total_on:.1f} | {total_on / len(rows):.2f} |",
        "",
        f"- Wall-time overhead: **{100 * s['overhead']:+.1f}%** (sum of answers; median over "
        f"pairs {100 * s['median_pair_overhead']:+.1f}%). Answers: {s['mean_new_tokens']:.0f} "
        "new tokens on average, same token ids with and without attribution.",
        f"- Attribution alone (warm embedder and cache): {s['attribution_ms_per_answer']:.0f} ms "
        f"per answer at once, {s['attribution_stream_ms_per_answer']:.0f} ms sentence by "
        f"sentence as the stream calls it (same verdicts); at once is "
        f"{100 * s['attribution_share']:.1f}% of an answer without it.",
        f"- Warm-up (first answers, excluded above): off {warm['off']:.1f} s (loads the model, "
        f"the keys and the evidence scorer's MiniLM), then on {warm['on']:.1f} s for the same "
        f"question (its later answers off: {s['first_off_s']:.1f} s; the first attributed answer "
        "builds the attributor and embeds the passages' sentences).",
        f"- Every attributed sentence is cited or flagged: {s['sentences']} sentences, "
        f"{s['sentences_unsupported']} flagged unsupported, 0 neither.",
        "",
        "| question | rep | decoding | off s | on s | attribution ms (at once / by sentence) | "
        "cited | support | unsupported |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['question']} | {r['rep']} | {r['decoding']} | {r['off_s']:.2f} | "
              f"{r['on_s']:.2f} | {1e3 * r['attribution_s']:.0f} / "
              f"{1e3 * r['attribution_stream_s']:.0f} | {r['cited']} | {r['support']} | "
              f"{r['unsupported']} |" for r in rows]
    harness.write_result(args.out, "attribution_overhead", {"summary": summary, "rows": rows},
                         "\n".join(lines) + "\n", run)
    return 0


def _verdicts(live):  # noqa: ANN001, ANN202
    """What a ``SentenceStream`` decided: its support citations and each sentence's verdict
    (raw scores differ in the 7th digit between one batch of units and several)."""
    return live.support, [(s.start, s.end, s.verdict, s.passage_id) for s in live.sentences]


if __name__ == "__main__":
    raise SystemExit(main())
