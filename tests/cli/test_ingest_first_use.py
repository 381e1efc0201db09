"""Issue 62: the first `nest ingest` of a fresh home converts the embedded model (GGUF ->
safetensors, once); it shows a progress bar for it, and the total time the summary prints
includes it (the issue saw 72 s of wall time printed as "time 6.8 s")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIME = re.compile(r"^  time        ([\d.]+) s(?:, of which ([\d.]+) s converting the embedded "
                  r"model \(first use of this NEST_HOME only\))?$", re.M)


@pytest.mark.slow
def test_first_ingest_of_a_fresh_home_announces_and_counts_the_model_conversion(
    tmp_path: Path,
) -> None:
    (tmp_path / "c.jsonl").write_text(
        '{"id": "x2", "text": "The Zephyr X2 costs 2,390 dollars and its battery lasts two '
        'years."}\n', encoding="utf-8")
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "NEST_HOME": str(home)}

    def ingest() -> tuple[subprocess.CompletedProcess, float]:
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "nest_integrations.cli", "ingest", "c.jsonl",
             "--backend", "torch", "--collection", "first-use"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out, time.perf_counter() - start

    out, wall = ingest()
    found = TIME.search(out.stdout)
    assert found and found.group(2), out.stdout  # the conversion is in the summary
    total, conversion = float(found.group(1)), float(found.group(2))
    assert 1.0 < conversion <= total <= wall, (conversion, total, wall)
    assert total >= 0.8 * wall - 5, (total, wall)  # the total is the command's, not a part
    assert "first use: converting SmolLM2-135M-Instruct to safetensors (once)" in out.stderr
    assert "saving safetensors" in out.stderr  # the bar went through its steps
    assert "1 added" in out.stdout
    out, _ = ingest()  # converted once: the next run neither converts nor says so
    found = TIME.search(out.stdout)
    assert found and found.group(2) is None and "converting" not in out.stderr, out.stdout
