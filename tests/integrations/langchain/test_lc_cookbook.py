"""Each LangChain cookbook script runs to completion and prints its citations (marked slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("langchain_lcel_citations.py", "cited span(s):"),
        ("langchain_existing_chroma.py", "Chroma id"),
        ("langchain_agent_tool.py", "ToolMessage (tool_call_id=call_1)"),
        ("langchain_attribute_any_model.py",
         "- answer[183:234]: 'Its light can be seen from France on a clear night.'"),
    ],
)
def test_cookbook_script_runs(script: str, expected: str, tmp_path: Path) -> None:
    """The script exits 0 and prints what it promises."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False"}
    args = [sys.executable, str(COOKBOOK / script)]
    if script == "langchain_existing_chroma.py":
        args += ["--persist-dir", str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout, proc.stdout
