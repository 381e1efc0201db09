"""NestQueryEngine: Response/StreamingResponse whose source nodes are the cited spans."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.response.schema import Response, StreamingResponse
from llama_index.core.llms import MockLLM

from nest_integrations.llama_index import NestLLM, NestQueryEngine
from tests.integrations.llama_index.corpus import DOCS, GROUNDED, ROME_PASSAGE


def check_sources(response) -> None:
    """Every source node slices its document; metadata answer offsets slice the answer."""
    text = str(response.response) if isinstance(response, Response) else response.response_txt
    for n in response.source_nodes:
        node = n.node
        assert DOCS[node.ref_doc_id][node.start_char_idx : node.end_char_idx] == node.text
        m = node.metadata
        assert text[m["response_start_char"] : m["response_end_char"]] == node.text
        assert m["doc_id"] == node.ref_doc_id and m["title"] == node.ref_doc_id.title()
    cites = response.metadata["citations"]
    assert [c["cited_text"] for c in cites] == [n.node.text for n in response.source_nodes]


def test_from_args_validates():
    with pytest.raises(ValueError, match="not both"):
        NestQueryEngine.from_args(None, llm=NestLLM(), max_new_tokens=4)
    with pytest.raises(TypeError, match="NestLLM"):
        NestQueryEngine.from_args(None, llm=MockLLM())
    qe = NestQueryEngine.from_args(None, config="lossless", max_new_tokens=4)  # nothing loads
    assert qe.llm._engine is None and qe.llm.max_new_tokens == 4


def test_query_stream_and_async_agree(tiny_llm, index):
    """query, streaming query and aquery give the same answer and cited source nodes."""
    qe = NestQueryEngine.from_args(index, llm=tiny_llm, similarity_top_k=3)
    response = qe.query(GROUNDED)
    assert isinstance(response, Response) and response.response
    assert response.source_nodes  # the tiny model copies too
    check_sources(response)
    assert response.metadata["nest"]["new_tokens"] > 0
    assert len(response.metadata["passage_ids"]) == 3

    streaming = NestQueryEngine.from_args(index, llm=tiny_llm, streaming=True).query(GROUNDED)
    assert isinstance(streaming, StreamingResponse) and not streaming.source_nodes
    assert "".join(streaming.response_gen) == response.response
    streaming.response_txt = response.response
    check_sources(streaming)
    assert [n.node.node_id for n in streaming.source_nodes] == [
        n.node.node_id for n in response.source_nodes
    ]

    again = asyncio.run(qe.aquery(GROUNDED))
    assert again.response == response.response


@pytest.mark.slow
def test_grounded_query_cites_the_corpus(default_lm, index):
    """With the real model a grounded question is answered by copying, and cited exactly."""
    from tests.integrations.llama_index.corpus import make_llm

    qe = NestQueryEngine.from_args(index, llm=make_llm(default_lm, index, max_new_tokens=24))
    response = qe.query(GROUNDED)
    check_sources(response)
    rome = [n for n in response.source_nodes if n.node.ref_doc_id == "rome"]
    assert rome and sum(n.node.metadata["n_tokens"] for n in rome) >= 8, response.response
    assert all(n.node.text in ROME_PASSAGE for n in rome)
