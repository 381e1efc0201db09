"""``NestQueryEngine``: retrieve nodes, answer with NEST, return the copied spans as sources.

Unlike prompt-based ``CitationQueryEngine`` (which asks the LLM to write ``[N]`` markers and
lists every retrieved chunk), ``source_nodes`` here are exactly the corpus spans the answer
copied, with offsets into the source documents.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

from llama_index.core.base.response.schema import Response, StreamingResponse
from llama_index.core.bridge.pydantic import Field
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore

from nest_integrations.integrations._common import citation_payload
from nest_integrations.integrations.llama_index.llms import NestLLM
from nest_integrations.integrations.llama_index.retrievers import (
    LlamaIndexPassageRetriever,
    answer,
    as_passage_retriever,
    citation_nodes,
)
from nest_integrations.types import NestResult


class NestQueryEngine(CustomQueryEngine):
    """A query engine whose ``source_nodes`` are the spans NEST copied into the answer.

    Each query retrieves passages (LlamaIndex nodes -> NEST passages), sends the question as one
    user message to ``NestLLM`` with those passages as its token memory, and returns a
    ``Response``. Passages go into the prompt only when the config says so
    (``ra_passages``, e.g. the ``paper-ra`` preset).

    Instantiate / query:
        .. code-block:: python

            from llama_index.core import Settings, VectorStoreIndex
            from nest_integrations.llama_index import NestEmbedding, NestQueryEngine

            Settings.embed_model = NestEmbedding()
            index = VectorStoreIndex.from_documents(docs)
            engine = NestQueryEngine.from_args(index, config="paper", max_new_tokens=64)
            response = engine.query("What is a list in Python?")
            for n in response.source_nodes:       # cited spans, answer order
                doc = n.node.ref_doc_id           # source document id
                n.node.text == doc_text[n.node.start_char_idx:n.node.end_char_idx]
            response.metadata["citations"], response.metadata["nest"]

    No corpus: over an empty index (or a retriever that returns nothing) the answer comes from
    the model alone; ``response.metadata["nest"]["grounded"]`` is then False, with the reason
    in ``["grounded_reason"]``, and the first such answer warns once (``UngroundedWarning``).
    Parameter names are ``NestLLM``'s (docs/parameters.md).

    Stream: ``from_args(..., streaming=True)`` returns a ``StreamingResponse``; its
    ``source_nodes`` and ``metadata`` are filled when ``response_gen`` is exhausted.
    """

    llm: Any = Field(description="The NestLLM that answers.")
    source: Any = Field(default=None, description="PassageRetriever; None = the LLM's own.")
    streaming: bool = Field(default=False, description="Return a StreamingResponse.")

    @classmethod
    def from_args(
        cls,
        index_or_retriever: Any = None,
        llm: NestLLM | None = None,
        similarity_top_k: int | None = None,
        streaming: bool = False,
        **nest_kwargs: Any,
    ) -> "NestQueryEngine":
        """Build over a LlamaIndex index or retriever (or a ``PassageRetriever``).

        Args:
            index_or_retriever: the passage source; ``None`` uses ``llm``'s own retriever.
            llm: a ``NestLLM``; default ``NestLLM(retriever=index_or_retriever, **nest_kwargs)``.
            similarity_top_k: nodes per query from an index (default: the config's
                ``n_passages``).
            streaming: return ``StreamingResponse``s.
            **nest_kwargs: ``NestLLM`` fields (``model``, ``config``, ``max_new_tokens``,
                ``engine``, ...) when ``llm`` is not given.
        """
        if llm is not None and nest_kwargs:
            raise ValueError(
                f"pass NEST settings {sorted(nest_kwargs)} to NestLLM(...) or to from_args, "
                "not both"
            )
        if llm is not None and not isinstance(llm, NestLLM):
            raise TypeError(f"NestQueryEngine needs a NestLLM, got {type(llm).__name__}")
        source = None
        if index_or_retriever is not None:
            source = (
                index_or_retriever
                if isinstance(index_or_retriever, LlamaIndexPassageRetriever)
                else as_passage_retriever(index_or_retriever)
            )
            if isinstance(source, LlamaIndexPassageRetriever) and similarity_top_k:
                source.similarity_top_k = similarity_top_k
        llm = llm or NestLLM(retriever=source, **nest_kwargs)
        return cls(llm=llm, source=source, streaming=streaming)

    def custom_query(self, query_str: str) -> Response | StreamingResponse:
        if self.streaming:
            return self._stream(query_str)
        resp = answer(self.llm, query_str, self.source)
        result = resp.raw["nest_result"]
        return Response(
            response=result.text, source_nodes=citation_nodes(result),
            metadata=_metadata(result, resp.additional_kwargs["nest"]),
        )

    async def acustom_query(self, query_str: str) -> Response | StreamingResponse:
        return await asyncio.to_thread(self.custom_query, query_str)

    def _stream(self, query_str: str) -> StreamingResponse:
        nodes: list[NodeWithScore] = []
        metadata: dict[str, Any] = {}
        responses = answer(self.llm, query_str, self.source, stream=True)

        def deltas() -> Iterator[str]:
            for r in responses:
                if r.raw is not None:  # the last item carries the result
                    result = r.raw["nest_result"]
                    nodes.extend(citation_nodes(result))
                    metadata.update(_metadata(result, r.additional_kwargs["nest"]))
                if r.delta:
                    yield r.delta

        return StreamingResponse(response_gen=deltas(), source_nodes=nodes, metadata=metadata)


def _metadata(result: NestResult, nest: dict[str, Any]) -> dict[str, Any]:
    return {
        "citations": [citation_payload(c) for c in result.citations],
        "nest": nest,
        "passage_ids": [p.id for p in result.passages],
    }
