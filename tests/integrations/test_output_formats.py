"""One ``NestResult`` through every edge: the LangChain, LlamaIndex and server citation payloads,
usage and stats are renames of ``nest_integrations.output`` (same values under each format's
names), and the one ``CitationStream`` gives both streaming semantics. No model: fast."""

from __future__ import annotations

from typing import Any

import pytest

import langchain_core  # noqa: F401  (required dependencies: imported, never skipped)
import llama_index.core  # noqa: F401

from nest_integrations import output  # noqa: E402
from nest_integrations.integrations import _common  # noqa: E402
from nest_integrations.integrations.langchain import chat_models as lc_chat  # noqa: E402
from nest_integrations.integrations.langchain import llms as lc_llms  # noqa: E402
from nest_integrations.integrations.llama_index import llms as li_llms  # noqa: E402
from nest_integrations.server import protocol as P  # noqa: E402
from nest_integrations.types import Citation, NestResult, NestStats  # noqa: E402

TEXT = "Rome was founded in 753 BC on the Tiber, the story says."


def _result() -> NestResult:
    """A copied span with every metadata field, and a verbatim match with none."""
    copy = Citation(
        text="founded in 753 BC", start=9, end=26, passage_id="rome-0", doc_id="rome",
        passage_start=40, passage_end=57, source_start=140, source_end=157, n_tokens=6,
        metadata={"title": "Rome", "url": "https://en.wikipedia.org/wiki/Rome",
                  "source": "wiki/rome.txt", "page": 3},
    )
    verbatim = Citation(
        text="the Tiber", start=30, end=39, passage_id="tiber-2", doc_id="tiber",
        passage_start=0, passage_end=9, source_start=None, source_end=None, n_tokens=3,
        kind="verbatim",
    )
    stats = NestStats(prompt_tokens=11, new_tokens=14, copied_tokens=6, attributed_tokens=9)
    return NestResult(text=TEXT, token_ids=list(range(14)), citations=[copy, verbatim],
                      stats=stats)


def _langchain(c: Citation) -> dict[str, Any]:
    """A LangChain payload flattened back to field names (through its rename maps)."""
    p = _common.citation_payload(c)
    back = {f: p[k] for f, k in _common.PAYLOAD_KEYS.items()}
    back.update((f, p["extras"][k]) for f, k in _common.EXTRAS_KEYS.items() if k in p["extras"])
    back.update((k, p[k]) for k in ("title", "url") if k in p)
    return back


def test_citation_payloads_are_one_dict_under_three_names(monkeypatch) -> None:
    result = _result()
    calls: list[str] = []
    original = output.citation_fields

    def spy(c: Citation) -> dict[str, Any]:
        calls.append(c.passage_id)
        return original(c)

    monkeypatch.setattr(output, "citation_fields", spy)
    ext = P.nest_extension(result, "grounded", "nest")
    server = [a["url_citation"] for a in
              P.chat_response("id", "nest", result, ext)["choices"][0]["message"]["annotations"]]
    assert calls == ["rome-0", "tiber-2"]  # the server built its annotations with it
    langchain = [_langchain(c) for c in result.citations]
    annotations = [lc_chat.citation_annotation(c) for c in result.citations]
    llama_kwargs = li_llms._completion(result, "", {}).additional_kwargs["citations"]
    blocks = [li_llms.citation_block(c) for c in result.citations]
    assert len(calls) == 2 * 5  # ... and so did every other format, once per citation
    monkeypatch.setattr(output, "citation_fields", original)

    for i, c in enumerate(result.citations):
        fields = output.citation_fields(c)
        # server: the fields under their own names, url/title filled in
        for key, value in fields.items():
            want = {"url": output.citation_link(fields),
                    "title": output.citation_label(fields)}.get(key, value)
            assert server[i][key] == want, key
        # LangChain (and LlamaIndex's additional_kwargs): the same values, renamed
        known = {k: v for k, v in fields.items() if k not in ("title", "url") or v}
        assert langchain[i] == known
        assert llama_kwargs[i] == _common.citation_payload(c)
        note = annotations[i]
        assert note["type"] == "citation" and note["cited_text"] == fields["cited_text"]
        assert (note["start_index"], note["end_index"]) == (fields["start_index"],
                                                            fields["end_index"])
        assert note["extras"].get("source_start_char") == fields["source_start"]  # documented
        # LlamaIndex CitationBlock: locations renamed *_char, source/title as the server's
        block = blocks[i]
        loc = block.additional_location_info
        for f, k in li_llms.LOCATION_KEYS.items():
            assert loc.get(k) == fields[f], k
        assert loc["copied"] == int(fields["copied"])
        assert block.cited_content.text == fields["cited_text"]
        assert (block.source, block.title) == (server[i]["url"], server[i]["title"])
    # the fields themselves: what the module docstring promises
    copy, verbatim = (output.citation_fields(c) for c in result.citations)
    assert copy["page"] == 3 and copy["copied"] and copy["kind"] == "copy"
    assert TEXT[copy["start_index"]:copy["end_index"]] == copy["cited_text"]
    assert verbatim["copied"] is False and verbatim["title"] is None and "page" not in verbatim
    assert server[1]["url"] == server[1]["title"] == "tiber"  # no metadata: the doc id


