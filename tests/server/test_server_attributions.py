"""``POST /v1/attributions``, fast: a real uvicorn server over a real ``NestEngine`` with the tiny
random Llama (its tokens cut the verbatim runs) and the in-memory retriever, held on events as
in ``test_server_gate.py``. Checks the ``url_citation`` shape, exact offsets, the unsupported
sentences, request passages, the queue (an attribution waits its turn and gets 429 when the
queue is full), auth and the 4xx errors."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.server import ServerSettings, create_app
from nest_integrations.server import protocol as P
from tests.server.live_server import (
    KEY, PASSAGES, WAIT, Server, chat, expect_error, idle, in_thread, running, until
)

MAX_CHARS = 600
VERBATIM = PASSAGES[1]  # "The assert statement is a convenient way to insert debugging ..."
PARAPHRASE = "Paris is the biggest city of France, and its capital."
MADE_UP = "The Eiffel Tower was moved to Berlin in 1066 by Charlemagne."
TEXT = f"{VERBATIM} {PARAPHRASE} {MADE_UP}"


@pytest.fixture(scope="module")
def server(tiny_lm) -> Any:
    settings = ServerSettings(api_key=KEY, max_queue=1, max_tokens_cap=32, default_max_tokens=8,
                              max_body_bytes=8192, collection="docs",
                              max_attribution_chars=MAX_CHARS)
    with running(tiny_lm, settings) as srv:
        yield srv


@pytest.fixture
def held(server: Server) -> Any:
    yield from idle(server)


def _span(sentence: str) -> tuple[int, int]:
    start = TEXT.index(sentence)
    return start, start + len(sentence)


def check_shape(body: dict[str, Any], text: str, passages: dict[str, str]) -> None:
    """The chat completions' annotation shape, exact on both sides."""
    assert body["object"] == "attribution" and body["id"].startswith("attr-")
    assert body["text"] == text
    for a in body["annotations"]:
        assert a["type"] == "url_citation"
        u = a["url_citation"]
        assert u["url"] and u["title"]  # never empty, as in chat completions
        source = passages[u["passage_id"]]
        assert source[u["passage_start"] : u["passage_end"]] == u["cited_text"]
        if u["kind"] == "verbatim":
            assert text[u["start_index"] : u["end_index"]] == u["cited_text"]
            assert u["score"] is None and u["copied"] is False
        else:
            assert u["kind"] == "support" and isinstance(u["score"], float)
    for s in body["unsupported"]:
        assert text[s["start"] : s["end"]] == s["text"]


def test_attributes_against_the_served_corpus(held: Server) -> None:
    r = held.post("/v1/attributions", {"text": TEXT})  # retrieved with the text itself
    assert r.status_code == 200, r.text
    body = r.json()
    by_id = {p.id: p.text for p in held.engine.retriever.passages}
    check_shape(body, TEXT, by_id)
    kinds = {a["url_citation"]["kind"]: a["url_citation"] for a in body["annotations"]}
    assert kinds["verbatim"]["cited_text"] == VERBATIM
    support = kinds["support"]
    assert (support["start_index"], support["end_index"]) == _span(PARAPHRASE)
    assert support["cited_text"] == PASSAGES[2]
    assert [s["text"] for s in body["unsupported"]] == [MADE_UP]
    assert [s["verdict"] for s in body["sentences"]] == ["verbatim", "support", "unsupported"]
    # the cited passage is what the playground fetches next
    pid = support["passage_id"]
    p = held.get("/v1/passages/" + pid)
    assert p.status_code == 200 and p.json()["text"] == PASSAGES[2]
    ok = held.post("/v1/attributions", {"text": TEXT, "collection": "docs"})
    assert ok.status_code == 200 and ok.json()["annotations"] == body["annotations"]
    # with a question, passages are retrieved for it: here only the Paris one
    asked = held.post("/v1/attributions", {"text": TEXT, "question": "Tell me about Paris."})
    assert [a["url_citation"]["kind"] for a in asked.json()["annotations"]] == ["support"]
    assert [s["text"] for s in asked.json()["unsupported"]] == [VERBATIM, MADE_UP]


def test_request_passages_replace_retrieval(held: Server) -> None:
    passages = [
        {"id": "fr-1", "text": "Paris is the capital and most populous city of France.",
         "title": "Paris", "url": "https://en.wikipedia.org/wiki/Paris", "doc_id": "paris"},
        "Something else entirely, about the weather in spring.",
    ]
    r = held.post("/v1/attributions", {"text": PARAPHRASE, "passages": passages})
    assert r.status_code == 200, r.text
    body = r.json()
    (a,) = body["annotations"]
    u = a["url_citation"]
    assert (u["passage_id"], u["doc_id"], u["title"], u["url"]) == (
        "fr-1", "paris", "Paris", "https://en.wikipedia.org/wiki/Paris")
    assert u["kind"] == "support" and u["cited_text"] == passages[0]["text"]
    assert held.get("/v1/passages/fr-1").json()["title"] == "Paris"  # cached for the page
    # the served corpus is not used: its verbatim sentence is unsupported here
    r = held.post("/v1/attributions", {"text": VERBATIM, "passages": passages})
    assert r.json()["annotations"] == [] and len(r.json()["unsupported"]) == 1


