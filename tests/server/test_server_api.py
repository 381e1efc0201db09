"""``nest serve`` against real clients: the openai SDK, LangChain's ChatOpenAI, raw HTTP.

One live server (tests/server/conftest.py) with the embedded model over a small sample corpus;
answers are short (max_tokens 8-24) so the whole module stays fast.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlparse

import pytest

from nest_integrations import assembly
from nest_integrations.attribution import split_units
from tests.server.conftest import API_KEY, MAX_BODY, MAX_QUEUE, MAX_TOKENS_CAP

pytestmark = pytest.mark.slow

#: Questions about corpus topics (the embedded model copies from the corpus on each).
QUESTIONS = [
    "How does the assert statement work in Python?",
    "What is belly dance?",
    "How does the while statement work in Python?",
    "What is the Anabasis by Xenophon?",
]


#: A question whose 24-token answer copies from the corpus (measured on an AMD EPYC with the
#: tests' fp32 model; the streamed test asks it too): there "How does the assert statement
#: work?" answers in the model's own words, without a copied span.
COPYING_QUESTION = QUESTIONS[1]


def _passage(server: Any, pid: str) -> dict[str, Any]:
    import httpx

    r = httpx.get(f"{server.url}/v1/passages/{pid}", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


def check_annotations(server: Any, text: str, annotations: list[dict[str, Any]]) -> None:
    """Every annotation slices the answer to ``cited_text``, and its source offsets slice the
    source document (and the passage, at ``source - char_start``) to the same text."""
    last_end = 0
    for a in annotations:
        assert a["type"] == "url_citation"
        u = a["url_citation"]
        if u["kind"] == "support":  # (on by default) the passage sentence that backs an answer
            assert (u["start_index"], u["end_index"]) in split_units(text), u  # sentence
        else:
            assert u["start_index"] >= last_end  # copies: in order, never overlapping
            last_end = u["end_index"]
            assert text[u["start_index"] : u["end_index"]] == u["cited_text"] != ""
        assert u["url"] and u["title"]
        p = _passage(server, u["passage_id"])
        assert p["doc_id"] == u["doc_id"]
        base = p["char_start"]
        assert p["text"][u["source_start"] - base : u["source_end"] - base] == u["cited_text"]
        source = server.sources.get(u["doc_id"])
        assert source is not None, u["doc_id"]
        assert source[u["source_start"] : u["source_end"]] == u["cited_text"]


def _as_dict(obj: Any) -> Any:
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


def test_openai_chat_non_streamed(live_server: Any) -> None:
    """The openai SDK gets an answer, usage, the nest stats and exact url_citation annotations."""
    client = live_server.client()
    resp = client.chat.completions.create(
        model="nest", messages=[{"role": "user", "content": COPYING_QUESTION}], max_tokens=24
    )
    msg = resp.choices[0].message
    assert msg.content and resp.choices[0].finish_reason in ("stop", "length")
    anns = [_as_dict(a) for a in msg.annotations or []]
    assert anns, msg.content
    assert anns[0]["url_citation"]["cited_text"] == msg.annotations[0].url_citation.cited_text
    check_annotations(live_server, msg.content, anns)
    assert resp.usage.completion_tokens == resp.model_extra["nest"]["stats"]["new_tokens"] > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    stats = resp.model_extra["nest"]["stats"]
    assert stats["attributed_tokens"] > 0 and stats["forward_passes"] > 0
    assert resp.model_extra["nest"]["preset"] == assembly.DEFAULT_PRESET


def test_openai_chat_streamed_equals_non_streamed(live_server: Any) -> None:
    """Streamed deltas add up to the same text; merged delta annotations equal the
    non-streamed ones exactly; the stream carries usage when asked."""
    from nest_integrations.server.protocol import merge_annotations

    client = live_server.client()
    kwargs = dict(model="nest", messages=[{"role": "user", "content": QUESTIONS[1]}], max_tokens=24)
    full = client.chat.completions.create(**kwargs)
    text, anns, usage, finish, copied_chunks = "", [], None, None, 0
    for chunk in client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        got = (delta.model_extra or {}).get("annotations") or []
        anns += got
        copied_chunks += bool(got and delta.content)
        finish = chunk.choices[0].finish_reason or finish
    assert text == full.choices[0].message.content
    want = [_as_dict(a) for a in full.choices[0].message.annotations]
    assert want and merge_annotations(anns) == want
    assert copied_chunks >= 1  # the copied text itself carries its annotation
    check_annotations(live_server, text, merge_annotations(anns))
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    assert finish == full.choices[0].finish_reason


#: With ``attribute`` on, the embedded model's answer to this question has sentences it did not
#: copy that the corpus supports (measured: a support annotation on the wire).
ATTRIBUTED_QUESTION = QUESTIONS[1]


def _sse(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``data:`` events of a streamed request over plain HTTP, up to ``[DONE]``."""
    import httpx

    events, done = [], False
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            events.append(json.loads(line[len("data: "):]))
    assert done, "the stream ended without [DONE]"
    return events


