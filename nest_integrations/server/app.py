"""The FastAPI app of ``nest serve``: OpenAI-compatible endpoints over one ``NestEngine``.

Endpoints:

- ``POST /v1/chat/completions`` (``stream`` true: server-sent events ending ``data: [DONE]``);
- ``POST /v1/completions``;
- ``POST /v1/attributions``: any text (another model's answer) attributed to the corpus or to
  the passages sent, as ``url_citation`` annotations plus the unsupported sentences;
- ``GET /v1/models``, ``GET /v1/passages/{passage_id}`` (the playground's source view);
- ``GET /health`` (no auth), ``GET /`` the playground page (static files, no build step).

The app stays thin: ``protocol`` validates requests and shapes responses, ``gate`` runs one
generation at a time with a bounded queue, ``streaming`` runs a generation whole or as
server-sent events, the engine does the rest (the engine, the config and the method registry
validate key sources, presets and decoding methods; the server only turns their errors into
400s naming the parameter). ``create_app`` builds a ``Server`` (the state
shared by the routes) and registers the route functions below; each reads it from
``request.app.state.nest``.
"""

import contextlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from nest_integrations import assembly, output
from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.policy import AnswerPolicy
from nest_integrations.defaults import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PRESET
from nest_integrations.server import protocol as P
from nest_integrations.server.gate import Disconnected, ModelGate
from nest_integrations.server.streaming import admit, generate, sse, stream_events  # noqa: F401
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"


@dataclass
class ServerSettings:
    """Everything ``nest serve`` can change, with its defaults.

    Attributes:
        model_name: the model id clients send (``/v1/models`` lists it).
        preset: the NestConfig preset used when a request names none.
        decoding: the decoding method used when a request names none (None: the engine's).
        api_key: when set, ``/v1/*`` needs ``Authorization: Bearer <api_key>``.
        max_queue: requests that may wait while one generates; more get 429.
        max_tokens_cap: the largest ``max_tokens`` accepted.
        default_max_tokens: ``max_tokens`` when a request sends none.
        max_body_bytes: the largest request body accepted (413 above).
        collection: the name of the served collection (a request may name it, or none; any
            other is a 400. None: the engine's Chroma collection's name, if any).
        max_attribution_chars: the longest ``text`` ``/v1/attributions`` accepts.
        attribution: the ``AttributionConfig`` of ``/v1/attributions`` (None: the defaults).
    """

    model_name: str = P.DEFAULT_SERVED_MODEL
    preset: str = DEFAULT_PRESET
    decoding: str | None = None
    api_key: str | None = None
    max_queue: int = 8
    max_tokens_cap: int = 1024
    default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_body_bytes: int = 1 << 20
    collection: str | None = None
    max_attribution_chars: int = 20_000
    attribution: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class _PassageCache:
    """Passages of recent answers by id, so the page can show a cited passage's source."""

    def __init__(self, size: int = 4096):
        self.size = size
        self.items: OrderedDict[str, Passage] = OrderedDict()

    def add(self, passages: list[Passage]) -> None:
        for p in passages:
            self.items[p.id] = p
            self.items.move_to_end(p.id)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