def test_usage_and_stats_are_one_payload() -> None:
    result = _result()
    usage = output.usage(result)
    assert usage == {"prompt_tokens": 11, "completion_tokens": 14, "total_tokens": 25}
    assert P.usage(result) == usage == li_llms._raw(result)["usage"]
    from tests.integrations.langchain.corpus import fake_engine

    lc_llm = lc_llms.NestLLM(engine=fake_engine())
    assert lc_llm._info(result)["token_usage"] == usage
    assert lc_chat.usage_metadata(result) == {"input_tokens": 11, "output_tokens": 14,
                                              "total_tokens": 25}
    stats = output.stats(result)
    assert stats["mean_span_length"] == 4.5 and stats["attribution_ratio"] == 9 / 14
    assert (_common.stats_payload(result) == P.nest_extension(result, "paper", None)["stats"]
            == result.to_dict()["stats"] == stats)
    # the framework edges add whether any passage was used (test_no_corpus.py)
    li_nest = li_llms.NestLLM(engine=fake_engine()).nest_metadata(result, {})
    for nest in (lc_llm._info(result)["nest"], lc_llm.nest_metadata(result), li_nest):
        grounded, reason = nest.pop("grounded"), nest.pop("grounded_reason")
        assert nest == stats and not result.passages  # no passage: not grounded, and why
        assert grounded is False and reason.startswith("no passages: NestLLM's retriever")
    # the method that decoded the answer (the stats'), else the one the request named
    assert P.nest_extension(result, "paper", "greedy")["decoding"] == "greedy"
    result.stats.decoding = "rag-copy"
    assert P.nest_extension(result, "grounded", None)["decoding"] == "rag-copy"


def _deltas(result: NestResult) -> list[Citation | None]:
    """The per-delta citations an engine gives while copying: the copy grows over two deltas,
    one LM delta, the verbatim span in one delta; then the stream ends."""
    copy, verbatim = result.citations
    partial = Citation(**{**copy.__dict__, "text": "founded in", "end": 19,
                          "passage_end": 50, "source_end": 150, "n_tokens": 3})
    return [None, partial, copy, None, verbatim]


def test_one_tracker_two_modes() -> None:
    """"growing" re-reports a span as it grows; "completed" reports each span once, complete;
    both add up to the final citations after ``finish``."""
    result = _result()
    copy, verbatim = result.citations
    growing, completed = output.CitationStream("growing"), output.CitationStream("completed")
    g = [growing.step(c) for c in _deltas(result)]
    d = [completed.step(c) for c in _deltas(result)]
    assert [[x.end for x in step] for step in g] == [[], [19], [26], [], [39]]
    assert d == [[], [], [], [copy], []]  # the copy completes with the LM delta after it
    assert growing.finish(result) == []  # every final form was sent
    assert completed.finish(result) == [verbatim]  # still open when the stream ended
    with pytest.raises(ValueError, match="growing"):
        output.CitationStream("sometimes")

    # the edges are these two modes: the server's annotations grow, LangChain's complete
    server = P.AnnotationStream()
    sent = [a for c in _deltas(result) for a in server.step(c)] + server.finish(result)
    assert P.merge_annotations(sent) == [P.annotation(c) for c in result.citations]
    tracker = output.CitationStream("completed")
    done = [c for x in _deltas(result) for c in tracker.step(x)] + tracker.finish(result)
    assert done == result.citations

    # LlamaIndex streams both: the growing span and the completed ones
    chunks = [_chunk(c) for c in _deltas(result)]
    extras = [extra for _, extra in li_llms._deltas(iter(chunks))]
    assert [e.get("citation", {}).get("end_index") for e in extras] == [None, 19, 26, None, 39]
    assert [len(e.get("completed_citations", [])) for e in extras] == [0, 0, 0, 1, 0]


def _chunk(citation: Citation | None) -> Any:
    from nest_integrations.types import StreamChunk

    return StreamChunk(text="x", citation=citation)
