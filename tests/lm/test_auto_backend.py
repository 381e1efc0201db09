"""``backend="auto"`` (``lm.auto_backend``): the faster exact engine for the embedded model,
measured once per machine on a short fixed answer and cached beside the row-exactness verdicts;
torch, silently, where llama.cpp is not installed or cannot run the request;
``--backend``/``backend=`` overrides.

The rule is a pure function of measured answer times (``choose_backend``), so its tests take
times; the cache key is read from the settings it names (threads, versions, the torch build,
the wheel's CPU level); the cache is exercised through a record written as ``decide`` writes
it; one slow test measures both real engines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nest_integrations import assembly
from nest_integrations.cli import info
from nest_integrations.lm import auto_backend, backend
from nest_integrations.lm.auto_backend import Decision, choose_backend, decide, resolve_backend
from nest_integrations.lm.llama_cpp.library import cpu_level
from nest_integrations.lm.row_exact import MachineCache

EXACT = {"torch": True, "llama.cpp": True}


class FileCache(MachineCache):
    """The ``backends`` section of a JSON file of the test's own (not $NEST_HOME's)."""

    def __init__(self, path: Path) -> None:
        super().__init__("backends")
        self.file = path

    def path(self) -> Path:  # type: ignore[override]
        return self.file


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """``backend=None`` means auto (no $NEST_BACKEND), over a cache file of this test."""
    monkeypatch.delenv(backend.BACKEND_ENV, raising=False)
    cache = FileCache(tmp_path / "machine.json")
    monkeypatch.setattr(auto_backend, "_CHOICES", cache)
    return cache


def record(choice: str, torch_s: float = 0.9, llama_s: float = 0.6) -> dict:
    """A record as ``measure_answers`` writes it (parts: half prefill, a third copy)."""
    seconds = {"torch": torch_s, "llama.cpp": llama_s}
    parts = {b: {"prefill": s / 2, "copy": s / 3, "steps": s / 6} for b, s in seconds.items()}
    return {"seconds": seconds, "parts": parts, "median_seconds": seconds, "exact": EXACT,
            "choice": choice, "threads": 1, "llama_cpp_level": "avx512",
            "builds": {"torch": "float32+packed+rowwise", "llama.cpp": "gguf-Q8_0+repack"},
            "workload": {"prompt_tokens": 288, "copy_tokens": 93, "copy_passes": 2,
                         "steps": 8, "rounds": 3},
            "measured": "test", "took_s": 0.0}


def test_the_cheapest_exact_engine_is_chosen() -> None:
    """Fastest exact answer wins; an inexact engine only when none is exact; ties go to
    torch."""
    assert choose_backend({"torch": 0.9, "llama.cpp": 0.6}, EXACT) == "llama.cpp"
    assert choose_backend({"torch": 0.6, "llama.cpp": 0.9}, EXACT) == "torch"
    assert choose_backend({"torch": 0.9, "llama.cpp": 0.6},
                          {"torch": True, "llama.cpp": False}) == "torch"
    assert choose_backend({"torch": 0.9, "llama.cpp": 0.6}, {}) == "llama.cpp"
    assert choose_backend({"torch": 0.7, "llama.cpp": 0.7}, EXACT) == "torch"
    with pytest.raises(ValueError, match="at least one"):
        choose_backend({}, {})


def test_auto_is_torch_silently_without_llama_cpp(auto, monkeypatch, caplog) -> None:
    """With ``llama_cpp`` not importable, auto is torch: nothing measured, nothing cached,
    nothing logged above debug."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # how Python refuses an import
    caplog.set_level("INFO")
    assert backend.requested_backend() == "auto"
    assert resolve_backend() == "torch"
    assert assembly.EngineSpec().backend == "torch"
    assert "not installed" in decide().reason
    assert not auto.file.exists()
    assert not [r for r in caplog.records if r.name == auto_backend.LOG.name]


