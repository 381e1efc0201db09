"""Cite ANOTHER LLM's answer in LlamaIndex: wrap any query engine in
``NestAttributionQueryEngine``; its ``source_nodes`` become the cited spans, at exact offsets
into the source documents, and ``metadata["unsupported"]`` lists what nothing supports.

The LLM is a stand-in for a hosted one (``OpenAI``, ``Anthropic``, a vLLM server...: nothing
leaves this machine): a ``CustomLLM`` with a canned answer that copies one sentence,
paraphrases another and makes one up. The corpus is three Wikipedia leads shipped with the
package, embedded with NEST's offline MiniLM.

Run:  python cookbook/llama_index_attribute_any_llm.py     (about 30 s on CPU; nothing downloaded)
"""

from __future__ import annotations

import json
from typing import Any

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.node_parser import SentenceSplitter

from nest_integrations.ingest import sample_corpus_path
from nest_integrations.llama_index import NestAttributionQueryEngine, NestEmbedding

Settings.embed_model = NestEmbedding()  # LlamaIndex defaults to OpenAI: stay offline

TITLES = ("Harry Potter", "Futurism", "Belly dance")
QUESTION = "What are the Harry Potter novels about?"
#: What "the hosted model" answers.
ANSWER = (
    "Harry Potter is a series of seven children's fantasy novels written by British author "
    "J. K. Rowling. The books follow a young wizard and his friends Ron Weasley and Hermione "
    "Granger, who study at Hogwarts School of Witchcraft and Wizardry. The first novel was "
    "published in Paris in 1975."
)


class HostedStandIn(CustomLLM):
    """Answers ``ANSWER`` to every prompt (replace with your LLM)."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="hosted-stand-in")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=ANSWER)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield CompletionResponse(text=ANSWER, delta=ANSWER)


def main() -> None:
    rows = [json.loads(line) for line in
            (sample_corpus_path() / "wikipedia.jsonl").read_text().splitlines()]
    docs = [Document(text=r["text"], id_=r["id"], metadata={"url": r["metadata"]["url"]})
            for r in rows if r["id"] in TITLES]
    texts = {d.doc_id: d.text for d in docs}
    index = VectorStoreIndex.from_documents(
        docs, transformations=[SentenceSplitter(chunk_size=96, chunk_overlap=0)]
    )

    inner = index.as_query_engine(llm=HostedStandIn(), similarity_top_k=3)  # any query engine
    engine = NestAttributionQueryEngine.from_args(inner)
    response = engine.query(QUESTION)

    print(f"Q: {QUESTION}\nA: {response.response}\n")
    print(f"{len(response.source_nodes)} cited span(s):")
    for n in response.source_nodes:
        node, m = n.node, n.node.metadata
        exact = texts[node.ref_doc_id][node.start_char_idx:node.end_char_idx] == node.text
        score = f" score {n.score:.2f}" if m["kind"] == "support" else ""
        print(f"- {m['kind']}{score}: answer[{m['response_start_char']}:"
              f"{m['response_end_char']}] <- {node.ref_doc_id} "
              f"[{node.start_char_idx}:{node.end_char_idx}] (exact: {exact}): {node.text!r}")
    print("\nUnsupported:")
    for u in response.metadata["unsupported"]:
        print(f"- answer[{u['start_index']}:{u['end_index']}]: {u['text']!r}")


if __name__ == "__main__":
    main()
