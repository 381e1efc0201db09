"""The wire format without a model: request validation, annotation shape, streamed merging,
and ``nest serve`` option errors (fast; no server, no model)."""

from __future__ import annotations

import pytest

from nest_integrations.server import protocol as P
from nest_integrations.types import Citation, NestResult, NestStats

LIMITS = P.Limits(max_tokens_cap=64, default_max_tokens=16)
MSG = [{"role": "user", "content": "hi"}]


def cite(start: int, end: int, text: str, pid: str = "p1", meta: dict | None = None) -> Citation:
    return Citation(
        text=text, start=start, end=end, passage_id=pid, doc_id="doc", passage_start=2,
        passage_end=2 + len(text), source_start=102, source_end=102 + len(text),
        n_tokens=2, metadata=meta or {},
    )


def test_chat_request_defaults_and_options() -> None:
    """Defaults fill in; extension options come top level (extra_body) or under ``nest``;
    content parts are joined; developer is system; OpenAI's fields this server ignores are
    accepted."""
    req = P.parse_chat({"messages": MSG, "user": "u", "logit_bias": {"1": 2}}, LIMITS)
    assert req.max_tokens == 16 and not req.stream and req.preset is None
    req = P.parse_chat(
        {"model": "nest", "stream": True, "max_completion_tokens": 8, "stop": "\n",
         "temperature": 0.5, "top_p": 0.9, "seed": 3, "preset": "paper-ra",
         "nest": {"decoding": "greedy"}, "stream_options": {"include_usage": True},
         "messages": [{"role": "developer", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]}]},
        LIMITS,
    )
    assert req.prompt == [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "ab"}]
    assert (req.max_tokens, req.stop, req.temperature) == (8, ["\n"], 0.5)
    assert (req.top_p, req.seed) == (0.9, 3)
    assert (req.preset, req.decoding) == ("paper-ra", "greedy")
    assert req.include_usage and req.stream


@pytest.mark.parametrize(
    "body, param, needle",
    [
        ([], None, "must be a JSON object"),
        ({}, "messages", "missing required parameter: 'messages'"),
        ({"messages": []}, "messages", "non-empty array"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "not supported"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages", "role 'user'"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0].content", "empty content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0]", "not a text part"),
        ({"messages": MSG, "max_tokens": -3}, "max_tokens", ">= 1"),
        ({"messages": MSG, "max_tokens": 65}, "max_tokens", "cap of 64"),
        ({"messages": MSG, "max_tokens": "8"}, "max_tokens", "must be an integer"),
        ({"messages": MSG, "temperature": -1}, "temperature", "out of range"),
        ({"messages": MSG, "top_p": 0}, "top_p", "(0, 1]"),
        ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"messages": MSG, "n": 2}, "n", "only n=1"),
        ({"messages": MSG, "stream": "yes"}, "stream", "boolean"),
        ({"messages": MSG, "preset": 3}, "preset", "non-empty string"),
        ({"messages": MSG, "tools": [{"type": "function"}]}, "tools", "not supported"),
        ({"messages": MSG, "logprobs": True}, "logprobs", "not supported"),
        ({"messages": MSG, "response_format": {"type": "json_object"}}, "response_format",
         "only 'text'"),
        ({"messages": MSG, "presett": "paper-ra"}, "presett",
         "Unrecognized request argument supplied: 'presett' (did you mean 'preset'?)"),
        ({"messages": MSG, "nest": {"decodng": "greedy"}}, "nest.decodng",
         "'nest.decodng' (did you mean 'decoding'?)"),
        ({"messages": MSG, "nest": "paper-ra"}, "nest", "must be an object"),
        ({"messages": MSG, "collection": ""}, "collection", "non-empty string"),
        ({"messages": MSG, "audio": {"voice": "alloy"}}, "audio", "not supported"),
        ({"messages": MSG, "modalities": ["text", "audio"]}, "modalities", "only the 'text'"),
        ({"messages": MSG, "function_call": {"name": "f"}}, "function_call", "not supported"),
    ],
)
def test_chat_request_errors(body, param, needle) -> None:
    """Each invalid value is a 400 naming the parameter, in OpenAI's error shape."""
    with pytest.raises(P.ApiError) as err:
        P.parse_chat(body, LIMITS)
    e = err.value
    assert e.status == 400 and needle in e.message and e.param == param
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}


def test_every_openai_field_is_accepted_and_the_lists_are_disjoint() -> None:
    """Issue 62: each field of OpenAI's chat/completions API is known (used, ignored, or
    refused only when set); the three lists do not overlap; a refused field that is absent,
    false or null is accepted, and each extension is read top level or under ``nest``."""
    for fields in (P.CHAT_FIELDS, P.COMPLETION_FIELDS):
        names = [k for v in fields.values() for k in v]
        assert len(names) == len(set(names))
    openai = pytest.importorskip("openai")
    from openai.types import completion_create_params as cp
    from openai.types.chat import completion_create_params as ccp

    for module, fields in ((ccp, P.CHAT_FIELDS), (cp, P.COMPLETION_FIELDS)):
        wire = set(module.CompletionCreateParamsBase.__annotations__)
        assert wire <= {k for v in fields.values() for k in v}, (openai.__version__, wire)
    body = {"messages": MSG, **{k: None for k in P.CHAT_FIELDS["refused"]},
            **{k: None for k in P.CHAT_FIELDS["ignored"]}, "logprobs": False, "tools": []}
    assert P.parse_chat(body, LIMITS).max_tokens == 16
    req = P.parse_chat({"messages": MSG, "collection": "docs"}, LIMITS)
    assert req.collection == "docs"
    assert P.parse_chat({"messages": MSG, "nest": {"collection": "c"}}, LIMITS).collection == "c"
    req = P.parse_completion({"prompt": "x", "suffix": None, "best_of": 1, "user": "u",
                              "collection": "docs"}, LIMITS)
    assert req.collection == "docs"


