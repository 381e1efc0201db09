"""Token-tree verification (``HFLanguageModel.forward_tree`` / ``select_cache``) against
sequential forwards of each root-to-node path."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.lm.tree import ancestor_matrix, tree_depths

PROMPT = [504, 3458, 282, 253, 1345, 30, 198, 1073]


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def _cache_tensors(cache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


TREES = [
    # (tokens, parents)
    ([11, 12, 13], [-1, 0, 1]),  # a chain
    ([11, 12, 13, 21, 22, 31], [-1, 0, 1, 0, 3, -1]),  # two roots, a fork at node 0
    ([5, 6, 7, 8, 9, 10, 11], [-1, 0, 0, 1, 1, 2, -1]),  # binary-ish tree
]


@pytest.mark.parametrize("tokens,parents", TREES)
def test_tree_forward_equals_sequential(tiny_lm, tokens, parents):
    torch.manual_seed(0)
    lm = tiny_lm
    cache = lm.new_cache()
    lm.forward(PROMPT, cache)
    past = lm.cache_length(cache)
    logits, keys = lm.forward_tree(tokens, parents, cache)
    assert logits.shape == (len(tokens), lm.vocab_size)
    assert lm.cache_length(cache) == past + len(tokens)
    for i in range(len(tokens)):
        path = _path(parents, i)
        ref = lm.new_cache()
        lm.forward(PROMPT, ref)
        ref_logits, ref_keys = lm.forward([tokens[j] for j in path], ref)
        torch.testing.assert_close(logits[i], ref_logits[-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(keys[i], ref_keys[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens,parents", TREES)
def test_select_cache_equals_sequential_path(tiny_lm, tokens, parents):
    lm = tiny_lm
    leaf = len(tokens) - 2 if len(tokens) > 2 else len(tokens) - 1
    path = _path(parents, leaf)
    cache = lm.new_cache()
    lm.forward(PROMPT, cache)
    start = lm.cache_length(cache)
    lm.forward_tree(tokens, parents, cache)
    lm.select_cache(cache, start, path)
    ref = lm.new_cache()
    lm.forward(PROMPT + [tokens[j] for j in path], ref)
    assert lm.cache_length(cache) == lm.cache_length(ref)
    for (k, v), (rk, rv) in zip(_cache_tensors(cache), _cache_tensors(ref)):
        torch.testing.assert_close(k, rk, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, rv, atol=1e-4, rtol=1e-4)
    # and decoding continues exactly as after the sequential path
    nxt, _ = lm.forward([42], cache)
    ref_nxt, _ = lm.forward([42], ref)
    torch.testing.assert_close(nxt, ref_nxt, atol=1e-4, rtol=1e-4)


def test_select_cache_prefix_and_errors(tiny_lm):
    lm = tiny_lm
    cache = lm.new_cache()
    lm.forward(PROMPT, cache)
    lm.forward_tree([1, 2, 3], [-1, 0, 1], cache)
    lm.select_cache(cache, len(PROMPT), [0, 1])
    assert lm.cache_length(cache) == len(PROMPT) + 2
    with pytest.raises(ValueError, match="outside"):
        lm.select_cache(cache, len(PROMPT), [5])
    with pytest.raises(ValueError, match="parents"):
        lm.forward_tree([1, 2], [-1, 3], cache)


def test_tree_helpers():
    parents = [-1, 0, 0, 2, -1]
    assert tree_depths(parents) == [0, 1, 1, 2, 0]
    a = ancestor_matrix(parents)
    assert a[3].tolist() == [True, False, True, True, False]
    assert a[4].tolist() == [False, False, False, False, True]
