"""The OpenAI wire format: request validation and response bodies (no web framework here).

Requests are plain dicts parsed from JSON; ``parse_chat`` / ``parse_completion`` check them the
way OpenAI does (an unknown field, or an invalid value, raises ``ApiError`` with a 400 naming it,
in OpenAI's error shape; every field of OpenAI's API is accepted: ``CHAT_FIELDS`` /
``COMPLETION_FIELDS`` say which are used, ignored, or refused when set) and return a
``GenerationRequest`` for the engine. Responses are built
from the engine's ``Citation`` / ``NestResult`` by ``server.responses`` (re-exported here).

Citations use the shape OpenAI's clients already parse (``message.annotations`` entries of type
``url_citation``), with NEST's source side as extra keys on the same object::

    {"type": "url_citation",
     "url_citation": {"start_index": 12, "end_index": 57, "url": "...", "title": "...",
                      "cited_text": "...", "doc_id": "...", "passage_id": "...",
                      "source": "...", "source_start": 104, "source_end": 149,
                      "passage_start": 104, "passage_end": 149, "n_tokens": 9,
                      "kind": "copy", "copied": true}}

The keys are ``nest_integrations.output.citation_fields``' own names (the LangChain and
LlamaIndex payloads carry the same values), with ``url``/``title`` never empty
(``output.citation_link``/``citation_label``: url or title, else the source path, else the
doc id). ``usage`` is ``output.usage`` and the ``nest`` extension's ``stats`` is
``output.stats``.

``answer[start_index:end_index] == cited_text == source[source_start:source_end]`` (offsets
count Unicode code points, as Python strings do).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from nest_integrations.defaults import DEFAULT_MAX_NEW_TOKENS
from nest_integrations.server.responses import (  # noqa: F401  (re-exported: one import)
    AnnotationStream,
    annotation,
    attribution_response,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    envelope,
    finish_reason,
    merge_annotations,
    nest_extension,
    new_id,
    usage,
)
from nest_integrations.types import Passage

#: The model id clients send and ``/v1/models`` lists, unless ``--served-model-name`` says.
DEFAULT_SERVED_MODEL = "nest"

#: Roles accepted in ``messages`` (``developer`` is OpenAI's newer name for ``system``).
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


#: The request fields of OpenAI's chat completions API (openai-python 3.x
#: ``CompletionCreateParams``), by what this server does with them. ``used``: read;
#: ``ignored``: accepted and ignored (they tune a hosted service: penalties, caching, storage,
#: the end user's id...); ``refused``: accepted when absent, false, empty or ``null``, else a 400
#: naming them (a client would silently miss the feature). Any other field is a 400.
CHAT_FIELDS = {
    "used": ("messages", "model", "max_tokens", "max_completion_tokens", "n", "stream",
             "stream_options", "stop", "temperature", "top_p", "seed", "response_format"),
    "ignored": ("frequency_penalty", "presence_penalty", "logit_bias", "user", "metadata",
                "store", "service_tier", "parallel_tool_calls", "tool_choice", "top_logprobs",
                "reasoning_effort", "verbosity", "prompt_cache_key", "prompt_cache_options",
                "prompt_cache_retention", "safety_identifier", "modalities"),
    "refused": ("tools", "functions", "function_call", "logprobs", "audio", "prediction",
                "web_search_options", "moderation"),
}
#: The same for ``/v1/completions`` (the legacy API's fields).
COMPLETION_FIELDS = {
    "used": ("prompt", "model", "max_tokens", "n", "stream", "stream_options", "stop",
             "temperature", "top_p", "seed"),
    "ignored": ("frequency_penalty", "presence_penalty", "logit_bias", "user"),
    "refused": ("echo", "logprobs", "best_of", "suffix"),
}
#: NEST's own request options, top level (the openai client's ``extra_body``) or inside a
#: ``nest`` object.
EXTENSIONS = ("preset", "decoding", "collection")


class ApiError(Exception):
    """An error answered in OpenAI's JSON shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    """One validated request: what to pass to ``engine.stream`` and how to answer."""

    prompt: str | list[dict[str, str]]
    max_tokens: int
    stream: bool = False
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    preset: str | None = None
    decoding: str | None = None
    collection: str | None = None
    include_usage: bool = False
    model: str = ""


@dataclass(frozen=True)
class Limits:
    """Server-side caps checked at validation time."""

    max_tokens_cap: int = 1024
    default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS
    #: The longest ``text`` ``/v1/attributions`` accepts (characters), and most ``passages``.
    max_attribution_chars: int = 20_000
    max_attribution_passages: int = 64


@dataclass
class AttributionRequest:
    """One validated ``/v1/attributions`` body: the text, its question, and the passages
    (``None``: retrieve from the server's corpus, or from ``collection``)."""

    text: str
    question: str | None = None
    collection: str | None = None
    passages: list[Passage] | None = None


# --------------------------------------------------------------------------------- requests