def test_completion_request() -> None:
    assert P.parse_completion({"prompt": ["x"]}, LIMITS).prompt == "x"
    for body, needle in (({}, "'prompt'"), ({"prompt": " "}, "empty"),
                         ({"prompt": ["a", "b"]}, "one prompt"),
                         ({"prompt": "a", "echo": True}, "echo"),
                         ({"prompt": "a", "best_of": 3}, "best_of=1"),
                         ({"prompt": "a", "suffix": "z"}, "suffix"),
                         ({"prompt": "a", "presett": "x"}, "'presett'"),
                         ({"prompt": "a", "messages": MSG}, "'messages'")):
        with pytest.raises(P.ApiError, match=needle):
            P.parse_completion(body, LIMITS)


def test_annotation_shape() -> None:
    """url_citation with OpenAI's four keys plus NEST's source keys; url/title fall back to
    the source path, then the doc id."""
    a = P.annotation(cite(3, 8, "hello", meta={"title": "T", "url": "https://x"}))
    u = a["url_citation"]
    assert a["type"] == "url_citation"
    assert (u["start_index"], u["end_index"], u["url"], u["title"]) == (3, 8, "https://x", "T")
    assert (u["cited_text"], u["doc_id"], u["passage_id"]) == ("hello", "doc", "p1")
    assert (u["source_start"], u["source_end"]) == (102, 107)
    u = P.annotation(cite(0, 1, "h", meta={"source": "docs/a.txt"}))["url_citation"]
    assert u["url"] == u["title"] == "docs/a.txt"
    assert P.annotation(cite(0, 1, "h"))["url_citation"]["url"] == "doc"


def test_annotation_stream_merges_to_the_final_list() -> None:
    """A growing span is re-sent with a larger end; ``finish`` adds what the stream missed or
    reported differently, so the client-side merge equals the final annotations."""
    text = "abcdefghij"
    final = [cite(0, 6, text[:6]), cite(7, 10, text[7:], pid="p2")]
    result = NestResult(text=text, token_ids=[], citations=final, stats=NestStats())
    tracker = P.AnnotationStream()
    sent = tracker.step(cite(0, 3, text[:3])) + tracker.step(None)
    sent += tracker.step(cite(0, 6, text[:6]))
    assert [a["url_citation"]["end_index"] for a in sent] == [3, 6]
    late = tracker.finish(result)
    assert [a["url_citation"]["passage_id"] for a in late] == ["p2"]  # never streamed
    assert P.merge_annotations(sent + late) == [P.annotation(c) for c in final]


def test_merge_orders_a_support_and_a_copy_that_start_together_as_the_response() -> None:
    """A support citation of the first sentence and a copy from the answer's start arrive
    copy first (the copy as it grows, the support when the sentence ends); merged, they are in
    the response's order: by start, then end (issue 53: the held-out dictionary's answer)."""
    import dataclasses

    text = "bytecode (noun). Instructions for a virtual machine."
    copy = cite(0, len(text), text)
    support = dataclasses.replace(cite(0, 16, text[:16]), kind="support", score=1.0)
    sent = [P.annotation(cite(0, 8, text[:8])), P.annotation(support), P.annotation(copy)]
    assert P.merge_annotations(sent) == [P.annotation(support), P.annotation(copy)]


def test_serve_rejects_bad_options_before_loading_the_model(monkeypatch, capsys) -> None:
    """Bad `nest serve` options are one clear line, and no engine is built."""
    from nest_integrations import cli
    from nest_integrations.cli import serve as serve_cli

    pytest.importorskip("uvicorn")
    monkeypatch.setattr(serve_cli, "build_engine", lambda args: pytest.fail("built an engine"))
    assert cli.main(["serve", "--max-queue", "-1"]) == 1
    assert "--max-queue=-1 is invalid" in capsys.readouterr().err
    parser = cli.build_parser()
    args = parser.parse_args(["serve"])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 8000, None)  # loopback by default


def test_docs_list_the_fields_as_the_server_takes_them() -> None:
    """docs/server.md's table of request fields is ``CHAT_FIELDS`` / ``COMPLETION_FIELDS``."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2:4]
            for line in page.splitlines() if line.startswith("| ") and line.count("|") == 4}
    names = {"used": "used", "ignored": "accepted, ignored",
             "refused": "400 when set (not null, false or empty)"}
    for column, fields in ((0, P.CHAT_FIELDS), (1, P.COMPLETION_FIELDS)):
        for key, row in names.items():
            assert set(re.findall(r"`(\w+)`", rows[row][column])) - {"text"} == set(
                fields[key]), (row, column)
    assert set(re.findall(r"`(\w+)`", rows["NEST's own"][0])) == {*P.EXTENSIONS, "nest"}
