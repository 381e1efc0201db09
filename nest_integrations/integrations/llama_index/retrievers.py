"""Retrievers both ways: LlamaIndex nodes -> NEST passages, and NEST citations -> LlamaIndex nodes.

- ``LlamaIndexPassageRetriever`` is our ``PassageRetriever`` over any LlamaIndex retriever or
  index (a ``VectorStoreIndex``, also on a ``ChromaVectorStore``): NEST's stage 1.
- ``citation_nodes`` turns a ``NestResult``'s copied spans into ``NodeWithScore``s whose
  ``start_char_idx``/``end_char_idx`` index the *source document*.
- ``NestCitationRetriever`` is a LlamaIndex ``BaseRetriever`` that answers the query with NEST
  and returns the spans the answer copied.
"""

from __future__ import annotations

from typing import Any, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import (
    BaseNode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)

from nest_integrations.integrations._common import (
    RESERVED_KEYS,
    citation_extras,
    passage_from_record,
)
from nest_integrations.types import Citation, NestResult, Passage

#: Metadata keys that ``citation_nodes`` adds (hidden from LLM prompts and embeddings).
CITATION_KEYS = (
    "doc_id", "passage_id", "source_start_char", "source_end_char", "passage_start_char",
    "passage_end_char", "response_start_char", "response_end_char", "n_tokens", "kind",
    "copied", "score",
)


def node_to_passage(node: NodeWithScore | BaseNode) -> Passage:
    """A ``Passage`` from a LlamaIndex node: id = ``node_id`` (unless metadata has
    ``passage_id``), doc id = ``ref_doc_id``, and ``start_char_idx``/``end_char_idx`` kept as the
    source offsets when they span exactly the text."""
    score = node.score if isinstance(node, NodeWithScore) else None
    base = node.node if isinstance(node, NodeWithScore) else node
    text = base.get_content()  # MetadataMode.NONE: the text alone
    meta = dict(base.metadata)
    if base.ref_doc_id:
        meta.setdefault("doc_id", base.ref_doc_id)
    start, end = base.start_char_idx, base.end_char_idx
    if isinstance(start, int) and isinstance(end, int) and end - start == len(text):
        meta.setdefault("char_start", start)
        meta.setdefault("char_end", end)
    return passage_from_record(text, meta, base.node_id, score)


def to_passages(items: Sequence[Any]) -> list[Passage]:
    """``Passage``s from passages and/or LlamaIndex nodes."""
    return [p if isinstance(p, Passage) else node_to_passage(p) for p in items]


class LlamaIndexPassageRetriever:
    """NEST's ``PassageRetriever`` over a LlamaIndex retriever or index.

    An index (anything with ``as_retriever``) is asked for exactly ``k`` nodes per query; a
    retriever returns its own top-k (e.g. ``index.as_retriever(similarity_top_k=8)``), cut to
    ``k``. Node ids become passage ids and node metadata flows into the citations.

    Instantiate:
        .. code-block:: python

            from nest_integrations.llama_index import LlamaIndexPassageRetriever, NestEmbedding

            passages = LlamaIndexPassageRetriever(index)              # a VectorStoreIndex
            passages = LlamaIndexPassageRetriever.from_vector_store(  # e.g. ChromaVectorStore
                ChromaVectorStore(chroma_collection=col), embed_model=NestEmbedding()
            )
            passages.retrieve("What is a list?", k=4)
    """

    def __init__(self, source: Any, similarity_top_k: int | None = None) -> None:
        if not (isinstance(source, BaseRetriever) or hasattr(source, "as_retriever")):
            raise TypeError(
                f"expected a LlamaIndex BaseRetriever or index, got {type(source).__name__}"
            )
        self.source = source
        self.similarity_top_k = similarity_top_k

    @classmethod
    def from_vector_store(
        cls, vector_store: Any, embed_model: Any = None, similarity_top_k: int | None = None
    ) -> "LlamaIndexPassageRetriever":
        """Over a LlamaIndex vector store (``embed_model`` defaults to ``NestEmbedding``)."""
        from llama_index.core import VectorStoreIndex

        from nest_integrations.integrations.llama_index.embeddings import NestEmbedding

        index = VectorStoreIndex.from_vector_store(
            vector_store, embed_model=embed_model or NestEmbedding()
        )
        return cls(index, similarity_top_k)

    def nodes(self, query: str, k: int) -> list[NodeWithScore]:
        """The top ``k`` LlamaIndex nodes for ``query``."""
        if isinstance(self.source, BaseRetriever):
            return self.source.retrieve(query)[:k]
        return self.source.as_retriever(similarity_top_k=self.similarity_top_k or k).retrieve(
            query
        )[:k]

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return [node_to_passage(n) for n in self.nodes(query, k)]

    def passages_titled(self, titles: Sequence[str], limit: int = 32) -> list[Passage]:
        """Nodes whose ``metadata["title"]`` is one of ``titles``, through the index's metadata
        filters (an index: anything with ``as_retriever(filters=...)``); none for a bare
        retriever (the answer policy then matches the retrieved nodes' titles only)."""
        from llama_index.core.vector_stores import (
            FilterCondition,
            MetadataFilter,
            MetadataFilters,
        )

        titles = [str(t) for t in titles if str(t)]
        if isinstance(self.source, BaseRetriever) or not titles or limit < 1:
            return []
        filters = MetadataFilters(filters=[MetadataFilter(key="title", value=t) for t in titles],
                                  condition=FilterCondition.OR)
        try:
            nodes = self.source.as_retriever(similarity_top_k=limit,
                                             filters=filters).retrieve(titles[0])
        except (NotImplementedError, ValueError, TypeError):  # a store without filters
            return []
        return [node_to_passage(n) for n in nodes[:limit]]