def test_sse_chat_with_attribution_on(live_server: Any) -> None:
    """``attribute`` on at the server (its base config): over plain HTTP SSE, support
    annotations arrive in the stream with the delta that ends their sentence, before the
    final chunk; merged, the streamed annotations equal the non-streamed response's; each is
    exact (a support annotation's ``cited_text`` is its passage's sentence, the answer span one
    of the answer's sentences), and the engine's own result for the same request has the same
    text, citations and unsupported sentences, none of which a support annotation covers."""
    import httpx

    from nest_integrations.attribution import split_units
    from nest_integrations.server.protocol import annotation, merge_annotations

    state = live_server.app.state.nest
    base = state.base_config
    # the paper's mu: this answer then has a sentence of the model's own that a passage
    # supports; at grounded's sharper mu (0.25) every sentence of it is a copy, and a support
    # annotation is what this test streams
    state.base_config = base.replace(attribute=True, knn_temperature=None)
    # and no evidence first: an answer that opens with its evidence sentence is all copies
    base_policy = state.base_policy
    state.base_policy = base_policy.replace(evidence=None)
    body = {"model": "nest", "max_tokens": 64,
            "messages": [{"role": "user", "content": ATTRIBUTED_QUESTION}]}
    try:
        r = httpx.post(f"{live_server.url}/v1/chat/completions", json=body, timeout=120,
                       headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        flagged = r.json()["nest"]["stats"]["unsupported"]  # the sentences nothing supports
        events = _sse(live_server, {**body, "stream": True})
        engine = live_server.engine.generate(
            [{"role": "user", "content": ATTRIBUTED_QUESTION}], max_new_tokens=64,
            config=state.base_config, policy=state.base_policy)
    finally:
        state.base_config, state.base_policy = base, base_policy
    text, streamed, support_before_end = "", [], 0
    for i, ev in enumerate(events):
        choice = ev["choices"][0] if ev["choices"] else {}
        delta = choice.get("delta", {})
        text += delta.get("content") or ""
        got = delta.get("annotations") or []
        streamed += got
        if choice.get("finish_reason") is None and i < len(events) - 1:
            support_before_end += sum(a["url_citation"]["kind"] == "support" for a in got)
    assert text == message["content"] == engine.text
    merged = merge_annotations(streamed)
    assert merged == message["annotations"] == [annotation(c) for c in engine.citations]
    support = [a["url_citation"] for a in merged if a["url_citation"]["kind"] == "support"]
    assert support and support_before_end == len(support)
    units = {(s, e) for s, e in split_units(text)}
    for u in support:
        assert (u["start_index"], u["end_index"]) in units
        assert isinstance(u["score"], float) and u["copied"] is False
        p = _passage(live_server, u["passage_id"])
        assert p["text"][u["passage_start"] : u["passage_end"]] == u["cited_text"]
        source = live_server.sources[u["doc_id"]]
        assert source[u["source_start"] : u["source_end"]] == u["cited_text"]
    assert flagged == [un.to_dict() for un in engine.unsupported]
    for un in engine.unsupported:
        assert text[un.start : un.end] == un.text
        assert not any(u["start_index"] < un.end and un.start < u["end_index"] for u in support)


def test_completions_endpoint(live_server: Any) -> None:
    PROMPT = "Assert statements are a convenient way"
    """/v1/completions completes raw text, with annotations on the choice."""
    client = live_server.client()
    # (a prompt the sample corpus continues verbatim: "... to insert debugging assertions")
    resp = client.completions.create(model="nest", prompt=PROMPT, max_tokens=24)
    choice = resp.choices[0]
    assert choice.text
    anns = choice.model_extra.get("annotations") or []
    assert anns, choice.text
    check_annotations(live_server, choice.text, anns)
    stream_text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="nest", prompt=PROMPT, max_tokens=24, stream=True
        )
        if c.choices
    )
    assert stream_text == choice.text


def test_models_and_health(live_server: Any) -> None:
    client = live_server.client()
    assert [m.id for m in client.models.list()] == ["nest"]
    import httpx

    h = httpx.get(f"{live_server.url}/health").json()
    assert h["status"] == "ok" and h["capacity"] == MAX_QUEUE + 1 and h["auth"] is True