@pytest.mark.parametrize("cpuinfo, kind, measured", [
    ("model name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n",
     "AMD EPYC, AVX-512", "4.7 s against torch's 8.3 s"),
    ("model name\t: AMD EPYC 7B13\nflags\t\t: fpu avx avx2 fma\n", "AMD EPYC, AVX2", None),
    ("model name\t: Intel(R) Xeon(R) Processor @ 2.10GHz\nflags\t\t: avx2 avx512f amx_bf16\n",
     "Intel Xeon, AVX-512", "2.7x"),
    ("", "unknown", None),
])
def test_without_llama_cpp_auto_says_how_to_add_it_and_what_it_gave_on_this_cpu_kind(
        cpuinfo, kind, measured) -> None:
    """The reason names the install command and either this CPU kind's measured figure with
    its result file, or that the kind was not measured (issue 63: the quickstart says what
    ``--fast`` would give on this CPU)."""
    assert auto_backend.cpu_kind(cpuinfo) == kind
    why = auto_backend.not_installed(kind)
    assert "scripts/quickstart.sh --fast" in why and f"({kind})" in why
    if measured:
        assert measured in why and "benchmarks/results/" in why
        assert Path(__file__).parents[2].joinpath(
            why.rsplit("(", 1)[1].rstrip(")")).is_file()  # the file it names exists
    else:
        assert "not measured on this CPU kind" in why


def test_auto_is_torch_where_llama_cpp_cannot_run_the_request(auto) -> None:
    """Another model, a GPU, a torch dtype, KNN-SSD or another key source decide without
    measuring; a GGUF file or a quantisation name means llama.cpp."""
    cases = [
        (dict(model="HuggingFaceTB/SmolLM2-360M"), "torch"),
        (dict(device="cuda"), "torch"),
        (dict(dtype="fp32"), "torch"),
        (dict(decoding="knn-ssd"), "torch"),
        (dict(key_source="block_input"), "torch"),
        (dict(model="/models/x.gguf"), "llama.cpp"),
        (dict(model="Q4_1"), "llama.cpp"),
    ]
    for kwargs, want in cases:
        assert decide(**kwargs).backend == want, kwargs
        assert resolve_backend(**kwargs) == want, kwargs
    assert assembly.EngineSpec(dtype="fp32").backend == "torch"
    assert not auto.file.exists()


def test_the_cached_measurement_decides_and_backend_overrides(auto) -> None:
    """A measured record in the machine's cache decides auto (no new measurement), for every
    entry point; an explicit backend, the process default or $NEST_BACKEND overrides it."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    key = auto_backend.cache_key()
    auto.get(key, lambda: record("llama.cpp"))
    on_disk = json.loads(auto.file.read_text())["backends"][key]
    assert on_disk["choice"] == "llama.cpp" and auto_backend.cached(key) == on_disk
    got = decide()
    assert isinstance(got, Decision) and got.backend == "llama.cpp"
    assert ("one answer (288-token prompt, a 93-token copy in 2 passes, 8 steps; the fastest "
            "of 3): llama.cpp 0.600 s an answer (prefill 300 ms, copy 200 ms, steps 100 ms), "
            "exact, gguf-Q8_0+repack; torch 0.900 s an answer") in got.reason
    assert assembly.EngineSpec().backend == "llama.cpp"
    assert assembly.EngineSpec().config.key_source == "final_norm"
    assert assembly.EngineSpec(backend="torch").backend == "torch"
    assert assembly.EngineSpec(backend="auto").backend == "llama.cpp"
    backend.set_default_backend("torch")
    assert assembly.EngineSpec().backend == "torch"
    backend.set_default_backend(None)


def test_a_torch_verdict_is_kept_too(auto) -> None:
    """Where torch measured faster, auto stays on torch."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    auto.get(auto_backend.cache_key(), lambda: record("torch", 0.5, 0.6))
    assert decide().backend == "torch" and resolve_backend() == "torch"


