"""Issue 19's before/after check: the seven decodings still produce the recorded token ids on
the sample corpus (``tests/data/outputs_baseline.json``, written by
``scripts/record_outputs.py``).

Slow. A fresh sample-corpus ingest takes about 2 minutes on 2 cores, so the whole check runs
past 4 minutes on 1 thread. The test therefore checks a subset: the first of the 3 recorded
questions for each of the 7 methods. The full check is
``python scripts/record_outputs.py --check tests/data/outputs_baseline.json``.

Token ids and citations: the baseline was recorded at 7a39c92 (issue 61's base, after issue
53's word rule of citations), and every one of its 21 outputs, ids and citations, was checked
against issue 61's loop (commits, typed port, the drafters' read view).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._stores import copy_sample_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "data" / "outputs_baseline.json"


def test_every_method_reproduces_the_recorded_token_ids(tmp_path: Path, sample_store: Path) -> None:
    # the session's `nest ingest --sample` store stands for the script's own ingest step
    store = copy_sample_store(sample_store, tmp_path / "store")
    (store / ".record_outputs.ingested").write_text("ok\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_outputs.py"), "--check", str(BASELINE),
         "--persist-dir", str(store), "--questions", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "OK: 7 method/question outputs" in proc.stdout, proc.stdout
