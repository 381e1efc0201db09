"""``NestAttributor`` in LCEL after other chat models: langchain_core's fake chat models (a
stand-in for any hosted model) and ``ChatNest`` over the FakeLM engine. The core attributor is
real (sentence splitting, verbatim runs, MiniLM support scores); nothing else loads: fast."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from nest_integrations.integrations._common import citation_payload
from nest_integrations.integrations.langchain.chat_models import citation_annotation
from nest_integrations.langchain import ChatNest, NestAttributor
from tests.integrations.langchain.corpus import SOURCES, documents, fake_engine, memory_store

VERBATIM = (
    "The current structure, designed by James Douglass, is the fourth lighthouse to be built "
    "on the site."
)
PARAPHRASE = (
    "Green tea comes from Camellia sinensis leaves that are not withered or oxidised the way "
    "oolong and black teas are."
)
MADE_UP = "The lighthouse was painted purple by Queen Victoria in 1731."
ANSWER = f"{VERBATIM} {PARAPHRASE} {MADE_UP}"
QUESTION = "Tell me about the Eddystone Lighthouse and green tea."
PROMPT = ChatPromptTemplate.from_messages([("human", "{question}")])


def _annotations(msg: AIMessage) -> list[dict]:
    (block,) = [b for b in msg.content_blocks if b["type"] == "text"]
    return list(block.get("annotations", []))


def _span(text: str, sentence: str) -> tuple[int, int]:
    start = text.index(sentence)
    return start, start + len(sentence)


def check_exact(msg: AIMessage) -> None:
    """Every annotation: the cited text is the exact passage and source slice; a verbatim one
    is also the answer slice, a support one spans a whole answer sentence."""
    text = msg.text
    for a in _annotations(msg):
        x = a["extras"]
        source = SOURCES[x["doc_id"]]
        assert source[x["source_start_char"] : x["source_end_char"]] == a["cited_text"], a
        assert x["kind"] in ("copy", "verbatim", "support")
        if x["kind"] == "support":
            assert isinstance(x["score"], float)
            assert text[a["start_index"] : a["end_index"]] in ANSWER
        else:
            assert x.get("score") is None  # create_citation leaves None extras out
            assert text[a["start_index"] : a["end_index"]] == a["cited_text"]


def check_answer(msg: AIMessage) -> None:
    """The three sentences of ``ANSWER``: verbatim, supported, unsupported."""
    check_exact(msg)
    assert msg.text == ANSWER
    by_kind: dict[str, list[dict]] = {}
    for a in _annotations(msg):
        by_kind.setdefault(a["extras"]["kind"], []).append(a)
    verbatim = by_kind["verbatim"]
    assert any(a["cited_text"] in VERBATIM and len(a["cited_text"]) > 40 for a in verbatim)
    assert all(a["extras"]["doc_id"] == "eddystone" for a in verbatim)
    (support,) = by_kind["support"]
    assert (support["start_index"], support["end_index"]) == _span(ANSWER, PARAPHRASE)
    assert support["extras"]["doc_id"] == "green-tea"
    assert support["extras"]["passage_id"] == "green-tea-1"  # the Document id is kept
    assert support["title"] == "Green tea"
    (gap,) = msg.response_metadata["unsupported"]
    assert gap["text"] == MADE_UP
    assert (gap["start_index"], gap["end_index"]) == _span(ANSWER, MADE_UP)
    summary = msg.response_metadata["attribution"]
    assert summary["unsupported"] == 1 and summary["support"] == 1
    assert summary["citations"] == len(_annotations(msg))


def test_after_a_fake_chat_model_in_lcel() -> None:
    """prompt | fake chat model | NestAttributor: the other model's answer comes back cited."""
    model = GenericFakeChatModel(messages=iter([AIMessage(ANSWER, id="run-1")]))
    chain = PROMPT | model | NestAttributor(documents=documents())
    msg = chain.invoke({"question": QUESTION})
    assert isinstance(msg, AIMessage) and msg.id == "run-1"
    check_answer(msg)
    payloads = msg.additional_kwargs["citations"]
    assert payloads == msg.response_metadata["citations"]
    assert [p["cited_text"] for p in payloads] == [a["cited_text"] for a in _annotations(msg)]


