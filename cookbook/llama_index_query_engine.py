"""NestQueryEngine over a LlamaIndex VectorStoreIndex: the answer, then the spans it copied.

NEST decodes while it retrieves: it copies spans of the retrieved passages into the answer and
cites each one. ``NestQueryEngine`` returns those cited spans as ``response.source_nodes``, each
with ``start_char_idx``/``end_char_idx`` into its source document (only text the answer actually
used; not every retrieved chunk). The corpus is three pages of the Python reference shipped with
the package, embedded with NEST's offline MiniLM, so nothing is downloaded.

Run:  python cookbook/llama_index_query_engine.py ["your question"]     (about 30 s on CPU)
"""

from __future__ import annotations

import sys

from llama_index.core import Settings, SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter

from nest_integrations.ingest import sample_corpus_path
from nest_integrations.llama_index import NestEmbedding, NestQueryEngine

# LlamaIndex defaults to OpenAI: use NEST's offline embedder, and no default LLM at all
# (NestQueryEngine brings its own).
Settings.embed_model = NestEmbedding()
Settings.llm = MockLLM()

QUESTION = "What does a dictionary display yield?"


def main(question: str) -> None:
    pages = sample_corpus_path() / "pydoc"
    docs = SimpleDirectoryReader(
        input_files=[pages / f for f in ("break.txt", "assert.txt", "dict.txt")],
        filename_as_id=True,
    ).load_data()
    texts = {d.doc_id: d.text for d in docs}
    index = VectorStoreIndex.from_documents(
        docs, transformations=[SentenceSplitter(chunk_size=128, chunk_overlap=0)]
    )

    engine = NestQueryEngine.from_args(index, similarity_top_k=4, config="paper", max_new_tokens=48)
    response = engine.query(question)

    print(f"Q: {question}\nA: {response.response.strip()}\n")
    stats = response.metadata["nest"]
    print(
        f"{len(response.source_nodes)} cited span(s); "
        f"{stats['attribution_ratio']:.0%} of {stats['new_tokens']} tokens attributed"
    )
    for n in response.source_nodes:
        node = n.node
        start, end = node.start_char_idx, node.end_char_idx
        assert texts[node.ref_doc_id][start:end] == node.text  # exact source offsets
        print(f"- {node.metadata['file_name']} [{start}:{end}] {node.text.strip()!r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else QUESTION)
