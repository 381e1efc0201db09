"""Row-exact verify passes on any CPU (``lm.row_exact``, ``lm.exactness``): the probe finds a row
plan for the kernel this CPU has, a model's verify rows then equal one-token steps bit for bit,
``dtype="auto"`` trades bf16 for fp32 where only fp32 is exact, and a lossless method that runs
where rows are not exact says so (a warning, ``stats.exact_rows``).

The kernels that differ between CPUs are exercised two ways: fake kernels whose rows depend on
the call size the way oneDNN's and MKL's do on some CPU (the other CPU's decision, faked), and
the real fp32 kernel, whose one-row calls (a matrix-vector product) round differently from
multi-row calls on the x86 CPUs measured."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.lm import exactness, row_exact
from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.lm.row_exact import RowExactLinear, RowPlan, check_rows, probe_plan

K, N = 24, 16


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g), torch.randn(N, generator=g)


def _linear64(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """A row-exact matmul on any CPU: accumulated in float64, rounded to the input's dtype
    (the float64 sums differ by call size far below a float32 rounding step)."""
    return F.linear(x.double(), w.double(), None if b is None else b.double()).to(x.dtype)


def _kernel(odd_one: bool = False, up_to: int = 64, position: bool = False):
    """A matmul whose rows depend on the call the way real kernels' do: ``odd_one`` = a one-row
    call rounds differently (a matrix-vector kernel); rows of calls longer than ``up_to``
    round differently; ``position`` = every row's bits depend on its place in the call."""
    w, b = _weights()

    def kernel(x: torch.Tensor) -> torch.Tensor:
        y = _linear64(x, w, b)
        m = x.shape[0]
        if (odd_one and m == 1) or m > up_to:
            y = y + 1e-3
        if position:
            y = y + 1e-4 * torch.arange(m, dtype=y.dtype)[:, None]
        return y

    return kernel


@pytest.mark.parametrize("kernel, plan", [
    (_kernel(), RowPlan(1, 32)),                         # oneDNN bf16 on the Xeon measured
    (_kernel(up_to=8), RowPlan(1, 8)),                   # exact only in smaller blocks
    (_kernel(odd_one=True, up_to=15), RowPlan(2, 15)),   # MKL fp32, one thread
    (_kernel(odd_one=True, up_to=3), RowPlan(2, 3)),     # MKL fp32, two threads
    (_kernel(position=True), RowPlan(1, 1)),             # nothing holds: one call per row
])
def test_the_probe_finds_the_plan_of_each_kernel(kernel, plan) -> None:
    assert probe_plan(kernel, K, torch.float32) == plan


@pytest.mark.parametrize("kernel", [_kernel(), _kernel(up_to=8), _kernel(odd_one=True, up_to=3),
                                    _kernel(position=True), _kernel(odd_one=True, position=True)])
def test_a_plan_gives_every_row_of_any_pass_the_bits_of_a_one_token_step(kernel) -> None:
    """What the loader relies on, for passes of 1..40 rows: row r of a pass run by the probed
    plan equals the same row run alone by that plan (a one-token step)."""
    plan = probe_plan(kernel, K, torch.float32)
    x = torch.randn(40, K, generator=torch.Generator().manual_seed(3))
    steps = torch.cat([plan.run(kernel, x[r : r + 1]) for r in range(40)])
    for rows in range(1, 41):
        assert torch.equal(plan.run(kernel, x[:rows]), steps[:rows]), (plan, rows)


def test_the_real_fp32_kernel_is_made_row_exact_by_its_plan() -> None:
    """torch's fp32 ``F.linear`` (MKL): whatever it does on this CPU, the probed plan makes
    every pass's rows equal one-row passes."""
    lin = torch.nn.Linear(576, 192)
    exact = RowExactLinear(lin)
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        steps = torch.cat([exact(x[r : r + 1]) for r in range(20)])
        for rows in (2, 3, 5, 9, 17, 20):
            assert torch.equal(exact(x[:rows]), steps[:rows]), (exact.plan(), rows)
        with row_exact.inexact_rows():  # one call: what relaxed decoding takes
            assert torch.allclose(exact(x), steps, atol=1e-4)


