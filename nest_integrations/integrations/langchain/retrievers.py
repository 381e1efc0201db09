"""LangChain <-> NEST retrieval: LangChain stores as NEST passage sources, citations as Documents.

- ``LangChainPassageRetriever`` (defined in ``passages``): NEST's ``PassageRetriever`` port over
  any LangChain ``BaseRetriever`` or ``VectorStore`` (Chroma, InMemoryVectorStore, FAISS, ...).
- ``citations_to_documents``: NEST citations as ``Document`` objects (one per cited span).
- ``NestCitationRetriever``: a ``BaseRetriever`` that answers the query with NEST and returns
  the spans the answer copied, for chains and agents.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.retrievers import BaseRetriever
from pydantic import Field

from nest_integrations.integrations._common import citation_payload
from nest_integrations.integrations.langchain.chat_models import ChatNest
from nest_integrations.integrations.langchain.llms import NestLLM
from nest_integrations.integrations.langchain.passages import (
    LangChainPassageRetriever,
    as_passages,
    document_to_passage,
)
from nest_integrations.types import Citation, NestResult

LOG = logging.getLogger(__name__)

__all__ = [
    "LangChainPassageRetriever",
    "NestCitationRetriever",
    "as_passages",
    "citations_to_documents",
    "document_to_passage",
]


def citations_to_documents(
    citations: NestResult | BaseMessage | Sequence[Citation | Mapping[str, Any]],
) -> list[Document]:
    """One ``Document`` per cited span, in answer order.

    Accepts a ``NestResult``, a ``ChatNest`` message (its ``response_metadata["citations"]``),
    ``Citation`` objects or their payload dicts. ``page_content`` is the cited span; metadata:

    - ``source``, ``title``, ``url`` (when known), ``doc_id``, ``passage_id``;
    - ``char_start``/``char_end``: the span in the source document (when the passage's offsets
      are known), so ``source_text[char_start:char_end] == page_content``;
    - ``passage_start_char``/``passage_end_char``: the span in the passage;
    - ``answer_start_index``/``answer_end_index``: where the answer copied it;
    - ``n_tokens``, ``citation_kind`` (``"copy"`` or ``"verbatim"``) and, for ``Citation``
      objects, the passage's own metadata.
    """
    if isinstance(citations, NestResult):
        items: Sequence[Any] = citations.citations
    elif isinstance(citations, BaseMessage):
        items = citations.response_metadata.get("citations") or []
    else:
        items = citations
    return [_citation_document(c) for c in items]


def _citation_document(c: Citation | Mapping[str, Any]) -> Document:
    if isinstance(c, Citation):
        user = {k: v for k, v in c.metadata.items() if k not in ("char_start", "char_end")}
        payload = citation_payload(c)
    else:
        user, payload = {}, dict(c)
    extras = payload.get("extras") or {}
    meta: dict[str, Any] = {
        **user,
        "source": extras.get("source") or user.get("source") or extras.get("doc_id"),
        "doc_id": extras.get("doc_id"),
        "passage_id": extras.get("passage_id", payload.get("id")),
        "char_start": extras.get("source_start_char"),
        "char_end": extras.get("source_end_char"),
        "passage_start_char": extras.get("passage_start_char"),
        "passage_end_char": extras.get("passage_end_char"),
        "answer_start_index": payload.get("start_index"),
        "answer_end_index": payload.get("end_index"),
        "n_tokens": extras.get("n_tokens"),
        "citation_kind": extras.get("kind"),
    }
    for key in ("title", "url"):
        if payload.get(key):
            meta[key] = payload[key]
    meta = {k: v for k, v in meta.items() if v is not None}
    span = f"{meta.get('passage_start_char', '')}-{meta.get('passage_end_char', '')}"
    return Document(page_content=payload.get("cited_text", ""), metadata=meta,
                    id=f"{meta.get('passage_id')}:{span}")


class NestCitationRetriever(BaseRetriever):
    """Answer the query with NEST and return the corpus spans the answer copied.

    Each ``Document`` is one cited span (see ``citations_to_documents``), in answer order: the
    evidence a chain or an agent can quote, with exact source offsets.

    Instantiate:
        .. code-block:: python

            from nest_integrations.langchain import ChatNest, NestCitationRetriever

            retriever = NestCitationRetriever(model=ChatNest(collection="docs"), k=4)

    Invoke:
        .. code-block:: python

            docs = retriever.invoke("How do I open a file?")
            docs = retriever.invoke("How do I open a file?", k=1)   # per-call limit
            docs[0].page_content, docs[0].metadata["source"], docs[0].metadata["char_start"]

    Args:
        model: the ``ChatNest`` (query asked as a user message) or ``NestLLM`` (query completed
            as text) that generates.
        k: the most spans returned (fewer when the answer copied fewer).
        max_tokens: new-token budget of the answer (default: the model's).
    """

    model: ChatNest | NestLLM
    k: int = Field(default=4, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        prompt: Any = query if isinstance(self.model, NestLLM) else [
            {"role": "user", "content": query}
        ]
        call = {"max_tokens": self.max_tokens} if self.max_tokens else {}
        result = self.model._nest_generate(prompt, None, call)
        LOG.debug("answer to %r: %r (%d citations)", query, result.text, len(result.citations))
        return citations_to_documents(result)[: k or self.k]