def test_an_attribution_waits_in_the_queue_and_gets_429_when_full(held: Server) -> None:
    gate, eng = held.gate, held.engine
    go = threading.Event()
    eng.start = go
    n_calls = len(eng.calls)
    first, out1 = in_thread(lambda: held.post("/v1/chat/completions", chat("running")))
    until(lambda: len(eng.calls) == n_calls + 1, "the generation runs, held")
    second, out2 = in_thread(lambda: held.post("/v1/attributions", {"text": TEXT}))
    until(lambda: gate.pending == 2, "the attribution is queued")
    r = held.post("/v1/attributions", {"text": TEXT})
    err = expect_error(r, 429, "busy")
    assert err["code"] == "rate_limit_exceeded" and r.headers["retry-after"].isdigit()
    assert not out2  # still waiting for the model
    go.set()
    first.join(WAIT)
    second.join(WAIT)
    assert [x.status_code for x in out1 + out2] == [200, 200], out1 + out2
    assert out2[0].json()["text"] == TEXT
    until(lambda: gate.pending == 0, "the gate is free")


@pytest.mark.parametrize("body, status, needle, param", [
    ({}, 400, "missing required parameter: 'text'", "text"),
    ({"text": "   "}, 400, "'text' is empty", "text"),
    ({"text": 7}, 400, "'text' must be a string", "text"),
    ({"text": "x" * (MAX_CHARS + 1)}, 400, f"cap of {MAX_CHARS:,}", "text"),
    ({"text": "Hi.", "question": 3}, 400, "'question' must be a string", "question"),
    ({"text": "Hi.", "collection": "nope"}, 400, "unknown collection 'nope': this server "
     "serves the collection 'docs'", "collection"),
    ({"text": "Hi.", "passage": ["a"]}, 400, "'passage' (did you mean 'passages'?)", "passage"),
    ({"text": "Hi.", "collection": "docs", "passages": ["a"]}, 400, "not both", "passages"),
    ({"text": "Hi.", "passages": []}, 400, "non-empty array", "passages"),
    ({"text": "Hi.", "passages": ["ok", {"title": "no text"}]}, 400, "passages[1] must be",
     "passages[1]"),
    ({"text": "Hi.", "passages": ["same", "same"]}, 400, "unique", "passages"),
])  # fmt: skip
def test_errors_are_clear_4xx(held: Server, body: dict, status: int, needle: str,
                              param: str) -> None:
    err = expect_error(held.post("/v1/attributions", body), status, needle)
    assert err["param"] == param
    assert held.gate.pending == 0  # refused before taking a place


def test_auth_and_body_cap(held: Server) -> None:
    for key, needle in ((None, "Missing API key"), ("wrong", "Incorrect API key")):
        err = expect_error(held.post("/v1/attributions", {"text": TEXT}, key=key), 401, needle)
        assert err["code"] == "invalid_api_key"
    expect_error(held.post("/v1/attributions", {"text": "y" * 9000}), 413, "cap of 8,192")
    r = httpx.get(held.url + "/v1/attributions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405


def test_parse_attribution_without_a_server() -> None:
    limits = P.Limits(max_attribution_chars=100, max_attribution_passages=2)
    req = P.parse_attribution({"text": "A b.", "question": "", "passages": [
        "x", {"text": "y", "id": "p2", "char_start": 5, "char_end": 6, "title": "T"}]}, limits)
    assert req.question is None and req.collection is None
    assert [p.text for p in req.passages] == ["x", "y"]
    assert req.passages[1].id == "p2" and req.passages[1].char_start == 5
    assert req.passages[1].metadata["title"] == "T"
    with pytest.raises(P.ApiError, match="cap of 2"):
        P.parse_attribution({"text": "A.", "passages": ["a", "b", "c"]}, limits)
    nested = P.parse_attribution({"text": "A.", "nest": {"collection": "c"}}, limits)
    assert nested.collection == "c"


def test_no_corpus_needs_passages(tiny_lm) -> None:
    """An engine without a retriever: the request must bring its passages (a clear 400)."""
    from starlette.testclient import TestClient

    app = create_app(NestEngine(tiny_lm, None, InMemoryKeyStore(), NestConfig()),
                     ServerSettings())
    with TestClient(app) as client:
        r = client.post("/v1/attributions", json={"text": TEXT})
        assert r.status_code == 400 and "no corpus" in r.json()["error"]["message"]
        r = client.post("/v1/attributions", json={"text": VERBATIM, "passages": [VERBATIM]})
        assert r.status_code == 200, r.text
        (a,) = r.json()["annotations"]
        assert a["url_citation"]["cited_text"] == VERBATIM
