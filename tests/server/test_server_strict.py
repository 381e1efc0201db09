"""Issue 62: ``nest serve`` ignores nothing a request names. An unknown collection or an unknown
request option is a 400 in OpenAI's error shape naming it (through the openai client, as a
builder calls it); OpenAI's own fields that the server does not use are still accepted. A real
uvicorn server over the tiny engine and a real Chroma store with two collections (fast)."""

from __future__ import annotations

from typing import Any

import pytest

from nest_integrations.server import ServerSettings
from tests.server.live_server import KEY, PASSAGES, Server, chat, expect_error, running

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(tiny_lm: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Serves the collection 'docs' of a store that also holds 'other'; ``--collection`` is
    left out: the served name is the store's."""
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(tmp_path_factory.mktemp("strict"), "docs")
    for name in ("docs", "other"):
        col = store.client.get_or_create_collection(
            name, embedding_function=store.embedding_function,
            configuration={"hnsw": {"space": "cosine"}},
        )
        col.add(ids=[f"p{i}" for i in range(len(PASSAGES))], documents=PASSAGES,
                metadatas=[{"doc_id": f"d{i}", "title": f"T{i}"} for i in range(len(PASSAGES))])
    settings = ServerSettings(api_key=KEY, max_tokens_cap=32, default_max_tokens=8)
    with running(tiny_lm, settings, retriever=store) as srv:
        yield srv


def _client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def _bad_request(server: Server, **kwargs: Any) -> dict[str, Any]:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        _client(server).chat.completions.create(
            model="nest", messages=[{"role": "user", "content": "What is belly dance?"}],
            max_tokens=4, **kwargs)
    assert err.value.status_code == 400
    body = err.value.body
    assert set(body) == {"message", "type", "param", "code"}, body
    return body


def test_unknown_collection_is_a_400_naming_the_served_and_the_known_ones(server: Server) -> None:
    err = _bad_request(server, extra_body={"collection": "nope"})
    assert err["param"] == "collection" and err["code"] == "collection_not_found"
    assert err["message"].startswith(
        "unknown collection 'nope': this server serves the collection 'docs' (`nest serve "
        "--collection docs`); send 'collection': 'docs' or leave it out. Other collections in "
        "its store: 'other'; serve one with `nest serve --collection NAME`."), err
    assert _bad_request(server, extra_body={"nest": {"collection": "other"}})["param"] == (
        "collection")
    for path, body in (("/v1/completions", {"prompt": "x", "collection": "nope"}),
                       ("/v1/attributions", {"text": "Paris.", "collection": "nope"})):
        assert expect_error(server.post(path, body), 400, "unknown collection 'nope'")[
            "param"] == "collection"
    assert server.gate.pending == 0  # refused before taking a place


def test_unknown_option_is_a_400_naming_it(server: Server) -> None:
    err = _bad_request(server, extra_body={"presett": "paper-ra"})
    assert err["param"] == "presett" and err["code"] == "unknown_parameter"
    assert "Unrecognized request argument supplied: 'presett' (did you mean 'preset'?)" in (
        err["message"])
    err = expect_error(server.post("/v1/completions", {"prompt": "x", "max_token": 3}), 400,
                       "'max_token' (did you mean 'max_tokens'?)")
    assert err["param"] == "max_token"


def test_the_served_collection_and_openai_fields_it_ignores_are_accepted(server: Server) -> None:
    """Naming the served collection, and OpenAI fields the server ignores (penalties, user,
    metadata, store), answer 200; /health names the collection."""
    resp = _client(server).chat.completions.create(
        model="nest", messages=[{"role": "user", "content": "What is belly dance?"}],
        max_tokens=4, user="someone", frequency_penalty=0.5, presence_penalty=0.1,
        metadata={"k": "v"}, store=False, extra_body={"collection": "docs"},
    )
    assert resp.choices[0].message.content
    r = server.post("/v1/chat/completions", chat(nest={"collection": "docs"}, logit_bias={}))
    assert r.status_code == 200, r.text
    assert server.get("/health").json()["collection"] == "docs"
