"""``NestLLM``: NEST as a LlamaIndex ``CustomLLM`` (convert in, call ``NestEngine``, convert out).

Citations (one per copied span) travel in LlamaIndex's native slots:
``additional_kwargs["citations"]`` (``citation_payload`` dicts: response offsets, source offsets
in ``extras``), ``additional_kwargs["nest"]`` (stats), ``CitationBlock``s after the
``TextBlock`` of a chat message, and ``raw = {"usage": ..., "nest_result": NestResult}``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Iterator, Sequence

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CitationBlock,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from nest_integrations import assembly, output
from nest_integrations.integrations._common import (
    LLAMA_INDEX_TOKEN_NAMES,
    canonical_names,
    citation_payload,
    engine_kwargs,
    grounding,
    messages_to_dicts,
    stats_payload,
    warn_ungrounded,
)
from nest_integrations.types import Citation, NestResult, StreamChunk

LOG = logging.getLogger(__name__)

#: Per-call keyword arguments understood by every NestLLM method (others are ignored); the
#: token limit under any of its names (``LLAMA_INDEX_TOKEN_NAMES``, docs/parameters.md).
CALL_KWARGS = (
    *LLAMA_INDEX_TOKEN_NAMES, "temperature", "stop", "config", "passages", "query", "decoding",
    "drafter_options",
)


class NestLLM(CustomLLM):
    """NEST (Nearest Neighbor Speculative Decoding) as a LlamaIndex LLM with span citations.

    The engine (model, passage retriever, key store) is built on first use by
    ``nest_integrations.assembly``, so constructing is cheap and the defaults are the
    LangChain adapter's: a bare ``NestLLM()`` has no corpus (plain decoding); ``collection``,
    ``persist_dir`` or ``chroma_url`` open the Chroma store filled by ``nest ingest``;
    ``retriever`` takes any LlamaIndex index/retriever or ``PassageRetriever``.

    Instantiate:
        .. code-block:: python

            from llama_index.core import Settings, VectorStoreIndex
            from nest_integrations.llama_index import NestEmbedding, NestLLM

            Settings.embed_model = NestEmbedding()
            index = VectorStoreIndex.from_documents(docs)
            llm = NestLLM(retriever=index, config="paper", max_new_tokens=64)
            # or: NestLLM(collection="nest"), NestLLM(engine=my_engine),
            #     NestLLM(collection="nest", decoding="prompt-lookup")   # lossless

    Complete / chat:
        .. code-block:: python

            resp = llm.complete("What is a list in Python?")
            resp.text, resp.additional_kwargs["citations"]
            msg = llm.chat([ChatMessage(role="user", content="What is a list?")]).message
            [b for b in msg.blocks if b.block_type == "citation"]

    Stream (``delta``s concatenate to the final ``text``; a copied delta carries
    ``additional_kwargs["citation"]``, and the delta after a span ends carries it complete in
    ``additional_kwargs["completed_citations"]``; the last item has ``delta=""`` and all the
    citations):
        .. code-block:: python

            for r in llm.stream_complete("The assert statement"):
                print(r.delta, end="")

    Use in LlamaIndex: ``Settings.llm = llm``, ``index.as_query_engine(llm=llm)``,
    ``index.as_chat_engine(chat_mode="context", llm=llm)``; ``NestQueryEngine`` gives cited
    spans as source nodes.

    Prompts: ``is_chat_model=True``, so query and chat engines call ``chat`` with their formatted
    messages; the model's chat template is applied. ``complete(prompt)`` also sends the prompt
    as one user message (what LlamaIndex chat-model LLMs do, and the default model is
    instruction-tuned), unless ``completion_as_chat=False`` or ``formatted=True``: then the text
    is continued as is (NEST's language-model setting, the most direct way to copy a passage
    whose opening words the prompt quotes). The retrieval query is the prompt or the last user
    message, a follow-up made standalone from the chat (``AnswerPolicy.conversation``); with a
    query engine's prompt that is the whole context-plus-question message.

    Per-call keyword arguments: ``max_new_tokens`` (aliases ``max_tokens``, ``num_output``),
    ``temperature``, ``stop``, ``config`` (a ``NestConfig`` or preset name), ``passages``
    (``Passage``s or LlamaIndex nodes: skips retrieval), ``query`` (the retrieval query),
    ``decoding`` and ``drafter_options``. The constructor takes the same token-limit aliases;
    two names with different values fail, naming both (docs/parameters.md).

    No corpus: an answer decoded over no passage (no retriever and no collection, or a
    retriever or index that returned nothing) has ``additional_kwargs["nest"]["grounded"] ==
    False`` and the reason in ``["grounded_reason"]``; the first such answer of an LLM warns
    once (``UngroundedWarning``, a ``UserWarning``).

    Decoding methods: ``decoding="nest"`` (default), ``"greedy"``, ``"prompt-lookup"``, ...
    Lossless methods cite nothing except ``kind="verbatim"`` provenance, reported in the same
    slots with ``extras["kind"]`` (``additional_location_info["copied"] == 0`` in blocks).
    """

    model: str | None = Field(
        default=None, description="HF id or folder of the model; None = SmolLM2-135M-Instruct."
    )
    collection: str | None = Field(
        default=None, description="Chroma collection of passages (None: no store unless "
        "persist_dir/chroma_url is given, then assembly.DEFAULT_COLLECTION)."
    )
    persist_dir: str | None = Field(
        default=None, description="Store folder (Chroma + keys); None = $NEST_HOME/store."
    )
    chroma_url: str | None = Field(default=None, description="A Chroma server URL.")
    device: str | None = Field(default=None, description="Torch device (default CPU).")
    backend: str | None = Field(
        default=None, description="What runs the model: torch (transformers) or llama.cpp (a "
        "GGUF file: model is its path, a quantisation such as Q4_1 of the embedded model, or "
        "None for the embedded model as Q8_0; the llamacpp extra); None = the process default (torch)."
    )
    dtype: str | None = Field(
        default=None, description="Model weights: auto (bf16 where the CPU multiplies bf16 "
        "natively, and on CUDA), fp32, bf16, fp16 or checkpoint; None = auto."
    )
    config: Any = Field(
        default=None,
        description="NestConfig or preset name; None = assembly.DEFAULT_PRESET (grounded).",
    )
    policy: Any = Field(
        default=None,
        description="AnswerPolicy or preset name; None = the preset's that config names, else "
        "grounded's.",
    )
    decoding: str | None = Field(
        default=None,
        description="Decoding method (drafters.METHODS); None = the policy's (grounded: rag-copy).",
    )
    drafter_options: dict[str, Any] | None = Field(
        default=None, description="Options for the decoding method's drafter."
    )
    hybrid: bool | None = Field(
        default=None, description="BM25 + dense retrieval; None = config.hybrid_retrieval."
    )
    max_new_tokens: int = Field(
        default=assembly.DEFAULT_MAX_NEW_TOKENS, gt=0,
        description="Default tokens per call (aliases: max_tokens, num_output).",
    )
    temperature: float | None = Field(
        default=None, ge=0, description="Sampling temperature on p_M; None = the config's "
        "(0 = greedy)."
    )
    stop: list[str] | None = Field(default=None, description="Default stop strings.")
    context_window: int | None = Field(
        default=None, description="Override the model's context window (tokens)."
    )
    completion_as_chat: bool = Field(
        default=True, description="complete() sends the prompt as a user chat message."
    )
    retriever: Any = Field(
        default=None,
        exclude=True,
        description="Passage source: a PassageRetriever, LlamaIndex retriever or index.",
    )
    _engine: Any = PrivateAttr(default=None)
    _warned_ungrounded: bool = PrivateAttr(default=False)

    def __init__(self, engine: Any = None, **kwargs: Any) -> None:
        kwargs = canonical_names(kwargs, LLAMA_INDEX_TOKEN_NAMES, "NestLLM")
        if kwargs.get("max_new_tokens", 0) is None:
            del kwargs["max_new_tokens"]  # not given: the field's default
        super().__init__(**kwargs)
        self.policy = assembly.resolve_policy(self.policy, self.config)  # a preset name's too
        if self.config is not None:
            self.config = assembly.resolve_config(self.config)  # a preset name or to_dict()
        assembly.check_sources(self.retriever, self.collection, self.chroma_url)
        assembly.check_dtype(self.dtype)  # a bad value fails here, naming the accepted ones
        if engine is None:
            self.engine_spec()  # a bad backend, or a dtype/config it cannot run, fails here
        # a user's engine is shared with its model calls serialised, as LangChain's adapters do
        self._engine = assembly.share_engine(engine) if engine is not None else None

    @classmethod
    def class_name(cls) -> str:
        return "NestLLM"

    # ----------------------------------------------------------------- engine
    @property
    def engine(self) -> Any:
        """The ``NestEngine`` (built on first access)."""
        if self._engine is None:
            self._engine = self._build_engine()
        return self._engine

    def engine_spec(self) -> assembly.EngineSpec:
        """What the engine is built from (no I/O)."""
        return assembly.EngineSpec.from_fields(self)

    def _build_engine(self) -> Any:
        from nest_integrations.integrations.llama_index.retrievers import as_passage_retriever

        retriever = as_passage_retriever(self.retriever) if self.retriever is not None else None
        return assembly.build_engine(self.engine_spec(), retriever=retriever)

    @property
    def metadata(self) -> LLMMetadata:
        """Context window (loads the model unless ``context_window`` is set), output budget."""
        if self._engine is not None:
            name = str(self._engine.lm.name)
        else:
            name = assembly.model_name(self.model)
        return LLMMetadata(
            context_window=self.context_window or int(self.engine.lm.max_context),
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=name,
        )

    # ----------------------------------------------------------------- convert in
    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        from nest_integrations.integrations.llama_index.retrievers import to_passages

        ignored = sorted(set(kwargs) - set(CALL_KWARGS) - {"formatted"})
        if ignored:
            LOG.debug("NestLLM ignores keyword arguments %s", ignored)
        kwargs = canonical_names(kwargs, LLAMA_INDEX_TOKEN_NAMES, "NestLLM call")
        config = self._config(kwargs.get("config", self.config))
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            base = config if config is not None else self.engine.config
            config = base.replace(temperature=float(temperature))
        passages = kwargs.get("passages")
        return engine_kwargs(
            kwargs,
            max_new_tokens=assembly.resolve_max_new_tokens(
                kwargs.get("max_new_tokens"), self.max_new_tokens
            ),
            stop=kwargs.get("stop", self.stop),
            config=config,
            passages=to_passages(passages) if passages is not None else None,
        )

    def nest_metadata(self, result: NestResult, kwargs: dict[str, Any]) -> dict[str, Any]:
        """NEST's statistics of one answer plus ``grounded`` and ``grounded_reason`` (see the
        class docstring); warns on the first answer without passages."""
        retrieves = self.engine.retriever is not None or kwargs.get("passages") is not None
        ground = grounding(result, retrieves, "NestLLM")
        warn_ungrounded(self, ground)
        return {**stats_payload(result), "grounded": ground["grounded"],
                "grounded_reason": ground["reason"]}

    def _config(self, config: Any) -> Any:
        """A call's (or the model's) config for the model's backend (None: the engine's)."""
        if config is None:
            return None
        if self._engine is not None:
            return assembly.engine_config(self._engine, config)
        return assembly.backend_config(assembly.resolve_config(config), self.engine_spec().backend)

    def _completion_prompt(self, prompt: str, formatted: bool) -> Any:
        if formatted:
            return prompt
        if self.completion_as_chat:
            return [{"role": "user", "content": prompt}]
        return self.completion_to_prompt(prompt)

    def _stream(self, prompt: Any, kwargs: dict[str, Any]) -> Iterator[StreamChunk]:
        return self.engine.stream(prompt, **self._options(kwargs))

    # ----------------------------------------------------------------- completion
    def _stream_complete(self, prompt: str, formatted: bool, kwargs: dict) -> CompletionResponseGen:
        text = ""
        for chunk, extra in _deltas(self._stream(self._completion_prompt(prompt, formatted), kwargs)):
            if chunk.result is not None:
                yield _completion(chunk.result, "", self.nest_metadata(chunk.result, kwargs))
                return
            text += chunk.text
            yield CompletionResponse(text=text, delta=chunk.text, additional_kwargs=extra)

    def _complete(self, prompt: str, formatted: bool, kwargs: dict) -> CompletionResponse:
        return _last(self._stream_complete(prompt, formatted, kwargs))

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        return self._stream_complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return await asyncio.to_thread(self._complete, prompt, formatted, kwargs)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return _in_thread(self._stream_complete(prompt, formatted, kwargs))

    # ----------------------------------------------------------------- chat
    def _stream_chat(self, messages: Sequence[ChatMessage], kwargs: dict) -> ChatResponseGen:
        prompt = messages_to_dicts([(m.role.value, m.content or "") for m in messages])
        text = ""
        for chunk, extra in _deltas(self._stream(prompt, kwargs)):
            if chunk.result is not None:
                yield _chat(chunk.result, "", self.nest_metadata(chunk.result, kwargs))
                return
            text += chunk.text
            message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
            yield ChatResponse(message=message, delta=chunk.text, additional_kwargs=extra)

    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict) -> ChatResponse:
        return _last(self._stream_chat(messages, kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream_chat(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat, messages, kwargs)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        return _in_thread(self._stream_chat(messages, kwargs))


# --------------------------------------------------------------------- convert out
#: ``output.citation_fields`` key -> ``CitationBlock.additional_location_info`` key (LlamaIndex
#: names locations ``*_char``; the slot holds ints only, so ``copied`` is 1 or 0).
LOCATION_KEYS = {
    "start_index": "response_start_char",
    "end_index": "response_end_char",
    "passage_start": "passage_start_char",
    "passage_end": "passage_end_char",
    "source_start": "source_start_char",
    "source_end": "source_end_char",
}


def citation_block(c: Citation) -> CitationBlock:
    """One cited span as a ``CitationBlock``: ``cited_content``, ``source`` =
    ``output.citation_link``, ``title`` = ``output.citation_label``, and int locations
    (response, passage and, when known, source offsets; ``copied``: 1 for a NEST copy, 0 for
    ``kind="verbatim"`` provenance and ``"support"``; a support citation also has ``support``
    = 1 and ``score_permille``, its score x 1000: ``response_*_char`` then span the supported
    answer sentence and ``cited_content`` is the passage sentence)."""
    fields = output.citation_fields(c)
    loc = {k: v for k, v in output.renamed(fields, LOCATION_KEYS).items() if v is not None}
    loc["copied"] = int(fields["copied"])
    if fields["kind"] == "support":  # the slot holds ints: the score in thousandths
        loc["support"] = 1
        loc["score_permille"] = round(1000 * fields["score"])
    return CitationBlock(
        cited_content=fields["cited_text"],
        source=output.citation_link(fields),
        title=output.citation_label(fields),
        additional_location_info=loc,
    )


def _extras(result: NestResult, nest: dict[str, Any]) -> dict[str, Any]:
    return {"citations": [citation_payload(c) for c in result.citations], "nest": nest}


def _raw(result: NestResult) -> dict[str, Any]:
    return {"usage": output.usage(result), "nest_result": result}


def _completion(result: NestResult, delta: str, nest: dict[str, Any]) -> CompletionResponse:
    return CompletionResponse(
        text=result.text, delta=delta, additional_kwargs=_extras(result, nest), raw=_raw(result)
    )


def _chat(result: NestResult, delta: str, nest: dict[str, Any]) -> ChatResponse:
    extras = _extras(result, nest)
    blocks: list[Any] = [TextBlock(text=result.text)]
    blocks += [citation_block(c) for c in result.citations]
    message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=extras)
    return ChatResponse(message=message, delta=delta, additional_kwargs=extras, raw=_raw(result))


def _deltas(chunks: Iterator[StreamChunk]) -> Iterator[tuple[StreamChunk, dict[str, Any]]]:
    """Each stream chunk with its ``additional_kwargs``: ``citation`` (the span this delta is
    part of, growing) and ``completed_citations`` (spans that ended before it, each once, and
    the support citations of the sentences it completes): the two modes of
    ``output.CitationStream``."""
    growing, completed = output.CitationStream("growing"), output.CitationStream("completed")
    for chunk in chunks:
        if chunk.result is not None:
            yield chunk, {}
            return
        extra: dict[str, Any] = {}
        for c in growing.step(chunk.citation):
            extra["citation"] = citation_payload(c)
        done = completed.step(chunk.citation, chunk.support)
        if done:
            extra["completed_citations"] = [citation_payload(c) for c in done]
        yield chunk, extra


def _last(gen: Iterator[Any]) -> Any:
    item = None
    for item in gen:
        pass
    return item


async def _in_thread(gen: Iterator[Any]) -> AsyncIterator[Any]:
    """Drive a sync generator from worker threads, one item at a time (the loop stays free)."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, gen, done)
        if item is done:
            return
        yield item
