"""Record, or check, the token ids that each decoding method produces on the sample corpus.

Issue 19 (the consolidation refactor) requires that ``paper``, ``grounded``, ``dresd``,
``knn-ssd``, ``rest``, ``rag-copy`` and ``prompt-lookup`` produce identical tokens on the
sample corpus before and after the refactor. This script records those outputs on one version
of the code and compares another version against them. It uses only the public entry points:
the ``nest`` CLI (``nest_integrations.cli.main``) to ingest and build, and
``NestEngine.from_defaults`` to decode.

Record (writes the baseline and the KNN-SSD profile next to it)::

    python scripts/record_outputs.py --out tests/data/outputs_baseline.json \\
        --persist-dir /tmp/nest-record

Check (exits 1, naming every method/question whose token ids or citations differ)::

    python scripts/record_outputs.py --check tests/data/outputs_baseline.json \\
        --persist-dir /tmp/nest-record

Steps:

1. ``nest ingest --sample --persist-dir DIR``. Skipped when DIR already holds a finished
   ingest (marker file ``DIR/.record_outputs.ingested``).
2. ``nest dresd build --collection nest --persist-dir DIR``. This builds the datastore that
   ``dresd`` and ``rest`` find at ``DIR/dresd/nest``. Skipped when the marker
   ``DIR/.record_outputs.dresd`` exists.
3. The KNN-SSD profile. A check always uses the profile saved with the baseline
   (``<baseline>.knn_ssd_profile.json``), because the skip-set search times forward passes
   and so may choose a different set on another run. A recording builds a small profile with
   the CLI (``PROFILE_RECIPE`` below, also written into the baseline's ``_meta``), or reuses
   the one passed with ``--knn-ssd-profile``.
4. For every method and each of the 3 questions: one chat message, ``max_new_tokens=48``,
   greedy decoding (``temperature`` 0 in every preset used), 1 torch thread.

Output JSON: ``{method: {question: {"token_ids": [...], "text": ..., "citations":
[[start, end, doc_id, source_start, source_end], ...]}}}``, plus one ``"_meta"`` entry (the
recipe, timings and versions; it is never compared). The token ids are
``NestResult.token_ids``, the ids the engine generated. They are not re-tokenised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

#: Three questions about the sample corpus (from ``benchmarks.sets.sample_questions``,
#: written out here so that moving that module does not change the recording).
QUESTIONS: tuple[str, ...] = (
    "How does the assert statement work in Python?",
    "How does the with statement work?",
    "What is the Roman Empire?",
)
MAX_NEW_TOKENS = 48
COLLECTION = "nest"
#: The baseline was recorded in fp32, the CPU default until issue 21 made ``auto`` (bf16 on a CPU
#: with native bf16) the default; every step of this script keeps fp32, so the check stays a
#: check of the code and not of the machine's dtype.
DTYPE = "fp32"

#: method name -> (decoding, config). ``None`` as config means the default preset
#: (``grounded`` when this was written), so a changed default shows up as a difference.
METHODS: dict[str, tuple[str, str | None]] = {
    "paper": ("nest", "paper"),
    "grounded": ("nest", None),
    "dresd": ("dresd", None),
    "knn-ssd": ("knn-ssd", None),
    "rest": ("rest", None),
    "rag-copy": ("rag-copy", None),
    "prompt-lookup": ("prompt-lookup", None),
}

#: How the KNN-SSD profile was built: ``nest knn-ssd`` argv lists (``{prompts}`` is the prompt
#: folder and ``{profile}`` the profile path). Two domains get anchors. ``python-docs`` has its
#: own searched skip set. ``wiki-en`` has none, so its prompts route to the ``mixed`` fallback.
PROFILE_RECIPE: list[list[str]] = [
    ["knn-ssd", "prompts", "--out", "{prompts}", "--n-train", "4", "--n-eval", "1",
     "--domains", "python-docs", "wiki-en"],
    ["knn-ssd", "search", "--domain", "python-docs", "--prompts",
     "{prompts}/python-docs.train.jsonl", "--trials", "3", "--n-prompts", "2",
     "--max-new-tokens", "12", "--profile", "{profile}"],
    ["knn-ssd", "search", "--domain", "mixed", "--prompts", "{prompts}/python-docs.train.jsonl",
     "--prompts", "{prompts}/wiki-en.train.jsonl", "--trials", "3", "--n-prompts", "2",
     "--max-new-tokens", "12", "--profile", "{profile}"],
    ["knn-ssd", "anchors", "--domain", "python-docs", "--prompts",
     "{prompts}/python-docs.train.jsonl", "--k", "2", "--profile", "{profile}"],
    ["knn-ssd", "anchors", "--domain", "wiki-en", "--prompts",
     "{prompts}/wiki-en.train.jsonl", "--k", "2", "--profile", "{profile}"],
]


def _log(msg: str) -> None:
    sys.stderr.write(f"[record_outputs] {msg}\n")
    sys.stderr.flush()


def _nest(argv: list[str]) -> None:
    from nest_integrations.cli import main

    _log("nest " + " ".join(argv))
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"`nest {' '.join(argv)}` failed with exit status {rc}")


def profile_path_for(baseline: Path) -> Path:
    return baseline.with_name(baseline.stem + ".knn_ssd_profile.json")


def prepare_store(persist: Path, timings: dict[str, float]) -> None:
    persist.mkdir(parents=True, exist_ok=True)
    marker = persist / ".record_outputs.ingested"
    if not marker.exists():
        t = time.perf_counter()
        _nest(["ingest", "--sample", "--persist-dir", str(persist), "--collection", COLLECTION])
        marker.write_text("ok\n")
        timings["ingest"] = time.perf_counter() - t
    else:
        _log(f"reusing the ingested sample corpus in {persist}")
    marker = persist / ".record_outputs.dresd"
    if not marker.exists():
        t = time.perf_counter()
        _nest(["dresd", "build", "--collection", COLLECTION, "--persist-dir", str(persist)])
        marker.write_text("ok\n")
        timings["dresd_build"] = time.perf_counter() - t
    else:
        _log(f"reusing the DReSD datastore in {persist}/dresd/{COLLECTION}")


def build_profile(target: Path, timings: dict[str, float]) -> None:
    """Run ``PROFILE_RECIPE`` in a scratch folder and copy the profile to ``target``."""
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="knn-ssd-profile-") as tmp:
        prompts, profile = Path(tmp) / "prompts", Path(tmp) / "profile" / "profile.json"
        for argv in PROFILE_RECIPE:
            _nest([a.format(prompts=prompts, profile=profile) for a in argv])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(profile, target)
    timings["knn_ssd_profile"] = time.perf_counter() - t


def _citation_row(c: Any) -> list[Any]:
    return [c.start, c.end, c.doc_id, c.source_start, c.source_end]


def run_methods(persist: Path, profile: Path, methods: list[str], questions: list[str],
                timings: dict[str, float]) -> dict[str, Any]:
    from nest_integrations import NestEngine

    out: dict[str, Any] = {}
    for name in methods:
        decoding, config = METHODS[name]
        options = {"profile": str(profile)} if decoding == "knn-ssd" else None
        t = time.perf_counter()
        engine = NestEngine.from_defaults(collection=COLLECTION, persist_dir=str(persist),
                                          config=config, decoding=decoding,
                                          drafter_options=options)
        per_q: dict[str, Any] = {}
        for q in questions:
            res = engine.generate([{"role": "user", "content": q}],
                                  max_new_tokens=MAX_NEW_TOKENS)
            per_q[q] = {"token_ids": [int(i) for i in res.token_ids], "text": res.text,
                        "citations": [_citation_row(c) for c in res.citations]}
        timings[f"method:{name}"] = time.perf_counter() - t
        _log(f"{name}: {len(questions)} questions in {timings[f'method:{name}']:.1f} s")
        out[name] = per_q
    return out


def _first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(baseline: dict[str, Any], got: dict[str, Any], ids_only: bool) -> list[str]:
    """One line per method/question whose token ids (or citations, unless ``ids_only``)
    differ from the baseline."""
    problems = []
    for method, per_q in got.items():
        for q, now in per_q.items():
            was = baseline.get(method, {}).get(q)
            if was is None:
                problems.append(f"{method} / {q!r}: not in the baseline")
                continue
            if was["token_ids"] != now["token_ids"]:
                i = _first_diff(was["token_ids"], now["token_ids"])
                problems.append(
                    f"{method} / {q!r}: TOKEN IDS DIFFER from position {i} "
                    f"(baseline {len(was['token_ids'])} tokens, now {len(now['token_ids'])})\n"
                    f"    baseline ids[{i}:{i + 8}] {was['token_ids'][i:i + 8]}\n"
                    f"    now      ids[{i}:{i + 8}] {now['token_ids'][i:i + 8]}\n"
                    f"    baseline text: {was['text']!r}\n"
                    f"    now      text: {now['text']!r}")
            elif not ids_only and was["citations"] != now["citations"]:
                problems.append(f"{method} / {q!r}: same token ids, CITATIONS DIFFER\n"
                                f"    baseline {was['citations']}\n    now      {now['citations']}")
            elif not ids_only and was["text"] != now["text"]:
                problems.append(f"{method} / {q!r}: same token ids, TEXT DIFFERS\n"
                                f"    baseline {was['text']!r}\n    now      {now['text']!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="write a new baseline JSON here")
    mode.add_argument("--check", type=Path, metavar="FILE", help="compare against this baseline")
    ap.add_argument("--persist-dir", type=Path,
                    help="store folder for the sample corpus (default: a temporary folder; a "
                    "folder already filled by this script is reused)")
    ap.add_argument("--knn-ssd-profile", type=Path,
                    help="record mode: use this KNN-SSD profile instead of building one "
                    "(it is copied next to the baseline; pass the file already there to keep "
                    "it, recorded as built by the recipe)")
    ap.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    ap.add_argument("--questions", type=int, default=len(QUESTIONS),
                    help="use the first N of the 3 questions (check mode: a subset)")
    ap.add_argument("--ids-only", action="store_true",
                    help="check mode: compare token ids only, not text and citations")
    args = ap.parse_args(argv)

    import torch

    from nest_integrations.lm.backend import set_default_dtype

    torch.set_num_threads(1)
    set_default_dtype(DTYPE)  # the in-process CLI steps and from_defaults all load in DTYPE
    questions = list(QUESTIONS[: max(1, args.questions)])
    timings: dict[str, float] = {}
    start = time.perf_counter()
    tmp = None
    copied_from = None  # record mode: the profile came from another file, not the recipe
    if args.persist_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="nest-record-")
        persist = Path(tmp.name)
    else:
        persist = args.persist_dir.resolve()
    try:
        prepare_store(persist, timings)
        if args.check:
            baseline = json.loads(args.check.read_text(encoding="utf-8"))
            profile = profile_path_for(args.check)
            if not profile.is_file():
                raise SystemExit(f"the baseline's KNN-SSD profile {profile} is missing")
        else:
            profile = profile_path_for(args.out)
            if args.knn_ssd_profile:
                if args.knn_ssd_profile.resolve() != profile.resolve():
                    shutil.copyfile(args.knn_ssd_profile, profile)
                    copied_from = str(args.knn_ssd_profile)
            else:
                build_profile(profile, timings)
        got = run_methods(persist, profile, args.methods, questions, timings)
    finally:
        if tmp is not None:
            tmp.cleanup()
    timings["total"] = time.perf_counter() - start
    summary = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())

    if args.check:
        problems = compare(baseline, got, args.ids_only)
        n = sum(len(v) for v in got.values())
        if problems:
            print(f"FAIL: {len(problems)} of {n} method/question outputs differ from "
                  f"{args.check}:")
            for p in problems:
                print("  - " + p)
            print(f"timings: {summary}")
            return 1
        print(f"OK: {n} method/question outputs ({len(got)} methods x {len(questions)} "
              f"questions) match {args.check} token for token; timings: {summary}")
        return 0

    import platform

    meta = {
        "about": "token ids of each decoding on the sample corpus (issue 19); written by "
                 "scripts/record_outputs.py; this entry is never compared",
        "questions": questions,
        "max_new_tokens": MAX_NEW_TOKENS,
        "collection": COLLECTION,
        "torch_threads": 1,
        "dtype": DTYPE,
        "methods": {m: {"decoding": d, "config": c or "default preset (grounded)"}
                    for m, (d, c) in METHODS.items() if m in args.methods},
        "token_ids_from": "NestResult.token_ids",
        "knn_ssd_profile": profile.name,
        "knn_ssd_profile_recipe": (
            f"copied from {copied_from}" if copied_from
            else [["nest", *a] for a in PROFILE_RECIPE]),
        "store_recipe": [["nest", "ingest", "--sample", "--collection", COLLECTION],
                         ["nest", "dresd", "build", "--collection", COLLECTION]],
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"_meta": meta, **got}, indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out} ({len(got)} methods x {len(questions)} questions) and {profile}; "
          f"timings: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
