"""The llama.cpp backend on the GGUF file the package ships: the context: KV cache types, a
closed model, its threads, repacked weights (``lm.llama_cpp.context``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel  # noqa: E402
from tests.lm.llama_cpp.llama_helpers import _prompt_logits, _quant_pair  # noqa: E402


def test_an_unknown_kv_cache_type_is_a_clear_error():
    from nest_integrations.lm.llama_cpp import kv_cache_type

    assert kv_cache_type(None) == "F16" and kv_cache_type("bf16") == "BF16"
    with pytest.raises(ValueError, match="kv_type='Q8_0' is not supported"):
        LlamaCppLanguageModel.from_default(threads=1, kv_type="Q8_0")


def test_a_closed_model_raises_instead_of_crashing():
    """After ``close()`` the llama.cpp context is gone: calls raise, they never reach freed
    memory."""
    closed = LlamaCppLanguageModel.from_default(threads=1)
    cache = closed.new_cache()
    closed.close()
    for call in (lambda: closed.forward([1, 2], cache), lambda: closed.tokenize("x"),
                 closed.new_cache, lambda: closed.detokenize([5])):
        with pytest.raises(RuntimeError, match="was closed"):
            call()


def test_threads_default_to_nest_threads_not_torchs(monkeypatch):
    """Without ``threads=``, llama.cpp runs on ``$NEST_THREADS`` (then on the CLI's
    ``--threads`` once ``configure_threads`` ran), not on torch's thread count, which a script
    that never configured threads leaves at torch's own default."""
    from nest_integrations.lm import backend

    before = torch.get_num_threads()
    monkeypatch.setenv(backend.THREADS_ENV, "1")
    torch.set_num_threads(2)
    try:
        model = LlamaCppLanguageModel.from_default()
        assert model.runtime.threads == 1
        model.close()
        backend.configure_threads(2)  # as `--threads 2` does (tests/conftest.py unsets it)
        model = LlamaCppLanguageModel.from_default()
        assert model.runtime.threads == 2
        model.close()
    finally:
        torch.set_num_threads(before)


def test_weights_are_repacked_as_llama_loads_them():
    """Q4_0 has repacked layouts on this build: loaded as ``Llama`` loads it (repacked), a
    prompt's logits equal ``Llama``'s bit for bit; unpacked (as this backend loaded every file
    before) they do not, so its greedy answers could leave a user's llama.cpp's."""
    import numpy as np
    import llama_cpp

    from nest_integrations.lm.llama_cpp import repack_by_default

    assert repack_by_default(llama_cpp)  # the package's builds have no AMX kernels
    lm, llm = _quant_pair("Q4_0")
    plain = LlamaCppLanguageModel.from_gguf(lm.runtime.path, threads=1, repack=False)
    try:
        assert lm.repack and not plain.repack
        ids = [1] + lm.tokenize("Paris is the capital of France. " * 12)
        ours, ref = _prompt_logits(lm, llm, ids)
        assert np.array_equal(ours, ref)
        ours, ref = _prompt_logits(plain, llm, ids)
        assert not np.array_equal(ours, ref)
    finally:
        for m in (lm, plain, llm):
            m.close()