@dataclass
class Server:
    """What the routes share: the engine, the settings and what ``create_app`` derived from
    them (validated once, at start-up)."""

    engine: Any
    settings: ServerSettings
    base_config: NestConfig
    base_policy: AnswerPolicy
    limits: P.Limits
    gate: ModelGate
    cache: _PassageCache = field(default_factory=_PassageCache)
    started: int = field(default_factory=lambda: int(time.time()))
    attributor: Any = None  # built by the first /v1/attributions request

    @classmethod
    def start(cls, engine: Any, settings: ServerSettings) -> "Server":
        """Validate ``settings`` against ``engine`` (``ValueError`` before anything is served)."""
        # an unknown preset names the choices; on llama.cpp its key source becomes final_norm
        base = assembly.engine_config(engine, settings.preset)
        engine.check_config(base)  # its key source must be the model's
        if settings.decoding is not None:
            get_method(settings.decoding)
        limits = P.Limits(max_tokens_cap=settings.max_tokens_cap,
                          default_max_tokens=settings.default_max_tokens,
                          max_attribution_chars=settings.max_attribution_chars)
        return cls(engine, settings, base, AnswerPolicy.from_preset(settings.preset), limits,
                   ModelGate(engine, max_queue=settings.max_queue))

    @property
    def collection(self) -> str | None:
        """The served collection's name: ``--collection``, else the engine's Chroma
        collection's (None: the engine's passages have no name)."""
        return self.settings.collection or getattr(_chroma(self.engine.retriever),
                                                   "collection_name", None)

    def collections(self) -> list[str] | None:
        """The collections of the served Chroma store (None: another retriever, or a Chroma
        server that cannot be reached now)."""
        store = _chroma(self.engine.retriever)
        try:
            return store.list_collections() if store is not None else None
        except Exception as exc:  # a server that went away: the error still names the served one
            LOG.warning("could not list the store's collections: %s", exc)
            return None

    @property
    def decoding(self) -> str:
        """The decoding method of a request that names none (the preset's policy decides when
        neither the settings nor the engine name one)."""
        return self.base_policy.method(self.settings.decoding, self.engine.decoding).name

    def attribute(self, req: P.AttributionRequest) -> Any:
        """Attribute ``req.text`` with the engine's model (its tokens), key store and retriever
        (the request's passages replace retrieval). Runs in the gate's worker, one at a time;
        the ``Attributor`` is built on the first request and kept (it caches passage
        embeddings)."""
        if self.attributor is None:
            from nest_integrations.attribution import Attributor

            e = self.engine
            self.attributor = Attributor(self.settings.attribution, lm=e.lm,
                                         key_store=e.key_store, retriever=e.retriever)
        return self.attributor(req.text, req.passages, question=req.question)


def _chroma(retriever: Any) -> Any:
    """The ``ChromaPassageStore`` under ``retriever`` (itself, or a hybrid's dense side)."""
    for r in (retriever, getattr(retriever, "dense", None)):
        if hasattr(r, "list_collections") and hasattr(r, "collection_name"):
            return r
    return None


def get_method(name: str) -> Any:
    """The registered decoding method ``name`` (``drafters.get_method``: a ``ValueError``
    lists the known ones). Imported when first needed: the package stays cheap to import."""
    from nest_integrations.drafters import get_method as registered

    return registered(name)


