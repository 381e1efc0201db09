"""The NEST evaluation harness: tasks, metrics, systems, runner, reports and ``nest eval``.

Module map:

- ``corpora``: Wikipedia leads (``nest_integrations.wikipedia``) and corpus folders ->
  passages;
- ``retrieval``: BM25 / dense MiniLM / hybrid stage-1 retrievers with cached embeddings;
- ``tasks``: ``Example``/``Task``; completion (in-corpus, held-out), "What is X?" QA, JSONL;
- ``metrics``: ROUGE, answer-level recall, perplexity, attribution, citation precision;
- ``entities``: the seeded fictional-entity corpus (shared sentence frames) and its questions;
- ``grounded``: grounded-QA metrics (correct, gold-cited share, off-topic copied, run-on) and
  ``meaningful_citations``;
- ``stats``: McNemar's exact test, bootstrap intervals, paired win rates;
- ``open_ended``: the open-ended metrics (the dev/test quality question set and the grounded-QA
  loop that use them are ``benchmarks.sets.quality_set`` and ``benchmarks.harness.qa_dev``);
- ``systems``: base LM, RA, two-stage kNN-LM, NEST, RA-NEST; generation + scoring of one example;
- ``runner``: ``EvalSettings`` (``small``/``medium``/``full``), ``run_eval``, aggregation;
- ``report``: markdown (Table 1 style), JSON, JSONL, PNG plots;
- ``suite``: end to end (model + datastore + tasks -> files);
- ``nest eval`` is ``nest_integrations/cli/eval.py``.

Tests: ``tests/evaluation/test_evaluation.py``, ``tests/evaluation/test_quality.py``.
"""

from nest_integrations.evaluation.metrics import (
    answer_recall,
    answer_token_recall,
    attribution_ratio,
    citation_hits,
    cut_at_eos,
    cut_at_stop,
    normalize_answer,
    perplexity,
    rouge,
    span_lengths,
)
from nest_integrations.evaluation.runner import SETTINGS, EvalRun, EvalSettings, aggregate, run_eval
from nest_integrations.evaluation.systems import SYSTEM_KEYS, System, make_systems
from nest_integrations.evaluation.tasks import Example, Task

__all__ = [
    "SETTINGS",
    "SYSTEM_KEYS",
    "EvalRun",
    "EvalSettings",
    "Example",
    "System",
    "Task",
    "aggregate",
    "answer_recall",
    "answer_token_recall",
    "attribution_ratio",
    "citation_hits",
    "cut_at_eos",
    "cut_at_stop",
    "make_systems",
    "normalize_answer",
    "perplexity",
    "rouge",
    "run_eval",
    "span_lengths",
]
