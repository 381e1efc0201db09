"""``ChatNest``: NEST as a LangChain chat model, copied spans returned as v1 ``Citation``s."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ChatMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.content import create_citation, create_text_block
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, SecretStr

from nest_integrations import output
from nest_integrations.integrations._common import (
    citation_payload,
    messages_to_dicts,
)
from nest_integrations.integrations.langchain._engine import NestModelParams
from nest_integrations.types import Citation, NestResult

__all__ = ["ChatNest", "citation_annotation", "to_chat_messages", "usage_metadata"]


class ChatNest(NestModelParams, BaseChatModel):
    """Chat with a local LM that decodes with NEST and cites every span it copies.

    NEST (arXiv 2405.19325) retrieves passages for the last user message (a follow-up made
    standalone from the history: ``AnswerPolicy.conversation``), mixes the LM with a
    token-level nearest-neighbour distribution, and copies whole spans of corpus text when
    retrieval is confident. Each copied span comes back as a standard LangChain ``Citation``.

    Setup:
        .. code-block:: bash

            pip install nest-integrations
            nest ingest docs/ --collection docs   # optional: a Chroma corpus with token keys

    Instantiate:
        .. code-block:: python

            from nest_integrations.langchain import ChatNest

            chat = ChatNest()                                  # no corpus: warns, see below
            chat = ChatNest(collection="nest")                 # the store filled by `nest ingest`
            chat = ChatNest(collection="docs", max_tokens=128, decoding="nest")
            chat = ChatNest(retriever=vectorstore.as_retriever(search_kwargs={"k": 8}))
            chat = ChatNest(engine=my_engine)                   # a ready NestEngine

        Nothing is loaded until the first call. ``model`` picks another causal LM (a local
        folder); ``config`` takes a ``NestConfig`` or a preset name (``"paper"``,
        ``"lossless"``, ...); ``temperature`` samples from NEST's mixture (0 = greedy);
        ``decoding`` picks the method (``"nest"``, ``"greedy"``, ``"prompt-lookup"``, ...:
        lossless methods have no copy citations, only ``kind="verbatim"`` provenance ones,
        annotated the same way with ``extras["kind"]``). Defaults: ``nest_integrations.assembly``.

    Invoke:
        .. code-block:: python

            msg = chat.invoke([("system", "Answer briefly."), ("human", "What is a list?")])
            msg.text
            msg.usage_metadata        # {"input_tokens": ..., "output_tokens": ..., ...}
            msg.response_metadata["nest"]["attribution_ratio"]

    Citations:
        .. code-block:: python

            block = msg.content_blocks[0]            # the one text block
            for c in block.get("annotations", []):   # langchain_core Citation dicts
                assert msg.text[c["start_index"]:c["end_index"]] == c["cited_text"]
                print(c.get("title"), c.get("url"), c["extras"]["doc_id"],
                      c["extras"]["source_start_char"], c["extras"]["source_end_char"])

        The same payloads are in ``msg.additional_kwargs["citations"]`` (v0 style) and
        ``msg.response_metadata["citations"]``; ``citations_to_documents(msg)`` turns them into
        ``Document``s.

    Stream:
        .. code-block:: python

            full = None
            for chunk in chat.stream("Continue: The assert statement"):
                print(chunk.text, end="")
                full = chunk if full is None else full + chunk
            full.content_blocks[0]["annotations"]   # equals the invoked message's

        Every chunk adds to one text block (``index`` 0). A citation arrives once, complete,
        on the chunk after its span ends (or on the last chunk); the last chunk
        (``chunk_position="last"``) carries ``usage_metadata`` and ``response_metadata``.

    Async and batch:
        ``ainvoke``, ``astream``, ``batch`` and ``abatch`` work (LangChain runs them in
        threads); concurrent generations interleave, with one model call at a time per model.

    Call arguments:
        ``invoke(..., max_tokens=, temperature=, stop=, query=, passages=, decoding=)``:
        ``query`` replaces the retrieval query; ``passages`` (``Document``s or NEST
        ``Passage``s) skips retrieval; ``decoding`` switches the method for this call. The
        token limit is also accepted as ``max_completion_tokens`` or ``max_new_tokens``, and
        ``stop`` as ``stop_sequences`` (constructor); two names with different values fail
        (docs/parameters.md).

    No corpus:
        An answer decoded over no passage (no retriever and no collection, or a retriever that
        returned nothing) has ``response_metadata["nest"]["grounded"] == False`` and the reason
        in ``["grounded_reason"]``; the first such answer of a model warns once
        (``UngroundedWarning``, a ``UserWarning``).

    Not supported: tool calling, structured output and images (the base class's defaults
    raise ``NotImplementedError``).
    """

    model_config = ConfigDict(
        populate_by_name=True,
        arbitrary_types_allowed=True,
        protected_namespaces=(),
        extra="forbid",
    )

    streaming: bool = False
    """Let ``invoke`` stream internally (callbacks then see each token)."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """Unused (the model is local); accepted so code written for hosted models runs unchanged."""

    @property
    def _llm_type(self) -> str:
        return "nest-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            **self._nest_params(),
            "chroma_url": self.chroma_url,
            "retriever": type(self.retriever).__name__ if self.retriever is not None else None,
        }

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = self._nest_generate(to_chat_messages(messages), stop, kwargs)
        annotations = [citation_annotation(c) for c in result.citations]
        message = AIMessage(
            content=[create_text_block(result.text, annotations=annotations or None)],
            additional_kwargs={"citations": [citation_payload(c) for c in result.citations]},
            response_metadata=self._response_metadata(result),
            usage_metadata=usage_metadata(result),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        block_id = f"lc_{uuid.uuid4()}"  # one id and index: chunks merge into one text block
        tracker = output.CitationStream("completed")
        for item in self._nest_stream(to_chat_messages(messages), stop, kwargs):
            if item.result is not None:
                done = tracker.finish(item.result)
                message = AIMessageChunk(
                    content=[_block("", done, block_id)],
                    additional_kwargs={"citations": [citation_payload(c) for c in done]},
                    response_metadata=self._response_metadata(item.result),
                    usage_metadata=usage_metadata(item.result),
                    chunk_position="last",
                )
            else:
                done = tracker.step(item.citation, item.support)
                extra = {"citations": [citation_payload(c) for c in done]} if done else {}
                message = AIMessageChunk(
                    content=[_block(item.text, done, block_id)], additional_kwargs=extra
                )
            chunk = ChatGenerationChunk(message=message)
            if run_manager is not None:
                run_manager.on_llm_new_token(item.text, chunk=chunk)
            yield chunk

    def _response_metadata(self, result: NestResult) -> dict[str, Any]:
        return {
            "model_name": self.resolved_model_name,
            "finish_reason": result.stats.finish_reason,
            "citations": [citation_payload(c) for c in result.citations],
            "nest": self.nest_metadata(result),
        }


def _block(text: str, citations: list[Citation], block_id: str) -> Any:
    annotations = [citation_annotation(c) for c in citations] or None
    return create_text_block(text, id=block_id, annotations=annotations, index=0)


def citation_annotation(c: Citation) -> Any:
    """A NEST ``Citation`` as a langchain-core v1 ``Citation`` annotation.

    ``start_index``/``end_index`` index the answer text; ``extras`` holds the source side
    (``doc_id``, ``passage_id``, ``source``, ``source_start_char``/``source_end_char``,
    ``passage_start_char``/``passage_end_char``, ``n_tokens``, ``kind``, ``copied``).
    """
    p = citation_payload(c)
    return create_citation(
        id=p["id"],
        url=p.get("url"),
        title=p.get("title"),
        start_index=p["start_index"],
        end_index=p["end_index"],
        cited_text=p["cited_text"],
        **p["extras"],
    )


#: ``output.usage`` key -> LangChain ``UsageMetadata`` key.
USAGE_KEYS = {
    "prompt_tokens": "input_tokens",
    "completion_tokens": "output_tokens",
    "total_tokens": "total_tokens",
}


def usage_metadata(result: NestResult) -> UsageMetadata:
    """Prompt and generated token counts of one generation (``output.usage``, renamed)."""
    return UsageMetadata(**output.renamed(output.usage(result), USAGE_KEYS))


def to_chat_messages(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as ``{"role", "content"}`` dicts, consecutive same-role messages
    merged (chat templates expect alternating turns). Message names are ignored."""
    pairs = [(m.role if isinstance(m, ChatMessage) else m.type, m.text) for m in messages]
    merged: list[dict[str, str]] = []
    for d in messages_to_dicts(pairs):
        if merged and merged[-1]["role"] == d["role"]:
            merged[-1]["content"] += "\n\n" + d["content"]
        else:
            merged.append(d)
    return merged
