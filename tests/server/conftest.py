"""One live ``nest serve`` app on a free loopback port, shared by the server tests.

The corpus is a small part of the shipped sample (three pydoc topics and six Wikipedia leads,
with titles and URLs), ingested with the real embedded model into a temporary store; the
server runs the real engine over it in a uvicorn thread.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

API_KEY = "test-key-123"
MAX_QUEUE = 15  # 16 places: exactly the 16 parallel requests of the concurrency test
MAX_TOKENS_CAP = 128
MAX_BODY = 64 * 1024
PYDOC = ("assert", "while", "if")
WIKI = 6


@dataclass
class LiveServer:
    url: str
    app: Any
    engine: Any
    sources: dict[str, str]  # doc_id -> the source document text as ingested

    @property
    def gate(self) -> Any:
        return self.app.state.gate

    def client(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, **kwargs)


def _sample_subset(root: Path) -> tuple[list[Path], dict[str, str]]:
    from nest_integrations.ingest import sample_corpus_path

    sample = sample_corpus_path()
    docs = root / "docs"
    docs.mkdir()
    texts: dict[str, str] = {}
    for name in PYDOC:
        text = (sample / "pydoc" / f"{name}.txt").read_text()
        (docs / f"{name}.txt").write_text(text)
        texts[f"{name}.txt"] = text
    lines = (sample / "wikipedia.jsonl").read_text().splitlines()[:WIKI]
    (docs / "wiki.jsonl").write_text("\n".join(lines) + "\n")
    for line in lines:
        rec = json.loads(line)
        texts[rec["id"]] = rec["text"]
    return [docs], texts


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory, default_lm: Any) -> Any:
    """The app on http://127.0.0.1:<free port>, with ``--api-key`` and small caps."""
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    from nest_integrations import assembly
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.config import Guards
    from nest_integrations.server import ServerSettings, create_app

    root = tmp_path_factory.mktemp("serve")
    inputs, texts = _sample_subset(root)
    store = root / "store"
    report = IngestPipeline(assembly.open_store("serve", store), default_lm).ingest(inputs)
    assert report.documents == len(PYDOC) + WIKI and not report.issues, report
    engine = assembly.build_engine(
        assembly.EngineSpec.for_store("serve", persist_dir=str(store)), lm=default_lm
    )
    retriever = engine.retriever
    sources = {}
    for p in retriever.iter_passages():  # doc ids as ingested -> the original texts
        name = next((k for k in texts if p.doc_id == k or p.doc_id.endswith("/" + k)), None)
        if name is not None:
            sources[p.doc_id] = texts[name]
    settings = ServerSettings(
        api_key=API_KEY, max_queue=MAX_QUEUE, max_tokens_cap=MAX_TOKENS_CAP,
        default_max_tokens=24, max_body_bytes=MAX_BODY,
    )
    app = create_app(engine, settings)
    # these tests check that citations reach the wire exactly, on short answers: the policy's
    # guards (tests/core/test_topic.py) are off, so every citation is kept and shown (by default
    # citations under 3 words are hidden, and copies from a second document dropped)
    app.state.nest.base_policy = app.state.nest.base_policy.replace(guards=Guards())
    sock = _free_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app, engine, sources)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
