"""Fast behavioural tests of the LangChain adapters over a ``FakeLM`` engine (no weights)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.vectorstores import InMemoryVectorStore

import nest_integrations.integrations.langchain as lc_pkg
import nest_integrations.langchain as lc_short
from tests.engines import make_engine
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.integrations.langchain.chat_models import to_chat_messages
from nest_integrations.langchain import (
    ChatNest,
    LangChainPassageRetriever,
    NestCitationRetriever,
    NestLLM,
    citations_to_documents,
)
from tests.fakes import FakeLM
from tests.integrations.langchain.corpus import (
    SOURCES,
    check_annotations,
    documents,
    fake_engine,
    passages,
)

EXPECTED_ALL = [
    "ChatNest",
    "LangChainPassageRetriever",
    "NestAttributor",
    "NestCitationRetriever",
    "NestEmbeddings",
    "NestLLM",
    "citations_to_documents",
]
# Two copied runs: the Eddystone continuation, then (max_span=3) it streams in several deltas.
PROMPT = "The Eddystone Lighthouse stands"


@pytest.fixture
def chat() -> ChatNest:
    return ChatNest(engine=fake_engine(max_span=3), max_tokens=20)


def _annotations(msg: AIMessage | AIMessageChunk) -> list[dict]:
    (block,) = [b for b in msg.content_blocks if b["type"] == "text"]
    return list(block.get("annotations", []))


def _stream(chat: ChatNest, *args, **kwargs) -> tuple[list[AIMessageChunk], AIMessageChunk]:
    chunks = list(chat.stream(*args, **kwargs))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return chunks, full


def test_all_is_pinned() -> None:
    """Both import paths export exactly the public API."""
    assert sorted(lc_pkg.__all__) == sorted(EXPECTED_ALL)
    assert sorted(lc_short.__all__) == sorted(EXPECTED_ALL)
    assert all(getattr(lc_short, n) is getattr(lc_pkg, n) for n in EXPECTED_ALL)


def test_construction_is_lazy() -> None:
    """Constructing loads nothing; the engine is built on first use."""
    chat = ChatNest(model="not-a-real-model", collection="docs", max_tokens=10)
    assert chat._engine is None
    assert chat.resolved_model_name == "not-a-real-model"
    assert ChatNest().resolved_model_name == "SmolLM2-135M-Instruct"
    assert ChatNest(config="lossless").nest_config.strict_acceptance


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"config": "no-such-preset"}, "preset"),
        ({"engine": object(), "collection": "x"}, "engine="),
        ({"retriever": object(), "collection": "x"}, "retriever="),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_parameters_raise(kwargs: dict, match: str) -> None:
    """Bad parameters fail at construction with a message naming them."""
    with pytest.raises(ValueError, match=match):
        ChatNest(**kwargs)


def test_messages_are_converted_and_merged() -> None:
    """Roles map to chat-template roles; repeated roles merge; names and list content work."""
    msgs = [
        SystemMessage("a"),
        SystemMessage("b"),
        HumanMessage("hi", name="bob"),
        HumanMessage([{"type": "text", "text": "there"}]),
        AIMessage("ok"),
        ChatMessage(role="user", content="last"),
    ]
    assert to_chat_messages(msgs) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "hi\n\nthere"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"},
    ]


def test_invoke_returns_v1_citations(chat: ChatNest) -> None:
    """Copied spans are v1 Citation annotations (answer and source slices), mirrored for v0."""
    msg = chat.invoke(PROMPT)
    notes = _annotations(msg)
    assert msg.text.startswith("on the Eddystone Rocks")  # a chat answer: no leading space
    assert notes and notes[0]["title"] == "Eddystone Lighthouse"
    check_annotations(msg.text, notes)
    assert notes[0]["extras"]["copied"] is True and notes[0]["extras"]["kind"] == "copy"
    assert msg.additional_kwargs["citations"] == msg.response_metadata["citations"]
    assert [c["cited_text"] for c in msg.additional_kwargs["citations"]] == [
        n["cited_text"] for n in notes
    ]
    meta = msg.response_metadata
    assert meta["model_name"] == "fake-lm"
    assert meta["nest"]["attributed_tokens"] > 0 and meta["nest"]["n_passages"] > 0
    usage = msg.usage_metadata
    assert usage and usage["output_tokens"] == meta["nest"]["new_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_output_version_v1_keeps_annotations() -> None:
    """With output_version="v1" the stored content is the standard block with its citations."""
    chat = ChatNest(engine=fake_engine(), max_tokens=20, output_version="v1")
    msg = chat.invoke(PROMPT)
    assert msg.content[0]["type"] == "text"
    check_annotations(msg.text, msg.content[0]["annotations"])


def test_stream_adds_up_to_invoke(chat: ChatNest) -> None:
    """Chunks merge into one text block whose text and citations equal invoke's; citations
    arrive on chunks before the last; only the last carries usage and metadata."""
    prompt = [HumanMessage(PROMPT + " and Green tea is made")]
    msg = chat.invoke(prompt, max_tokens=40)
    chunks, full = _stream(chat, prompt, max_tokens=40)
    assert len(chunks) > 3
    assert full.text == msg.text
    assert _annotations(full) == _annotations(msg)
    assert len(_annotations(msg)) >= 2
    assert full.additional_kwargs["citations"] == msg.additional_kwargs["citations"]
    assert any(_annotations(c) for c in chunks[:-1])
    assert chunks[-1].chunk_position == "last"
    assert [c.usage_metadata is not None for c in chunks].count(True) == 1
    assert full.usage_metadata == msg.usage_metadata
    assert full.response_metadata["citations"] == msg.response_metadata["citations"]
    assert full.response_metadata["model_name"] == "fake-lm"
    streamed_invoke = ChatNest(engine=chat.engine, streaming=True).invoke(prompt, max_tokens=40)
    assert streamed_invoke.text == msg.text
    assert _annotations(streamed_invoke) == _annotations(msg)


async def test_async_matches_sync(chat: ChatNest) -> None:
    """ainvoke and astream give the sync results."""
    msg = chat.invoke(PROMPT)
    amsg = await chat.ainvoke(PROMPT)
    assert amsg.text == msg.text and _annotations(amsg) == _annotations(msg)
    full = None
    async for c in chat.astream(PROMPT):
        full = c if full is None else full + c
    assert full is not None and full.text == msg.text
    assert _annotations(full) == _annotations(msg)


def test_batch_matches_invoke(chat: ChatNest) -> None:
    """batch (threads) gives the same answers as one-by-one invokes."""
    prompts = [PROMPT, "Green tea is made", "Assert statements are"]
    assert [m.text for m in chat.batch(prompts)] == [chat.invoke(p).text for p in prompts]


def test_stop_sequences(chat: ChatNest) -> None:
    """Output is cut before the first stop string (call-level or model-level), exactly where
    the engine cuts it (at the last whole token before the stop string)."""
    full = chat.invoke(PROMPT).text
    # the engine continues the string; the chat answer is that text without its leading space
    cut = chat.engine.generate(PROMPT, max_new_tokens=20, stop=["south"]).text.lstrip()
    assert full.startswith(cut) and full[len(cut):].lstrip().startswith("south")
    msg = chat.invoke(PROMPT, stop=["south"])
    assert msg.text == cut and msg.response_metadata["finish_reason"] == "stop"
    check_annotations(msg.text, _annotations(msg))
    assert ChatNest(engine=chat.engine, max_tokens=20, stop=["south"]).invoke(PROMPT).text == cut
    _, streamed = _stream(chat, PROMPT, stop=["south"])
    assert streamed.text == cut


def test_stream_stop_straddling_deltas(chat: ChatNest) -> None:
    """A stop string spanning two deltas is not streamed (regression: the engine once emitted
    the stop string's first part)."""
    _, full = _stream(chat, PROMPT, stop=["Eddystone Rocks"])
    assert full.text == chat.invoke(PROMPT, stop=["Eddystone Rocks"]).text


def test_call_arguments(chat: ChatNest) -> None:
    """temperature maps to NestConfig.temperature; max_tokens and passages apply per call."""
    assert ChatNest(engine=chat.engine, temperature=0.7)._call_config({}).temperature == 0.7
    assert chat._call_config({"temperature": 0.2}).temperature == 0.2
    assert chat._call_config({}).temperature == 0.0
    short = chat.invoke(PROMPT, max_tokens=3)
    assert short.usage_metadata["output_tokens"] == 3
    tea = [d for d in documents() if d.metadata["doc_id"] == "green-tea"]
    msg = chat.invoke(PROMPT, passages=tea)
    assert msg.response_metadata["nest"]["n_passages"] == len(tea)
    assert all(n["extras"]["doc_id"] == "green-tea" for n in _annotations(msg))


def test_no_corpus_is_plain_decoding() -> None:
    """Without a retriever the model decodes plainly: no passages, no citations."""
    chat = ChatNest(engine=make_engine(FakeLM()), max_tokens=5)
    msg = chat.invoke("hello there")
    assert msg.response_metadata["nest"]["n_passages"] == 0
    assert _annotations(msg) == [] and msg.additional_kwargs["citations"] == []


def test_standard_params() -> None:
    """Tracing params name the provider, model, temperature, max_tokens and stop."""
    params = ChatNest(model="m", max_tokens=7, stop=["x"])._get_ls_params()
    assert params == {
        "ls_provider": "nest",
        "ls_model_type": "chat",
        "ls_model_name": "m",
        "ls_temperature": 0.0,
        "ls_max_tokens": 7,
        "ls_stop": ["x"],
    }
    assert NestLLM(model="m")._get_ls_params()["ls_model_type"] == "llm"


# --------------------------------------------------------------------------- NestLLM


def test_llm_completion_with_citations() -> None:
    """NestLLM completes raw text; citations and stats sit in generation_info."""
    llm = NestLLM(engine=fake_engine(max_span=3), max_tokens=20)
    text = llm.invoke(PROMPT)
    result = llm.generate([PROMPT])
    gen = result.generations[0][0]
    assert gen.text == text
    check_annotations(text, gen.generation_info["citations"])
    assert gen.generation_info["nest"]["attributed_tokens"] > 0
    assert result.llm_output["token_usage"]["completion_tokens"] > 0
    chunks = list(llm._stream(PROMPT))
    assert "".join(c.text for c in chunks) == text
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.generation_info["citations"] == gen.generation_info["citations"]


# --------------------------------------------------------------------------- retrieval


@pytest.fixture
def fake_store() -> InMemoryVectorStore:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents(documents())
    return store


def test_passage_retriever_over_vectorstore_and_retriever(fake_store) -> None:
    """Documents become passages with their ids, metadata and offsets; k is respected."""
    passages = LangChainPassageRetriever(fake_store).retrieve("tea", k=4)
    assert len(passages) == 4
    by_id = {d.id: d for d in documents()}
    for p in passages:
        doc = by_id[p.id]
        assert p.text == doc.page_content and p.doc_id == doc.metadata["doc_id"]
        assert SOURCES[p.doc_id][p.char_start : p.char_end] == p.text
        assert p.metadata["lang"] == "en"
    via_retriever = LangChainPassageRetriever(fake_store.as_retriever(search_kwargs={"k": 2}))
    assert len(via_retriever.retrieve("tea", k=10)) == 2  # the retriever's own k
    assert len(via_retriever.retrieve("tea", k=1)) == 1
    with pytest.raises(TypeError, match="BaseRetriever or VectorStore"):
        LangChainPassageRetriever(object())  # type: ignore[arg-type]


def test_chat_over_langchain_store(fake_store) -> None:
    """Document ids and metadata of a LangChain store flow into the citations."""
    engine = make_engine(FakeLM(), LangChainPassageRetriever(fake_store))
    msg = ChatNest(engine=engine, max_tokens=20).invoke(PROMPT)
    notes = _annotations(msg)
    assert notes
    check_annotations(msg.text, notes)
    assert {n["extras"]["passage_id"] for n in notes} <= {d.id for d in documents()}


def test_citations_to_documents(chat: ChatNest) -> None:
    """Cited spans become Documents carrying source offsets, ids and user metadata."""
    msg = chat.invoke(PROMPT)
    result = chat.engine.generate(PROMPT, max_new_tokens=20)
    docs = citations_to_documents(result)
    assert docs and all(isinstance(d, Document) for d in docs)
    for d, c in zip(docs, result.citations):
        m = d.metadata
        answer_slice = result.text[m["answer_start_index"] : m["answer_end_index"]]
        assert d.page_content == c.text == answer_slice
        assert SOURCES[m["doc_id"]][m["char_start"] : m["char_end"]] == d.page_content
        assert m["source"] == f"{m['doc_id']}.md" and m["lang"] == "en" and m["title"]
    from_msg = citations_to_documents(msg)
    assert [d.page_content for d in from_msg] == [d.page_content for d in docs]
    assert [d.metadata["char_start"] for d in from_msg] == [d.metadata["char_start"] for d in docs]


def test_citation_retriever(chat: ChatNest) -> None:
    """NestCitationRetriever returns at most k cited spans, k settable per call."""
    retriever = NestCitationRetriever(model=chat, k=1, max_tokens=40)
    docs = retriever.invoke(PROMPT + " and Green tea is made")
    assert len(docs) == 1 and docs[0].page_content in SOURCES[docs[0].metadata["doc_id"]]
    assert len(retriever.invoke(PROMPT + " and Green tea is made", k=2)) == 2
    llm = NestLLM(engine=chat.engine, max_tokens=20)
    llm_docs = NestCitationRetriever(model=llm).invoke(PROMPT)
    assert llm_docs and llm_docs[0].page_content.startswith("on the Eddystone")  # trimmed


class _CountingLM(FakeLM):
    """FakeLM that records how many forward calls overlap in time."""

    def __init__(self) -> None:
        super().__init__()
        self.active = self.peak = 0

    def forward(self, ids, cache, *, last=None):  # type: ignore[no-untyped-def]
        import time

        self.active += 1
        self.peak = max(self.peak, self.active)
        time.sleep(0.002)
        try:
            return super().forward(ids, cache, last=last)
        finally:
            self.active -= 1


def test_model_calls_are_serialised() -> None:
    """Concurrent generations (batch threads) never run two model calls at once, and the
    caller's engine is left untouched."""
    lm = _CountingLM()
    engine = make_engine(lm, InMemoryRetriever(passages()))
    chat = ChatNest(engine=engine, max_tokens=12)
    prompts = [PROMPT, "Green tea is made", "Assert statements are", "hello there"]
    texts = [m.text for m in chat.batch(prompts, config={"max_concurrency": 4})]
    assert lm.peak == 1
    assert texts == [chat.invoke(p).text for p in prompts]
    assert engine.lm is lm and chat.get_engine() is not engine


def test_engine_wiring(monkeypatch, tmp_path, fake_store) -> None:
    """Parameters pick the parts: LangChain store -> LangChainPassageRetriever; persist_dir ->
    keys on disk; collection/persist_dir alone -> NEST's Chroma store; nothing -> no corpus."""
    from nest_integrations import assembly
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: FakeLM())
    docs = ChromaPassageStore.from_persist_dir(tmp_path / "store", "docs")
    IngestPipeline(docs, FakeLM(), with_keys=False).ingest(texts=["A lighthouse."])
    plain = ChatNest().get_engine()
    assert plain.retriever is None and isinstance(plain.key_store, InMemoryKeyStore)
    over_lc = ChatNest(retriever=fake_store.as_retriever()).get_engine()
    assert isinstance(over_lc.retriever, LangChainPassageRetriever)
    assert isinstance(over_lc.key_store, InMemoryKeyStore)
    kept = ChatNest(retriever=fake_store, persist_dir=str(tmp_path)).get_engine()
    assert isinstance(kept.key_store, DiskKeyStore)
    assert kept.key_store.path == tmp_path / "keys"
    chroma = ChatNest(collection="docs", persist_dir=str(tmp_path / "store")).get_engine()
    assert isinstance(chroma.retriever, ChromaPassageStore)
    assert chroma.retriever.collection_name == "docs"
    assert chroma.key_store.path == tmp_path / "store" / "keys"


def test_verbatim_citations_are_annotated_with_their_kind() -> None:
    """A lossless method's ``kind="verbatim"`` provenance is annotated like a copy, with its kind
    in ``extras``, and the shared tracker streams it once (LangChain and LlamaIndex alike)."""
    import dataclasses

    from nest_integrations import output
    from nest_integrations.integrations._common import citation_payload
    from nest_integrations.integrations.langchain.chat_models import citation_annotation

    result = fake_engine().generate(PROMPT, max_new_tokens=20)
    copy = result.citations[0]
    verbatim = dataclasses.replace(copy, kind="verbatim")
    note = citation_annotation(verbatim)
    assert note["extras"]["kind"] == "verbatim" and note["extras"]["copied"] is False
    assert {k: v for k, v in note.items() if k != "extras"} == {
        k: v for k, v in citation_annotation(copy).items() if k != "extras"
    }
    docs = citations_to_documents([citation_payload(verbatim)])
    assert docs[0].metadata["citation_kind"] == "verbatim"
    tracker = output.CitationStream("completed")
    assert tracker.step(verbatim) == [] and tracker.step(None) == [verbatim]
    assert tracker.finish(dataclasses.replace(result, citations=[verbatim])) == []
