"""Shared fixtures: the real embedded LM (slow) and a tiny random Llama with the real tokenizer.

Environment set at import: ``NEST_HOME`` is the repo's ignored ``.nest/`` folder whatever the
caller's is (no test depends on the caller's home or cache; ``NEST_TEST_HOME`` names another
folder), so the converted default model is cached once; the Hugging Face Hub is offline,
telemetry is off; the default backend is torch (``NEST_BACKEND``).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ["NEST_HOME"] = os.environ.get("NEST_TEST_HOME") or str(REPO / ".nest")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# CLI jobs (in-process or child processes) follow the tests' one torch thread (see below).
os.environ.setdefault("NEST_THREADS", "1")
# The product default backend is "auto" (lm.auto_backend: llama.cpp where it is installed and
# faster); tests run torch unless they name a backend, so no result depends on whether the
# llamacpp extra is installed. tests/lm/test_auto_backend.py tests auto itself.
os.environ.setdefault("NEST_BACKEND", "torch")

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
    """The embedded SmolLM2-135M-Instruct (fp32, CPU, key_source="ffn_input").

    fp32 explicitly: the product default is ``dtype="auto"`` (bf16 on a CPU with native bf16),
    which differs by machine; the tests that assert model-level numbers use one dtype
    everywhere, and the bf16 path has its own tests (``test_lossless_oracles``, ``test_backend``,
    ``test_packing``, ``test_rowwise_attention``) and the CLI / README tests run the default."""
    from nest_integrations.lm.hf import HFLanguageModel

    return HFLanguageModel.from_default(dtype="fp32")


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """Folder of a tiny random Llama (2 layers, hidden 64) with the real SmolLM2 tokenizer."""
    from tests._tiny import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_lm(tiny_lm_path):
    """The tiny random Llama loaded through ``HFLanguageModel.from_pretrained`` (fp32, CPU:
    explicitly, as ``default_lm``)."""
    from nest_integrations.lm.hf import HFLanguageModel

    return HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32")


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory) -> Path:
    """A persist dir holding the shipped sample corpus exactly as ``nest ingest --sample``
    writes it (Chroma passages + eager token keys of the default model), made ONCE per session:
    the ingest takes about 2.5 min on 2 cores, and four slow modules need it. Tests that write
    to a store, or run ``nest ingest`` on it, take a copy (``copy_sample_store``).

    Under pytest-xdist (scripts/test.sh, .ci/run) it lives in the workers' shared temp folder,
    behind a file lock: the first worker to need it makes it, the others wait and reuse it
    (tests/_policy.py orders the files so that the README's makes it first)."""
    import fcntl
    import subprocess
    import sys

    if os.environ.get("PYTEST_XDIST_WORKER"):  # the run's folder, above each worker's own
        base = tmp_path_factory.getbasetemp().parent / "sample-store"
        base.mkdir(exist_ok=True)
    else:
        base = tmp_path_factory.mktemp("sample-store")
    root, done = base / "store", base / "DONE"
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return root
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NEST_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(
            [sys.executable, "-m", "nest_integrations.cli", "ingest", "--sample",
             "--persist-dir", str(root), "--dtype", "fp32"],  # keys as default_lm encodes them
            env=env, capture_output=True, text=True, timeout=1500,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        documents = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["documents"]]
        assert documents and int(documents[0][1].rstrip(":")) > 300, proc.stdout  # the whole sample corpus
        done.touch()
    return root


@pytest.fixture(autouse=True)
def _process_defaults():
    """A CLI job run in-process (``--dtype``, ``--backend``, ``--threads``) sets process-wide
    defaults; every test starts from the unset defaults (auto dtype, torch backend, threads
    from ``$NEST_THREADS``) and leaves them unset, so no test depends on which tests ran before
    it in the same worker."""
    from nest_integrations.lm import backend

    def unset() -> None:
        backend.set_default_dtype(None)
        backend.set_default_backend(None)
        backend._CONFIGURED = None

    unset()
    yield
    unset()
