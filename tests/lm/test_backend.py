"""The backend (issue 21, first step): dtype parsing and resolution, the model cache per dtype,
the CLI's ``--dtype``/``--threads``, the thread-count helper, and lossless methods in bf16."""

from __future__ import annotations

import argparse

import pytest
import torch

from nest_integrations import assembly
from nest_integrations.lm import backend
from nest_integrations.lm.hf import HFLanguageModel


@pytest.fixture(autouse=True)
def _restore_threads():
    """Every test leaves torch's thread count as it found it (the suite runs with 1 thread;
    tests/conftest.py resets the process default dtype and backend around every test)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ parsing and resolution


@pytest.mark.parametrize(
    "given, want",
    [("fp32", torch.float32), ("float32", torch.float32), ("FP32", torch.float32),
     ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
     ("fp16", torch.float16), ("float16", torch.float16), (torch.bfloat16, torch.bfloat16),
     ("auto", "auto"), ("checkpoint", "checkpoint"), (None, None)],
)
def test_parse_dtype_accepts_every_spelling(given, want) -> None:
    assert backend.parse_dtype(given) == want


@pytest.mark.parametrize("bad", ["int8", "half-ish", "", torch.int8, 16])
def test_parse_dtype_rejects_with_the_allowed_values(bad) -> None:
    with pytest.raises(ValueError) as err:
        backend.parse_dtype(bad)
    for name in ("auto", "fp32", "bf16", "fp16", "checkpoint"):
        assert name in str(err.value)


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_cpu_follows_the_native_bf16_check(monkeypatch, native) -> None:
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: native)
    want = torch.bfloat16 if native else torch.float32
    assert backend.resolve_dtype("auto", "cpu") == want
    assert backend.resolve_dtype("auto", "cuda") == torch.bfloat16  # CUDA: always bf16
    assert backend.resolve_dtype(None, "cpu") == want  # the default is auto (issue 21)
    assert backend.resolve_dtype(None, "cuda") == torch.bfloat16
    assert backend.resolve_dtype("checkpoint", "cpu") == "auto"  # transformers' spelling


@pytest.mark.parametrize("caps, want", [
    ({"avx512_bf16": True, "amx_bf16": False}, True),
    ({"avx512_bf16": False, "amx_bf16": True}, True),
    ({"avx512_bf16": False, "amx_bf16": False, "avx512_f": True}, False),
])
def test_native_bf16_reads_torch_cpu_capabilities(monkeypatch, caps, want) -> None:
    monkeypatch.setattr(backend, "_cpu_capabilities", lambda: caps)
    assert backend.cpu_has_native_bf16() is want


def test_native_bf16_falls_back_to_proc_cpuinfo(monkeypatch, tmp_path) -> None:
    import builtins

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n")
    real_open = builtins.open
    monkeypatch.setattr(backend, "_cpu_capabilities", lambda: None)
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(
        cpuinfo if p == "/proc/cpuinfo" else p, *a, **k))
    assert backend.cpu_has_native_bf16() is True
    cpuinfo.write_text("flags\t\t: fpu sse avx512f\n")
    assert backend.cpu_has_native_bf16() is False


def test_process_default_dtype_is_what_none_means(monkeypatch) -> None:
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: True)
    backend.set_default_dtype("fp32")
    assert backend.resolve_dtype(None, "cpu") == torch.float32
    assert backend.resolve_dtype("bf16", "cpu") == torch.bfloat16  # explicit beats the default
    backend.set_default_dtype(None)
    assert backend.resolve_dtype(None, "cpu") == torch.bfloat16  # back to auto
    with pytest.raises(ValueError, match="not supported"):
        backend.set_default_dtype("int4")


# ------------------------------------------------------------------ threads


def test_configure_threads_bounds_the_blas_and_openmp_pools_too() -> None:
    """``--threads N`` is N cores for every pool in the process, not only torch's: numpy's
    OpenBLAS keeps a thread per core otherwise (a 1-thread speed run once used both cores
    through it)."""
    import numpy as np
    import threadpoolctl

    a = np.random.default_rng(0).standard_normal((64, 64))
    with threadpoolctl.threadpool_limits(limits=None):  # every pool's size restored after
        before = torch.get_num_threads()
        try:
            for n in (2, 1):
                assert backend.configure_threads(n) == n
                pools = threadpoolctl.threadpool_info()
                blas = [p for p in pools if p["user_api"] == "blas"]
                assert blas, pools  # numpy's BLAS is loaded and seen
                assert all(p["num_threads"] == n for p in pools), pools
                assert torch.get_num_threads() == n
                assert np.allclose(a @ a.T, (a @ a.T).T)  # still computes on the bounded pool
        finally:
            torch.set_num_threads(before)


def test_thread_count_honours_argument_then_env_then_physical_cores(monkeypatch) -> None:
    monkeypatch.delenv(backend.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(backend, "_cpu_capabilities", lambda: {"num_physical_cores": 6})
    assert backend.thread_count() == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # OpenMP's own variable is a user choice too
    assert backend.thread_count() == 4
    monkeypatch.setenv(backend.THREADS_ENV, "3")
    assert backend.thread_count() == 3  # NEST_THREADS wins over OMP_NUM_THREADS
    assert backend.thread_count(2) == 2  # --threads wins over the environment
    assert backend.configure_threads() == 3 and torch.get_num_threads() == 3
    assert backend.configured_threads() == 3
    monkeypatch.setenv(backend.THREADS_ENV, "5")  # configured once: --threads wins from then on
    assert backend.configured_threads() == 3
    monkeypatch.setenv(backend.THREADS_ENV, "many")
    with pytest.raises(ValueError, match="NEST_THREADS='many'"):
        backend.thread_count()
    with pytest.raises(ValueError, match="--threads must be at least 1"):
        backend.thread_count(0)


def test_physical_cores_falls_back_to_cpu_count(monkeypatch) -> None:
    import os

    monkeypatch.setattr(backend, "_cpu_capabilities", lambda: None)
    assert backend.physical_cores() == (os.cpu_count() or 1)


# ------------------------------------------------------------------ CLI


@pytest.mark.parametrize("argv", [
    ["ingest", "--sample"],
    ["ask", "q"],
    ["serve"],
    ["calibrate"],
    ["dresd", "build"],
    ["knn-ssd", "search", "--domain", "d", "--prompts", "p.jsonl"],
])
def test_every_model_command_takes_dtype_and_threads(argv) -> None:
    from nest_integrations.cli import build_parser

    parser = build_parser()
    ns = parser.parse_args([*argv, "--dtype", "BF16", "--threads", "3"])
    assert (ns.dtype, ns.threads) == ("bf16", 3)
    ns = parser.parse_args(argv)
    assert (ns.dtype, ns.threads) == (None, None)
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--dtype", "int8"])


def test_apply_backend_args_sets_threads_and_default_dtype(monkeypatch) -> None:
    monkeypatch.delenv(backend.THREADS_ENV, raising=False)
    backend.apply_backend_args(argparse.Namespace(dtype="bf16", threads=2))
    assert torch.get_num_threads() == 2 and backend.default_dtype() == "bf16"


def test_ask_and_serve_specs_carry_the_dtype() -> None:
    from nest_integrations.cli.ask import ask_spec
    from nest_integrations.cli import build_parser
    from nest_integrations.cli.serve import serve_spec

    parser = build_parser()
    assert ask_spec(parser.parse_args(["ask", "q", "--dtype", "bf16"])).dtype == "bfloat16"
    assert serve_spec(parser.parse_args(["serve", "--dtype", "fp32"])).dtype == "float32"
    assert ask_spec(parser.parse_args(["ask", "q"])).dtype is None


# ------------------------------------------------------------------ spec, cache, adapters


def test_engine_spec_validates_and_normalises_dtype() -> None:
    assert assembly.EngineSpec(dtype="BF16").dtype == "bfloat16"
    assert assembly.EngineSpec(dtype=torch.float32).dtype == "float32"
    assert assembly.EngineSpec(dtype="auto").dtype == "auto"
    assert assembly.EngineSpec(dtype="bf16") == assembly.EngineSpec(dtype="bfloat16")
    with pytest.raises(ValueError, match="not supported"):
        assembly.EngineSpec(dtype="int8")


def test_an_unset_key_source_is_the_backends_and_an_explicit_one_stays() -> None:
    """``NestConfig.key_source`` unset (None) is each backend's (torch ``"ffn_input"``,
    llama.cpp ``"final_norm"``); an explicit ``"ffn_input"`` stays on llama.cpp (its eval
    callback computes it), and a key source llama.cpp cannot compute is refused."""
    from nest_integrations.config import NestConfig

    assert NestConfig().key_source is None
    assert backend.backend_config(NestConfig(), "torch").key_source == "ffn_input"
    assert backend.backend_config(NestConfig(), "llama.cpp").key_source == "final_norm"
    explicit = NestConfig(key_source="ffn_input")
    assert backend.backend_config(explicit, "llama.cpp").key_source == "ffn_input"
    assert backend.backend_config(explicit, "torch") is explicit
    with pytest.raises(ValueError, match="'block_input' is not available on the llama.cpp"):
        backend.backend_config(NestConfig(key_source="block_input"), "llama.cpp")


def test_shared_model_keys_on_the_resolved_dtype(monkeypatch) -> None:
    loads: list[tuple] = []

    def load(model, device, key_source, dtype=None, backend=None):  # noqa: ANN001
        loads.append((model, dtype))
        return object()

    monkeypatch.setattr(assembly, "load_model", load)
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: True)
    assembly.clear_model_cache()
    try:
        default = assembly.shared_model("m")
        fp32 = assembly.shared_model("m", dtype="fp32")
        assert fp32 is not default
        bf16 = assembly.shared_model("m", dtype="bf16")
        assert bf16 is default  # None is auto, and auto is bf16 on this (patched) CPU
        assert assembly.shared_model("m", dtype="auto") is bf16
        spec = assembly.EngineSpec(model="m", dtype="bfloat16")
        assert assembly.spec_model(spec) is bf16
        assert loads == [("m", None), ("m", "fp32")]
    finally:
        assembly.clear_model_cache()


def test_adapters_pass_dtype_into_the_spec() -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from nest_integrations.integrations.langchain import ChatNest
    from nest_integrations.integrations.langchain.llms import NestLLM as LangChainLLM
    from nest_integrations.integrations.llama_index import NestLLM as LlamaIndexLLM

    for adapter in (ChatNest, LangChainLLM, LlamaIndexLLM):
        assert adapter(dtype="bf16").engine_spec().dtype == "bfloat16"
        assert adapter().engine_spec().dtype is None
        with pytest.raises(ValueError, match="not supported"):
            adapter(dtype="int8")


# ------------------------------------------------------------------ the model itself


def test_tiny_model_loads_in_bf16_and_returns_fp32(tiny_lm_path) -> None:
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    assert lm.dtype == torch.bfloat16
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    logits, keys = lm.forward(lm.tokenize("Hello there, world"), lm.new_cache())
    assert logits.dtype == torch.float32 and keys.dtype == torch.float32  # the core's dtype
    (passage,) = lm.encode_passages([lm.tokenize("A passage of text.")])
    assert passage.dtype.name == "float32"
    assert HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32").dtype == torch.float32
    # no dtype: the process default, auto (bf16 on a CPU with native bf16)
    assert HFLanguageModel.from_pretrained(str(tiny_lm_path)).dtype == backend.resolve_dtype(
        "auto", "cpu")
    with pytest.raises(ValueError, match="not supported"):
        HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="int8")


# ------------------------------------------------------------------ key stores across dtypes


def test_fp32_store_is_read_under_bf16_with_a_note(tiny_lm_path, tmp_path, caplog) -> None:
    """Decision by measurement (benchmarks/results/bf16_keys.md): keys are interchangeable,
    so the fingerprint ignores the dtype; the store records the encoding dtype and a model in
    another dtype reads it, with a logged note."""
    import json
    import logging

    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.types import Passage

    lm32 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32")
    lm16 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    assert lm32.fingerprint == lm16.fingerprint
    passages = [Passage("p1", "The quick brown fox jumps over the lazy dog.", doc_id="d")]
    with DiskKeyStore.open(tmp_path, lm32) as store:
        ensure_keys(store, lm32, passages)
        (stored,) = store.get_keys(passages)
    assert json.loads((tmp_path / "store.json").read_text())["model_dtype"] == "fp32"
    with caplog.at_level(logging.INFO, logger="nest_integrations.index.store"):
        store = DiskKeyStore.open(tmp_path, lm16)
    assert "encoded by the model in fp32; this one runs in bf16" in caplog.text
    with store:
        (again,) = store.get_keys(passages)
    assert again is not None and (again.token_ids == stored.token_ids).all()
    (fresh,) = lm16.encode_passages([lm16.tokenize(passages[0].text)])
    cos = torch.nn.functional.cosine_similarity(
        torch.from_numpy(fresh), torch.from_numpy(again.keys.astype("float32")), dim=-1)
    assert float(cos.min()) > 0.99  # what the measurement found, on the tiny model too


# ------------------------------------------------------------------ lossless in bf16


def test_lossless_methods_equal_hf_generate_in_bf16(tiny_lm_path, tmp_path) -> None:
    """The bf16 code path: greedy, prompt-lookup, rag-copy and dresd (chain, tree) on the tiny
    Llama loaded in bf16 equal HF ``generate`` of the same bf16 model token for token (the
    oracle of tests/decoding/test_lossless_oracles.py), with drafts really verified.

    A bf16 CPU model loads with row-wise verify attention (``lm.rowwise_attention``), so a
    verify pass equals one-token steps bit for bit and this holds by construction, not by wide
    margins; the real model's version is in tests/decoding/test_lossless_oracles.py (slow). Without
    it, SmolLM2's near-ties flipped (benchmarks/results/bf16_exactness.md: prompt-lookup 3/6)."""
    from nest_integrations.config import NestConfig
    from nest_integrations.decoding.engine import NestEngine
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.lm.layer_skip import SkipSet
    from tests.oracles import copy_cases, corpus_cases, run_oracle

    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    assert lm.dtype == torch.bfloat16 and lm.rowwise_attention
    n = 24
    questions = ["Name three colours.", "Who was Julius Caesar?"]
    skip = SkipSet.from_lists(len(lm.model.model.layers), [1], [])
    cases = [c for c in corpus_cases(lm, questions, n, tmp_path / "ds", skip)
             if c.label in ("greedy", "dresd", "dresd-tree")]
    cases += copy_cases(lm, questions[:1], n, chat=True)
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())
    out = run_oracle(engine, cases, n, {})
    assert set(out.mismatches) == {"greedy", "dresd", "dresd-tree", "prompt-lookup", "rag-copy"}
    assert all(not bad for bad in out.mismatches.values()), out.mismatches
    assert out.drafted["dresd"] > 0 and out.drafted["dresd-tree"] > 0
