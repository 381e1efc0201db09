"""The llama.cpp backend on the GGUF file the package ships: the text side: prompts, tokens,
offsets and end tokens equal the Hugging Face tokenizer's (``lm.llama_cpp.vocab``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations.lm.llama_cpp import DEFAULT_QUANT  # noqa: E402


def test_text_side_equals_the_hugging_face_tokenizer(lm, hf_tokenizer, llama):
    """Tokens, chat prompts, end tokens and the passage prefix are the torch backend's, except
    where llama.cpp's pre-tokenizer groups whitespace before a digit differently (there they
    are llama-cpp-python's own)."""
    from nest_integrations.lm.hf_text import eos_token_ids, passage_prefix

    tok = hf_tokenizer
    for text in ("a\n\n1", "Total:  12 apples", "x\n 2"):  # the known difference
        assert lm.tokenize(text) == llama.tokenize(text.encode(), add_bos=False)
        assert lm.tokenize(text) != tok(text, add_special_tokens=False)["input_ids"]
    texts = ["Héllo wörld, ça va? 日本語 <|im_end|> x", "  two  spaces\n\nnew\tline",
             "def f(x):\n    return x**2  # 🙂", "Paris, France (1889): 330 m tall."]
    for text in texts:
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert lm.tokenize(text) == ids
        got, off = lm.tokenize_with_offsets(text)
        assert got == ids and off[0, 0] == 0 and off[-1, 1] == len(text)
        assert (off[1:, 0] == off[:-1, 1]).all()  # a tiling
        assert lm.detokenize(ids) == text
        for i in range(len(ids)):  # a token ends where its prefix's complete characters end
            assert text[: off[i, 1]] == lm.detokenize(ids[: i + 1]).rstrip("\ufffd"), (text, i)
        if text.isascii():  # no split characters: exactly the torch backend's offsets
            assert (off == _hf_offsets(tok, text)).all()
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is NEST?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert lm.chat_prompt(msgs) == tok(text, add_special_tokens=False)["input_ids"]
    from transformers import AutoConfig

    from nest_integrations.lm.default import default_model_path

    config = AutoConfig.from_pretrained(str(default_model_path()))
    assert lm.passage_prefix == passage_prefix(tok, config)
    assert lm.eos_token_ids >= {tok.eos_token_id} and lm.eos_token_ids <= set(
        eos_token_ids(type("M", (), {"config": config})(), tok)) | {tok.eos_token_id}
    assert lm.key_source == "final_norm" and lm.key_dim == config.hidden_size
    assert lm.vocab_size == 49152 and lm.quantization == DEFAULT_QUANT


def _hf_offsets(tok: Any, text: str) -> Any:
    """``HFLanguageModel.tokenize_with_offsets`` with this tokenizer (no model needed)."""
    from nest_integrations.lm.hf_text import offsets_from_tokenizer

    return offsets_from_tokenizer(tok, text)[1]
