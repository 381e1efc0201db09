"""Benchmarks, each run as ``python -m benchmarks.<name>`` from the repository root (``--help``
lists its options). The shared parts (prompt sets, timers, interleaving, system rows, the result
writer) are ``benchmarks.harness``; results land in ``benchmarks/results`` as one Markdown
summary and one JSON file per run, each naming the command, machine, load and commit."""
