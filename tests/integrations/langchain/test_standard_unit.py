"""langchain-tests unit suites for ChatNest and NestEmbeddings (no weights, sockets disabled)."""

from __future__ import annotations

from typing import Iterator

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests, EmbeddingsUnitTests
from pytest_socket import disable_socket, enable_socket

from nest_integrations.langchain import ChatNest, NestEmbeddings


@pytest.fixture(autouse=True)
def _offline() -> Iterator[None]:
    disable_socket(allow_unix_socket=True)
    yield
    enable_socket()


class TestChatNestUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatNest]:
        return ChatNest

    @property
    def chat_model_params(self) -> dict:
        # Never loaded: construction must not touch the model (test_init_time builds it 10x).
        return {"model": "tiny-test-model", "collection": "docs"}


class TestNestEmbeddingsUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[NestEmbeddings]:
        return NestEmbeddings
