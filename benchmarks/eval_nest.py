"""The NEST evaluation (Table 1 style): base LM, RA, kNN-LM, NEST, RA-NEST (and calibrated NEST).

Same as ``nest eval``; see ``nest_integrations/cli/eval.py`` for every option.

    python benchmarks/eval_nest.py --config small     # ~20 min on 2 idle CPU cores
    python benchmarks/eval_nest.py --config medium    # >= 50 examples/task, entity QA,
                                                      # calibrated NEST, paired statistics
    python benchmarks/eval_nest.py --config medium --n-examples 2 --gammas none \
        --passages 8 --calibration-texts 4 --out /tmp/eval_smoke   # a smoke run (minutes)
    python benchmarks/eval_nest.py --config full --device cuda

Writes ``benchmarks/results/eval_<config>.{md,json}``, ``eval_<config>_examples.jsonl``,
``eval_<config>_gamma.png`` and ``eval_<config>_speed.png``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nest_integrations.cli.eval import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv += ["--out", str(REPO / "benchmarks" / "results")]
    raise SystemExit(main(argv))