def test_per_request_options(live_server: Any) -> None:
    """preset and seed/temperature reach the engine: the same seed gives the same sample;
    an unknown preset or decoding is a 400 naming the choices."""
    import openai

    client = live_server.client()
    msgs = [{"role": "user", "content": QUESTIONS[2]}]
    knn = client.chat.completions.create(
        model="nest", messages=msgs, max_tokens=8, extra_body={"preset": "knn-lm"}
    )
    assert knn.model_extra["nest"]["preset"] == "knn-lm"
    assert knn.model_extra["nest"]["stats"]["verify_steps"] == 0  # no span copying
    greedy = client.chat.completions.create(
        model="nest", messages=msgs, max_tokens=8, extra_body={"decoding": "greedy"}
    )
    assert greedy.model_extra["nest"]["decoding"] == "greedy"
    assert greedy.model_extra["nest"]["stats"]["copied_tokens"] == 0  # plain LM decoding
    sampled = [
        client.chat.completions.create(
            model="nest", messages=msgs, max_tokens=8, temperature=1.5, top_p=0.9, seed=7
        ).choices[0].message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    for body, word in (({"preset": "nope"}, "paper-ra"), ({"decoding": "nope"}, "nest")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="nest", messages=msgs, max_tokens=8, extra_body=body
            )
        assert word in err.value.message


def test_langchain_chat_openai(live_server: Any) -> None:
    """LangChain's ChatOpenAI pointed at the server: invoke and stream."""
    lco = pytest.importorskip("langchain_openai")
    chat = lco.ChatOpenAI(
        model="nest", base_url=f"{live_server.url}/v1", api_key=API_KEY, max_tokens=16,
        max_retries=0,
    )
    msg = chat.invoke(QUESTIONS[0])
    assert isinstance(msg.content, str) and msg.content
    assert msg.usage_metadata and msg.usage_metadata["output_tokens"] > 0
    assert msg.response_metadata["model_name"] == "nest"
    streamed = "".join(str(c.content) for c in chat.stream(QUESTIONS[0]))
    assert streamed == msg.content


def _stream_one(client: Any, question: str, max_tokens: int) -> tuple[str, list[dict]]:
    from nest_integrations.server.protocol import merge_annotations

    text, anns = "", []
    for chunk in client.chat.completions.create(
        model="nest", messages=[{"role": "user", "content": question}], max_tokens=max_tokens,
        stream=True,
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            anns += (chunk.choices[0].delta.model_extra or {}).get("annotations") or []
    return text, merge_annotations(anns)


class _Held:
    """The server's engine, made to wait for ``go`` before each generation starts."""

    def __init__(self, engine: Any, go: threading.Event):
        self.engine, self.go = engine, go

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        assert self.go.wait(120)
        return self.engine.stream(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_concurrency_and_queue_bound(live_server: Any) -> None:
    """16 parallel streamed requests fill every place (1 running + 15 queued) and all complete
    with exact citations; requests sent meanwhile get 429 with Retry-After; the server stays
    healthy and serves again."""
    import httpx
    import openai

    n = MAX_QUEUE + 1
    gate = live_server.gate
    go = threading.Event()
    gate.engine = _Held(gate.engine, go)  # the first generation waits until all are admitted
    try:
        results: list[Any] = [None] * n
        clients = [live_server.client() for _ in range(n)]

        def worker(i: int) -> None:
            try:
                results[i] = _stream_one(clients[i], QUESTIONS[i % len(QUESTIONS)], 8)
            except Exception as exc:  # noqa: BLE001 - checked below
                results[i] = exc

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while gate.pending < n:
            assert time.monotonic() < deadline, gate.status()
            time.sleep(0.01)

        # Past the bound: 4 more while the 16 hold every place.
        extra: list[Any] = []
        for _ in range(4):
            try:
                clients[0].chat.completions.create(
                    model="nest", messages=[{"role": "user", "content": QUESTIONS[0]}],
                    max_tokens=2,
                )
                extra.append(200)
            except openai.RateLimitError as exc:
                extra.append((exc.response.headers.get("retry-after", ""), exc.message))
        go.set()
        for t in threads:
            t.join(180)
    finally:
        go.set()
        gate.engine = gate.engine.engine
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert sum(bool(anns) for _, anns in results) >= n // 2
    for text, anns in results:
        check_annotations(live_server, text, anns)
    assert len(extra) == 4 and 200 not in extra, extra
    for retry_after, message in extra:
        assert retry_after.isdigit() and int(retry_after) >= 1
        assert "busy" in message
    h = httpx.get(f"{live_server.url}/health").json()
    assert h["status"] == "ok" and h["running"] == 0 and h["queued"] == 0
    assert h["rejected"] >= 4
    text, _ = _stream_one(live_server.client(), QUESTIONS[0], 4)
    assert text


def _raw_stream_request(url: str, body: dict[str, Any]) -> socket.socket:
    """Send a streamed request on a raw socket and read until the first content delta."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((u.hostname, u.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    got = b""
    deadline = time.monotonic() + 60
    while b'"content": "' not in got.replace(b'"content": ""', b""):
        assert time.monotonic() < deadline
        part = sock.recv(65536)
        assert part, got
        got += part
    return sock


class _Recorded:
    """The server's engine, recording each generation: ``[chunks, finished, closed]``."""

    def __init__(self, engine: Any):
        self.engine, self.calls = engine, []

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        rec = [0, False, False]
        self.calls.append(rec)
        try:
            for chunk in self.engine.stream(*args, **kwargs):
                rec[0] += 1
                yield chunk
            rec[1] = True
        finally:
            rec[2] = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_client_killed_mid_stream_frees_its_slot(live_server: Any) -> None:
    """A client that drops its connection mid-stream is cancelled at the next chunk: its
    generation stops before its end, the model is free, and the next request runs on it."""
    import httpx

    gate = live_server.gate
    before = gate.cancelled
    gate.engine = rec = _Recorded(gate.engine)
    try:
        # knn-lm decodes token by token: 128 tokens, many chunks, if not cancelled.
        sock = _raw_stream_request(
            live_server.url,
            {"model": "nest", "stream": True, "max_tokens": MAX_TOKENS_CAP, "preset": "knn-lm",
             "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]},
        )
        sock.close()  # what the kernel does when the client process is killed
        deadline = time.monotonic() + 120  # a hang fails; the order below is what is checked
        while not rec.calls[0][2] or httpx.get(f"{live_server.url}/health").json()["running"]:
            assert time.monotonic() < deadline, "the cancelled generation still holds the model"
            time.sleep(0.02)
        assert gate.cancelled == before + 1
        chunks, finished, _ = rec.calls[0]
        assert not finished and chunks >= 1  # stopped at a chunk boundary, before its end
        h = httpx.get(f"{live_server.url}/health").json()
        assert h["running"] == 0 and h["queued"] == 0  # nothing ahead of the next request
        stream = live_server.client().chat.completions.create(
            model="nest", messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=4,
            stream=True,
        )
        got = ""
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got += chunk.choices[0].delta.content
        assert got and len(rec.calls) == 2 and rec.calls[1][1]  # it ran, to its end
    finally:
        gate.engine = rec.engine


def _post(server: Any, path: str, body: Any, *, key: str | None = API_KEY,
          raw: bytes | None = None) -> Any:
    import httpx

    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "body, raw, key, status, needle, param",
    [
        (None, b'{"messages": [', API_KEY, 400, "could not parse the JSON body", None),
        ({"model": "nest"}, None, API_KEY, 400, "missing required parameter: 'messages'",
         "messages"),
        ({"messages": [{"role": "user", "content": "  "}]}, None, API_KEY, 400,
         "empty content", "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, None, API_KEY, 400,
         "'max_tokens' must be >= 1", "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS_CAP + 1},
         None, API_KEY, 400, f"cap of {MAX_TOKENS_CAP} tokens", "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, None, API_KEY, 400,
         "'temperature'=9 is out of range", "temperature"),
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, None, API_KEY,
         404, "The model 'gpt-4o' does not exist", "model"),
        ({"messages": [{"role": "user", "content": "hi"}]}, None, "wrong-key", 401,
         "Incorrect API key", None),
        ({"messages": [{"role": "user", "content": "hi"}]}, None, None, 401, "Missing API key",
         None),
        (None, b'{"messages": [], "pad": "' + b"x" * (MAX_BODY + 10) + b'"}', API_KEY, 413,
         f"cap of {MAX_BODY:,} bytes", None),
    ],
    ids=["malformed-json", "no-messages", "empty-content", "max-tokens-0", "max-tokens-over-cap",
         "bad-temperature", "unknown-model", "wrong-key", "no-key", "oversized-body"],
)
def test_bad_input(live_server: Any, body, raw, key, status, needle, param) -> None:
    """Each bad request gets its status and a clear message in OpenAI's error shape."""
    r = _post(live_server, "/v1/chat/completions", body, key=key, raw=raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"], err
    assert set(err) == {"message", "type", "param", "code"}
    if param:
        assert err["param"] == param


def test_bad_input_via_openai_client_and_still_serving(live_server: Any) -> None:
    """The SDK raises its typed errors (an unknown field is a 400 naming it, as OpenAI's API
    answers), OpenAI's fields the server ignores are accepted, and the server keeps serving."""
    import openai

    client = live_server.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="'frobnicate'"):
        client.chat.completions.create(model="nest", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"frobnicate": True})
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="bad", max_retries=0).models.list()
    resp = client.chat.completions.create(
        model="nest", messages=[{"role": "user", "content": QUESTIONS[3]}], max_tokens=4,
        extra_body={"logit_bias": {"1": 2}}, user="someone",
    )
    assert resp.choices[0].message.content
