"""ChatNest / NestLLM end to end with the real embedded SmolLM2-135M and MiniLM (marked slow).

The grounded prompt asks the model to continue the opening of a corpus passage, which makes the
135M model copy (``attributed_tokens > 0``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import chromadb
import pytest
from langchain_chroma import Chroma

from nest_integrations.langchain import ChatNest, NestEmbeddings, NestLLM, citations_to_documents
from tests.integrations.langchain.corpus import (
    GROUNDED,
    SOURCES,
    check_annotations,
    documents,
    memory_store,
)

pytestmark = pytest.mark.slow


def _annotations(msg) -> list[dict]:
    (block,) = [b for b in msg.content_blocks if b["type"] == "text"]
    return list(block.get("annotations", []))


@pytest.fixture(scope="module")
def chat() -> ChatNest:
    return ChatNest(retriever=memory_store(), max_tokens=24)


@pytest.fixture(scope="module")
def grounded(chat: ChatNest):
    return chat.invoke(GROUNDED)


def test_citations_over_langchain_chroma(tmp_path: Path) -> None:
    """A grounded answer over a langchain_chroma store cites exact answer and source slices;
    Chroma ids and metadata reach the citations; token keys (a NEST call) persist under
    persist_dir."""
    store = Chroma(
        collection_name=f"nest-{uuid.uuid4().hex[:8]}",
        embedding_function=NestEmbeddings(),
        persist_directory=str(tmp_path / "chroma"),
        client_settings=chromadb.config.Settings(anonymized_telemetry=False),
        collection_configuration={"hnsw": {"space": "cosine"}},
    )
    store.add_documents(documents())
    chat = ChatNest(
        retriever=store.as_retriever(search_kwargs={"k": 3}), persist_dir=str(tmp_path),
        max_tokens=24,
    )
    msg = chat.invoke(GROUNDED)
    assert msg.response_metadata["nest"]["attributed_tokens"] > 0
    notes = _annotations(msg)
    assert notes
    check_annotations(msg.text, notes)
    assert all(n["extras"]["source_start_char"] is not None for n in notes)
    assert {n["extras"]["passage_id"] for n in notes} <= {d.id for d in documents()}
    assert any(n.get("title") == "Eddystone Lighthouse" for n in notes)
    for doc in citations_to_documents(msg):
        m = doc.metadata
        assert SOURCES[m["doc_id"]][m["char_start"] : m["char_end"]] == doc.page_content
    key_store = chat.get_engine().key_store
    assert Path(key_store.path).is_relative_to(tmp_path)
    # the grounded policy's rag-copy needs no token keys; NEST's kNN-LM encodes the retrieved
    # passages' keys, and they persist under persist_dir
    assert chat.invoke(GROUNDED, decoding="nest").text
    assert len(key_store) > 0


def test_stream_adds_up_to_invoke(chat: ChatNest, grounded) -> None:
    """Streamed chunks concatenate to the invoked message, citations included."""
    chunks = list(chat.stream(GROUNDED))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.text == grounded.text
    assert _annotations(full) == _annotations(grounded)
    assert full.usage_metadata == grounded.usage_metadata
    assert chunks[-1].chunk_position == "last"
    check_annotations(full.text, _annotations(full))


def test_stop_sequence_cuts_the_answer(chat: ChatNest, grounded) -> None:
    """A stop string from the middle of the answer cuts it there (at the last whole token
    before it: the engine's rule, so only whitespace may be dropped)."""
    words = grounded.text.split()
    stop = words[len(words) // 2]
    cut = grounded.text[: grounded.text.index(stop)]
    msg = chat.invoke(GROUNDED, stop=[stop])
    assert cut.startswith(msg.text) and cut[len(msg.text):].strip() == ""
    assert msg.response_metadata["finish_reason"] == "stop"
    check_annotations(msg.text, _annotations(msg))


def test_batch_matches_invoke(chat: ChatNest, grounded) -> None:
    """batch runs in threads on one model and still gives the one-by-one answers."""
    hello = chat.invoke("Hello", max_tokens=8)
    out = chat.batch([GROUNDED, "Hello"], max_tokens=8)
    assert out[1].text == hello.text
    assert out[0].text == chat.invoke(GROUNDED, max_tokens=8).text


def test_no_corpus_and_completion() -> None:
    """No corpus: plain decoding, no citations. NestLLM completes raw text and cites copies."""
    msg = ChatNest(max_tokens=8).invoke("Hello")
    assert msg.text and msg.response_metadata["nest"]["n_passages"] == 0
    assert _annotations(msg) == []
    llm = NestLLM(retriever=memory_store(), max_tokens=16)
    gen = llm.generate(["The Eddystone Lighthouse stands on the"]).generations[0][0]
    assert gen.generation_info["nest"]["attributed_tokens"] > 0
    check_annotations(gen.text, gen.generation_info["citations"])
