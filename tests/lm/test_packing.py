"""Prepacked bf16 linears (``lm.packing``): the loader packs a bf16 CPU model, keeps its
parameters and fingerprint, and the packed model computes what the plain one does (bf16
numerics). Speed is a benchmark (``python -m benchmarks.speed --kernels``), not a test."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.lm.packing import (
    PACK_ENV,
    PackedLinear,
    pack_linear_weights,
    packing_available,
    packing_wanted,
)

AVAILABLE = packing_available(torch.bfloat16)


def _linears(model: torch.nn.Module) -> int:
    return sum(type(m) is torch.nn.Linear for m in model.modules())


def test_bf16_and_fp32_on_cpu_are_packed(monkeypatch) -> None:
    from nest_integrations.lm.packing import fp32_packing_available

    monkeypatch.delenv(PACK_ENV, raising=False)
    cpu = torch.device("cpu")
    assert not packing_available(torch.float32) and not packing_available(torch.float16)
    assert packing_wanted(None, cpu, torch.bfloat16) is AVAILABLE
    assert packing_wanted(None, cpu, torch.float32) is fp32_packing_available()
    assert not packing_wanted(None, cpu, torch.float16)
    assert not packing_wanted(False, cpu, torch.float32)
    assert not packing_wanted(None, torch.device("cuda"), torch.bfloat16)
    assert not packing_wanted(False, cpu, torch.bfloat16)
    monkeypatch.setenv(PACK_ENV, "0")
    assert not packing_wanted(None, cpu, torch.bfloat16)
    assert packing_wanted(True, cpu, torch.bfloat16) is AVAILABLE  # the argument wins


def test_loader_packs_a_bf16_model_and_keeps_its_parameters(tiny_lm_path, monkeypatch) -> None:
    monkeypatch.delenv(PACK_ENV, raising=False)
    plain = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16", pack_weights=False,
                                            exact_rows=False)
    packed = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    fp32 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32", exact_rows=False,
                                           pack_weights=False)
    n = _linears(plain.model)
    assert plain.packed_linears == 0 and fp32.packed_linears == 0
    assert _linears(fp32.model) == n
    if not AVAILABLE:  # a torch build without oneDNN bf16: nothing is packed, nothing breaks
        assert packed.packed_linears == 0 and _linears(packed.model) == n
        return
    assert packed.packed_linears == n > 0
    assert _linears(packed.model) == 0
    assert sum(isinstance(m, PackedLinear) for m in packed.model.modules()) == n
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


def test_packed_linear_matches_f_linear_and_falls_back_off_its_dtype() -> None:
    if not AVAILABLE:  # only where the CPU has no native bf16 (never on the project's machines)
        from nest_integrations.lm.backend import cpu_has_native_bf16

        assert not cpu_has_native_bf16()
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
