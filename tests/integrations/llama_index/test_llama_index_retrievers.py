"""Nodes -> passages (ids, doc ids, offsets, metadata), citations -> nodes (source offsets),
the PassageRetriever adapter over an index or a retriever, and NestCitationRetriever."""

from __future__ import annotations

import pytest
from llama_index.core.schema import NodeRelationship, NodeWithScore, RelatedNodeInfo, TextNode

from nest_integrations.llama_index import (
    LlamaIndexPassageRetriever,
    NestCitationRetriever,
    citation_nodes,
    node_to_passage,
)
from nest_integrations.retrieval.base import PassageRetriever
from nest_integrations.types import Citation, NestResult, NestStats, Passage
from tests.integrations.llama_index.corpus import DOCS, GROUNDED, ROME_PASSAGE


def _node(text: str, start: int | None, end: int | None, **meta) -> TextNode:
    return TextNode(
        id_="n1", text=text, start_char_idx=start, end_char_idx=end, metadata=meta,
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-1")},
    )


def test_node_to_passage_keeps_ids_offsets_and_metadata():
    """node_id -> passage id, ref_doc_id -> doc id, exact char offsets kept, score kept."""
    p = node_to_passage(NodeWithScore(node=_node("abc", 10, 13, title="T"), score=0.5))
    assert (p.id, p.doc_id, p.char_start, p.char_end, p.score) == ("n1", "doc-1", 10, 13, 0.5)
    assert p.metadata["title"] == "T"
    # offsets that do not span the text are dropped; explicit passage/doc ids win
    q = node_to_passage(_node("abc", 10, 20, passage_id="p9", doc_id="d9"))
    assert (q.id, q.doc_id, q.char_start, q.char_end, q.score) == ("p9", "d9", None, None, None)


def test_passage_retriever_over_index_and_retriever(index):
    """Both an index and a retriever give k passages that are exact slices of their documents."""
    by_index = LlamaIndexPassageRetriever(index)
    assert isinstance(by_index, PassageRetriever)
    passages = by_index.retrieve("the Roman Empire", k=2)
    assert len(passages) == 2 and passages[0].doc_id == "rome"
    assert any(p.char_start for p in passages)  # a second paragraph: non-zero offset
    for p in passages:
        assert DOCS[p.doc_id][p.char_start : p.char_end] == p.text
        assert p.metadata["title"] == p.doc_id.title() and p.score is not None
    node_ids = {n.node.node_id for n in index.as_retriever(similarity_top_k=5).retrieve("Rome")}
    assert {p.id for p in passages} <= node_ids
    by_retriever = LlamaIndexPassageRetriever(index.as_retriever(similarity_top_k=3))
    assert [p.id for p in by_retriever.retrieve("the Roman Empire", k=2)] == [
        p.id for p in passages
    ]
    with pytest.raises(TypeError, match="LlamaIndex"):
        LlamaIndexPassageRetriever(object())


def test_citation_nodes_point_into_the_source():
    """A citation becomes a node: cited text, source offsets, doc relationship, metadata."""
    passage = Passage("p1", ROME_PASSAGE, "rome", 0.7, 151, 151 + len(ROME_PASSAGE), {"title": "R"})
    span = ROME_PASSAGE[63:88]
    cite = Citation(
        text=span, start=5, end=5 + len(span), passage_id="p1", doc_id="rome",
        passage_start=63, passage_end=88, source_start=151 + 63, source_end=151 + 88,
        n_tokens=4, metadata=dict(passage.metadata),
    )
    result = NestResult("hello" + span, [1, 2, 3, 4, 5], [cite], NestStats(), [passage])
    (nws,) = citation_nodes(result)
    node = nws.node
    assert node.text == span and nws.score == 0.7
    assert DOCS["rome"][node.start_char_idx : node.end_char_idx] == span
    assert node.ref_doc_id == "rome" and node.node_id == "p1:63-88"
    assert node.metadata["title"] == "R" and node.metadata["passage_id"] == "p1"
    m = node.metadata
    assert result.text[m["response_start_char"] : m["response_end_char"]] == span
    assert ROME_PASSAGE[m["passage_start_char"] : m["passage_end_char"]] == span
    assert "passage_id" not in node.get_content(metadata_mode="llm")


def test_citation_retriever_returns_cited_spans(tiny_llm, index):
    """Nodes are exactly the copied spans, each a slice of its source document."""
    retriever = NestCitationRetriever(tiny_llm, index, max_new_tokens=8)
    nodes = retriever.retrieve(GROUNDED)
    assert nodes
    for n in nodes:
        assert DOCS[n.node.ref_doc_id][n.node.start_char_idx : n.node.end_char_idx] == n.node.text
    # with no source, the LLM's own retriever (the same index here) supplies the passages
    own = NestCitationRetriever(tiny_llm, max_new_tokens=8).retrieve(GROUNDED)
    assert [n.node.node_id for n in own] == [n.node.node_id for n in nodes]
