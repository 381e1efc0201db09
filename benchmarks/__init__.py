"""Benchmarks, each run as ``python -m benchmarks.<name>`` from the repository root (``--help``
lists its options). The shared parts (prompt sets, timers, interleaving, system rows, the result
writer, the grounded-QA loop) are ``benchmarks.harness``, the question sets only benchmarks read
are ``benchmarks.sets``; results land in ``benchmarks/results`` as one Markdown
summary and one JSON file per run, each naming the command, machine, load and commit."""
