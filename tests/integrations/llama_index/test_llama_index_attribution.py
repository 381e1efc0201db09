"""``attribute_response`` and ``NestAttributionQueryEngine``: answers of LLMs other than NEST
(llama_index's ``MockLLM``, a canned "hosted" LLM) attributed to a real ``VectorStoreIndex``
over the corpus with our MiniLM embedder. The core attributor is real; no LM loads: fast."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.base.response.schema import Response
from llama_index.core.llms import MockLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from nest_integrations.integrations.llama_index.llms import LOCATION_KEYS
from nest_integrations.llama_index import NestAttributionQueryEngine, attribute_response
from tests.integrations.llama_index.corpus import DOCS, ROME_PASSAGE

VERBATIM = "A Python list is a mutable sequence type."
PARAPHRASE = (
    "Plants and some other organisms use photosynthesis to turn light energy into chemical "
    "energy for their later activities."
)
MADE_UP = "The Roman Empire was founded on the Moon in 1999 by Napoleon."
ANSWER = f"{VERBATIM} {PARAPHRASE} {MADE_UP}"


class CannedLLM(CustomLLM):
    """A stand-in for a hosted LLM: always answers ``answer``."""

    answer: str = ANSWER

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="canned")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.answer)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        def gen() -> CompletionResponseGen:
            text = ""
            for word in self.answer.split(" "):
                delta = word if not text else " " + word
                text += delta
                yield CompletionResponse(text=text, delta=delta)

        return gen()


def check_nodes(response: Response, sentences: tuple[str, ...] | None = None) -> None:
    """Each source node is the exact source slice at its offsets; verbatim nodes are also the
    answer slice, support nodes span a whole answer sentence (one of ``sentences``)."""
    text = response.response
    sentences = sentences or (VERBATIM, PARAPHRASE, MADE_UP)
    for n in response.source_nodes:
        node, m = n.node, n.node.metadata
        assert DOCS[node.ref_doc_id][node.start_char_idx : node.end_char_idx] == node.text
        answer_span = text[m["response_start_char"] : m["response_end_char"]]
        if m["kind"] == "support":
            assert n.score == m["score"] and isinstance(n.score, float)
            assert answer_span in sentences
        else:
            assert answer_span == node.text
    cites = response.metadata["citations"]
    assert [c["cited_text"] for c in cites] == [n.node.text for n in response.source_nodes]
    blocks = response.metadata["citation_blocks"]
    assert [b.cited_content.text for b in blocks] == [c["cited_text"] for c in cites]
    for b, c in zip(blocks, cites):
        loc = b.additional_location_info
        assert (loc["response_start_char"], loc["response_end_char"]) == (
            c["start_index"], c["end_index"])
        assert set(loc) <= set(LOCATION_KEYS.values()) | {"copied", "support", "score_permille"}
        if c["extras"]["kind"] == "support":
            assert loc["support"] == 1
            assert loc["score_permille"] == round(1000 * c["extras"]["score"])
        else:
            assert "support" not in loc


def check_answer(response: Response) -> None:
    check_nodes(response, (VERBATIM, PARAPHRASE, MADE_UP))
    assert response.response == ANSWER
    kinds = [n.node.metadata["kind"] for n in response.source_nodes]
    verbatim = [n for n in response.source_nodes if n.node.metadata["kind"] == "verbatim"]
    assert any(n.node.text == VERBATIM for n in verbatim), kinds
    (support,) = [n for n in response.source_nodes if n.node.metadata["kind"] == "support"]
    assert support.node.ref_doc_id == "bio"
    m = support.node.metadata
    start = ANSWER.index(PARAPHRASE)
    assert (m["response_start_char"], m["response_end_char"]) == (start, start + len(PARAPHRASE))
    (gap,) = response.metadata["unsupported"]
    assert gap["text"] == MADE_UP and ANSWER[gap["start_index"] : gap["end_index"]] == MADE_UP
    assert response.metadata["attribution"]["unsupported"] == 1


def test_query_engine_wraps_any_llm(index) -> None:
    """Any LLM's query engine, wrapped: source nodes become the cited spans; the retrieved
    nodes stay in metadata."""
    n_nodes = len(index.docstore.docs)
    inner = index.as_query_engine(llm=CannedLLM(), similarity_top_k=n_nodes)
    engine = NestAttributionQueryEngine.from_args(inner)
    response = engine.query("What is a Python list, and what is photosynthesis?")
    check_answer(response)
    retrieved = response.metadata["retrieved_nodes"]
    assert len(retrieved) == n_nodes
    ids = {n.node.node_id for n in retrieved}
    assert {n.node.metadata["passage_id"] for n in response.source_nodes} <= ids
    again = asyncio.run(engine.aquery("What is a Python list, and what is photosynthesis?"))
    assert [n.node.text for n in again.source_nodes] == [n.node.text for n in response.source_nodes]


def test_streaming_inner_engine_is_read_to_the_end(index) -> None:
    inner = index.as_query_engine(llm=CannedLLM(), similarity_top_k=6, streaming=True)
    response = NestAttributionQueryEngine.from_args(inner).query("What is a list?")
    assert isinstance(response, Response)
    check_answer(response)


def test_mock_llm_echo_is_verbatim_with_exact_offsets(index) -> None:
    """MockLLM echoes its prompt, which holds the retrieved text: that text is cited verbatim
    at its exact source offsets; the prompt's own words are unsupported."""
    inner = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    response = NestAttributionQueryEngine.from_args(inner).query(
        "What was the Roman Empire?")
    units = response.metadata["sentences"] if "sentences" in response.metadata else None
    check_nodes(response, tuple(u["text"] for u in units) if units else (response.response,))
    verbatim = [n.node.text for n in response.source_nodes if n.node.metadata["kind"] == "verbatim"]
    assert any(ROME_PASSAGE.startswith(t) or t in ROME_PASSAGE for t in verbatim), verbatim
    assert any(len(t) > 60 for t in verbatim)
    assert response.metadata["unsupported"]  # "Context information is below." and the like


