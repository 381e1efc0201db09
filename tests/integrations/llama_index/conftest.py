"""Fixtures for the LlamaIndex adapter tests: offline Settings, an index, NestLLMs.

LlamaIndex defaults to OpenAI: every test runs with ``Settings.embed_model = NestEmbedding()``
and ``Settings.llm = MockLLM()`` unless it sets its own.
"""

from __future__ import annotations

import pytest

from tests.integrations.llama_index.corpus import documents, make_llm, splitter


@pytest.fixture(autouse=True)
def offline_settings():
    """LlamaIndex Settings that never reach OpenAI; restored after each test."""
    from llama_index.core import Settings
    from llama_index.core.llms import MockLLM

    from nest_integrations.llama_index import NestEmbedding

    old_llm, old_embed = Settings._llm, Settings._embed_model
    Settings.llm = MockLLM()
    Settings.embed_model = NestEmbedding()
    yield Settings
    Settings._llm, Settings._embed_model = old_llm, old_embed


@pytest.fixture(scope="session")
def index():
    """An in-memory ``VectorStoreIndex`` over ``DOCS`` embedded by ``NestEmbedding``."""
    from llama_index.core import VectorStoreIndex

    from nest_integrations.llama_index import NestEmbedding

    return VectorStoreIndex.from_documents(
        documents(), embed_model=NestEmbedding(), transformations=[splitter()]
    )


@pytest.fixture(scope="session")
def tiny_llm(tiny_lm, index):
    """``NestLLM`` on the tiny random Llama (fast, meaningless text) over ``index``."""
    return make_llm(tiny_lm, index)


@pytest.fixture(scope="session")
def nest_llm(default_lm, index):
    """``NestLLM`` on the real SmolLM2-135M-Instruct over ``index``."""
    return make_llm(default_lm, index, max_new_tokens=16)
