"""The llama.cpp backend on the GGUF file the package ships: a pass's rows: a prefill's logits
equal ``Llama``'s prompt processing, with or without keys, argmax rows, and verify rows equal
one-token steps (``lm.llama_cpp.passes``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from tests.lm.llama_cpp.llama_helpers import _rows_vs_steps  # noqa: E402


def test_prefill_logits_equal_llama_prompt_processing(lm, llama):
    """``forward(prompt, last=1)`` returns the logits ``Llama.eval`` computes for the prompt's
    last token, bit for bit (long and short prompts: one batch, as Llama processes it)."""
    import llama_cpp
    import numpy as np

    for text in ("The capital of France is", "Paris is the capital of France. " * 40):
        ids = [1] + lm.tokenize(text)
        llama.reset()
        llama.eval(ids)  # the prompt in batches of n_batch, logits of its last token
        ptr = llama_cpp.llama_get_logits_ith(llama.ctx, -1)
        ref = np.ctypeslib.as_array(ptr, shape=(llama.n_vocab(),)).copy()
        cache = lm.new_cache()
        logits, keys = lm.forward(ids, cache, last=1)
        assert logits.shape == (1, lm.vocab_size) and keys.shape == (1, lm.key_dim)
        assert np.array_equal(logits[0].numpy(), ref)
        assert lm.cache_length(cache) == len(ids)
        del cache  # the next prompt is laid out in the KV cache from cell 0, as Llama's


def test_a_prefill_without_keys_equals_one_with_keys(lm):
    """``forward_logits(prompt, last=1)`` (the loop's prefill when nothing reads the keys)
    returns ``forward``'s logits bit for bit and no key rows, and leaves the cache as
    ``forward`` does: the next step's logits and keys are the same bits."""
    ids = [1] + lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 3)
    a, b = lm.new_cache(), lm.new_cache()
    la, ka = lm.forward(ids, a, last=1)
    lb, kb = lm.forward_logits(ids, b, last=1)
    assert kb.shape == (0, lm.key_dim) and ka.shape == (1, lm.key_dim)
    assert torch.equal(la, lb) and lm.cache_length(a) == lm.cache_length(b) == len(ids)
    nxt = int(la[-1].argmax())
    sa, sb = lm.forward([nxt], a), lm.forward([nxt], b)
    assert torch.equal(sa[0], sb[0]) and torch.equal(sa[1], sb[1])
    step = lm.forward_logits([nxt], b)  # a step without keys: the same logits, one position
    assert torch.equal(step[0], lm.forward([nxt], a)[0]) and step[1].shape == (0, lm.key_dim)
    assert lm.cache_length(a) == lm.cache_length(b)


def test_argmax_passes_equal_the_argmax_of_the_logits(lm):
    """``forward_argmax`` (what lossless greedy decoding reads on llama.cpp: no logits copied
    out) returns each row's argmax of the logits ``forward``/``forward_logits`` return for the
    same tokens, the same key rows, and leaves the cache as they do."""
    ids = [1] + lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 3)
    a, b = lm.new_cache(), lm.new_cache()
    la, _ = lm.forward_logits(ids, a, last=1)
    tb, kb = lm.forward_argmax(ids, b, last=1)
    assert tb == [int(la[-1].numpy().argmax())] and kb.shape == (0, lm.key_dim)
    draft = lm.tokenize(" It was built in 1889 for the fair")
    la, ka = lm.forward(draft, a)  # a verify pass with keys: every row
    tb, kb = lm.forward_argmax(draft, b, keys=True)
    assert tb == [int(r) for r in la.numpy().argmax(axis=1)] and len(tb) == len(draft)
    assert torch.equal(ka, kb) and lm.cache_length(a) == lm.cache_length(b)
    none, keys = lm.forward_argmax([], b)
    assert none == [] and keys.shape == (0, lm.key_dim)


def test_verify_rows_equal_one_token_steps(lm):
    """The rows of a T-token decode (T up to 33) equal T one-token steps bit for bit, before
    and after 256 cached positions."""
    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 30)
    for n_ctx in (40, 300):
        for t in (2, 9, 33):
            assert _rows_vs_steps(lm, ids[:n_ctx], ids[n_ctx:n_ctx + t]) == 0.0, (n_ctx, t)
