"""Prepacked bf16 linears (``lm.packing``): the loader packs a bf16 CPU model, keeps its
parameters and fingerprint, and the packed model computes what the plain one does (bf16
numerics). Speed is a benchmark (``python -m benchmarks.speed --kernels``), not a test.

Both CPU kinds run here: the ``onednn_bf16`` fixture runs each loader test with this CPU's own
oneDNN bf16 (AVX-512 machines) and with it forced off (``packing.packing_available`` says no,
as on an AVX2-only CPU), where the loader keeps the model exact by the row-exact wrapper of
plain ``F.linear`` (``lm.row_exact``) instead of the prepacked kernel."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.lm import backend, packing
from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.lm.packing import (
    PACK_ENV,
    PackedLinear,
    pack_linear_weights,
    packing_available,
    packing_wanted,
)
from nest_integrations.lm.row_exact import ENV as EXACT_ENV
from nest_integrations.lm.row_exact import RowExactLinear

AVAILABLE = packing_available(torch.bfloat16)


def _linears(model: torch.nn.Module) -> int:
    return sum(type(m) is torch.nn.Linear for m in model.modules())


def _wrapped(model: torch.nn.Module, cls: type) -> int:
    return sum(type(m) is cls for m in model.modules())


@pytest.fixture(params=["native", "forced-off"])
def onednn_bf16(request, monkeypatch) -> bool:
    """Whether oneDNN's bf16 linears are available: this CPU's own answer ("native"; skipped
    where it is no), or forced off as on an AVX2-only CPU (the probe says no, the CPU has no
    native bf16 either)."""
    monkeypatch.delenv(PACK_ENV, raising=False)
    monkeypatch.delenv(EXACT_ENV, raising=False)
    if request.param == "native":
        if not AVAILABLE:
            pytest.skip("this CPU has no oneDNN bf16; the forced-off case is this CPU's own")
        return True
    monkeypatch.setattr(packing, "packing_available", lambda dtype: False)
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: False)
    return False


def test_bf16_and_fp32_on_cpu_are_packed(onednn_bf16, monkeypatch) -> None:
    from nest_integrations.lm.packing import fp32_packing_available

    cpu = torch.device("cpu")
    assert not packing_available(torch.float32) and not packing_available(torch.float16)
    assert packing_wanted(None, cpu, torch.bfloat16) is onednn_bf16
    assert packing_wanted(None, cpu, torch.float32) is fp32_packing_available()
    assert not packing_wanted(None, cpu, torch.float16)
    assert not packing_wanted(False, cpu, torch.float32)
    assert not packing_wanted(None, torch.device("cuda"), torch.bfloat16)
    assert not packing_wanted(False, cpu, torch.bfloat16)
    monkeypatch.setenv(PACK_ENV, "0")
    assert not packing_wanted(None, cpu, torch.bfloat16)
    assert packing_wanted(True, cpu, torch.bfloat16) is onednn_bf16  # the argument wins


def test_loader_packs_a_bf16_model_and_keeps_its_parameters(tiny_lm_path, onednn_bf16,
                                                            monkeypatch) -> None:
    """With oneDNN bf16 every linear is a ``PackedLinear``; without it (an AVX2-only CPU) none
    is packed and every linear is the row-exact ``F.linear`` wrapper instead, so lossless
    methods stay exact in bf16 there too. Either way: the same parameters, fingerprint and
    numerics, and verify rows that are one-token steps bit for bit."""
    plain = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16", pack_weights=False,
                                            exact_rows=False)
    packed = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    fp32 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32", exact_rows=False,
                                           pack_weights=False)
    n = _linears(plain.model)
    assert n > 0 and plain.packed_linears == 0 and fp32.packed_linears == 0
    assert _linears(fp32.model) == n
    assert _linears(packed.model) == 0 and packed.row_exact_linears == n
    kernel = PackedLinear if onednn_bf16 else RowExactLinear
    assert packed.packed_linears == (n if onednn_bf16 else 0)
    assert _wrapped(packed.model, kernel) == n
    assert packed.rowwise_attention and packed.exact_rows  # checked on this kernel, this CPU
    # The same parameters under the same names: state dicts, tied embeddings, fingerprints.
    assert packed.model.state_dict().keys() == plain.model.state_dict().keys()
    assert packed.model.lm_head.weight is packed.model.model.embed_tokens.weight
    assert packed.fingerprint == plain.fingerprint == fp32.fingerprint
    ids = packed.tokenize("The quick brown fox jumps over the lazy dog, twice over.")
    a, ka = packed.forward(ids, packed.new_cache())
    b, kb = plain.forward(ids, plain.new_cache())
    assert a.dtype == torch.float32 and a.shape == b.shape
    # bf16 numerics: the kernels may round differently, never by more than bf16 noise.
    assert torch.allclose(a, b, rtol=0.05, atol=0.05), (a - b).abs().max()
    assert torch.allclose(ka, kb, rtol=0.05, atol=0.05)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    with monkeypatch.context() as m:
        m.setenv(PACK_ENV, "off")
        off = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16", exact_rows=False)
        assert off.packed_linears == 0 and _linears(off.model) == n


def test_auto_dtype_follows_the_cpu(tiny_lm_path, onednn_bf16) -> None:
    """``dtype="auto"``: bf16 (prepacked) where the CPU multiplies bf16 natively and its verify
    rows are exact; fp32 without native bf16 (an AVX2-only CPU), prepacked where oneDNN's fp32
    kernel works, and exact either way."""
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert lm.exact_rows and lm.row_exact_linears > 0 and _linears(lm.model) == 0
    if onednn_bf16 and backend.cpu_has_native_bf16():
        assert lm.dtype in (torch.bfloat16, torch.float32), lm.dtype_choice
        assert "auto" in lm.dtype_choice
        if lm.dtype == torch.bfloat16:
            assert lm.packed_linears == lm.row_exact_linears
        return
    assert lm.dtype == torch.float32
    assert lm.packed_linears == (lm.row_exact_linears if packing.fp32_packing_available() else 0)


def test_packed_linear_matches_f_linear_and_falls_back_off_its_dtype() -> None:
    if not AVAILABLE:  # only where the CPU has no native bf16 (never on the project's machines)
        assert not backend.cpu_has_native_bf16()
        return
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40, bias=True).to(torch.bfloat16)
    packed = PackedLinear(lin)
    assert packed.weight is lin.weight and packed.bias is lin.bias
    for shape in ((1, 48), (3, 48), (2, 5, 48)):
        x = torch.randn(*shape).to(torch.bfloat16)
        got, want = packed(x), lin(x)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), want.float(), rtol=0.02, atol=0.05)
    with pytest.raises(RuntimeError):  # another dtype takes F.linear: its own dtype error
        packed(torch.randn(2, 48))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    assert pack_linear_weights(model.to(torch.bfloat16)) == 2
    assert all(isinstance(model[i], PackedLinear) for i in (0, 2))


def test_auto_remembers_an_fp32_choice_and_loads_fp32_at_once(tiny_lm_path, monkeypatch,
                                                              tmp_path) -> None:
    """Where ``auto`` loaded bf16, found its rows not exact and loaded fp32, the next load goes
    to fp32 at once (one load, not two) and says so; an explicit dtype is never redirected."""
    from nest_integrations.lm import auto_dtype, exactness
    from nest_integrations.lm.row_exact import MachineCache

    class Isolated(MachineCache):
        @staticmethod
        def path():
            return tmp_path / "machine.json"

    monkeypatch.setattr(auto_dtype, "CHOICES", Isolated(auto_dtype.SECTION))
    monkeypatch.setattr(backend, "cpu_has_native_bf16", lambda: True)
    real_verdict, real_prepare = exactness.verdict, exactness.prepare
    monkeypatch.setattr(exactness, "verdict", lambda lm: lm.dtype != torch.bfloat16
                        and real_verdict(lm))  # this CPU's bf16 rows, faked not exact
    loads: list[torch.dtype] = []

    def prepare(model, **kwargs):
        loads.append(next(model.parameters()).dtype)
        return real_prepare(model, **kwargs)

    monkeypatch.setattr(exactness, "prepare", prepare)
    first = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert loads == [torch.bfloat16, torch.float32] and first.dtype == torch.float32
    assert "remembered" not in first.dtype_choice
    loads.clear()
    again = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert loads == [torch.float32] and again.exact_rows
    assert again.dtype_choice == auto_dtype.REMEMBERED
    assert again.fingerprint == first.fingerprint
    loads.clear()
    bf16 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")  # as asked
    assert loads == [torch.bfloat16] and bf16.dtype == torch.bfloat16 and bf16.dtype_choice is None
    monkeypatch.setattr(exactness, "verdict", real_verdict)
    (tmp_path / "machine.json").unlink()  # forgotten: the check runs again
    loads.clear()
    HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="auto")
    assert loads[0] == torch.bfloat16