def parse_chat(body: Any, limits: Limits) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` body."""
    raw = _required(_object(body), "messages")
    _known_fields(body, CHAT_FIELDS, "OpenAI's chat/completions")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty array of {role, content} objects")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise invalid("messages", "'messages' must contain at least one message with role 'user'")
    if not users[-1]["content"].strip():
        raise invalid(
            f"messages[{messages.index(users[-1])}].content",
            "the last user message has empty content: send the question as non-empty text",
        )
    _unsupported(body)
    req = _common(body, limits, max_keys=("max_completion_tokens", "max_tokens"))
    req.prompt = messages
    return req


def parse_completion(body: Any, limits: Limits) -> GenerationRequest:
    """Validate a ``/v1/completions`` body (one prompt string)."""
    prompt = _required(_object(body), "prompt")
    _known_fields(body, COMPLETION_FIELDS, "OpenAI's completions")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt", "'prompt' must be a string (one prompt per request)")
    if not prompt.strip():
        raise invalid("prompt", "'prompt' is empty: send non-empty text")
    if body.get("echo"):
        raise invalid("echo", "'echo' is not supported")
    if body.get("logprobs"):
        raise invalid("logprobs", "'logprobs' is not supported by this server")
    if body.get("best_of") not in (None, 1):
        raise invalid("best_of", "only best_of=1 is supported")
    if body.get("suffix"):
        raise invalid("suffix", "'suffix' (insertion) is not supported by this server")
    req = _common(body, limits, max_keys=("max_tokens",))
    req.prompt = prompt
    return req


def parse_attribution(body: Any, limits: Limits) -> AttributionRequest:
    """Validate a ``/v1/attributions`` body: ``text`` (required), ``question``, ``collection``
    and ``passages`` (strings, or objects with ``text`` and optional ``id``, ``doc_id``,
    ``title``, ``url``, ``source``, ``char_start``/``char_end``)."""
    text = _required(_object(body), "text")
    _known_fields(body, {"used": ("text", "question", "passages")}, "the attributions")
    if not isinstance(text, str):
        raise invalid("text", "'text' must be a string: the answer to attribute")
    if not text.strip():
        raise invalid("text", "'text' is empty: send the answer to attribute")
    cap = limits.max_attribution_chars
    if len(text) > cap:
        raise invalid(
            "text", f"'text' is {len(text):,} characters, over this server's cap of {cap:,}",
            code="text_too_long",
        )
    question = body.get("question")
    if question is not None and not isinstance(question, str):
        raise invalid("question", "'question' must be a string")
    collection = _name(body, "collection")
    passages = None
    if body.get("passages") is not None:
        if collection is not None:
            raise invalid(
                "passages", "send 'passages' or 'collection', not both: 'passages' replaces "
                "retrieval"
            )
        passages = _passages(body["passages"], limits)
    return AttributionRequest(text=text, question=question or None, collection=collection,
                              passages=passages)


#: Keys of a request passage object, besides ``text`` (kept as the passage's metadata).
PASSAGE_KEYS = ("id", "doc_id", "title", "url", "source", "char_start", "char_end")


def _passages(raw: Any, limits: Limits) -> list[Passage]:
    from nest_integrations.integrations._common import passage_from_record

    if not isinstance(raw, list) or not raw:
        raise invalid("passages", "'passages' must be a non-empty array of strings or objects "
                      "with 'text'")
    if len(raw) > limits.max_attribution_passages:
        raise invalid("passages", f"'passages' has {len(raw)} items, over this server's cap "
                      f"of {limits.max_attribution_passages}")
    out = []
    for i, item in enumerate(raw):
        where = f"passages[{i}]"
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not (
            item["text"].strip()
        ):
            raise invalid(where, f"{where} must be a non-empty string or an object with a "
                          "non-empty 'text'")
        meta = {k: item[k] for k in PASSAGE_KEYS if item.get(k) is not None and k != "id"}
        pid = item.get("id")
        if pid is not None and not isinstance(pid, str):
            raise invalid(f"{where}.id", f"{where}.id must be a string")
        out.append(passage_from_record(item["text"], meta, pid))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise invalid("passages", "passage ids must be unique (two passages have the same id "
                      "or the same text)")
    return out


def _known_fields(body: dict[str, Any], fields: Mapping[str, Sequence[str]], api: str) -> None:
    """A 400 naming the first field that is neither the API's (``fields``) nor one of NEST's
    ``EXTENSIONS`` (the OpenAI API answers an unknown parameter the same way), with the closest
    known name; inside a ``nest`` object only the ``EXTENSIONS`` are known."""
    known = list(dict.fromkeys([k for names in fields.values() for k in names]
                               + [*EXTENSIONS, "nest"]))
    for key in body:
        if key not in known:
            raise _unknown(key, key, known, api)
    nest = body.get("nest")
    if nest is None:
        return
    if not isinstance(nest, dict):
        raise invalid("nest", "'nest' must be an object of NEST options: "
                      + ", ".join(repr(k) for k in EXTENSIONS))
    for key in nest:
        if key not in EXTENSIONS:
            raise _unknown(f"nest.{key}", key, list(EXTENSIONS), api)


def _unknown(param: str, key: str, known: Sequence[str], api: str) -> ApiError:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ApiError(
        400,
        f"Unrecognized request argument supplied: {param!r}{hint}. This server takes {api} "
        "fields and NEST's " + ", ".join(repr(k) for k in EXTENSIONS)
        + " (top level, e.g. the openai client's extra_body, or inside 'nest'); see "
        "docs/server.md",
        param=param, code="unknown_parameter",
    )


def _unsupported(body: dict[str, Any]) -> None:
    """Features a client would silently miss if ignored: refuse them by name."""
    if body.get("tools") or body.get("functions"):
        raise invalid("tools", "tools / function calling are not supported by this server")
    if body.get("function_call") not in (None, "", "none", "auto"):
        raise invalid("function_call", "function calling is not supported by this server")
    for key, what in (("logprobs", "'logprobs'"), ("audio", "audio output"),
                      ("prediction", "predicted outputs ('prediction')"),
                      ("web_search_options", "web search"), ("moderation", "'moderation'")):
        if body.get(key):
            raise invalid(key, f"{what} is not supported by this server")
    modalities = body.get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise invalid("modalities", "only the 'text' modality is supported by this server")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise invalid(
            "response_format", f"response_format type {fmt.get('type')!r} is not supported "
            "(only 'text')"
        )


def _required(body: dict[str, Any], key: str) -> Any:
    if key not in body:
        raise ApiError(
            400, f"missing required parameter: '{key}'", param=key,
            code="missing_required_parameter",
        )
    return body[key]


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def _message(m: Any, i: int) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise invalid(where, f"{where} must be an object with 'role' and 'content'")
    role = m.get("role")
    if role not in ROLES:
        raise invalid(
            f"{where}.role", f"{where}.role={role!r} is not supported: use one of {sorted(ROLES)}"
        )
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text is supported
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str
            ):
                raise invalid(
                    f"{where}.content[{j}]",
                    f"{where}.content[{j}] is not a text part: only "
                    '{"type": "text", "text": ...} parts are supported',
                )
            texts.append(part["text"])
        content = "".join(texts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise invalid(f"{where}.content", f"{where}.content must be a string or text parts")
    return {"role": ROLES[role], "content": content}


def _common(body: dict[str, Any], limits: Limits, max_keys: Sequence[str]) -> GenerationRequest:
    """Options shared by chat and completions (the fields were checked by ``_known_fields``)."""
    model = body.get("model", "")
    if not isinstance(model, str):
        raise invalid("model", "'model' must be a string")
    max_tokens = limits.default_max_tokens
    for key in max_keys:
        if body.get(key) is not None:
            max_tokens = _int(body, key)
            if max_tokens < 1:
                raise invalid(key, f"'{key}' must be >= 1 (got {max_tokens})")
            if max_tokens > limits.max_tokens_cap:
                raise invalid(
                    key,
                    f"'{key}'={max_tokens} is over this server's cap of "
                    f"{limits.max_tokens_cap} tokens",
                )
            break
    n = body.get("n")
    if n is not None and (_int(body, "n") != 1):
        raise invalid("n", "only n=1 is supported")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("stream", "'stream' must be a boolean")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise invalid("stream_options", "'stream_options' must be an object")
        include_usage = bool(opts.get("include_usage", False))
    return GenerationRequest(
        prompt="",
        max_tokens=max_tokens,
        stream=stream,
        stop=_stop(body.get("stop")),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_top_p(body),
        seed=_int(body, "seed") if body.get("seed") is not None else None,
        preset=_name(body, "preset"),
        decoding=_name(body, "decoding"),
        collection=_name(body, "collection"),
        include_usage=include_usage,
        model=model,
    )


def _int(body: dict[str, Any], key: str) -> int:
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise invalid(key, f"'{key}' must be an integer (got {v!r})")
    return v


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid(key, f"'{key}' must be a number (got {v!r})")
    if not lo <= v <= hi:
        raise invalid(key, f"'{key}'={v} is out of range: use a number in [{lo:g}, {hi:g}]")
    return float(v)


def _top_p(body: dict[str, Any]) -> float | None:
    v = _number(body, "top_p", 0.0, 1.0)
    if v is not None and v <= 0:
        raise invalid("top_p", "'top_p' must be in (0, 1]")
    return v


def _stop(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise invalid("stop", "'stop' must be a string or an array of strings")
    if len(v) > 4:
        raise invalid("stop", "'stop' takes at most 4 sequences")
    return [s for s in v if s]


def _name(body: dict[str, Any], key: str) -> str | None:
    """An extension option, top level (``extra_body``) or inside a ``nest`` object."""
    v = body.get(key)
    nest = body.get("nest")
    if v is None and isinstance(nest, dict):
        v = nest.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise invalid(key, f"'{key}' must be a non-empty string")
    return v

