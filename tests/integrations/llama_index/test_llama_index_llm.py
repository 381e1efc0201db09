"""NestLLM behaviour: lazy construction, complete/chat (sync, streaming, async), citations in
``additional_kwargs`` and ``CitationBlock``s, per-call options, and LlamaIndex's usual paths
(``Settings.llm``, ``index.as_query_engine``, chat engines) with the real model."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, CitationBlock, TextBlock

from nest_integrations.config import NestConfig
from nest_integrations.llama_index import NestLLM
from tests.integrations.llama_index.corpus import DOCS, GROUNDED, ROME_PASSAGE

USER = [ChatMessage(role="user", content="Tell me about the Roman Empire.")]


def check_citations(text: str, kwargs: dict) -> list[dict]:
    """Each citation payload slices the answer (a support citation, on by default: to one of
    its sentences) and its source document exactly; the sentences nothing supports are in the
    stats."""
    from nest_integrations.attribution import split_units

    cites = kwargs["citations"]
    for c in cites:
        x = c["extras"]
        if x["kind"] == "support":  # cited_text: the passage sentence that backs it
            assert (c["start_index"], c["end_index"]) in split_units(text), c
        else:
            assert text[c["start_index"] : c["end_index"]] == c["cited_text"]
        assert DOCS[x["doc_id"]][x["source_start_char"] : x["source_end_char"]] == c["cited_text"]
    assert set(kwargs["nest"]) >= {"attribution_ratio", "new_tokens", "mean_span_length",
                                   "unsupported"}
    return cites


def check_blocks(message: ChatMessage, cites: list[dict]) -> None:
    """One TextBlock with the answer, then one CitationBlock per citation, in order."""
    assert isinstance(message.blocks[0], TextBlock)
    blocks = [b for b in message.blocks if isinstance(b, CitationBlock)]
    assert len(blocks) == len(cites)
    for b, c in zip(blocks, cites):
        loc = b.additional_location_info
        assert b.cited_content.text == c["cited_text"]
        answer = message.content[loc["response_start_char"] : loc["response_end_char"]]
        assert answer == b.cited_content.text
        doc = DOCS[c["extras"]["doc_id"]]
        assert doc[loc["source_start_char"] : loc["source_end_char"]] == b.cited_content.text


def _open_at_end(items: list) -> list[dict]:
    """The span the last text delta is part of (complete by then), if that delta is copied: a
    stream reports it only there and in the final list, never in ``completed_citations``."""
    last = items[-2].additional_kwargs if len(items) > 1 else {}
    return [last["citation"]] if "citation" in last else []


def test_construction_is_cheap_and_config_presets(index, offline_settings):
    """Building a NestLLM (and setting it globally) loads nothing; presets become NestConfigs."""
    llm = NestLLM(retriever=index, config="lossless", max_new_tokens=8)
    offline_settings.llm = llm
    assert llm._engine is None
    assert llm.config == NestConfig.from_preset("lossless")
    assert NestLLM.from_dict(llm.to_dict()).config == llm.config
    assert NestLLM(context_window=2048).metadata.context_window == 2048  # no load needed


def test_metadata(tiny_llm, tiny_lm):
    meta = tiny_llm.metadata
    assert meta.is_chat_model and not meta.is_function_calling_model
    assert meta.context_window == tiny_lm.max_context and meta.num_output == 12


def test_stream_complete_concatenates_to_complete(tiny_llm):
    """Streamed deltas add up to the final text, which equals complete()'s."""
    items = list(tiny_llm.stream_complete("The Roman Empire was"))
    done = tiny_llm.complete("The Roman Empire was")
    assert "".join(r.delta for r in items) == items[-1].text == done.text
    assert all(a.text + b.delta == b.text for a, b in zip(items, items[1:]))
    assert items[-1].delta == ""
    assert items[-1].additional_kwargs["citations"] == done.additional_kwargs["citations"]
    # the shared CitationStream: each completed span once, complete, and in the final list
    completed = [c for i in items for c in i.additional_kwargs.get("completed_citations", [])]
    assert all(c in done.additional_kwargs["citations"] for c in completed)
    assert len({(c["id"], c["start_index"]) for c in completed}) == len(completed)
    cites = check_citations(done.text, done.additional_kwargs)
    assert cites  # the tiny model copies a span of the retrieved passages (measured: 1)
    assert completed + _open_at_end(items) == cites  # each span reported complete, in order
    usage = done.raw["usage"]
    assert usage["completion_tokens"] == len(done.raw["nest_result"].token_ids) > 0


def test_stream_chat_concatenates_to_chat(tiny_llm):
    items = list(tiny_llm.stream_chat(USER))
    done = tiny_llm.chat(USER)
    assert "".join(r.delta for r in items) == items[-1].message.content == done.message.content
    cites = check_citations(done.message.content, done.additional_kwargs)
    assert cites  # measured: 1 copied span
    completed = [c for i in items for c in i.additional_kwargs.get("completed_citations", [])]
    assert completed + _open_at_end(items) == cites
    check_blocks(done.message, cites)
    check_blocks(items[-1].message, cites)
    assert done.message.additional_kwargs["citations"] == cites


def test_async_variants_match_sync(tiny_llm):
    """acomplete/astream_complete/achat/astream_chat give the sync results."""

    async def run():
        a = await tiny_llm.acomplete("The Roman Empire was")
        sa = [r async for r in await tiny_llm.astream_complete("The Roman Empire was")]
        c = await tiny_llm.achat(USER)
        sc = [r async for r in await tiny_llm.astream_chat(USER)]
        return a, sa, c, sc

    a, sa, c, sc = asyncio.run(run())
    assert a.text == tiny_llm.complete("The Roman Empire was").text
    assert "".join(r.delta for r in sa) == sa[-1].text == a.text
    assert c.message.content == tiny_llm.chat(USER).message.content
    assert "".join(r.delta for r in sc) == c.message.content
    assert sc[-1].additional_kwargs["citations"] == c.additional_kwargs["citations"]


