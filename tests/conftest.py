"""Shared fixtures: the real embedded LM (slow) and a tiny random Llama with the real tokenizer.

Environment set at import: ``NEST_HOME`` defaults to the repo's ignored ``.nest/`` folder (so the
converted default model is cached once), the Hugging Face Hub is offline, telemetry is off.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# CLI jobs (in-process or child processes) follow the tests' one torch thread (see below).
os.environ.setdefault("NEST_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Skip policy, timeouts, global seeds and the Hypothesis profile (see tests/_policy.py).
pytest_plugins = ["tests._policy"]

# One intra-op thread: on a 2-core machine with anything else running, two OpenMP threads spin
# while waiting for a busy core (a 40-token forward of SmolLM2-135M measured 1.8-3.6 s with 2
# threads under load, 0.2 s with 1), so tests stay fast and stable. Benchmarks keep the default.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_lm():
    """The embedded SmolLM2-135M-Instruct (fp32, CPU, key_source="ffn_input")."""
    from nest_integrations.lm.hf import HFLanguageModel

    return HFLanguageModel.from_default()


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """Folder of a tiny random Llama (2 layers, hidden 64) with the real SmolLM2 tokenizer."""
    from tests._tiny import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_lm(tiny_lm_path):
    """The tiny random Llama loaded through ``HFLanguageModel.from_pretrained`` (fp32, CPU)."""
    from nest_integrations.lm.hf import HFLanguageModel

    return HFLanguageModel.from_pretrained(str(tiny_lm_path))
