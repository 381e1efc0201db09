"""The llama.cpp backend on the GGUF file the package ships: keys: the torch backend's keys of
the same layer, key sources, passages after the prefix (``lm.llama_cpp.outputs``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel  # noqa: E402


@pytest.mark.parametrize("source", ["ffn_input", "final_norm"])
def test_keys_are_the_torch_backends_keys_of_the_same_layer(source):
    """Each llama.cpp key source is the torch backend's key of that layer on the same text
    (Q8_0 against fp32 weights: cosine > 0.995 per token, and nearer to its own layer than
    to the other); ``ffn_input`` comes through llama.cpp's eval callback, on every path that
    returns keys (a forward, a prefill's last rows, passages packed in one decode)."""
    from nest_integrations.lm.hf import HFLanguageModel

    text = ("Paris is the capital and most populous city of France, with an estimated "
            "population of two million residents.")
    ours = LlamaCppLanguageModel.from_default(threads=1, key_source=source)
    try:
        assert ours.key_source == source
        ids = ours.tokenize(text)
        _, keys = ours.forward(ids, ours.new_cache())
        _, last = ours.forward(ids, ours.new_cache(), last=3)
        packed = ours.encode_passages([ids[:5], ids])[1]
        _, after_prefix = ours.forward(ours.passage_prefix + ids[:-1], ours.new_cache())
    finally:
        ours.close()
    torch_keys = {}
    for s in ("ffn_input", "final_norm"):
        hf = HFLanguageModel.from_default(dtype="fp32", key_source=s)
        torch_keys[s] = hf.forward(ids, hf.new_cache())[1].float()

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)

    other = "final_norm" if source == "ffn_input" else "ffn_input"
    assert keys.shape == (len(ids), ours.key_dim)
    assert cos(keys, torch_keys[source]).min() > 0.995
    assert (cos(keys, torch_keys[source]) > cos(keys, torch_keys[other])).all()
    assert torch.allclose(last, keys[-3:], atol=1e-3)
    n = len(ours.passage_prefix)
    assert torch.allclose(torch.as_tensor(packed), after_prefix[n - 1:], atol=1e-3)


def test_an_unknown_key_source_on_llama_cpp_is_a_clear_error():
    with pytest.raises(ValueError, match="key_source='block_input' is not available"):
        LlamaCppLanguageModel.from_default(threads=1, key_source="block_input")


def test_encode_passages_equals_forward_after_the_prefix(lm):
    """Passage keys (several passages packed in one decode) equal the keys of a forward over
    the passage prefix and the passage, within float noise."""
    texts = ["Paris is the capital of France.", "Belly dance comes from Egypt.", "x"]
    tokens = [lm.tokenize(t) for t in texts] + [[]]
    keys = lm.encode_passages(tokens)
    assert [k.shape for k in keys] == [(len(t), lm.key_dim) for t in tokens]
    for t, k in zip(tokens[:3], keys):
        _, ref = lm.forward(lm.passage_prefix + t[:-1], lm.new_cache())
        start = len(lm.passage_prefix) - 1
        assert torch.allclose(torch.from_numpy(k), ref[start:], atol=1e-3)