def test_a_failed_measurement_runs_torch_and_is_not_cached(auto, monkeypatch) -> None:
    """A measurement that raises (a broken GGUF, say) leaves auto on torch for this request,
    with the reason, and caches nothing: the next request measures again."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

    def broken() -> dict:
        raise OSError("GGUF unreadable")

    monkeypatch.setattr(auto_backend, "measure_answers", broken)
    got = decide()
    assert got.backend == "torch" and "GGUF unreadable" in got.reason
    assert auto_backend.cached() is None
    monkeypatch.setattr(auto_backend, "measure_answers", lambda: record("llama.cpp"))
    assert decide().backend == "llama.cpp"


def test_bad_backend_values_name_the_choices(monkeypatch) -> None:
    """``backend=`` and ``$NEST_BACKEND`` accept auto, torch and llama.cpp (and aliases)."""
    assert backend.parse_backend("AUTO") == "auto"
    assert backend.parse_backend("llamacpp") == "llama.cpp"
    with pytest.raises(ValueError, match="auto, torch, llama.cpp"):
        backend.parse_backend("onnx")
    monkeypatch.setenv(backend.BACKEND_ENV, "onnx")
    with pytest.raises(ValueError, match="NEST_BACKEND='onnx'"):
        backend.requested_backend()
    monkeypatch.setenv(backend.BACKEND_ENV, "llama.cpp")
    assert backend.requested_backend() == "llama.cpp"
    assert backend.requested_backend("torch") == "torch"


@pytest.mark.slow
def test_measuring_both_engines_is_short_and_cached(auto) -> None:
    """The real measurement: the fixed answer on each default engine (models loaded as they
    run), its parts timed, cached once; the second ``decide`` reads the file."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    first = decide()
    rec = first.record
    assert set(rec["seconds"]) == {"torch", "llama.cpp"} == set(rec["parts"])
    for b, parts in rec["parts"].items():
        assert set(parts) == {"prefill", "copy", "steps"} and min(parts.values()) > 0
        assert sum(parts.values()) == pytest.approx(rec["seconds"][b])
        assert rec["median_seconds"][b] >= rec["seconds"][b]
        assert parts["steps"] / auto_backend.STEPS < 1.0  # a step, as the step rule bounded it
    assert rec["workload"]["copy_tokens"] == auto_backend.COPY_TOKENS
    assert rec["workload"]["copy_passes"] == 2 and rec["workload"]["prompt_tokens"] > 200
    assert rec["builds"]["llama.cpp"].startswith("gguf-Q8_0")
    assert rec["llama_cpp_level"] == auto_backend.wheel_level() != "?"
    assert rec["choice"] == choose_backend(rec["seconds"], rec["exact"]) == first.backend
    assert auto_backend.cached() == rec
    auto.clear()  # forget the process's memo: the file answers
    assert decide().record == rec


def test_the_cache_key_names_what_the_answers_depend_on(monkeypatch) -> None:
    """Threads, torch's version, llama-cpp-python's version, the wheel's CPU level, the torch
    build in use (dtype, packing) and the workload are in the key; changing the threads or
    the packing changes it."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    import torch
    from importlib.metadata import version

    key = auto_backend.cache_key()
    model, build, device, threads, torch_version = key.split("|")
    assert (device, threads, torch_version) == ("cpu", f"t{backend.configured_threads()}",
                                                f"torch{torch.__version__}")
    level = auto_backend.wheel_level()
    assert level in ("avx512", "avx2", "generic", "avx512+amx", "avx2+amx", "generic+amx")
    assert build == (f"{auto_backend.torch_build()}+llama_cpp{version('llama_cpp_python')}"
                     f"-{level}+{auto_backend.WORKLOAD}")
    assert auto_backend.torch_build().split("+")[0] in ("fp32", "bf16")
    monkeypatch.setenv("NEST_PACK_WEIGHTS", "0")
    assert "+packed" not in auto_backend.torch_build()
    assert (auto_backend.cache_key() != key) == ("+packed" in build)
    monkeypatch.delenv("NEST_PACK_WEIGHTS")
    assert auto_backend.cache_key() == key
    monkeypatch.setattr(backend, "_CONFIGURED", backend.configured_threads() + 1)
    assert auto_backend.cache_key() != key


def test_the_wheel_level_is_read_from_llama_cpps_system_info() -> None:
    """``cpu_level`` reads the features a build lists: the install script's levels."""
    avx2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    avx512 = avx2 + "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
    assert cpu_level(avx512 + "LLAMAFILE = 1 | REPACK = 1 | ") == "avx512"
    assert cpu_level(avx2 + "AVX512 = 1 | ") == "avx2"  # no VNNI/BF16: not the avx512 build
    assert cpu_level(avx2.replace("AVX2 = 1", "AVX2 = 0")) == "generic"
    assert cpu_level("CPU : SSE3 = 1 | ") == "generic"
    assert cpu_level(avx512 + "AMX_INT8 = 1 | ") == "avx512+amx"


