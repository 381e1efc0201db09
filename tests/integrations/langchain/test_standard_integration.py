"""langchain-tests integration suites with the real embedded SmolLM2-135M (marked slow).

``ChatNest`` runs the chat suite twice: over a small in-memory corpus (LangChain
``InMemoryVectorStore`` with our MiniLM embeddings) and with no corpus at all (plain decoding).
``max_tokens`` stays small so each suite takes minutes on two CPU cores. Tool calling,
structured output, JSON mode and multimodal tests skip themselves: ChatNest does not override
``bind_tools``/``with_structured_output`` and declares no multimodal support.
"""

from __future__ import annotations

import functools

import pytest
from langchain_tests.integration_tests import (
    ChatModelIntegrationTests,
    EmbeddingsIntegrationTests,
    RetrieversIntegrationTests,
)

from nest_integrations.langchain import ChatNest, NestCitationRetriever, NestEmbeddings
from tests.integrations.langchain.corpus import GROUNDED, memory_store

pytestmark = pytest.mark.slow


class TestChatNestCorpus(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatNest]:
        return ChatNest

    @property
    def chat_model_params(self) -> dict:
        return {"retriever": memory_store(), "max_tokens": 16}

    @property
    def supports_model_override(self) -> bool:
        return False  # one local model per instance; `model=` is not switchable per call


class TestChatNestNoCorpus(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatNest]:
        return ChatNest

    @property
    def chat_model_params(self) -> dict:
        return {"max_tokens": 8}

    @property
    def supports_model_override(self) -> bool:
        return False


@functools.cache
def _citing_chat() -> ChatNest:
    return ChatNest(retriever=memory_store(), max_tokens=48)


class TestNestCitationRetriever(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[NestCitationRetriever]:
        return NestCitationRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"model": _citing_chat(), "k": 3}

    @property
    def retriever_query_example(self) -> str:
        return GROUNDED  # the answer copies the corpus

    # The example's answer copies its passage whole: adjacent runs of one passage are one
    # citation (issue 53), so it has fewer than k=3 citations to return. LangChain's suite
    # allows an xfail here; strict, so an answer with 3+ citations again fails it.
    _FEWER = "the example answer is one merged citation, fewer than k=3 (issue 53)"

    @pytest.mark.xfail(reason=_FEWER, strict=True)
    def test_k_constructor_param(self) -> None:
        super().test_k_constructor_param()

    @pytest.mark.xfail(reason=_FEWER, strict=True)
    def test_invoke_with_k_kwarg(self) -> None:
        super().test_invoke_with_k_kwarg()


class TestNestEmbeddingsIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[NestEmbeddings]:
        return NestEmbeddings
