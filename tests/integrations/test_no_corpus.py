"""An answer decoded over no passage says so: one ``UngroundedWarning`` (a ``UserWarning``) per
model, at its first such answer, and ``grounded: False`` with the reason in the answer's NEST
metadata, at each edge: ``ChatNest`` / LangChain ``NestLLM`` with no corpus or an empty
retriever, LlamaIndex ``NestLLM`` with no corpus, ``NestQueryEngine`` over an empty index.
A model with passages is grounded and never warns. Runs the tiny random Llama (fast)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from nest_integrations.integrations._common import UngroundedWarning
from nest_integrations.types import Passage

Q = "How long does the Zephyr lamp run?"


def _ungrounded(call: Any, times: int = 2) -> list[dict[str, Any]]:
    """Call ``times`` times; exactly one UngroundedWarning, a UserWarning; the NEST metadata."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metas = [call() for _ in range(times)]
    ours = [w for w in caught if issubclass(w.category, UngroundedWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert issubclass(ours[0].category, UserWarning)
    for meta in metas:
        assert meta["grounded"] is False and meta["grounded_reason"], meta
    assert metas[0]["grounded_reason"] in str(ours[0].message)
    return metas


def _grounded(call: Any) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UngroundedWarning)
        meta = call()
    assert meta["grounded"] is True and meta["grounded_reason"] is None, meta
    return meta


@pytest.fixture(scope="module")
def lamp() -> list[Passage]:
    return [Passage(id="lamp", doc_id="lamp", text="The Zephyr lamp runs for 40 hours.")]


def test_chat_nest_without_a_corpus(tiny_lm_path: Any) -> None:
    """``ChatNest()`` with no retriever and no collection (the model a folder: the real
    assembly path) warns once and flags each answer, invoked or streamed."""
    from nest_integrations.langchain import ChatNest

    chat = ChatNest(model=str(tiny_lm_path), max_tokens=3)
    (meta, _) = _ungrounded(lambda: chat.invoke(Q).response_metadata["nest"])
    assert meta["grounded_reason"].startswith("no corpus: ChatNest has no retriever")
    assert "collection=" in meta["grounded_reason"]  # says what to do
    last = list(chat.stream(Q))[-1]
    assert last.response_metadata["nest"]["grounded"] is False


def test_chat_nest_and_llm_with_an_empty_retriever(tiny_lm: Any, lamp: list[Passage]) -> None:
    """A LangChain retriever that returns nothing: the reason is "no passages"; the same
    models over a store with the passage are grounded."""
    from langchain_core.vectorstores import InMemoryVectorStore

    from nest_integrations.langchain import ChatNest, NestEmbeddings, NestLLM
    from nest_integrations.langchain import LangChainPassageRetriever
    from tests.engines import make_engine

    empty = InMemoryVectorStore(NestEmbeddings())
    engine = make_engine(tiny_lm, LangChainPassageRetriever(empty.as_retriever()))
    chat = ChatNest(engine=engine, max_tokens=3)
    (meta, _) = _ungrounded(lambda: chat.invoke(Q).response_metadata["nest"])
    assert meta["grounded_reason"].startswith("no passages: ChatNest's retriever returned")
    llm = NestLLM(engine=engine, max_tokens=3)
    _ungrounded(lambda: llm.generate([Q]).generations[0][0].generation_info["nest"])

    full = InMemoryVectorStore(NestEmbeddings())
    full.add_texts([lamp[0].text], ids=["lamp"])
    engine = make_engine(tiny_lm, LangChainPassageRetriever(full.as_retriever()))
    _grounded(lambda: ChatNest(engine=engine, max_tokens=3).invoke(Q).response_metadata["nest"])


def test_llama_index_llm_without_a_corpus(tiny_lm_path: Any, tiny_lm: Any,
                                          lamp: list[Passage]) -> None:
    """LlamaIndex ``NestLLM()`` with no corpus: completion and chat flag it, one warning; with
    passages per call it is grounded."""
    from llama_index.core.llms import ChatMessage

    from nest_integrations.llama_index import NestLLM

    llm = NestLLM(model=str(tiny_lm_path), max_new_tokens=3)
    (meta, _) = _ungrounded(lambda: llm.complete(Q).additional_kwargs["nest"])
    assert meta["grounded_reason"].startswith("no corpus: NestLLM has no retriever")
    chat = llm.chat([ChatMessage(role="user", content=Q)])
    assert chat.message.additional_kwargs["nest"]["grounded"] is False
    _grounded(lambda: NestLLM(model=str(tiny_lm_path), max_new_tokens=3).complete(
        Q, passages=lamp).additional_kwargs["nest"])


def test_query_engine_over_an_empty_index(tiny_lm: Any) -> None:
    """``NestQueryEngine`` over a ``VectorStoreIndex`` with no documents: ``response.metadata``
    flags it ("no passages"), warned once, streamed too."""
    from llama_index.core import VectorStoreIndex

    from nest_integrations.llama_index import NestEmbedding, NestQueryEngine
    from tests.engines import make_engine

    index = VectorStoreIndex([], embed_model=NestEmbedding())
    qe = NestQueryEngine.from_args(index, engine=make_engine(tiny_lm), max_new_tokens=3)
    (meta, _) = _ungrounded(lambda: qe.query(Q).metadata["nest"])
    assert meta["grounded_reason"].startswith("no passages: NestLLM's retriever returned")
    streaming = NestQueryEngine.from_args(index, engine=make_engine(tiny_lm), max_new_tokens=3,
                                          streaming=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UngroundedWarning)
        resp = streaming.query(Q)
        "".join(resp.response_gen)
    assert resp.metadata["nest"]["grounded"] is False
