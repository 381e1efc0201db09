"""The OpenAI wire format's response bodies and stream chunks, built from the engine's
``Citation`` / ``NestResult`` (the annotation shape is described in ``server.protocol``, which
re-exports every name here)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Mapping, Sequence

from nest_integrations import output
from nest_integrations.types import Citation, NestResult


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def annotation(c: Citation) -> dict[str, Any]:
    """A NEST citation as an OpenAI ``url_citation`` annotation: ``output.citation_fields``
    under their own names, ``url``/``title`` filled in (never empty)."""
    fields = output.citation_fields(c)
    fields["url"], fields["title"] = output.citation_link(fields), output.citation_label(fields)
    return {"type": "url_citation", "url_citation": fields}


#: The token counts of a response (``output.usage``: OpenAI's own names).
usage = output.usage


def nest_extension(result: NestResult, preset: str, decoding: str | None) -> dict[str, Any]:
    """The one extension field: NEST's stats (``output.stats``), the preset and the decoding
    method."""
    return {"preset": preset, "decoding": result.stats.decoding or decoding,
            "stats": output.stats(result)}


def finish_reason(result: NestResult) -> str:
    return "length" if result.stats.finish_reason == "length" else "stop"


def envelope(
    rid: str, kind: str, created: int, model: str, choice: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The body every response and chunk shares: id, ``object`` kind, creation time, model, the
    one choice, then ``extra`` (usage, the ``nest`` extension)."""
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice],
            **extra}


def chat_response(
    rid: str, model: str, result: NestResult, ext: dict[str, Any]
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": result.text,
            "refusal": None,
            "annotations": [annotation(c) for c in result.citations],
        },
        "logprobs": None,
        "finish_reason": finish_reason(result),
    }
    return envelope(rid, "chat.completion", int(time.time()), model, choice,
                    usage=usage(result), nest=ext)


def completion_response(
    rid: str, model: str, result: NestResult, ext: dict[str, Any]
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": result.text,
        "logprobs": None,
        "finish_reason": finish_reason(result),
        "annotations": [annotation(c) for c in result.citations],
    }
    return envelope(rid, "text_completion", int(time.time()), model, choice,
                    usage=usage(result), nest=ext)


def attribution_response(rid: str, attribution: Any) -> dict[str, Any]:
    """The ``/v1/attributions`` body: the text, one ``url_citation`` annotation per citation
    (``annotation``: the chat completions' shape; a ``"support"`` citation's ``cited_text`` is
    the passage sentence and ``start_index``/``end_index`` span the answer sentence it
    supports), the unsupported sentences and the sentences (``output.attribution_fields``)."""
    fields = output.attribution_fields(attribution)
    return {
        "id": rid,
        "object": "attribution",
        "created": int(time.time()),
        "text": fields["text"],
        "annotations": [annotation(c) for c in attribution.citations],
        "unsupported": fields["unsupported"],
        "sentences": fields["sentences"],
    }


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return envelope(rid, "chat.completion.chunk", created, model, choice, **extra)


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    annotations: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if annotations:
        choice["annotations"] = annotations
    return envelope(rid, "text_completion", created, model, choice, **extra)


class AnnotationStream:
    """Which annotations a streamed chunk carries: ``output.CitationStream`` in ``"growing"``
    mode, as annotations.

    A copied delta carries its citation *as known so far*; a run that keeps growing is sent
    again with the same ``start_index`` and ``passage_id`` and a larger ``end_index``, so a
    client keeps the last annotation per ``(passage_id, start_index)``. ``finish`` returns
    what the final result holds and was not sent in that final form, so the merged stream
    equals the non-streamed ``annotations`` exactly.
    """

    def __init__(self) -> None:
        self.citations = output.CitationStream("growing")

    def step(
        self, citation: Citation | None, support: Sequence[Citation] = ()
    ) -> list[dict[str, Any]]:
        return [annotation(c) for c in self.citations.step(citation, support)]

    def finish(self, result: NestResult) -> list[dict[str, Any]]:
        return [annotation(c) for c in self.citations.finish(result)]


def merge_annotations(stream: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Client side of ``AnnotationStream``: the last annotation per (passage, start, kind), in
    the non-streamed response's order, by answer offsets (start, then end: a support citation
    may start where a copied span of its passage does, and the shorter comes first)."""
    merged: dict[tuple[str, int, Any], dict[str, Any]] = {}
    for a in stream:
        u = a["url_citation"]
        merged[(u["passage_id"], u["start_index"], u.get("kind"))] = dict(a)
    return sorted(merged.values(),
                  key=lambda a: (a["url_citation"]["start_index"], a["url_citation"]["end_index"]))
