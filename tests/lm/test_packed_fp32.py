"""Prepacked fp32 linears (``lm.packing``, on by default on CPU; ``pack_weights=False`` or
``NEST_PACK_WEIGHTS=0`` turns them off): another kernel, made row-exact by its own probed row plan, so a
verify row still equals a one-token step bit for bit and the lossless methods still equal greedy
decoding token for token (the oracle)."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.lm import packing, row_exact
from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.lm.packing import PackedLinear
from nest_integrations.lm.row_exact import check_rows

pytestmark = pytest.mark.skipif(not packing.fp32_packing_available(),
                                reason="this torch build has no prepacked fp32 oneDNN linears")

PROMPT = "one two three four one two three four one two three four one two"


def _packed(path: str, monkeypatch, **kwargs) -> HFLanguageModel:
    monkeypatch.delenv(row_exact.ENV, raising=False)
    monkeypatch.delenv(packing.PACK_ENV, raising=False)
    return HFLanguageModel.from_pretrained(path, dtype="fp32", **kwargs)


def test_fp32_is_packed_by_default_unless_turned_off(tiny_lm_path, monkeypatch) -> None:
    packed = _packed(str(tiny_lm_path), monkeypatch)
    assert packed.packed_linears == packed.row_exact_linears > 0  # the default packs fp32
    assert all(m.weight.dtype == torch.float32 for m in packed.model.modules()
               if isinstance(m, PackedLinear))
    plain = _packed(str(tiny_lm_path), monkeypatch, pack_weights=False)
    assert plain.packed_linears == 0
    assert packed.fingerprint == plain.fingerprint  # the same parameters
    assert _packed(str(tiny_lm_path), monkeypatch, pack_weights=True).packed_linears == \
        packed.packed_linears
    monkeypatch.setenv(packing.PACK_ENV, "0")
    assert HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32").packed_linears == 0


def test_packed_fp32_rows_are_exact_and_close_to_plain(tiny_lm_path, monkeypatch) -> None:
    plain = _packed(str(tiny_lm_path), monkeypatch, pack_weights=False)
    lm = _packed(str(tiny_lm_path), monkeypatch)
    assert lm.rowwise_attention and lm.exact_rows and check_rows(lm)
    ids = lm.tokenize(PROMPT)
    a = lm.forward(ids, lm.new_cache())[0]
    b = plain.forward(ids, plain.new_cache())[0]
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # another kernel, the same model


def test_lossless_methods_equal_greedy_on_packed_fp32(tmp_path, monkeypatch) -> None:
    """The oracle on the packed kernels: drafts verified in multi-row passes commit exactly
    the tokens greedy one-token steps give. A tiny Llama with zero attention outputs (its next
    token depends on the current token only, as in ``test_lossless_oracles``) answers a prompt
    that holds its own answer, so prompt-lookup's drafts are accepted, in multi-row passes."""
    from tests._tiny import smollm2_tokenizer, tiny_llama

    model = tiny_llama(seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    model.save_pretrained(tmp_path)
    smollm2_tokenizer().save_pretrained(tmp_path)
    lm = _packed(str(tmp_path), monkeypatch, pack_weights=True)
    assert lm.packed_linears > 0
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())
    first = engine.generate(PROMPT, max_new_tokens=24, decoding="greedy")
    planted = PROMPT + lm.detokenize(first.token_ids) + " " + PROMPT
    greedy = engine.generate(planted, max_new_tokens=24, decoding="greedy")
    lookup = engine.generate(planted, max_new_tokens=24, decoding="prompt-lookup")
    assert lookup.stats.exact_rows is True
    assert lookup.token_ids == greedy.token_ids
    assert lookup.stats.forward_passes < len(greedy.token_ids)  # drafts were accepted


@pytest.mark.slow
def test_every_lossless_method_equals_hf_generate_on_smollm2_packed_fp32(tmp_path,
                                                                         monkeypatch) -> None:
    """The real model's oracle (``test_lossless_oracles``: every lossless method, chains,
    token trees and skipped layers, 6 prompts x 48 tokens against HF ``generate``) on the
    prepacked fp32 kernels."""
    from tests.decoding.test_lossless_oracles import _smollm2_oracle

    monkeypatch.delenv(row_exact.ENV, raising=False)
    lm = HFLanguageModel.from_default(dtype="fp32", pack_weights=True)
    assert lm.packed_linears > 0 and lm.rowwise_attention and lm.exact_rows
    _smollm2_oracle(lm, tmp_path)
