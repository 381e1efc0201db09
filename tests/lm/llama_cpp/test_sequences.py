"""The llama.cpp backend on the GGUF file the package ships: caches as sequences of the
context's KV cache: reused after collection, given back when a generation ends, a dead one never
shifts the next (``lm.llama_cpp.sequences``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations.config import NestConfig  # noqa: E402
from tests.lm.llama_cpp.llama_helpers import _steps  # noqa: E402


def test_a_dead_cache_in_a_cycle_does_not_shift_the_next_sequence(lm):
    """A new cache is laid out from cell 0 as in a fresh context even when a dead cache is
    only collectable by the garbage collector: a sequence laid out after another cache's cells
    gives other logits (measured: up to 1.1 apart over 20 steps, AMD EPYC)."""
    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. " * 6)
    prompt, new = ids[:70], ids[70:90]


    fresh = _steps(lm, prompt, new)
    dead = lm.new_cache()
    lm.forward(ids[:37], dead, last=1)
    dead.cycle = dead  # only the garbage collector frees it
    del dead
    assert torch.equal(_steps(lm, prompt, new), fresh)


def test_caches_are_sequences_reused_after_collection(lm):
    """Interleaved caches keep their own positions; caches given up return their sequence to
    the pool (more caches over time than the context has sequences)."""
    from nest_integrations.lm.llama_cpp import MAX_SEQUENCES

    p, q = lm.tokenize("One two three four"), lm.tokenize("Alpha beta gamma")
    c1, c2 = lm.new_cache(), lm.new_cache()
    l1, _ = lm.forward(p, c1)
    l2, _ = lm.forward(q, c2)
    assert torch.equal(lm.forward(p, lm.new_cache())[0], l1)
    lm.crop_cache(c1, 2)
    assert torch.equal(lm.forward(p[2:], c1)[0], l1[2:])
    for _ in range(MAX_SEQUENCES + 10):  # each cache is freed when the call returns
        lm.forward(p, lm.new_cache())
    with pytest.raises(ValueError, match="cannot crop"):
        lm.crop_cache(c2, 99)


def test_a_finished_generation_gives_its_cache_back_at_once(lm, monkeypatch):
    """The decode loop releases its cache when decoding ends, even while the loop itself is
    still referenced (a cycle keeps it until collected): no sequence stays live, so the next
    ``new_cache`` has no reason to run ``gc.collect()``; a released cache refuses further use."""
    import gc

    from nest_integrations.config import NestConfig
    from nest_integrations.decoding.loop import DecodeLoop
    from nest_integrations.drafters import get_method
    from nest_integrations.types import NestStats

    ids = lm.tokenize("The Eiffel Tower is in")
    loop = DecodeLoop(lm, get_method("greedy"), None, config=NestConfig(temperature=0.0),
                      prompt_ids=ids, memory=None, passages=[], offsets=[], max_new_tokens=4,
                      stats=NestStats(), generator=None)  # fmt: skip
    loop.itself = loop  # a reference cycle, as an engine's request can make
    assert lm.runtime.sequences.live() == 1
    list(loop.run())
    assert lm.runtime.sequences.live() == 0 and len(loop.output.ids) == 4
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    lm.release_cache(lm.new_cache())
    assert not collected
    with pytest.raises(ValueError, match="released"):
        lm.forward(ids, loop.cache)
