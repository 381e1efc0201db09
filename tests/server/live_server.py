"""A real uvicorn server over the tiny engine, whose generations can be held at a chosen
point (``HeldEngine``), and the helpers that drive it. Used by
``tests/server/test_server_gate.py`` and ``tests/server/test_server_attributions.py``."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import httpx
import uvicorn

from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.server import ServerSettings, create_app


KEY = "gate-key"


WAIT = 60.0  # a deadline for conditions that must become true (a hang fails, nothing else)
PASSAGES = [
    "Belly dance is a Middle Eastern dance that originated in Egypt.",
    "The assert statement is a convenient way to insert debugging assertions into a program.",
    "Paris is the capital and most populous city of France.",
]


@dataclass
class Call:
    """One generation the engine was asked for."""

    prompt: Any
    chunks: int = 0
    finished: bool = False  # the engine's stream ran to its end
    closed: bool = False  # the stream was closed (finished or cancelled)


@dataclass
class HeldEngine:
    """The real engine; ``start`` / ``after_first`` (Events) hold a generation before it starts
    / after its first chunk until the test sets them. ``None``: no hold."""

    engine: Any
    start: threading.Event | None = None
    after_first: threading.Event | None = None
    calls: list[Call] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def __getattr__(self, name: str) -> Any:  # lm, retriever, decoding, ...
        return getattr(self.engine, name)

    def stream(self, prompt: Any, **kwargs: Any) -> Any:
        call = Call(prompt)
        start, after_first = self.start, self.after_first
        with self.lock:
            self.calls.append(call)
            self.lock.notify_all()
        try:
            if start is not None:
                assert start.wait(WAIT)
            for chunk in self.engine.stream(prompt, **kwargs):
                call.chunks += 1
                yield chunk
                if call.chunks == 1 and after_first is not None:
                    assert after_first.wait(WAIT)
            call.finished = True
        finally:
            call.closed = True


@dataclass
class Server:
    url: str
    app: Any
    engine: HeldEngine

    @property
    def gate(self) -> Any:
        return self.app.state.gate

    def post(self, path: str, body: Any = None, *, key: str | None = KEY,
             content: bytes | None = None, **kw: Any) -> httpx.Response:
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = content if content is not None else json.dumps(body).encode()
        return httpx.post(self.url + path, content=data, headers=headers, timeout=WAIT, **kw)

    def get(self, path: str, key: str | None = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.url + path, headers=headers, timeout=WAIT)


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.005)


def chat(content: str = "What is belly dance?", **extra: Any) -> dict[str, Any]:
    return {"model": "nest", "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, **extra}


@contextlib.contextmanager
def running(tiny_lm: Any, settings: ServerSettings, retriever: Any = None) -> Iterator[Server]:
    """A real uvicorn server over the tiny engine (``HeldEngine``) with ``settings``, over
    ``retriever`` (default: ``PASSAGES`` in memory)."""
    retriever = InMemoryRetriever(PASSAGES) if retriever is None else retriever
    engine = HeldEngine(NestEngine(tiny_lm, retriever, InMemoryKeyStore(), NestConfig()))
    app = create_app(engine, settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # held open and handed to uvicorn: nobody else can take it
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: srv.started or not thread.is_alive(), "uvicorn started")
    assert srv.started
    try:
        yield Server(f"http://127.0.0.1:{port}", app, engine)
    finally:
        srv.should_exit = True
        thread.join(WAIT)
        sock.close()


def idle(server: Server) -> Iterator[Server]:
    """The server with holds cleared, idle, before and after the test."""
    server.engine.start = server.engine.after_first = None
    until(lambda: server.gate.pending == 0, "the gate is idle")
    yield server
    server.engine.start = server.engine.after_first = None
    until(lambda: server.gate.pending == 0, "the gate is idle after the test")


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# ------------------------------------------------------------------------------ caps, auth, 404


def expect_error(r: httpx.Response, status: int, needle: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"], err
    return err
