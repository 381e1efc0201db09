"""LangChain sources -> NEST passages: Documents, retrievers and vector stores as NEST's
``PassageRetriever`` port (convert in; no model, no engine)."""

from __future__ import annotations

import inspect

from typing import Any, Iterable, Mapping, Sequence

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore

from nest_integrations.integrations._common import passage_from_record
from nest_integrations.types import Passage


def is_langchain_source(obj: Any) -> bool:
    """A LangChain ``BaseRetriever`` or ``VectorStore``."""
    return isinstance(obj, (BaseRetriever, VectorStore))


def document_to_passage(doc: Document, score: float | None = None) -> Passage:
    """A NEST ``Passage`` from a LangChain ``Document`` (id, metadata and offsets kept)."""
    if score is None:
        value = doc.metadata.get("score", doc.metadata.get("relevance_score"))
        score = float(value) if isinstance(value, (int, float)) else None
    return passage_from_record(doc.page_content, doc.metadata, doc.id, score)


def as_passages(items: Iterable[Passage | Document | str]) -> list[Passage]:
    """``Passage`` objects from passages, Documents or plain strings."""
    out = []
    for item in items:
        if isinstance(item, Passage):
            out.append(item)
        elif isinstance(item, Document):
            out.append(document_to_passage(item))
        else:
            out.append(passage_from_record(str(item)))
    return out


class LangChainPassageRetriever:
    """NEST stage-1 retrieval from a LangChain retriever or vector store.

    Instantiate:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore
            from nest_integrations.langchain import LangChainPassageRetriever, NestEmbeddings

            store = InMemoryVectorStore.from_texts(texts, NestEmbeddings())
            passages = LangChainPassageRetriever(store).retrieve("what is a list?", k=8)

    Passage ids come from ``metadata["passage_id"]``, else the Document id, else a hash of the
    text; the doc id from ``metadata["doc_id"]`` or ``metadata["source"]``. All metadata
    (``title``, ``url``, your own keys) flows into the citations. ``ChatNest(retriever=...)``
    wraps retrievers and stores with this class for you.

    Args:
        source: a ``BaseRetriever`` (returns as many documents as it is configured for, e.g.
            ``as_retriever(search_kwargs={"k": 8})``; NEST keeps at most ``k``) or a
            ``VectorStore`` (searched with the engine's ``k = n_passages``; relevance scores
            are kept when the store provides them).
        search_kwargs: extra arguments for the vector store search (e.g. ``filter``).
    """

    def __init__(
        self, source: BaseRetriever | VectorStore, *, search_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        if not isinstance(source, (BaseRetriever, VectorStore)):
            raise TypeError(
                f"expected a LangChain BaseRetriever or VectorStore, got {type(source).__name__}"
            )
        self.source = source
        self.search_kwargs = dict(search_kwargs or {})

    def retrieve(self, query: str, k: int) -> list[Passage]:
        """The top ``k`` passages for ``query``, best first."""
        if k < 1:
            return []
        if isinstance(self.source, VectorStore):
            return [document_to_passage(d, s) for d, s in self._search(query, k)]
        docs = self.source.invoke(query)
        return [document_to_passage(d) for d in docs[:k]]

    def passages_titled(self, titles: Sequence[str], limit: int = 32) -> list[Passage]:
        """Stored documents whose ``metadata["title"]`` is one of ``titles``, where the vector
        store can filter by metadata (Chroma's ``get(where=...)``, ``InMemoryVectorStore``'s
        filter function); else none (the answer policy then matches the retrieved documents'
        titles only)."""
        store = self.source if isinstance(self.source, VectorStore) else getattr(
            self.source, "vectorstore", None)
        titles = [str(t) for t in titles if str(t)]
        if store is None or not titles or limit < 1:
            return []
        get = getattr(store, "get", None)
        if callable(get) and "where" in inspect.signature(get).parameters:  # Chroma
            where = {"title": titles[0]} if len(titles) == 1 else {"title": {"$in": titles}}
            res = get(where=where, limit=limit, include=["documents", "metadatas"])
            return [document_to_passage(Document(page_content=text, metadata=meta or {}, id=i))
                    for i, text, meta in zip(res["ids"], res["documents"], res["metadatas"])]
        if type(store).__name__ == "InMemoryVectorStore":
            wanted = set(titles)
            docs = store.similarity_search(titles[0], k=limit,
                                           filter=lambda d: d.metadata.get("title") in wanted)
            return [document_to_passage(d) for d in docs]
        return []

    def _search(self, query: str, k: int) -> list[tuple[Document, float | None]]:
        store = self.source
        assert isinstance(store, VectorStore)
        try:
            pairs = store.similarity_search_with_relevance_scores(query, k=k, **self.search_kwargs)
            return [(d, float(s)) for d, s in pairs]
        except NotImplementedError:  # the store has no relevance function
            return [(d, None) for d in store.similarity_search(query, k=k, **self.search_kwargs)]

    def __repr__(self) -> str:
        return f"LangChainPassageRetriever({type(self.source).__name__})"