def test_standard_rag_chain_dict() -> None:
    """The ``{"input", "context", "answer"}`` dict of create_retrieval_chain (and the
    ``question`` variant) is attributed against its context; the question goes to the core."""
    seen: list = []

    class Spy:
        def __init__(self) -> None:
            from nest_integrations.attribution import Attributor

            self.inner = Attributor()

        def __call__(self, text, passages=None, *, question=None):
            seen.append((question, [p.id for p in passages]))
            return self.inner(text, passages, question=question)

    retrieve = RunnableLambda(lambda q: documents())
    answer = PROMPT | FakeListChatModel(responses=[ANSWER]) | (lambda m: m.content)
    rag = RunnablePassthrough.assign(context=(lambda d: d["input"]) | retrieve).assign(
        answer=(lambda d: {"question": d["input"]}) | answer
    )
    cite = NestAttributor(attributor=Spy())
    out = (rag | cite).invoke({"input": QUESTION})
    check_answer(out)
    assert seen[-1] == (QUESTION, [d.id for d in documents()])
    both = cite.invoke({"question": "Q?", "answer": AIMessage(ANSWER), "context": documents()})
    assert seen[-1][0] == "Q?"
    assert both.text == ANSWER and _annotations(both) == _annotations(out)


def test_str_with_documents_and_message_fields_kept() -> None:
    """A str plus ``documents=`` works; an input message keeps its id, usage and metadata; the
    annotations are ``citation_annotation``s (kind and score in the extras)."""
    cite = NestAttributor()
    plain = cite.invoke(ANSWER, documents=documents())
    check_answer(plain)
    usage = {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}
    message = AIMessage(ANSWER, id="m-7", usage_metadata=usage,
                        response_metadata={"model_name": "hosted-x"})
    msg = cite.invoke(message, documents=documents())
    assert msg.id == "m-7" and msg.usage_metadata == usage
    assert msg.response_metadata["model_name"] == "hosted-x"
    assert _annotations(msg) == _annotations(plain)
    # the same Attribution through the converters gives exactly these annotations
    from nest_integrations.attribution import Attributor
    from nest_integrations.integrations.langchain.passages import as_passages

    a = Attributor()(ANSWER, as_passages(documents()))
    assert _annotations(msg) == [citation_annotation(c) for c in a.citations]
    assert msg.additional_kwargs["citations"] == [citation_payload(c) for c in a.citations]


def test_after_chat_nest_keeps_its_copies() -> None:
    """ChatNest | NestAttributor: the copy citations ChatNest made stay as they are, and no
    verbatim citation repeats a copied span."""
    chat = ChatNest(engine=fake_engine(), max_tokens=20)
    first = chat.invoke("The Eddystone Lighthouse stands")
    copies = _annotations(first)
    assert copies and all(a["extras"]["kind"] == "copy" for a in copies)
    chain = chat | NestAttributor(documents=documents())
    msg = chain.invoke("The Eddystone Lighthouse stands")
    assert msg.text == first.text
    notes = _annotations(msg)
    assert notes[: len(copies)] == copies
    for a in notes[len(copies):]:
        assert a["extras"]["kind"] in ("verbatim", "support")
        if a["extras"]["kind"] == "verbatim":
            assert all(a["end_index"] <= c["start_index"] or c["end_index"] <= a["start_index"]
                       for c in copies)
    nest, was = msg.response_metadata["nest"], first.response_metadata["nest"]  # kept
    assert (nest["new_tokens"], nest["copied_tokens"]) == (was["new_tokens"], was["copied_tokens"])
    assert msg.response_metadata["model_name"] == first.response_metadata["model_name"]
    assert msg.additional_kwargs["citations"][: len(copies)] == first.additional_kwargs["citations"]


def test_retriever_when_the_input_has_no_documents() -> None:
    """Without documents the passages come from ``retriever`` (a LangChain retriever here),
    with the store's Document ids and offsets."""
    retriever = memory_store().as_retriever(search_kwargs={"k": 6})
    msg = (PROMPT | FakeListChatModel(responses=[ANSWER]) | NestAttributor(
        retriever=retriever)).invoke({"question": QUESTION})
    check_answer(msg)
    ids = {d.id for d in documents()}
    assert {a["extras"]["passage_id"] for a in _annotations(msg)} <= ids


def test_stream_and_async_match_invoke() -> None:
    cite = NestAttributor(documents=documents())
    want = cite.invoke(ANSWER)
    chain = PROMPT | GenericFakeChatModel(messages=iter([AIMessage(ANSWER)])) | cite
    chunks = list(chain.stream({"question": QUESTION}))
    assert len(chunks) == 1 and _annotations(chunks[0]) == _annotations(want)
    got = asyncio.run(cite.ainvoke(ANSWER))
    assert _annotations(got) == _annotations(want)
    assert got.response_metadata["unsupported"] == want.response_metadata["unsupported"]