def test_nest_info_prints_the_figures_auto_chose_by(auto, monkeypatch, capsys) -> None:
    """``nest info``'s backend section under auto: the choice, then each engine's measured
    answer, fastest first, with its parts, exactness and build."""
    info._print_backend({"backend": "llama.cpp", "backend_choice": "auto: chosen by the figures "
                         "below; --backend torch|llama.cpp overrides",
                         "backend_measured": record("llama.cpp"), "model": "m", "device": "cpu",
                         "dtype": "Q8_0", "threads": 1, "exact_rows": True})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Backend:      llama.cpp [auto: chosen by the figures below")
    assert lines[1] == ("Measured:     one answer (288-token prompt, a 93-token copy in 2 passes, "
                        "8 steps; the fastest of 3), on 1 thread(s), llama.cpp wheel avx512, "
                        "test (cached in $NEST_HOME/exactness):")
    assert lines[2].split() == ["llama.cpp", "0.600", "s", "an", "answer", "(prefill", "300",
                                "ms,", "copy", "200", "ms,", "steps", "100", "ms),", "exact,",
                                "gguf-Q8_0+repack"]
    assert lines[3].split()[:3] == ["torch", "0.900", "s"]


def test_auto_is_measured_where_the_engine_is_built_not_in_the_spec(auto, monkeypatch) -> None:
    """``EngineSpec()`` under auto loads no model when only a measurement can decide: it keeps
    ``"auto"`` (its config not yet adapted); ``resolved()`` (what ``build_engine`` and
    ``spec_model`` call) measures once, and a spec made after that is decided by the cache."""
    calls = []

    def measure() -> dict:
        calls.append(1)
        return record("llama.cpp")

    monkeypatch.setattr(auto_backend, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(auto_backend, "measure_answers", measure)
    spec = assembly.EngineSpec()
    assert spec.backend == "auto" and calls == []
    assert decide(measure=False).pending and decide(measure=False).backend == "torch"
    done = spec.resolved()
    assert calls == [1] and done.backend == "llama.cpp"
    assert done.config.key_source == "final_norm" and spec.config.key_source is None
    assert done.resolved() is done and spec.resolved() == done and calls == [1]
    assert assembly.EngineSpec().backend == "llama.cpp" and calls == [1]
    assert not decide(measure=False).pending


def test_a_dtype_settled_by_the_measurement_finds_the_record_next_time(auto, monkeypatch) -> None:
    """The first torch load may settle ``auto``'s dtype (bf16 rows not exact: fp32,
    remembered), which changes the key: the record is cached under the key before and after,
    so the next process, which predicts fp32, measures nothing."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    build = ["bf16+packed"]
    calls = []

    def measure() -> dict:
        calls.append(1)
        build[0] = "fp32+packed"  # what lm.auto_dtype remembers after the load
        return record("llama.cpp")

    monkeypatch.setattr(auto_backend, "torch_build", lambda: build[0])
    monkeypatch.setattr(auto_backend, "measure_answers", measure)
    before = auto_backend.cache_key()
    assert decide().backend == "llama.cpp" and calls == [1]
    after = auto_backend.cache_key()
    assert before != after and "bf16+packed" in before and "fp32+packed" in after
    on_disk = json.loads(auto.file.read_text())["backends"]
    assert on_disk[before] == on_disk[after] == record("llama.cpp")
    auto.clear()
    assert decide().backend == "llama.cpp" and calls == [1]
