"""Generation behind ``nest serve``'s routes: a place in the model's queue (``admit``: 429 when
full), a whole answer (``generate``) or its server-sent events (``stream_events``: chunks with
their growing annotations, then ``data: [DONE]``). ``server.app`` re-exports every name here."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from nest_integrations.server import protocol as P
from nest_integrations.server.gate import Disconnected, QueueFull
from nest_integrations.types import NestResult

if TYPE_CHECKING:
    from nest_integrations.server.app import Server

LOG = logging.getLogger(__name__)


def admit(server: Server) -> Any:
    try:
        return server.gate.admit()
    except QueueFull as exc:
        retry = server.gate.retry_after()
        raise P.ApiError(
            429,
            f"the server is busy ({exc}); retry in about {retry} s",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry)},
        ) from None


async def generate(server: Server, request: Any, kwargs: dict[str, Any]) -> NestResult:
    ticket = admit(server)
    result = None
    try:
        async with contextlib.aclosing(
            server.gate.run(ticket, kwargs, request.is_disconnected)
        ) as chunks:
            async for chunk in chunks:
                result = chunk.result or result
    except ValueError as exc:
        raise P.ApiError(400, str(exc)) from None
    except Disconnected:
        raise P.ApiError(499, "client disconnected") from None
    assert result is not None
    server.cache.add(result.passages)
    return result


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _ticketed_stream(ticket: Any, body: AsyncIterator[bytes]) -> Any:
    """A server-sent event response that frees the queue place however it ends, even if the
    body never started (a client gone before the headers were sent)."""
    from starlette.responses import StreamingResponse

    class TicketedStream(StreamingResponse):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                ticket.release()

    return TicketedStream(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def stream_events(
    server: Server,
    request: Any,
    req: P.GenerationRequest,
    kwargs: dict[str, Any],
    preset: str,
    decoding: str,
    chat: bool,
) -> Any:
    ticket = admit(server)
    rid = P.new_id("chatcmpl" if chat else "cmpl")
    created = int(time.time())
    model = server.settings.model_name

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
                yield sse(P.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
            async with contextlib.aclosing(
                server.gate.run(ticket, kwargs, request.is_disconnected)
            ) as chunks:
                async for item in chunks:
                    if item.result is not None:
                        res = item.result
                        server.cache.add(res.passages)
                        late = tracker.finish(res)
                        if late:
                            yield sse(chunk("", late))
                        ext = P.nest_extension(res, preset, decoding)
                        if req.include_usage:
                            yield sse(chunk(None, [], P.finish_reason(res), nest=ext))
                            yield sse({**chunk(None, []), "choices": [], "usage": P.usage(res)})
                        else:
                            yield sse(
                                chunk(None, [], P.finish_reason(res), usage=P.usage(res), nest=ext)
                            )
                    elif item.text:
                        yield sse(chunk(item.text, tracker.step(item.citation, item.support)))
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

    return _ticketed_stream(ticket, events())
