"""What every benchmark shares.

- ``run``: the environment (``$NEST_HOME`` = the repo's ``.nest``, offline hub), the run record
  (command, machine: ``lscpu`` model name, load at start and end, commit, date, wall time),
  and ``parser``/``start``, the opening of every benchmark's ``main`` (``question_parser`` and
  ``question_sets`` for the benchmarks over question sets);
- ``report``: the one result writer (Markdown + JSON, both headed by the run record), table
  helpers, and ``read_jsonl`` for raw records (plain or gzipped);
- ``timing``: rotating interleaving of systems per prompt, pooled tokens/s (whole answers, and
  the decode after the first token) and ratios;
- ``prompts``: the shared prompt sets (sample-corpus completions, held-out leads, QA,
  "Tell me about {title}." chat prompts);
- ``systems``: ``Row``, the definition of one system under test (engine, backend, dtype, method,
  threads, prompt, config), and the runners that execute a row per ``(engine, backend)``;
- ``qa_dev``: the interleaved grounded-QA loop (closed and open-ended questions through several
  systems, scored) of ``python -m benchmarks.quality`` (imported on its own, not re-exported);
- ``answer_metrics`` (what a reader sees in one answer: right, cited on gold, run-on, opens
  with the lead, ends mid-clause), ``answer_summary`` (rates with Wilson or cluster-bootstrap
  intervals, a question-clustered sign test) and ``lead_examples`` (the hand-checked answers
  behind the lead threshold), for ``python -m benchmarks.answers``; ``stores``: benchmark
  stores ingested once (imported on their own).
"""

from benchmarks.harness.report import fmt, pct, read_jsonl, row, table, write_result
from benchmarks.harness.run import (
    REPO,
    RESULTS,
    Run,
    machine,
    parser,
    question_parser,
    question_sets,
    setup,
    start,
)
from benchmarks.harness.timing import (
    decode_timed,
    fastest,
    geomean,
    pooled,
    pooled_decode,
    rate,
    ratio,
    rotated,
)

__all__ = [
    "REPO",
    "RESULTS",
    "Run",
    "decode_timed",
    "fastest",
    "fmt",
    "geomean",
    "machine",
    "parser",
    "pct",
    "pooled",
    "pooled_decode",
    "question_parser",
    "question_sets",
    "rate",
    "ratio",
    "read_jsonl",
    "rotated",
    "row",
    "setup",
    "start",
    "table",
    "write_result",
]
