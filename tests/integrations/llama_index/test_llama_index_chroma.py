"""Chroma-backed indexes: LlamaIndex's ``ChromaVectorStore`` as NEST's passage source, both for
a LlamaIndex-built collection and for one ingested by ``ChromaPassageStore`` (``nest ingest``)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.vector_stores.chroma")

from llama_index.core import StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.vector_stores.chroma import ChromaVectorStore  # noqa: E402

from nest_integrations.embedders.minilm import NestEmbeddingFunction  # noqa: E402
from nest_integrations.llama_index import (  # noqa: E402
    LlamaIndexPassageRetriever,
    NestEmbedding,
    NestQueryEngine,
)
from tests.integrations.llama_index.corpus import (  # noqa: E402
    DOCS,
    GROUNDED,
    documents,
    make_llm,
    splitter,
)


def _client(path):
    import chromadb
    from chromadb.config import Settings

    return chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))


@pytest.fixture(scope="module")
def chroma_index(tmp_path_factory):
    """A VectorStoreIndex written to a persistent Chroma collection (our embedding function)."""
    client = _client(tmp_path_factory.mktemp("li-chroma"))
    col = client.get_or_create_collection("docs", embedding_function=NestEmbeddingFunction())
    store = ChromaVectorStore(chroma_collection=col)
    index = VectorStoreIndex.from_documents(
        documents(),
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=NestEmbedding(),
        transformations=[splitter()],
    )
    return client, store, index


def test_llama_index_collection_round_trip(chroma_index):
    """Node ids, doc ids, offsets and metadata survive Chroma into NEST passages."""
    client, _, index = chroma_index
    reopened = ChromaVectorStore(chroma_collection=client.get_collection("docs"))
    passages = LlamaIndexPassageRetriever.from_vector_store(reopened).retrieve("Roman Empire", 3)
    assert len(passages) == 3 and passages[0].doc_id == "rome"
    nodes = index.as_retriever(similarity_top_k=3).retrieve("Roman Empire")
    assert [p.id for p in passages] == [n.node.node_id for n in nodes]
    for p in passages:
        assert DOCS[p.doc_id][p.char_start : p.char_end] == p.text
        assert p.metadata["source"] == f"{p.doc_id}.txt"


def test_query_engine_over_chroma(tiny_lm, chroma_index):
    """NestQueryEngine over the Chroma-backed index cites spans of the source documents."""
    _, _, index = chroma_index
    response = NestQueryEngine.from_args(index, llm=make_llm(tiny_lm, index)).query(GROUNDED)
    assert response.source_nodes
    for n in response.source_nodes:
        node = n.node
        assert DOCS[node.ref_doc_id][node.start_char_idx : node.end_char_idx] == node.text


def test_nest_ingested_collection_through_llama_index(tmp_path):
    """A collection written by our ingest pipeline reads back through ChromaVectorStore with our
    passage ids, doc ids and offsets unchanged."""
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    ours = ChromaPassageStore.from_client(_client(tmp_path), collection="nest")
    IngestPipeline(ours, with_keys=False).ingest(
        texts=list(DOCS.values()), ids=list(DOCS), metadatas=[{"title": d} for d in DOCS]
    )
    expected = ours.retrieve("the Roman Empire", k=2)
    store = ChromaVectorStore(chroma_collection=ours.client.get_collection("nest"))
    got = LlamaIndexPassageRetriever.from_vector_store(store).retrieve("the Roman Empire", k=2)
    assert [(p.id, p.doc_id, p.char_start, p.char_end, p.text) for p in got] == [
        (p.id, p.doc_id, p.char_start, p.char_end, p.text) for p in expected
    ]
    assert got[0].metadata["title"] == expected[0].metadata["title"]
