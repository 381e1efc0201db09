"""Attribute ANY LlamaIndex answer: ``attribute_response`` and ``NestAttributionQueryEngine``.

Whatever LLM wrote the answer (OpenAI, a local ``HuggingFaceLLM``, ``MockLLM`` in tests), the
answer is checked against the nodes it was given: ``nest_integrations.attribution`` splits it
into sentences and returns exact ``"verbatim"`` spans, ``"support"`` passage sentences with a
score, and the sentences nothing supports. These come back in LlamaIndex's native slots:

- ``Response``: ``source_nodes`` = the cited spans (``TextNode.start_char_idx``/``end_char_idx``
  index the source document; ``span_nodes``), ``metadata["citations"]`` (payloads),
  ``metadata["citation_blocks"]`` (``CitationBlock``s), ``metadata["unsupported"]``,
  ``metadata["sentences"]`` (each sentence's verdict), ``metadata["attribution"]`` (counts)
  and ``metadata["retrieved_nodes"]`` (the nodes the answer was given);
- ``ChatResponse``: ``CitationBlock``s after the message's text, the same payloads in
  ``additional_kwargs``;
- ``CompletionResponse``: the payloads in ``additional_kwargs``.

Convert in (nodes -> ``Passage``s with ids and offsets, ``retrievers.node_to_passage``), call the
core ``Attributor``, convert out (``llms.citation_block``, ``_common.citation_payload``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
    TextBlock,
)
from llama_index.core.base.response.schema import Response, StreamingResponse
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.query_engine import CustomQueryEngine

from nest_integrations.integrations._common import (
    LazyAttributor,
    attribution_summary,
    citation_payload,
    no_passages_error,
    sentences_payload,
    unsupported_payload,
)
from nest_integrations.integrations.llama_index.llms import citation_block
from nest_integrations.integrations.llama_index.retrievers import (
    as_passage_retriever,
    span_nodes,
    to_passages,
)

LOG = logging.getLogger(__name__)

__all__ = ["NestAttributionQueryEngine", "attribute_response"]


def attribute_response(
    response: Any,
    passages: Sequence[Any] | None = None,
    *,
    question: str | None = None,
    attributor: Any = None,
    retriever: Any = None,
    collection: str | None = None,
    persist_dir: str | None = None,
    config: Any = None,
) -> Any:
    """``response`` with its answer attributed (see the module docstring for the slots).

    Args:
        response: a ``Response`` or ``StreamingResponse`` of any query engine (it is read to
            the end), a ``ChatResponse``, a ``CompletionResponse``, a ``ChatMessage`` or a str.
        passages: what to attribute against (LlamaIndex nodes or NEST ``Passage``s); default:
            the response's ``source_nodes``, else ``retriever``'s nodes for ``question`` (else
            for the answer), else the ``collection`` store.
        question: the question the answer replies to (retrieval, and the core's scorer).
        attributor: a ready core ``Attributor`` (else built from ``collection``/
            ``persist_dir``/``config`` with the embedded model and embedder).
        retriever: a LlamaIndex retriever or index, or a NEST ``PassageRetriever`` (asked for
            the config's ``k`` nodes).
        config: an ``AttributionConfig``; None = the core's defaults.

    Returns: the same kind of object (a str or ``ChatMessage`` gives a ``ChatResponse``).
    """
    holder = _holder(attributor, retriever, collection, persist_dir, config)
    return _attribute(response, passages, question, holder)


def _holder(
    attributor: Any, retriever: Any, collection: str | None, persist_dir: str | None, config: Any
) -> LazyAttributor:
    source = as_passage_retriever(retriever) if retriever is not None else None
    return LazyAttributor(attributor, retriever=source, collection=collection,
                          persist_dir=persist_dir, config=config)


def _attribute(response: Any, passages: Any, question: str | None, holder: LazyAttributor) -> Any:
    if isinstance(response, StreamingResponse):
        response = response.get_response()
    text = _text(response)
    if passages is None and isinstance(response, Response) and response.source_nodes:
        passages = response.source_nodes
    found = to_passages(list(passages)) if passages is not None else None
    if found is None and not holder.retrieves:
        raise no_passages_error("attribute_response")
    attribution = holder.get()(text, found, question=question)
    LOG.debug("attributed %d chars: %d citations, %d unsupported", len(text),
              len(attribution.citations), len(attribution.unsupported))
    return _convert_out(response, attribution)


def _text(response: Any) -> str:
    if isinstance(response, str):
        return response
    if isinstance(response, Response):
        return response.response or ""
    if isinstance(response, ChatResponse):
        return response.message.content or ""
    if isinstance(response, ChatMessage):
        return response.content or ""
    if isinstance(response, CompletionResponse):
        return response.text
    raise TypeError(
        "attribute_response takes a Response, StreamingResponse, ChatResponse, "
        f"CompletionResponse, ChatMessage or str, got {type(response).__name__}"
    )


def _extras(attribution: Any) -> dict[str, Any]:
    return {
        "citations": [citation_payload(c) for c in attribution.citations],
        "unsupported": unsupported_payload(attribution),
        "sentences": sentences_payload(attribution),
        "attribution": attribution_summary(attribution, attribution.citations),
    }


def _convert_out(response: Any, attribution: Any) -> Any:
    extras = _extras(attribution)
    blocks = [citation_block(c) for c in attribution.citations]
    if isinstance(response, Response):
        metadata = {**(response.metadata or {}), **extras, "citation_blocks": blocks,
                    "retrieved_nodes": list(response.source_nodes)}
        return Response(response=attribution.text,
                        source_nodes=span_nodes(attribution.citations, attribution.passages),
                        metadata=metadata)
    if isinstance(response, CompletionResponse):
        return response.model_copy(
            update={"additional_kwargs": {**response.additional_kwargs, **extras}}
        )
    old = response.message if isinstance(response, ChatResponse) else response
    role = old.role if isinstance(old, ChatMessage) else MessageRole.ASSISTANT
    kwargs = old.additional_kwargs if isinstance(old, ChatMessage) else {}
    message = ChatMessage(role=role, blocks=[TextBlock(text=attribution.text), *blocks],
                          additional_kwargs={**kwargs, **extras})
    if isinstance(response, ChatResponse):
        return response.model_copy(update={
            "message": message, "additional_kwargs": {**response.additional_kwargs, **extras}
        })
    return ChatResponse(message=message, additional_kwargs=extras)


class NestAttributionQueryEngine(CustomQueryEngine):
    """Wrap any query engine: its answers come back attributed to the nodes it retrieved.

    The inner engine (``index.as_query_engine(llm=any_llm)``, a ``RetrieverQueryEngine``, a
    ``CitationQueryEngine``, ...) answers as usual; the answer is then attributed against that
    response's ``source_nodes`` (or ``retriever``'s nodes when the inner engine returns none),
    and the ``Response`` is ``attribute_response``'s: ``source_nodes`` are the cited spans at
    exact source offsets, ``metadata["unsupported"]`` the sentences nothing supports.

    Instantiate / query:
        .. code-block:: python

            from nest_integrations.llama_index import NestAttributionQueryEngine

            engine = NestAttributionQueryEngine.from_args(index.as_query_engine(llm=llm))
            response = engine.query("Where is the Eddystone Lighthouse?")
            for n in response.source_nodes:          # verbatim spans and support sentences
                n.node.metadata["kind"], n.score, n.node.start_char_idx, n.node.end_char_idx
            response.metadata["unsupported"]         # [{"text", "start_index", ...}]

    A streaming inner engine is read to the end first (attribution needs the whole answer).
    """

    query_engine: Any = Field(description="The query engine whose answers are attributed.")
    attributor: Any = Field(default=None, description="A ready core Attributor.")
    retriever: Any = Field(default=None, description="Fallback node source (no source nodes).")
    collection: str | None = Field(default=None, description="Chroma collection (fallback).")
    persist_dir: str | None = Field(default=None, description="Store folder of collection.")
    config: Any = Field(default=None, description="AttributionConfig; None = the defaults.")
    _parts: Any = PrivateAttr(default=None)

    @classmethod
    def from_args(cls, query_engine: Any, **kwargs: Any) -> "NestAttributionQueryEngine":
        """Over ``query_engine`` (anything with ``query``); ``kwargs`` are the fields."""
        if not callable(getattr(query_engine, "query", None)):
            raise TypeError(f"expected a query engine, got {type(query_engine).__name__}")
        return cls(query_engine=query_engine, **kwargs)

    def _core(self) -> LazyAttributor:
        if self._parts is None:
            self._parts = _holder(self.attributor, self.retriever, self.collection,
                                  self.persist_dir, self.config)
        return self._parts

    def custom_query(self, query_str: str) -> Response:
        response = self.query_engine.query(query_str)
        return _attribute(response, None, query_str, self._core())

    async def acustom_query(self, query_str: str) -> Response:
        return await asyncio.to_thread(self.custom_query, query_str)