def test_plans_are_cached_per_machine_and_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    cache = row_exact.MachineCache("plans")
    calls = []
    assert cache.get("k", lambda: calls.append(1) or [2, 15]) == [2, 15]
    assert cache.get("k", lambda: calls.append(1) or [1, 1]) == [2, 15] and calls == [1]
    again = row_exact.MachineCache("plans")  # a new process: read from the file
    assert again.get("k", lambda: calls.append(1) or [1, 1]) == [2, 15] and calls == [1]
    data = json.loads(cache.path().read_text())
    assert data["format"] == row_exact.FORMAT and data["plans"] == {"k": [2, 15]}
    cache.path().write_text("{not json")  # a damaged file is measured again, not fatal
    assert row_exact.MachineCache("plans").get("k", lambda: [1, 4]) == [1, 4]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_verify_rows_of_a_loaded_model_are_exact_and_the_control_is_not_checked(
        tiny_lm_path, dtype, monkeypatch) -> None:
    monkeypatch.delenv(row_exact.ENV, raising=False)
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype=dtype)
    assert lm.row_exact_linears > 0 and lm.rowwise_attention
    assert lm.exact_rows and check_rows(lm)
    plain = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype=dtype, exact_rows=False)
    assert plain.row_exact_linears == 0 and not plain.exact_rows  # nothing guarantees it
    monkeypatch.setenv(row_exact.ENV, "0")
    assert not HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype=dtype).exact_rows


def test_a_wrong_plan_is_caught_by_the_model_check(tiny_lm_path, monkeypatch) -> None:
    """The check is not a formality: a plan that runs every pass in one call, on a kernel
    whose one-row calls round differently (faked), gives rows that differ from steps."""
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32")
    for m in lm.model.modules():
        if isinstance(m, RowExactLinear):
            w, b = m.weight, m.bias
            m.kernel = (lambda w, b: lambda x: _linear64(x, w, b) + (1e-3 if x.shape[0] == 1
                                                                     else 0.0))(w, b)
            m._plans = {torch.get_num_threads(): RowPlan(1, 32)}
    assert not check_rows(lm)
    for m in lm.model.modules():
        if isinstance(m, RowExactLinear):
            m._plans = {torch.get_num_threads(): RowPlan(2, 32)}  # what the probe would pick
    assert check_rows(lm)


def test_auto_loads_fp32_where_bf16_rows_are_not_exact(tiny_lm_path, monkeypatch) -> None:
    """The other CPU's decision, faked: on a CPU with native bf16 whose bf16 verify rows are
    not bit-exact, ``dtype="auto"`` gives the fp32 model (exact), and says why."""
    from nest_integrations.lm import auto_dtype, backend

    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(auto_dtype, "remember", lambda key, choice: None)  # a faked verdict
    real = exactness.verdict
    monkeypatch.setattr(exactness, "verdict",
                        lambda lm: lm.dtype != torch.bfloat16 and real(lm))
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert lm.dtype == torch.float32 and lm.exact_rows
    assert "not bit-exact" in lm.dtype_choice
    assert exactness.describe(lm)["dtype_choice"] == lm.dtype_choice
    explicit = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")  # as asked
    assert explicit.dtype == torch.bfloat16 and not explicit.exact_rows
    monkeypatch.setattr(exactness, "verdict", real)  # this CPU's own decision
    mine = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert mine.dtype == torch.bfloat16 and mine.exact_rows and "bit-exact" in mine.dtype_choice


def test_a_lossless_method_reports_whether_its_rows_were_exact(tiny_lm_path) -> None:
    exact = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32")
    plain = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32", exact_rows=False)
    prompt = "one two three four one two three four one two"
    for lm, want in ((exact, True), (plain, False)):
        engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = engine.generate(prompt, max_new_tokens=8, decoding="prompt-lookup")
            greedy = engine.generate(prompt, max_new_tokens=8, decoding="greedy")
        assert result.stats.exact_rows is want
        assert greedy.stats.exact_rows is None  # greedy is the reference itself
        warned = [w for w in caught if issubclass(w.category, RuntimeWarning)
                  and "prompt-lookup" in str(w.message)]
        assert bool(warned) is not want


def test_nest_info_shows_the_decision(capsys, monkeypatch, tmp_path) -> None:
    from nest_integrations import cli
    from nest_integrations.paths import models_dir

    (tmp_path / "models").symlink_to(models_dir().resolve())  # the session's converted model
    monkeypatch.setenv("NEST_HOME", str(tmp_path))  # no store: info reports the backend, then fails
    assert cli.main(["info", "--dtype", "fp32", "--threads", "1"]) == 1
    out = capsys.readouterr()
    assert "Lossless:     exact here" in out.out and "float32" in out.out
    assert "Row plans:" in out.out and "no store" in out.err