def create_app(engine: Any, settings: ServerSettings | None = None) -> Any:
    """A FastAPI app serving ``engine`` (a ready ``NestEngine``)."""
    from nest_integrations._optional import require

    require("fastapi", extra="server")
    from fastapi import FastAPI
    from starlette.exceptions import HTTPException as StarletteHTTPException

    server = Server.start(engine, settings or ServerSettings())

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        server.gate.close()

    app = FastAPI(title="nest serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.nest = server
    app.state.gate = server.gate
    app.state.engine = engine
    app.state.settings = server.settings
    app.add_exception_handler(P.ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    for path, methods, route in ROUTES:
        app.add_route(path, route, methods=list(methods), include_in_schema=False)
    return app


# ---------------------------------------------------------------------------------- errors


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


async def api_error(_: Any, exc: P.ApiError) -> Any:
    return _json(exc.body(), exc.status, exc.headers)


async def http_error(_: Any, exc: Any) -> Any:
    err = P.ApiError(exc.status_code, str(exc.detail), code=_code(exc.status_code))
    return _json(err.body(), exc.status_code)


async def server_error(_: Any, exc: Exception) -> Any:
    LOG.exception("request failed")
    err = P.ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
    return _json(err.body(), 500)


# ---------------------------------------------------------------------------------- requests


def authorize(server: Server, request: Any) -> None:
    key = server.settings.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise P.ApiError(
            401,
            "Incorrect API key provided: send 'Authorization: Bearer <key>' with the key "
            "given to `nest serve --api-key`" if header else
            "Missing API key: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
        )


async def read_json(server: Server, request: Any) -> Any:
    cap = server.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        raise _too_large(int(declared), cap)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > cap:
            raise _too_large(len(body), cap)
    try:
        return json.loads(bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise P.ApiError(400, f"could not parse the JSON body: {exc}", code="invalid_json") from None


def check_model(server: Server, req: P.GenerationRequest) -> None:
    name = server.settings.model_name
    if req.model and req.model != name:
        raise P.ApiError(
            404,
            f"The model {req.model!r} does not exist: this server serves {name!r}",
            param="model",
            code="model_not_found",
        )


def check_collection(server: Server, name: str | None) -> None:
    """A request's ``collection`` must be the served one (``nest serve --collection``): any
    other is a 400 naming the served collection and the others in its store, never an answer
    from the wrong corpus."""
    served = server.collection
    if name is None or name == served:
        return
    if served is None:
        raise P.ApiError(400, f"unknown collection {name!r}: this server serves one unnamed "
                         "corpus; leave 'collection' out", param="collection",
                         code="collection_not_found")
    listed = server.collections()
    others = [c for c in listed or () if c != served]
    if listed is None:
        more = ""
    elif others:
        more = (f" Other collections in its store: {', '.join(repr(c) for c in others)}; serve "
                "one with `nest serve --collection NAME`.")
    else:
        more = (f" Its store has no other collection: create one with `nest ingest PATH... "
                f"--collection {name}`, then serve it with `nest serve --collection {name}`.")
    raise P.ApiError(
        400,
        f"unknown collection {name!r}: this server serves the collection {served!r} (`nest "
        f"serve --collection {served}`); send 'collection': {served!r} or leave it out.{more}",
        param="collection", code="collection_not_found",
    )


def engine_call(server: Server, req: P.GenerationRequest) -> tuple[dict[str, Any], str, str]:
    """``engine.stream`` arguments for ``req``, its preset and decoding method; what the config,
    the engine and the method registry reject is a 400 naming the parameter."""
    preset = req.preset or server.settings.preset
    try:
        cfg = (server.base_config if req.preset is None
               else assembly.engine_config(server.engine, preset))
        server.engine.check_config(cfg)
        policy = server.base_policy if req.preset is None else AnswerPolicy.from_preset(preset)
    except ValueError as exc:
        raise P.invalid("preset", str(exc)) from None
    changes = {
        k: v
        for k, v in (("temperature", req.temperature), ("top_p", req.top_p), ("seed", req.seed))
        if v is not None
    }
    try:
        cfg = cfg.replace(**changes) if changes else cfg
    except ValueError as exc:
        raise P.invalid(next(iter(changes)), str(exc)) from None
    try:
        decoding = policy.method(req.decoding, server.settings.decoding,
                                 server.engine.decoding).name
    except ValueError as exc:
        raise P.invalid("decoding", str(exc)) from None
    # a method the request or the server names is passed on; none named, the engine's policy
    # decides per request (evidence first, raw text's method), as for every other edge
    kwargs: dict[str, Any] = dict(
        prompt=req.prompt, max_new_tokens=req.max_tokens, stop=req.stop or None, config=cfg,
        policy=policy, decoding=req.decoding or server.settings.decoding,
    )
    return kwargs, preset, decoding

# ---------------------------------------------------------------------------------- routes


async def _completion(request: Any, chat: bool) -> Any:
    server: Server = request.app.state.nest
    authorize(server, request)
    parse = P.parse_chat if chat else P.parse_completion
    req = parse(await read_json(server, request), server.limits)
    check_model(server, req)
    check_collection(server, req.collection)
    kwargs, preset, decoding = engine_call(server, req)
    if req.stream:
        return stream_events(server, request, req, kwargs, preset, decoding, chat=chat)
    result = await generate(server, request, kwargs)
    ext = P.nest_extension(result, preset, decoding)
    respond = P.chat_response if chat else P.completion_response
    return _json(respond(P.new_id("chatcmpl" if chat else "cmpl"), server.settings.model_name,
                         result, ext))


async def chat_completions(request: Any) -> Any:
    """``POST /v1/chat/completions``."""
    return await _completion(request, chat=True)


async def completions(request: Any) -> Any:
    """``POST /v1/completions``."""
    return await _completion(request, chat=False)


async def attributions(request: Any) -> Any:
    """``POST /v1/attributions``: ``{text, question?, collection?, passages?}`` -> the text's
    citations as ``url_citation`` annotations, plus its unsupported sentences. Runs in the
    model's queue (it uses the model's hidden states): 429 when full, like generations."""
    server: Server = request.app.state.nest
    authorize(server, request)
    req = P.parse_attribution(await read_json(server, request), server.limits)
    check_collection(server, req.collection)
    if req.passages is None and server.engine.retriever is None:
        raise P.invalid("passages", "this server has no corpus: send the 'passages' to "
                        "attribute the text against")
    ticket = admit(server)

    def work() -> Any:
        return [server.attribute(req)]

    try:
        async with contextlib.aclosing(
            server.gate.run(ticket, {}, request.is_disconnected, work=work)
        ) as items:
            found = [a async for a in items]
    except ValueError as exc:
        raise P.ApiError(400, str(exc)) from None
    except Disconnected:
        raise P.ApiError(499, "client disconnected") from None
    attribution = found[0]
    server.cache.add(list(attribution.passages))
    return _json(P.attribution_response(P.new_id("attr"), attribution))


async def models(request: Any) -> Any:
    """``GET /v1/models``: the one served model."""
    server: Server = request.app.state.nest
    authorize(server, request)
    name = server.settings.model_name
    return _json({
        "object": "list",
        "data": [{"id": name, "object": "model", "created": server.started, "owned_by": "nest"}],
    })


async def passage(request: Any) -> Any:
    """``GET /v1/passages/{passage_id}``: a passage's text and where it sits in its source."""
    server: Server = request.app.state.nest
    authorize(server, request)
    passage_id = request.path_params["passage_id"]
    p = server.cache.items.get(passage_id)
    retriever = server.engine.retriever
    if p is None and hasattr(retriever, "get_passages"):
        found = retriever.get_passages([passage_id])
        p = found[0] if found else None
    if p is None:
        raise P.ApiError(404, f"no passage {passage_id!r}", param="passage_id", code="not_found")
    return _json({
        "id": p.id,
        "object": "passage",
        "text": p.text,
        "doc_id": p.doc_id,
        "char_start": p.char_start,
        "char_end": p.char_end,
        "title": p.metadata.get("title") or p.metadata.get("source") or p.doc_id,
        "url": output.document_url(p.metadata),
        "source": p.metadata.get("source"),
    })


async def health(request: Any) -> Any:
    """``GET /health`` (no auth): the model, the defaults and the queue."""
    server: Server = request.app.state.nest
    s = server.settings
    return _json({
        "status": "ok",
        "model": s.model_name,
        "preset": s.preset,
        "decoding": server.decoding,
        "collection": server.collection,
        "auth": s.api_key is not None,
        "presets": sorted(PRESETS),
        **server.gate.status(),
    })


async def index(_: Any) -> Any:
    """``GET /``: the playground page."""
    from starlette.responses import FileResponse

    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


async def static(request: Any) -> Any:
    """``GET /static/{name}``: the page's files."""
    from starlette.responses import FileResponse

    name = request.path_params["name"]
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise P.ApiError(404, f"no static file {name!r}", code="not_found")
    return FileResponse(path)


#: ``(path, methods, route)`` of every endpoint.
ROUTES = (
    ("/v1/chat/completions", ("POST",), chat_completions),
    ("/v1/completions", ("POST",), completions),
    ("/v1/attributions", ("POST",), attributions),
    ("/v1/models", ("GET",), models),
    ("/v1/passages/{passage_id:path}", ("GET",), passage),
    ("/health", ("GET",), health),
    ("/", ("GET",), index),
    ("/static/{name}", ("GET",), static),
)


def _too_large(size: int, cap: int) -> P.ApiError:
    return P.ApiError(
        413,
        f"the request body is {size:,} bytes, over this server's cap of {cap:,} bytes",
        code="request_too_large",
    )


def _code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed"}.get(status, "error")