def test_per_call_options(tiny_llm, index):
    """max_new_tokens, passages (LlamaIndex nodes, no retrieval) and config apply per call."""
    nodes = index.as_retriever(similarity_top_k=1).retrieve("photosynthesis")
    r = tiny_llm.complete("Plants", max_new_tokens=3, passages=nodes, config="lossless")
    result = r.raw["nest_result"]
    assert result.stats.new_tokens <= 3
    assert [p.id for p in result.passages] == [nodes[0].node.node_id]
    assert tiny_llm.complete("Plants", max_tokens=2).raw["nest_result"].stats.new_tokens <= 2


def test_completion_prompt_modes(tiny_llm):
    """complete() wraps the prompt as a user message; formatted=True continues the raw text."""
    assert tiny_llm._completion_prompt("hi", formatted=False) == [{"role": "user", "content": "hi"}]
    assert tiny_llm._completion_prompt("hi", formatted=True) == "hi"
    raw = tiny_llm.model_copy(update={"completion_as_chat": False})
    assert raw._completion_prompt("hi", formatted=False) == "hi"
    as_chat = tiny_llm.complete("The Roman Empire was").text
    user = [ChatMessage(role="user", content="The Roman Empire was")]
    assert as_chat == tiny_llm.chat(user).message.content


def test_stream_with_stop_string_concatenates(tiny_llm):
    """Streamed deltas add up to the final text even when a stop string spans tokens."""
    deltas = [r.delta for r in tiny_llm.stream_complete("Hello there", formatted=True)]
    stop = deltas[1][-2:] + deltas[2][:2]  # spans a token boundary
    items = list(tiny_llm.stream_complete("Hello there", formatted=True, stop=[stop]))
    assert "".join(r.delta for r in items) == items[-1].text


# ------------------------------------------------------------------ the real model
@pytest.mark.slow
def test_grounded_completion_copies_the_passage(nest_llm):
    """A raw prompt quoting a passage's first sentence is continued from the corpus, cited."""
    r = nest_llm.complete(GROUNDED, formatted=True)
    cites = check_citations(r.text, r.additional_kwargs)
    rome = [c for c in cites if c["extras"]["doc_id"] == "rome"]
    assert sum(c["extras"]["n_tokens"] for c in rome) >= 10, r.text
    assert all(c["cited_text"] in ROME_PASSAGE for c in rome)
    assert max(c["extras"]["source_start_char"] for c in rome) > 0  # offsets are the document's
    items = list(nest_llm.stream_complete(GROUNDED, formatted=True))
    assert "".join(i.delta for i in items) == r.text
    assert any("citation" in i.additional_kwargs for i in items[:-1])


@pytest.mark.slow
def test_built_from_parameters(index, tmp_path):
    """The lazy parameter paths: a Chroma collection in a persist dir, and a LlamaIndex index."""
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(tmp_path, collection="li-docs")
    IngestPipeline(store, with_keys=False).ingest(texts=list(DOCS.values()), ids=list(DOCS))
    for llm in (
        NestLLM(collection="li-docs", persist_dir=str(tmp_path), config="paper", max_new_tokens=8),
        NestLLM(retriever=index, max_new_tokens=8),
    ):
        assert llm._engine is None
        r = llm.complete(GROUNDED, formatted=True)
        assert r.additional_kwargs["citations"], r.text
        check_citations(r.text, r.additional_kwargs)
        assert llm.metadata.model_name == "SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_grounded_chat_has_citation_blocks(nest_llm):
    msg = [ChatMessage(role="user", content=GROUNDED)]
    r = nest_llm.chat(msg)
    cites = check_citations(r.message.content, r.additional_kwargs)
    assert cites and any(c["extras"]["doc_id"] == "rome" for c in cites)
    check_blocks(r.message, cites)
    assert "".join(i.delta for i in nest_llm.stream_chat(msg)) == r.message.content


@pytest.mark.slow
def test_settings_llm_and_as_query_engine(nest_llm, index, offline_settings):
    """``Settings.llm = NestLLM`` drives index.as_query_engine(); so does llm=..., streaming."""
    nest_llm = nest_llm.model_copy(update={"max_new_tokens": 8})  # shares the engine
    offline_settings.llm = nest_llm
    response = index.as_query_engine(similarity_top_k=1).query(GROUNDED)
    assert response.response.strip() and response.source_nodes  # the retrieved context
    streaming = index.as_query_engine(llm=nest_llm, similarity_top_k=1, streaming=True)
    assert "".join(streaming.query(GROUNDED).response_gen) == response.response


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["simple", "context"])
def test_chat_engines(nest_llm, index, mode):
    """index.as_chat_engine(chat_mode=...) chats over two turns and streams."""
    nest_llm = nest_llm.model_copy(update={"max_new_tokens": 8})
    chat = index.as_chat_engine(chat_mode=mode, llm=nest_llm, similarity_top_k=1)
    first = chat.chat(GROUNDED)
    assert first.response.strip()
    second = chat.stream_chat("And what else?")
    text = "".join(second.response_gen)
    assert text.strip()
    history = chat.chat_history
    assert [m.role.value for m in history[-4:]] == ["user", "assistant", "user", "assistant"]
