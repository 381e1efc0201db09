"""NEST over a Chroma-backed LlamaIndex index: build it once, reopen it, query with citations.

The index lives in a persistent Chroma collection (``ChromaVectorStore``). The collection is
created with NEST's registered embedding function and LlamaIndex embeds with ``NestEmbedding``
(the same offline MiniLM), so Chroma's downloading default never runs. Node ids, metadata
(title, url) and character offsets survive the round trip into NEST's citations.

Run:  python cookbook/llama_index_chroma.py [persist_dir]      (about 40 s on CPU)
"""

from __future__ import annotations

import json
import sys
import tempfile

import chromadb
from chromadb.config import Settings as ChromaSettings
from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.vector_stores.chroma import ChromaVectorStore

from nest_integrations.embedders.minilm import NestEmbeddingFunction
from nest_integrations.ingest import sample_corpus_path
from nest_integrations.llama_index import NestEmbedding, NestQueryEngine

Settings.embed_model = NestEmbedding()  # never the OpenAI defaults
Settings.llm = MockLLM()

ARTICLES = ("Chichen Itza", "Cauliflower", "Pizza", "Denver", "Igloo")
QUESTION = "What is Chichen Itza?"


def load_articles() -> list[Document]:
    """A few articles of the sample Wikipedia corpus as LlamaIndex Documents."""
    docs = []
    with open(sample_corpus_path() / "wikipedia.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["id"] in ARTICLES:
                meta = {k: row["metadata"][k] for k in ("title", "url")}
                docs.append(Document(text=row["text"], id_=row["id"], metadata=meta))
    return docs


def open_collection(persist_dir: str) -> ChromaVectorStore:
    settings = ChromaSettings(anonymized_telemetry=False)
    client = chromadb.PersistentClient(persist_dir, settings=settings)
    collection = client.get_or_create_collection(
        "wiki", embedding_function=NestEmbeddingFunction()
    )
    return ChromaVectorStore(chroma_collection=collection)


def main(persist_dir: str) -> None:
    # 1. Build: documents -> nodes -> embeddings -> Chroma (skipped when already there).
    store = open_collection(persist_dir)
    docs = load_articles()
    if store.client.count() == 0:  # store.client is the Chroma collection
        VectorStoreIndex.from_documents(
            docs,
            storage_context=StorageContext.from_defaults(vector_store=store),
            transformations=[SentenceSplitter(chunk_size=128, chunk_overlap=0)],
        )

    # 2. Reopen (as a later session would) and query with NEST.
    index = VectorStoreIndex.from_vector_store(open_collection(persist_dir))
    # "paper-ra" (RA-NEST) also puts the top passages in the prompt, which keeps a 135M model
    # on topic; "paper" relies on the token memory alone.
    engine = NestQueryEngine.from_args(
        index, similarity_top_k=3, config="paper-ra", max_new_tokens=48
    )
    response = engine.query(QUESTION)

    print(f"Q: {QUESTION}\nA: {response.response.strip()}\n")
    texts = {d.doc_id: d.text for d in docs}
    for n in response.source_nodes:
        node = n.node
        start, end = node.start_char_idx, node.end_char_idx
        assert texts[node.ref_doc_id][start:end] == node.text  # offsets into the article
        print(f"- {node.metadata['title']} [{start}:{end}] {node.metadata['url']}")
        print(f"    {node.text.strip()!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
