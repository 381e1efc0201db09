"""The typed LM port (``lm.port``) and the one cache key (``lm.cache_key``): an LM's declared
capabilities become typed members of ``LMPort`` (None where it declares nothing), resolved once
by the assembly's ``SerializedLM``; every cached measurement (cost curves, exactness verdicts,
the ``auto`` choice) is keyed by ``CacheKey``, and an older home's entries are measured again
without an error."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch

from nest_integrations.lm import auto_backend, cost, exactness, row_exact
from nest_integrations.lm.backend import configured_threads, machine_name
from nest_integrations.lm.base import capabilities_of
from nest_integrations.lm.cache_key import engines_key, key_of
from nest_integrations.lm.port import TORCH_THREADS, Build, port_of, resolve_port
from nest_integrations.lm.serialized import serialized
from nest_integrations.lm.uncached import UncachedLM
from tests.fakes import FakeLM

OPTIONAL = ("logits_only", "argmax", "prompt_vector", "release", "inexact", "steps_only",
            "session", "rows_split", "exact", "trees", "layer_skip")


def test_a_hugging_face_lm_gets_what_it_declares_typed(tiny_lm) -> None:
    port = resolve_port(tiny_lm)
    present = {name for name in OPTIONAL if getattr(port, name) is not None}
    assert present == {"prompt_vector", "inexact", "exact", "trees", "layer_skip"}
    assert all(getattr(port, name) is tiny_lm for name in present)
    assert port.regime is TORCH_THREADS and port.regime.threads == torch.get_num_threads()
    build = port.build()
    assert build.backend == "torch" and build.weights == "float32"
    assert build.label == "+".join(("float32", *build.kernels))
    assert port.exact_rows() == tiny_lm.exact_rows


def test_an_lm_that_declares_nothing_gets_the_defaults() -> None:
    port = port_of(FakeLM())
    assert all(getattr(port, name) is None for name in OPTIONAL)
    assert port.build() == Build() and port.regime is TORCH_THREADS
    assert not port.exact_rows() and isinstance(port.inexact_context(), nullcontext)


def test_the_assembly_resolves_the_port_once_and_calls_through_its_lock(tiny_lm) -> None:
    """``SerializedLM`` carries the port it resolved; its members are the wrapper (calls
    serialised), its record the model's own, read now."""
    lm = serialized(tiny_lm)
    assert port_of(lm) is port_of(lm) is lm.port
    assert lm.port.trees is lm and lm.port.layer_skip is lm
    assert capabilities_of(lm) == capabilities_of(tiny_lm)


def test_the_uncached_oracle_declares_chains_only(tiny_lm) -> None:
    lm = UncachedLM(tiny_lm)
    port = port_of(lm)
    assert port.trees is None and port.layer_skip is None and port.argmax is None
    assert port.prompt_vector is lm and port.inexact is lm
    assert lm.name == tiny_lm.name and lm.build() == tiny_lm.build()


def test_one_cache_key_for_every_measurement(tiny_lm) -> None:
    """The cost curve's key, the verdicts' key and the auto choice's key are ``CacheKey``s."""
    key = key_of(tiny_lm, now=True)
    assert cost.curve_key(tiny_lm) == {"model": tiny_lm.fingerprint, "dtype": key.build,
                                       "device": "cpu", "threads": torch.get_num_threads(),
                                       "machine": machine_name()}
    assert key_of(tiny_lm).text() == (f"{tiny_lm.fingerprint}|{key.build}|cpu"
                                      f"|t{torch.get_num_threads()}|torch{torch.__version__}")
    auto = auto_backend.cache_key()
    assert auto.startswith(engines_key(auto.split("|")[0], "").model + "|")
    assert f"|cpu|t{configured_threads()}|torch{torch.__version__}" in auto


def test_an_older_homes_verdicts_are_measured_again_without_an_error(tmp_path,
                                                                    monkeypatch) -> None:
    """Entries under the keys of an older release stay in the file, unread; the verdict is
    measured under the new key; a file that does not parse is measured over too."""
    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    lm = FakeLM()
    path = row_exact.MachineCache.path()
    path.parent.mkdir(parents=True)
    old = {"format": row_exact.FORMAT, "version": row_exact.VERSION,
           "verdicts": {f"{lm.fingerprint}|FakeLM|t1": True}}
    path.write_text(json.dumps(old), encoding="utf-8")
    exactness.VERDICTS.clear()
    calls = []
    monkeypatch.setattr(exactness, "check_rows", lambda m: calls.append(m) or False)
    assert exactness.checked(lm) is False and calls == [lm]
    verdicts = json.loads(path.read_text(encoding="utf-8"))["verdicts"]
    assert verdicts == {f"{lm.fingerprint}|FakeLM|t1": True, key_of(lm).text(): False}
    path.write_text("{broken", encoding="utf-8")
    exactness.VERDICTS.clear()
    assert exactness.checked(lm) is False and len(calls) == 2
    exactness.VERDICTS.clear()


@pytest.mark.parametrize("kernels,want", [((), "gguf-Q8_0"), (("kvBF16", "repack"),
                                                              "gguf-Q8_0+kvBF16+repack")])
def test_a_build_label_names_the_weights_and_kernels(kernels, want) -> None:
    assert Build("llama.cpp", "gguf-Q8_0", kernels).label == want
    assert not Build("torch", "float32", ("packed",), row_exact_linears=3).row_exact
    assert Build("torch", "float32", ("rowwise",), row_exact_linears=3).row_exact


def test_torch_threads_go_to_one_within_nested_blocks_and_back() -> None:
    """The torch regime's ``on_one_thread`` (the llama.cpp backend's decoding session): nested
    blocks share it and the last one out restores the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with TORCH_THREADS.on_one_thread():
            assert TORCH_THREADS.threads == 1
            with TORCH_THREADS.on_one_thread():
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2 == TORCH_THREADS.threads
    finally:
        torch.set_num_threads(before)