def test_attribute_response_of_chat_and_completion(index) -> None:
    """A ChatResponse gains CitationBlocks after its text; a CompletionResponse the payloads."""
    nodes = index.as_retriever(similarity_top_k=6).retrieve("lists and photosynthesis")
    llm = CannedLLM()
    chat = attribute_response(llm.chat([ChatMessage(role="user", content="hi")]), nodes)
    blocks = chat.message.blocks
    assert blocks[0].block_type == "text" and blocks[0].text == ANSWER
    cites = [b for b in blocks[1:] if b.block_type == "citation"]
    assert cites and len(cites) == len(chat.additional_kwargs["citations"])
    assert chat.message.additional_kwargs["unsupported"] == chat.additional_kwargs["unsupported"]
    assert [u["text"] for u in chat.additional_kwargs["unsupported"]] == [MADE_UP]
    done = attribute_response(llm.complete("hi"), nodes)
    assert done.text == ANSWER
    assert done.additional_kwargs["citations"] == chat.additional_kwargs["citations"]
    plain = attribute_response(ANSWER, nodes)
    assert [b.cited_content.text for b in plain.message.blocks[1:]] == [
        b.cited_content.text for b in cites]
    resp = attribute_response(Response(response=ANSWER, source_nodes=nodes))
    check_answer(resp)


def test_retriever_fallback_and_errors(index) -> None:
    resp = attribute_response(Response(response=ANSWER),
                              retriever=index.as_retriever(similarity_top_k=6))
    check_answer(resp)
    with pytest.raises(ValueError, match="no passages"):
        attribute_response(Response(response=ANSWER))
    with pytest.raises(TypeError, match="Response, StreamingResponse"):
        attribute_response(42, [])
    with pytest.raises(TypeError, match="query engine"):
        NestAttributionQueryEngine.from_args(object())


def test_collection_wiring(monkeypatch, index) -> None:
    """With no source nodes, ``collection=`` attributes through the store's attributor
    (``assembly.attributor_from_defaults``, built once)."""
    from nest_integrations import assembly
    from nest_integrations.attribution import AttributionConfig, Attributor
    from nest_integrations.llama_index import LlamaIndexPassageRetriever

    calls: list = []

    def fake(collection=None, **kwargs):  # every node of the index: the store's stand-in
        calls.append(collection)
        return Attributor(AttributionConfig(k=10), retriever=LlamaIndexPassageRetriever(index))

    monkeypatch.setattr(assembly, "attributor_from_defaults", fake)

    class NoSources:
        def query(self, q):
            return Response(response=ANSWER)

    engine = NestAttributionQueryEngine.from_args(NoSources(), collection="nest")
    check_answer(engine.query("q"))
    check_answer(engine.query("q"))
    assert calls == ["nest"]
