"""``NestAttributor``: attribute ANY model's answer in LCEL, as standard LangChain citations.

A ``Runnable`` that takes an answer (an ``AIMessage`` or a string, with its documents, or the
``{"answer", "context", "input"/"question"}`` dict of the standard RAG chains) and returns the
answer as an ``AIMessage`` whose text block carries one LangChain ``Citation`` annotation per
attributed span (``nest_integrations.attribution``: ``kind`` ``"verbatim"`` for text found
word for word in a passage, ``"support"`` for a passage sentence that supports an answer
sentence written in other words, with its ``score``; both in ``extras``). Sentences that no
passage supports are listed in ``response_metadata["unsupported"]``: the hallucination signal.

Convert in (Documents -> ``Passage``s keeping ids and offsets, ``passages.as_passages``), call
the core ``Attributor``, convert out (``_common.citation_payload``: ``output.citation_fields``
renamed, as ``ChatNest`` does).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Mapping, Sequence

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.content import create_text_block
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import ConfigDict, Field, PrivateAttr

from nest_integrations.integrations._common import (
    LazyAttributor,
    attribution_summary,
    citation_payload,
    no_passages_error,
    sentences_payload,
    unsupported_payload,
)
from nest_integrations.integrations.langchain.chat_models import citation_annotation
from nest_integrations.integrations.langchain.passages import (
    LangChainPassageRetriever,
    as_passages,
    is_langchain_source,
)
from nest_integrations.types import Citation, Passage

LOG = logging.getLogger(__name__)

__all__ = ["NestAttributor", "attribution_message"]

#: Keys of a RAG chain's dict that hold the answer, the documents and the question.
ANSWER_KEYS = ("answer", "output", "result")
CONTEXT_KEYS = ("context", "documents", "source_documents")
QUESTION_KEYS = ("question", "input", "query")


class NestAttributor(RunnableSerializable[Any, AIMessage]):
    """Cite another model's answer: exact verbatim spans, supporting passage sentences with a
    score, and the sentences nothing supports.

    Chains after any chat model (a hosted one, ``ChatNest``, a fake one in tests): the answer is
    split into sentences and each is checked against the passages; every citation is exact
    (``passage_text[passage_start_char:passage_end_char] == cited_text``, and the same in the
    source document when its offsets are known).

    Instantiate:
        .. code-block:: python

            from nest_integrations.langchain import NestAttributor

            cite = NestAttributor()                         # passages come with each input
            cite = NestAttributor(retriever=vectorstore.as_retriever())  # else retrieved
            cite = NestAttributor(collection="nest")        # the store filled by `nest ingest`
            cite = NestAttributor(attributor=my_attributor) # a ready core Attributor

    Invoke:
        .. code-block:: python

            msg = cite.invoke({"answer": "Paris is in France.", "context": docs,
                               "input": "Where is Paris?"})   # create_retrieval_chain's dict
            msg = cite.invoke(ai_message, documents=docs)     # or a message / str + documents
            chain = prompt | any_chat_model | cite            # LCEL: retrieves for the answer

            for c in msg.content_blocks[0].get("annotations", []):
                c["extras"]["kind"], c["extras"]["score"]      # "verbatim"/"support", float|None
                msg.text[c["start_index"]:c["end_index"]]      # the answer span it cites
                c["cited_text"]                                # the passage text it cites
            msg.response_metadata["unsupported"]    # [{"text", "start_index", "end_index", ...}]
            msg.response_metadata["sentences"]      # each sentence's verdict, score, passage_id

    For ``"verbatim"`` citations ``cited_text`` is also the answer slice; for ``"support"`` it
    is the supporting passage sentence and ``start_index``/``end_index`` span the answer
    sentence it supports. An input message's own annotations (e.g. ``ChatNest``'s copies) are
    kept; attributed verbatim spans inside them are not repeated. The returned message keeps
    the input message's id, usage and metadata; citations are mirrored in
    ``additional_kwargs["citations"]`` and ``response_metadata["citations"]``, as ``ChatNest``
    does. Use ``RunnablePassthrough.assign(cited=cite)`` to keep a chain's dict.

    Where the passages come from, first that applies: the input's documents (``context``), the
    call's ``documents=``, the field ``documents``; else ``retriever`` (a LangChain retriever
    or vector store, or a NEST ``PassageRetriever``), queried with the question when the input
    has one, else with the answer; else the ``collection`` store.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    attributor: Any = Field(default=None, exclude=True)
    """A ready ``nest_integrations.attribution.Attributor`` (or any callable
    ``(text, passages, *, question) -> Attribution``); replaces the fields below."""
    retriever: Any = Field(default=None, exclude=True)
    """Passage source when the input brings no documents: a LangChain ``BaseRetriever`` or
    ``VectorStore``, or a NEST ``PassageRetriever``."""
    documents: list[Any] | None = Field(default=None, exclude=True)
    """Fixed passages (``Document``s, NEST ``Passage``s or strings) for every call."""
    collection: str | None = None
    """Chroma collection filled by ``nest ingest`` (retrieval and its stored token keys)."""
    persist_dir: str | None = None
    """Store folder of ``collection`` (default ``$NEST_HOME/store``)."""
    config: Any = None
    """An ``AttributionConfig`` (scorer, thresholds, ``k`` passages retrieved per query); None =
    the core's measured defaults."""
    _core: Any = PrivateAttr(default=None)

    @property
    def InputType(self) -> Any:  # noqa: N802 - LangChain's name
        return Any

    @property
    def OutputType(self) -> type[AIMessage]:  # noqa: N802 - LangChain's name
        return AIMessage

    # ----------------------------------------------------------------- the core attributor
    def core(self) -> Any:
        """The core ``Attributor`` (built on first use: the embedded model and embedder load
        then, once per process)."""
        return self._holder().get()

    def _holder(self) -> LazyAttributor:
        if self._core is None:
            self._core = LazyAttributor(
                self.attributor, retriever=self.passage_source(),
                collection=None if self.retriever is not None else self.collection,
                persist_dir=self.persist_dir, config=self.config,
            )
        return self._core

    def passage_source(self) -> Any:
        """``retriever`` as NEST's ``PassageRetriever`` port (None without one)."""
        if self.retriever is None:
            return None
        if is_langchain_source(self.retriever):
            return LangChainPassageRetriever(self.retriever)
        if not callable(getattr(self.retriever, "retrieve", None)):
            raise TypeError(
                f"retriever must be a LangChain retriever or vector store, or a NEST "
                f"PassageRetriever, got {type(self.retriever).__name__}"
            )
        return self.retriever

    # ----------------------------------------------------------------- Runnable
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        return self._call_with_config(
            functools.partial(self._attribute, **kwargs), input, config, run_type="chain"
        )

    def _attribute(
        self, input: Any, documents: Sequence[Any] | None = None, question: str | None = None
    ) -> AIMessage:
        text, message, docs, asked = parse_input(input)
        docs = docs if docs is not None else documents
        docs = docs if docs is not None else self.documents
        question = question or asked
        passages = as_passages(_document_list(docs)) if docs is not None else None
        if passages is None and not self._holder().retrieves:
            raise no_passages_error("NestAttributor")
        attribution = self.core()(text, passages, question=question)
        LOG.debug("attributed %d chars: %d citations, %d unsupported", len(text),
                  len(attribution.citations), len(attribution.unsupported))
        return attribution_message(attribution, message)