def as_passage_retriever(source: Any) -> Any:
    """A ``PassageRetriever`` from ours or from a LlamaIndex retriever/index."""
    if isinstance(source, BaseRetriever) or hasattr(source, "as_retriever"):
        return LlamaIndexPassageRetriever(source)
    if not callable(getattr(source, "retrieve", None)):
        raise TypeError(f"{type(source).__name__} is not a passage retriever or LlamaIndex index")
    return source


def citation_nodes(result: NestResult) -> list[NodeWithScore]:
    """The copied spans of ``result`` as nodes, in answer order.

    Each ``TextNode`` has ``text`` = the cited span, ``id_`` = ``"<passage_id>:<start>-<end>"``
    (passage offsets), ``start_char_idx``/``end_char_idx`` into the source document (``None``
    when the passage had no source offsets), its SOURCE relationship = the doc id, and metadata
    = the passage's user metadata plus ``doc_id``, ``passage_id`` and the source, passage and
    response offsets. The score is the passage's retrieval score.
    """
    return span_nodes(result.citations, result.passages)


def span_nodes(
    citations: Sequence[Citation], passages: Sequence[Passage] = ()
) -> list[NodeWithScore]:
    """``citations`` as nodes (see ``citation_nodes``); the score is the citation's own (a
    ``"support"`` citation's support score), else its passage's retrieval score."""
    scores = {p.id: p.score for p in passages}
    out = []
    for c in citations:
        meta = {k: v for k, v in c.metadata.items() if k not in RESERVED_KEYS}
        meta.update((k, v) for k, v in citation_extras(c).items() if v is not None)
        meta.update(response_start_char=c.start, response_end_char=c.end)
        node = TextNode(
            id_=f"{c.passage_id}:{c.passage_start}-{c.passage_end}",
            text=c.text,
            start_char_idx=c.source_start,
            end_char_idx=c.source_end,
            metadata=meta,
            excluded_llm_metadata_keys=list(CITATION_KEYS),
            excluded_embed_metadata_keys=list(CITATION_KEYS),
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=c.doc_id)},
        )
        score = c.score if c.score is not None else scores.get(c.passage_id)
        out.append(NodeWithScore(node=node, score=score))
    return out


def answer(llm: Any, query: str, source: Any = None, stream: bool = False, **kwargs: Any) -> Any:
    """Chat ``query`` to a ``NestLLM`` (``stream_chat`` when ``stream``), with passages from
    ``source`` (a PassageRetriever) when given, else from the LLM's own retriever. The (last)
    response's ``raw["nest_result"]`` holds the ``NestResult``."""
    if source is not None:
        config = llm.config or llm.engine.config
        kwargs["passages"] = source.retrieve(query, config.n_passages)
    messages = [ChatMessage(role=MessageRole.USER, content=query)]
    if stream:
        return llm.stream_chat(messages, query=query, **kwargs)
    return llm.chat(messages, query=query, **kwargs)


class NestCitationRetriever(BaseRetriever):
    """A LlamaIndex retriever whose nodes are the corpus spans NEST copied into its answer.

    Only text the answer actually used comes back (not every retrieved passage), with exact
    source offsets: ``doc_text[n.node.start_char_idx:n.node.end_char_idx] == n.node.text``.

    Instantiate / retrieve:
        .. code-block:: python

            from nest_integrations.llama_index import NestCitationRetriever, NestLLM

            retriever = NestCitationRetriever(NestLLM(retriever=index), index)
            for n in retriever.retrieve("What is a list in Python?"):
                print(n.node.metadata["doc_id"], n.node.text)

    Args:
        llm: a ``NestLLM``.
        source: where passages come from: a LlamaIndex retriever or index, or a
            ``PassageRetriever``; ``None`` uses the LLM's own retriever.
        max_new_tokens: answer length (default: the LLM's).
    """

    def __init__(
        self,
        llm: Any,
        source: Any = None,
        max_new_tokens: int | None = None,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        super().__init__(callback_manager=callback_manager)
        self.llm = llm
        self.source = as_passage_retriever(source) if source is not None else None
        self.max_new_tokens = max_new_tokens

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        kwargs = {"max_new_tokens": self.max_new_tokens} if self.max_new_tokens else {}
        response = answer(self.llm, query_bundle.query_str, self.source, **kwargs)
        return citation_nodes(response.raw["nest_result"])