def test_bad_inputs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="no passages"):
        NestAttributor().invoke(ANSWER)
    with pytest.raises(ValueError, match="without an answer"):
        NestAttributor(documents=documents()).invoke({"context": documents()})
    with pytest.raises(TypeError, match="AIMessage, a string, or a dict"):
        NestAttributor(documents=documents()).invoke(42)
    with pytest.raises(TypeError, match="retriever must be"):
        NestAttributor(retriever=object()).invoke(ANSWER)
    # an empty context is no passages at all: every sentence is unsupported
    empty = NestAttributor().invoke({"answer": ANSWER, "context": []})
    assert not _annotations(empty)
    assert [u["text"] for u in empty.response_metadata["unsupported"]] == [
        VERBATIM, PARAPHRASE, MADE_UP]


def test_a_single_document_or_string_context() -> None:
    doc = Document(page_content=SOURCES["eddystone"], id="whole",
                   metadata={"doc_id": "eddystone", "char_start": 0,
                             "char_end": len(SOURCES["eddystone"])})
    msg = NestAttributor().invoke({"answer": VERBATIM, "context": doc})
    (a,) = _annotations(msg)
    assert a["cited_text"] == VERBATIM and a["extras"]["passage_id"] == "whole"
    start = SOURCES["eddystone"].index(VERBATIM)
    assert (a["extras"]["source_start_char"], a["extras"]["source_end_char"]) == (
        start, start + len(VERBATIM))
    text_only = NestAttributor().invoke({"answer": VERBATIM, "context": SOURCES["eddystone"]})
    (b,) = _annotations(text_only)
    assert b["extras"].get("source_start_char") is None  # a bare string: no source offsets
    assert b["extras"]["passage_start_char"] == start


@pytest.mark.slow
def test_after_chat_nest_with_the_real_model(default_lm) -> None:
    """The real SmolLM2 ChatNest | NestAttributor (retrieving from the same store, verbatim runs
    cut at the model's own tokens): ChatNest's copies stay, every added citation is exact, and
    every sentence of the answer gets a verdict."""
    from nest_integrations.attribution import Attributor
    from nest_integrations.integrations.langchain.passages import LangChainPassageRetriever
    from tests.integrations.langchain.corpus import GROUNDED

    store = memory_store()
    chat = ChatNest(retriever=store, max_tokens=32)
    core = Attributor(lm=default_lm, retriever=LangChainPassageRetriever(store))
    first = chat.invoke(GROUNDED)
    copies = _annotations(first)
    assert copies and first.response_metadata["nest"]["attributed_tokens"] > 0
    msg = (chat | NestAttributor(attributor=core)).invoke(GROUNDED)
    assert msg.text == first.text  # greedy: the same answer
    notes = _annotations(msg)
    assert notes[: len(copies)] == copies
    for a in notes:
        x = a["extras"]
        assert SOURCES[x["doc_id"]][x["source_start_char"] : x["source_end_char"]] == (
            a["cited_text"])
        if x["kind"] != "support":
            assert msg.text[a["start_index"] : a["end_index"]] == a["cited_text"]
    sentences = msg.response_metadata["sentences"]
    assert sentences and {s["verdict"] for s in sentences} <= {
        "verbatim", "support", "unsupported"}
    for s in sentences:
        assert msg.text[s["start_index"] : s["end_index"]] == s["text"]
    assert msg.response_metadata["model_name"] == first.response_metadata["model_name"]


def test_store_wiring(monkeypatch) -> None:
    """``collection=``/``persist_dir=`` build the core attributor through
    ``assembly.attributor_from_defaults`` (once, on first use); ``retriever=`` goes there as
    NEST's passage port; passages-only attributors open no store."""
    from nest_integrations import assembly
    from nest_integrations.attribution import Attributor, AttributionConfig
    from nest_integrations.integrations.langchain.passages import LangChainPassageRetriever
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    calls: list[tuple] = []

    def fake(collection=None, **kwargs):
        calls.append((collection, kwargs))
        return Attributor(kwargs["config"], retriever=InMemoryRetriever(
            [d.page_content for d in documents()]))

    monkeypatch.setattr(assembly, "attributor_from_defaults", fake)
    cfg = AttributionConfig(k=6)
    cite = NestAttributor(collection="docs", persist_dir="/tmp/x", config=cfg)
    assert not calls  # nothing built at construction
    cite.invoke(ANSWER)
    cite.invoke(ANSWER)
    assert calls == [("docs", {"persist_dir": "/tmp/x", "config": cfg, "retriever": None})]
    store = memory_store()
    NestAttributor(retriever=store, collection="ignored").invoke(ANSWER)
    collection, kwargs = calls[-1]
    assert collection is None and isinstance(kwargs["retriever"], LangChainPassageRetriever)
    assert kwargs["retriever"].source is store
    n = len(calls)
    NestAttributor(documents=documents()).invoke(ANSWER)  # no store: a plain Attributor
    assert len(calls) == n
