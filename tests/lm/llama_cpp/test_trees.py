"""The llama.cpp backend on the GGUF file the package ships: token trees: their rows and
selected path equal chains, a dropped cache gives its branches back (``lm.llama_cpp.trees``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from tests.lm.llama_cpp.llama_helpers import _steps  # noqa: E402


def test_a_cache_dropped_after_a_token_tree_gives_back_its_branches(lm):
    """A cache collected right after ``forward_tree`` (no ``select_cache``), as the exactness
    check (``row_exact.check_rows``, run by the first lossless generation in a process whose
    ``$NEST_HOME`` lacks the verdict) leaves its tree cache, gives its branch sequences back
    with its own: the next cache is laid out from cell 0 again. Before, the branch stayed taken
    with 43 cells, every later sequence sat after them and the oracles left ``Llama.generate``'s
    path (issue 35: only in a process that ran the check, e.g. CI's fresh home)."""
    from nest_integrations.lm.row_exact import check_rows

    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. " * 6)
    prompt, new = ids[:70], ids[70:90]


    fresh = _steps(lm, prompt, new)
    tree = lm.new_cache()
    lm.forward(ids[:37], tree, last=1)
    lm.forward_tree(ids[37:43], [-1, 0, 1, -1, 3, 4], tree)
    del tree  # collected with its tree: no select_cache
    assert lm.runtime.sequences.live() == 0
    assert torch.equal(_steps(lm, prompt, new), fresh)
    assert check_rows(lm)  # what the verdict measures
    assert lm.runtime.sequences.live() == 0
    assert torch.equal(_steps(lm, prompt, new), fresh)


def test_token_tree_rows_and_selected_path_equal_chains(lm):
    """Each root-to-leaf path of a tree decodes as that path alone; after ``select_cache`` the
    cache holds exactly the kept path (the next step equals the chain's)."""
    ctx = lm.tokenize("A wrought-iron lattice tower on the Champ de Mars in Paris, France")
    a, b, c, x, y = lm.tokenize(" It is named after the")[:5]

    def chain(tokens: list[int]) -> tuple[Any, Any, Any]:
        cache = lm.new_cache()
        lm.forward(ctx, cache, last=1)
        logits, keys = lm.forward(tokens, cache)
        return logits, keys, cache

    ids, parents = [a, b, c, x, y], [-1, 0, 1, 0, 3]
    cache = lm.new_cache()
    lm.forward(ctx, cache, last=1)
    logits, keys = lm.forward_tree(ids, parents, cache)
    for path in ([0, 1, 2], [0, 3, 4]):
        ref, ref_keys, ref_cache = chain([ids[i] for i in path])
        assert torch.equal(logits[path], ref) and torch.equal(keys[path], ref_keys)
    with pytest.raises(ValueError, match="token tree"):
        lm.forward([a], cache)
    with pytest.raises(ValueError, match="not a root-to-node path"):
        lm.select_cache(cache, len(ctx), [0, 2])
    lm.select_cache(cache, len(ctx), [0, 3])
    assert lm.cache_length(cache) == len(ctx) + 2
    _, _, ref_cache = chain([a, x])
    assert torch.equal(lm.forward([y], cache)[0], lm.forward([y], ref_cache)[0])