def parse_input(input: Any) -> tuple[str, BaseMessage | None, Any, str | None]:
    """``(answer text, the answer message or None, documents or None, question or None)`` of a
    ``NestAttributor`` input: a message, a string, or a RAG chain's dict."""
    if isinstance(input, BaseMessage):
        return input.text, input, None, None
    if isinstance(input, str):
        return input, None, None, None
    if isinstance(input, Mapping):
        key = next((k for k in ANSWER_KEYS if input.get(k) is not None), None)
        if key is None:
            raise ValueError(
                f"NestAttributor got a dict without an answer: expected one of {ANSWER_KEYS} "
                f"(got keys {sorted(input)})"
            )
        text, message, _, _ = parse_input(input[key])
        docs = next((input[k] for k in CONTEXT_KEYS if input.get(k) is not None), None)
        question = next((input[k] for k in QUESTION_KEYS if isinstance(input.get(k), str)), None)
        return text, message, docs, question
    raise TypeError(
        "NestAttributor takes an AIMessage, a string, or a dict with 'answer' (and 'context', "
        f"'input'/'question'), got {type(input).__name__}"
    )


def _document_list(docs: Any) -> list[Passage | Document | str]:
    if isinstance(docs, (str, Document, Passage)):
        return [docs]
    return list(docs)


def attribution_message(attribution: Any, message: BaseMessage | None = None) -> AIMessage:
    """An ``Attribution`` as an ``AIMessage``: one text block with the citations as
    annotations (after ``message``'s own, whose answer spans win over overlapping verbatim
    ones), ``additional_kwargs["citations"]`` and ``response_metadata["citations"]``
    (payloads), ``response_metadata["unsupported"]``, ``response_metadata["sentences"]`` (each
    sentence's verdict) and ``response_metadata["attribution"]`` (counts). ``message`` (the
    answer's message) lends its id, usage and metadata."""
    kept = _own_annotations(message)
    taken = [(a["start_index"], a["end_index"]) for a in kept if "start_index" in a]
    citations = [c for c in attribution.citations if not _inside_copy(c, taken)]
    annotations = kept + [citation_annotation(c) for c in citations]
    payloads = _own_payloads(message) + [citation_payload(c) for c in citations]
    summary = attribution_summary(attribution, citations)
    text = attribution.text
    block = create_text_block(text, annotations=annotations or None)
    others = [b for b in (message.content_blocks if message is not None else [])
              if b.get("type") != "text"]
    update = {
        "content": [block, *others],
        "additional_kwargs": {**(message.additional_kwargs if message else {}),
                              "citations": payloads},
        "response_metadata": {**(message.response_metadata if message else {}),
                              "citations": payloads,
                              "unsupported": unsupported_payload(attribution),
                              "sentences": sentences_payload(attribution),
                              "attribution": summary},
    }
    if isinstance(message, AIMessage):
        data = message.model_dump(exclude={"type", "content", "additional_kwargs",
                                           "response_metadata", "tool_call_chunks",
                                           "chunk_position"})
        return AIMessage(**{**data, **update})
    extra = {"id": message.id, "name": message.name} if message is not None else {}
    return AIMessage(**update, **extra)


def _own_annotations(message: BaseMessage | None) -> list[dict[str, Any]]:
    if message is None:
        return []
    out = []
    for b in message.content_blocks:
        if b.get("type") == "text":
            out.extend(dict(a) for a in b.get("annotations") or [])
    return out


def _own_payloads(message: BaseMessage | None) -> list[dict[str, Any]]:
    if message is None:
        return []
    own = message.additional_kwargs.get("citations")
    return list(own) if isinstance(own, list) else []


def _inside_copy(c: Citation, taken: list[tuple[int, int]]) -> bool:
    """A verbatim span that overlaps a span the answer's own annotations already cite."""
    return c.kind == "verbatim" and any(c.start < e and s < c.end for s, e in taken)
