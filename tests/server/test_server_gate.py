"""``nest serve``'s gate, queue, 429 + ``Retry-After``, disconnects, caps, auth and 404s, fast.

A real uvicorn server (on a socket bound to port 0 before it starts, so no port race) runs
``create_app`` over a real ``NestEngine`` with the tiny random Llama, the in-memory retriever and
key store. The engine is wrapped so that a generation can be held at a point the test chooses
(before it starts, or after its first chunk) on a ``threading.Event``: every ordering below is
forced by events, and waits poll a condition (the gate's counters) with a generous deadline that
only turns a hang into a failure; nothing depends on how fast the machine is. The real-model
versions are in ``test_server_api.py`` (slow set).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx
import pytest

from nest_integrations.server import ServerSettings
from tests.server.live_server import (
    KEY, WAIT, Server, chat, expect_error, idle, in_thread, running, until
)

MAX_QUEUE = 1  # 2 places: one running, one waiting
MAX_BODY = 4096
CAP = 32


@pytest.fixture(scope="module")
def server(tiny_lm) -> Any:
    settings = ServerSettings(api_key=KEY, max_queue=MAX_QUEUE, max_tokens_cap=CAP,
                              default_max_tokens=8, max_body_bytes=MAX_BODY)
    with running(tiny_lm, settings) as srv:
        yield srv


@pytest.fixture
def held(server: Server) -> Any:
    """The server with holds cleared, idle, before and after the test."""
    yield from idle(server)


def _raw_stream(server: Server, body: dict[str, Any]) -> socket.socket:
    """A streamed request on a raw socket (so the test can drop the connection); returns once
    the headers are sent."""
    data = json.dumps({**body, "stream": True}).encode()
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
    )
    return sock


def _read_until(sock: socket.socket, needle: bytes) -> bytes:
    got = b""
    sock.settimeout(WAIT)
    while needle not in got:
        part = sock.recv(65536)
        assert part, got
        got += part
    return got


# ------------------------------------------------------------------------------ answers


def test_tiny_engine_answers_non_streamed_and_streamed(held: Server) -> None:
    r = held.post("/v1/chat/completions", chat())
    assert r.status_code == 200, r.text
    body = r.json()
    text = body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == body["nest"]["stats"]["new_tokens"] >= 1
    with httpx.stream("POST", held.url + "/v1/chat/completions", json=chat(stream=True),
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT) as s:
        assert s.status_code == 200
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"] for e in events[:-1]]
    streamed = "".join(c[0]["delta"].get("content", "") for c in deltas if c)
    assert streamed == text  # greedy: the same answer both ways


# ------------------------------------------------------------------------------ queue


def test_queue_is_fifo_and_full_queue_gets_429_with_retry_after(held: Server) -> None:
    gate, eng = held.gate, held.engine
    go = threading.Event()
    eng.start = go
    rejected_before, n_calls = gate.rejected, len(eng.calls)
    first, out1 = in_thread(lambda: held.post("/v1/chat/completions", chat("first question")))
    with eng.lock:
        assert eng.lock.wait_for(lambda: len(eng.calls) == n_calls + 1, WAIT)  # running, held
    second, out2 = in_thread(lambda: held.post("/v1/chat/completions", chat("second question")))
    until(lambda: gate.pending == 2, "the second request is queued")
    assert gate.status()["running"] == 1 and gate.status()["queued"] == 1
    # Every place is taken: the next requests are refused at once, streamed or not.
    for body in (chat("third"), chat("fourth", stream=True)):
        r = held.post("/v1/chat/completions", body)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
        assert "busy" in err["message"]
    assert gate.rejected == rejected_before + 2
    assert len(eng.calls) == n_calls + 1  # the queued one has not started; the 429s never ran
    go.set()
    first.join(WAIT)
    second.join(WAIT)
    assert [r.status_code for r in out1 + out2] == [200, 200], out1 + out2
    prompts = [c.prompt[0]["content"] for c in eng.calls[n_calls:]]
    assert prompts == ["first question", "second question"]  # FIFO
    assert all(c.finished for c in eng.calls[n_calls:])
    h = held.get("/health", key=None).json()
    assert h["running"] == 0 and h["queued"] == 0 and h["rejected"] == rejected_before + 2


def test_retry_after_is_the_expected_drain_time() -> None:
    from nest_integrations.server.gate import ModelGate, QueueFull

    gate = ModelGate(engine=None, max_queue=1)
    try:
        assert gate.retry_after() == 1  # nothing measured yet: 1 s
        gate.served, gate.busy_s = 4, 10.0  # 2.5 s per generation
        tickets = [gate.admit(), gate.admit()]
        with pytest.raises(QueueFull, match="capacity 2"):
            gate.admit()
        assert gate.retry_after() == 5  # two generations ahead
        for t in tickets:
            t.release()
            t.release()  # released exactly once
        assert gate.pending == 0 and gate.retry_after() == 2  # at least one generation
        gate.busy_s = 0.01
        assert gate.retry_after() == 1  # never 0
    finally:
        gate.close()


def test_client_gone_mid_stream_cancels_at_the_next_chunk_and_frees_the_model(
    held: Server,
) -> None:
    gate, eng = held.gate, held.engine
    release = threading.Event()
    eng.after_first = release
    cancelled, n_calls = gate.cancelled, len(eng.calls)
    sock = _raw_stream(held, chat("Write a long story.", max_tokens=CAP))
    _read_until(sock, b'"role": "assistant"')  # the stream has started
    until(lambda: len(eng.calls) > n_calls and eng.calls[-1].chunks == 1,
          "the first chunk was generated")
    call = eng.calls[-1]
    sock.close()  # what the kernel does when the client process dies
    until(lambda: gate.cancelled == cancelled + 1, "the server noticed the disconnect")
    assert not call.closed  # still held after its first chunk
    release.set()  # the worker produces one more chunk, sees the cancel flag and stops
    until(lambda: call.closed, "the cancelled generation stopped")
    assert not call.finished and call.chunks == 2  # one chunk after the cancel, not 32 tokens
    until(lambda: gate.pending == 0 and not gate.running, "the model is free")
    # The next request runs at once (no 429, nothing left running).
    r = held.post("/v1/chat/completions", chat())
    assert r.status_code == 200, r.text
    assert gate.status()["running"] == 0


def test_client_gone_while_queued_gives_back_its_place(held: Server) -> None:
    gate, eng = held.gate, held.engine
    go = threading.Event()
    eng.start = go
    n_calls = len(eng.calls)
    first, out = in_thread(lambda: held.post("/v1/chat/completions", chat("running")))
    until(lambda: len(eng.calls) == n_calls + 1, "the first request runs")
    sock = _raw_stream(held, chat("queued, then gone"))
    until(lambda: gate.pending == 2, "the streamed request is queued")
    assert held.post("/v1/chat/completions", chat()).status_code == 429  # really full
    sock.close()
    until(lambda: gate.pending == 1, "the gone client's place was given back")
    third, out3 = in_thread(lambda: held.post("/v1/chat/completions", chat("third")))
    until(lambda: gate.pending == 2, "a new request takes the freed place")
    go.set()
    first.join(WAIT)
    third.join(WAIT)
    assert [r.status_code for r in out + out3] == [200, 200], out + out3
    prompts = [c.prompt[0]["content"] for c in eng.calls[n_calls:]]
    assert prompts == ["running", "third"]  # the gone client's generation never started


def test_body_cap_413_declared_and_streamed(held: Server) -> None:
    big = json.dumps(chat("x" * (MAX_BODY + 10))).encode()
    err = expect_error(held.post("/v1/chat/completions", content=big), 413, f"cap of {MAX_BODY:,}")
    assert err["code"] == "request_too_large"

    def chunked():  # no Content-Length: the cap is checked while reading
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    r = httpx.post(held.url + "/v1/chat/completions", content=chunked(), timeout=WAIT,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert "content-length" not in {k.lower() for k in r.request.headers}
    expect_error(r, 413, f"cap of {MAX_BODY:,}")
    padded = {**chat(), "user": "x" * (MAX_BODY // 2)}  # under the cap (an ignored field)
    assert held.post("/v1/chat/completions", padded).status_code == 200


def test_max_tokens_cap(held: Server) -> None:
    err = expect_error(held.post("/v1/chat/completions", chat(max_tokens=CAP + 1)), 400,
                 f"cap of {CAP} tokens")
    assert err["param"] == "max_tokens"
    r = held.post("/v1/completions", {"model": "nest", "prompt": "The assert", "max_tokens": CAP})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= CAP


@pytest.mark.parametrize("path, method", [
    ("/v1/chat/completions", "post"), ("/v1/completions", "post"), ("/v1/models", "get"),
    ("/v1/passages/anything", "get"),
])  # fmt: skip
def test_auth_401_on_every_api_route(held: Server, path: str, method: str) -> None:
    body = chat() if "chat" in path else {"prompt": "x"}
    for key, needle in ((None, "Missing API key"), ("wrong", "Incorrect API key")):
        r = held.post(path, body, key=key) if method == "post" else held.get(path, key=key)
        assert expect_error(r, 401, needle)["code"] == "invalid_api_key"
    assert held.gate.pending == 0  # refused before taking a place
    ok = held.post(path, body) if method == "post" else held.get(path)
    assert ok.status_code in (200, 404), ok.text  # the right key gets through
    assert held.get("/health", key=None).status_code == 200  # health needs no key


def test_404s(held: Server) -> None:
    err = expect_error(held.post("/v1/chat/completions", {**chat(), "model": "gpt-4o"}), 404,
                 "The model 'gpt-4o' does not exist")
    assert err["param"] == "model" and err["code"] == "model_not_found"
    expect_error(held.get("/v1/passages/no-such-passage"), 404, "no passage 'no-such-passage'")
    expect_error(held.get("/v1/nothing-here"), 404, "Not Found")
    expect_error(held.get("/static/..secret"), 404, "no static file")
    assert held.gate.pending == 0
