"""The FastAPI app of ``nest serve``: OpenAI-compatible endpoints over one ``NestEngine``.

Endpoints:

- ``POST /v1/chat/completions`` (``stream`` true: server-sent events ending ``data: [DONE]``);
- ``POST /v1/completions``;
- ``GET /v1/models``, ``GET /v1/passages/{passage_id}`` (the playground's source view);
- ``GET /health`` (no auth), ``GET /`` the playground page (static files, no build step).

The app stays thin: ``protocol`` validates requests and shapes responses, ``gate`` runs one
generation at a time with a bounded queue, the engine does the rest.
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

from nest_integrations.assembly import DEFAULT_PRESET
from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.server import protocol as P
from nest_integrations.server.gate import Disconnected, ModelGate, QueueFull
from nest_integrations.types import NestResult, Passage

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
    """

    model_name: str = "nest"
    preset: str = DEFAULT_PRESET
    decoding: str | None = None
    api_key: str | None = None
    max_queue: int = 8
    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    max_body_bytes: int = 1 << 20
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


def create_app(engine: Any, settings: ServerSettings | None = None) -> Any:
    """A FastAPI app serving ``engine`` (a ready ``NestEngine``)."""
    from nest_integrations._optional import require

    fastapi = require("fastapi", extra="server")
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    del fastapi
    s = settings or ServerSettings()
    if s.preset not in PRESETS:
        raise ValueError(f"unknown NEST preset {s.preset!r}: choose one of {sorted(PRESETS)}")
    base_config = NestConfig.from_preset(s.preset)
    _check_key_source(engine, base_config, s.preset)
    if s.decoding is not None:
        _check_decoding(engine, s.decoding)
    limits = P.Limits(max_tokens_cap=s.max_tokens_cap, default_max_tokens=s.default_max_tokens)
    gate = ModelGate(engine, max_queue=s.max_queue)
    cache = _PassageCache()
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        gate.close()

    app = FastAPI(title="nest serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.gate = gate
    app.state.engine = engine
    app.state.settings = s

    # ------------------------------------------------------------------ errors
    @app.exception_handler(P.ApiError)
    async def _api_error(_: Request, exc: P.ApiError) -> Any:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Any:
        err = P.ApiError(exc.status_code, str(exc.detail), code=_code(exc.status_code))
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Any:
        return JSONResponse(P.ApiError(400, str(exc)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _server_error(_: Request, exc: Exception) -> Any:
        LOG.exception("request failed")
        err = P.ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(err.body(), status_code=500)

    class _TicketedStream(StreamingResponse):
        """Frees the queue place however the response ends, even if the body never started
        (a client gone before the headers were sent)."""

        def __init__(self, ticket: Any, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.ticket = ticket

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.ticket.release()

    # ------------------------------------------------------------------ helpers
    def authorize(request: Request) -> None:
        if s.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), s.api_key.encode()
        ):
            raise P.ApiError(
                401,
                "Incorrect API key provided: send 'Authorization: Bearer <key>' with the key "
                "given to `nest serve --api-key`" if header else
                "Missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > s.max_body_bytes:
            raise _too_large(int(declared), s.max_body_bytes)
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > s.max_body_bytes:
                raise _too_large(len(body), s.max_body_bytes)
        try:
            return json.loads(bytes(body))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise P.ApiError(
                400, f"could not parse the JSON body: {exc}", code="invalid_json"
            ) from None

    def check_model(req: P.GenerationRequest) -> None:
        if req.model and req.model != s.model_name:
            raise P.ApiError(
                404,
                f"The model {req.model!r} does not exist: this server serves {s.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def engine_call(req: P.GenerationRequest) -> tuple[dict[str, Any], str, str | None]:
        preset = req.preset or s.preset
        if preset not in PRESETS:
            raise P.invalid("preset", f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
        cfg = base_config if req.preset is None else NestConfig.from_preset(preset)
        changes = {
            k: v
            for k, v in (("temperature", req.temperature), ("top_p", req.top_p), ("seed", req.seed))
            if v is not None
        }
        try:
            cfg = cfg.replace(**changes) if changes else cfg
        except ValueError as exc:
            raise P.invalid(next(iter(changes)), str(exc)) from None
        _check_key_source(engine, cfg, preset, api=True)
        kwargs: dict[str, Any] = dict(
            prompt=req.prompt, max_new_tokens=req.max_tokens, stop=req.stop or None, config=cfg
        )
        decoding = req.decoding or s.decoding or getattr(engine, "decoding", None)
        if decoding is not None:
            _check_decoding(engine, decoding, api=True)
            kwargs["decoding"] = decoding
        return kwargs, preset, decoding

    def admit() -> Any:
        try:
            return gate.admit()
        except QueueFull as exc:
            retry = gate.retry_after()
            raise P.ApiError(
                429,
                f"the server is busy ({exc}); retry in about {retry} s",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry)},
            ) from None

    async def generate(
        request: Request, req: P.GenerationRequest, kwargs: dict[str, Any]
    ) -> NestResult:
        ticket = admit()
        result = None
        try:
            async with contextlib.aclosing(
                gate.run(ticket, kwargs, request.is_disconnected)
            ) as chunks:
                async for chunk in chunks:
                    result = chunk.result or result
        except ValueError as exc:
            raise P.ApiError(400, str(exc)) from None
        except Disconnected:
            raise P.ApiError(499, "client disconnected") from None
        assert result is not None
        cache.add(result.passages)
        return result

    def sse(obj: Any) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    async def stream_events(
        request: Request,
        req: P.GenerationRequest,
        kwargs: dict[str, Any],
        preset: str,
        decoding: str | None,
        chat: bool,
    ) -> Any:
        ticket = admit()
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        created = int(time.time())
        model = s.model_name

        def chunk(text: str | None, annotations: list, finish: str | None = None, **extra: Any):
            if chat:
                delta: dict[str, Any] = {} if text is None else {"content": text}
                if annotations:
                    delta["annotations"] = annotations
                return P.chat_chunk(rid, model, created, delta, finish, **extra)
            return P.completion_chunk(rid, model, created, text or "", annotations, finish, **extra)

        async def events() -> AsyncIterator[bytes]:
            tracker = P.AnnotationStream()
            try:
                if chat:
                    role = {"role": "assistant", "content": ""}
                    yield sse(P.chat_chunk(rid, model, created, role))
                async with contextlib.aclosing(
                    gate.run(ticket, kwargs, request.is_disconnected)
                ) as chunks:
                    async for item in chunks:
                        if item.result is not None:
                            res = item.result
                            cache.add(res.passages)
                            late = tracker.finish(res)
                            if late:
                                yield sse(chunk("", late))
                            ext = P.nest_extension(res, preset, decoding)
                            if req.include_usage:
                                yield sse(chunk(None, [], P.finish_reason(res), nest=ext))
                                yield sse({**chunk(None, []), "choices": [], "usage": P.usage(res)})
                            else:
                                yield sse(
                                    chunk(None, [], P.finish_reason(res),
                                          usage=P.usage(res), nest=ext)
                                )
                        elif item.text:
                            yield sse(chunk(item.text, tracker.step(item.citation)))
            except Disconnected:
                return
            except ValueError as exc:
                yield sse(P.ApiError(400, str(exc)).body())
            except Exception as exc:  # noqa: BLE001 - reported in the stream, then [DONE]
                LOG.exception("generation failed")
                yield sse(P.ApiError(500, f"generation failed: {exc}", type="server_error").body())
            finally:
                ticket.release()  # no-op once the gate released it
            yield b"data: [DONE]\n\n"

        return _TicketedStream(
            ticket,
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # ------------------------------------------------------------------ endpoints
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        authorize(request)
        req = P.parse_chat(await read_json(request), limits)
        check_model(req)
        kwargs, preset, decoding = engine_call(req)
        if req.stream:
            return await stream_events(request, req, kwargs, preset, decoding, chat=True)
        result = await generate(request, req, kwargs)
        ext = P.nest_extension(result, preset, decoding)
        return P.chat_response(P.new_id("chatcmpl"), s.model_name, result, ext)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        authorize(request)
        req = P.parse_completion(await read_json(request), limits)
        check_model(req)
        kwargs, preset, decoding = engine_call(req)
        if req.stream:
            return await stream_events(request, req, kwargs, preset, decoding, chat=False)
        result = await generate(request, req, kwargs)
        ext = P.nest_extension(result, preset, decoding)
        return P.completion_response(P.new_id("cmpl"), s.model_name, result, ext)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        authorize(request)
        return {
            "object": "list",
            "data": [
                {"id": s.model_name, "object": "model", "created": started, "owned_by": "nest"}
            ],
        }

    @app.get("/v1/passages/{passage_id:path}")
    async def passage(request: Request, passage_id: str) -> Any:
        """A passage's text and where it sits in its source document."""
        authorize(request)
        p = cache.items.get(passage_id)
        if p is None and hasattr(engine.retriever, "get_passages"):
            found = engine.retriever.get_passages([passage_id])
            p = found[0] if found else None
        if p is None:
            raise P.ApiError(404, f"no passage {passage_id!r}", param="passage_id",
                             code="not_found")
        return {
            "id": p.id,
            "object": "passage",
            "text": p.text,
            "doc_id": p.doc_id,
            "char_start": p.char_start,
            "char_end": p.char_end,
            "title": p.metadata.get("title") or p.metadata.get("source") or p.doc_id,
            "url": p.metadata.get("url") or None,
            "source": p.metadata.get("source"),
        }

    @app.get("/health")
    async def health() -> Any:
        return {
            "status": "ok",
            "model": s.model_name,
            "preset": s.preset,
            "decoding": s.decoding or "nest",
            "auth": s.api_key is not None,
            "presets": sorted(PRESETS),
            **gate.status(),
        }

    @app.get("/", include_in_schema=False)
    async def index() -> Any:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Any:
        path = STATIC_DIR / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise P.ApiError(404, f"no static file {name!r}", code="not_found")
        return FileResponse(path)

    return app


def _too_large(size: int, cap: int) -> P.ApiError:
    return P.ApiError(
        413,
        f"the request body is {size:,} bytes, over this server's cap of {cap:,} bytes",
        code="request_too_large",
    )


def _code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed"}.get(status, "error")


def _check_key_source(engine: Any, cfg: NestConfig, preset: str, api: bool = False) -> None:
    lm_source = getattr(getattr(engine, "lm", None), "key_source", cfg.key_source)
    if str(cfg.key_source) != str(lm_source):
        msg = (
            f"preset {preset!r} uses key_source={cfg.key_source!r} but this server's model "
            f"computes keys from {lm_source!r}: pick another preset"
        )
        if api:
            raise P.invalid("preset", msg)
        raise ValueError(msg)


def _check_decoding(engine: Any, decoding: str, api: bool = False) -> None:
    """``decoding`` must name a registered method (``nest_integrations.drafters.METHODS``)."""
    from nest_integrations.drafters import METHODS

    if decoding not in METHODS:
        problem = f"unknown decoding {decoding!r}: choose one of {sorted(METHODS)}"
        if api:
            raise P.invalid("decoding", problem)
        raise ValueError(problem)
