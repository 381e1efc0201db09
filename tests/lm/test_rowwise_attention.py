"""Row-wise verify attention (``lm.rowwise_attention``): in bf16 on CPU a verify pass's rows equal
one-token steps bit for bit, for chains and token trees, which is what makes the lossless
methods exactly greedy there. The control: transformers' own SDPA does not give that on the
real model. Speed is a benchmark (``python -m benchmarks.speed --kernels``), not a test."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.lm import rowwise_attention
from nest_integrations.lm.hf import HFLanguageModel


def _steps_and_verify(lm: HFLanguageModel, prompt: list[int], new: list[int]):
    """(logits of len(new) one-token steps, logits of one verify pass over ``new``)."""
    cache = lm.new_cache()
    lm.forward(prompt, cache, last=1)
    steps = torch.cat([lm.forward([t], cache)[0] for t in new])
    cache = lm.new_cache()
    lm.forward(prompt, cache, last=1)
    verify, _ = lm.forward(new, cache)
    return steps, verify


def test_cpu_models_load_with_rowwise_attention(tiny_lm_path, monkeypatch) -> None:
    monkeypatch.delenv(rowwise_attention.ENV, raising=False)
    bf16 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    assert bf16.rowwise_attention
    assert bf16.model.config._attn_implementation == rowwise_attention.NAME
    assert HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32").rowwise_attention
    plain = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="fp32", exact_rows=False)
    assert not plain.rowwise_attention and not plain.exact_rows
    chosen = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16",
                                             attn_implementation="eager")
    assert not chosen.rowwise_attention  # the caller's choice stands
    monkeypatch.setenv(rowwise_attention.ENV, "0")
    assert not HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16").rowwise_attention
    assert bf16.fingerprint == chosen.fingerprint  # a kernel choice, not another model


def test_verify_rows_equal_one_token_steps_on_the_tiny_model(tiny_lm_path) -> None:
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    prompt = lm.tokenize("Once upon a time there was a small village by the sea, and")
    new = lm.tokenize(" every morning the fishermen went out in their boats")[:9]
    steps, verify = _steps_and_verify(lm, prompt, new)
    assert torch.equal(steps, verify)


def test_tree_rows_equal_one_token_steps_along_each_branch(tiny_lm_path) -> None:
    lm = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype="bf16")
    prompt = lm.tokenize("The list of colours: red, green,")
    a, b = lm.tokenize(" blue, yellow")[:3], lm.tokenize(" white and black")[:3]
    # node 0 = a[0]; 1, 2 continue it; 3 = b[0] (a sibling of node 0); 4, 5 continue b
    ids, parents = a + b, [-1, 0, 1, -1, 3, 4]
    cache = lm.new_cache()
    lm.forward(prompt, cache, last=1)
    tree, _ = lm.forward_tree(ids, parents, cache)
    for branch, rows in ((a, tree[:3]), (b, tree[3:])):
        steps, _ = _steps_and_verify(lm, prompt, branch)
        assert torch.equal(steps, rows)


@pytest.mark.slow
def test_real_model_verify_rows_are_exact_only_with_rowwise_attention(monkeypatch) -> None:
    """The embedded model in bf16: whether a 9-token verify equals 9 one-token steps bit for bit
    is what the load-time check (``lm.exact_rows``) says on this CPU; where it says no, the
    ``auto`` dtype is fp32, whose rows are. One SDPA call per pass (the control) is not exact."""
    monkeypatch.delenv(rowwise_attention.ENV, raising=False)
    lm = HFLanguageModel.from_default(dtype="bf16")
    assert lm.rowwise_attention
    prompt = list(range(1000, 1100))
    new = list(range(2000, 2009))
    steps, verify = _steps_and_verify(lm, prompt, new)
    assert torch.equal(steps, verify) is lm.exact_rows
    if not lm.exact_rows:  # this CPU's bf16 kernels: the downgrade
        lm = HFLanguageModel.from_default(dtype="auto")
        assert lm.dtype == torch.float32 and lm.exact_rows, lm.dtype_choice
        steps, verify = _steps_and_verify(lm, prompt, new)
        assert torch.equal(steps, verify)
    with lm.inexact_rows():  # one SDPA call per pass: what relaxed decoding takes
        _, fast = _steps_and_verify(lm, prompt, new)
    assert not torch.equal(steps, fast)
    assert torch.allclose(steps, fast, atol=1.0)  # rounding, not another model
