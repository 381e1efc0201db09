"""Fixtures of the llama.cpp backend's tests: the embedded model on llama.cpp, llama-cpp-python's
own ``Llama`` on the same file (the reference) and the Hugging Face tokenizer, loaded once
for the folder (the test modules skip without the llamacpp extra)."""

from __future__ import annotations

import pytest

from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel, default_gguf


@pytest.fixture(scope="package")
def lm():
    """The embedded model on llama.cpp as it runs by default (Q8_0, made from the shipped
    Q4_1 file), one thread."""
    model = LlamaCppLanguageModel.from_default(threads=1)
    yield model
    model.close()


@pytest.fixture(scope="package")
def llama():
    """llama-cpp-python's own ``Llama`` on the same file, as a user runs it with flash attention
    on and one thread: the reference."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(default_gguf()), n_ctx=4096, n_threads=1,
                          n_threads_batch=1, flash_attn=True, verbose=False, seed=0)
    yield llm
    llm.close()


@pytest.fixture(scope="package")
def hf_tokenizer():
    """The Hugging Face tokenizer of the embedded model (what the torch backend reads)."""
    from transformers import AutoTokenizer

    from nest_integrations.lm.default import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))
