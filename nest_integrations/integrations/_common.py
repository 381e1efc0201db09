"""Shared by the framework adapters: the citation payload both frameworks report, the record ->
Passage mapping, and chat-message normalisation. Framework-free: imports no LangChain/LlamaIndex.

Adapters convert in (framework documents/nodes -> ``Passage``), call the engine, and convert out
(``Citation`` -> the framework's native slot). The payload is a rename of
``nest_integrations.output.citation_fields`` (the one citation dict, shared with the server):
answer offsets and text under their own names, the source side in ``extras`` with the offsets
renamed ``*_char`` (``EXTRAS_KEYS``, the names the adapters document). Citations of every
``kind`` are handled alike: ``"copy"`` (NEST copied the span) and ``"verbatim"`` (a lossless
method generated text that matches a passage verbatim: provenance, not copying);
``extras["kind"]`` says which, ``extras["copied"]`` is True only for copies.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from nest_integrations import output
from nest_integrations.types import Citation, Passage

#: Metadata keys that carry NEST's own bookkeeping (the rest is the user's metadata).
RESERVED_KEYS = ("doc_id", "passage_id", "char_start", "char_end", "chunk_index")


def passage_from_record(
    text: str,
    metadata: Mapping[str, Any] | None = None,
    record_id: str | None = None,
    score: float | None = None,
) -> Passage:
    """A ``Passage`` from a framework record (LangChain Document, LlamaIndex node, Chroma row).

    The passage id is ``metadata["passage_id"]``, else the record id, else a hash of the text;
    the doc id is ``metadata["doc_id"]``, else ``metadata["source"]``, else the passage id.
    ``char_start``/``char_end`` are kept only when they are ints that span exactly the text.
    """
    meta = dict(metadata or {})
    pid = str(meta.get("passage_id") or record_id or hashlib.sha1(text.encode()).hexdigest()[:20])
    doc_id = str(meta.get("doc_id") or meta.get("source") or pid)
    start, end = meta.get("char_start"), meta.get("char_end")
    if not (isinstance(start, int) and isinstance(end, int) and end - start == len(text)):
        start = end = None
    return Passage(
        id=pid, text=text, doc_id=doc_id, score=score, char_start=start, char_end=end,
        metadata=meta,
    )


#: ``output.citation_fields`` key -> key in the payload's ``extras``.
EXTRAS_KEYS = {
    "doc_id": "doc_id",
    "passage_id": "passage_id",
    "source": "source",
    "source_start": "source_start_char",
    "source_end": "source_end_char",
    "passage_start": "passage_start_char",
    "passage_end": "passage_end_char",
    "n_tokens": "n_tokens",
    "kind": "kind",
    "copied": "copied",
    "score": "score",
    "page": "page",
}
#: ``output.citation_fields`` key -> top-level payload key (``title``/``url`` only when known).
PAYLOAD_KEYS = {
    "passage_id": "id",
    "start_index": "start_index",
    "end_index": "end_index",
    "cited_text": "cited_text",
}


def citation_extras(c: Citation) -> dict[str, Any]:
    """Source-side fields that the frameworks' citation types have no slot for."""
    return output.renamed(output.citation_fields(c), EXTRAS_KEYS)


def citation_payload(c: Citation) -> dict[str, Any]:
    """The citation as a LangChain-style dict (``type="citation"``, response-text offsets,
    ``cited_text``, ``title``/``url`` when known, source offsets in ``extras``)."""
    fields = output.citation_fields(c)
    out: dict[str, Any] = {"type": "citation", **output.renamed(fields, PAYLOAD_KEYS),
                           "extras": output.renamed(fields, EXTRAS_KEYS)}
    out.update((key, fields[key]) for key in ("title", "url") if fields[key])
    return out


#: NEST's statistics for ``response_metadata`` / ``additional_kwargs`` (``output.stats``).
stats_payload = output.stats


def engine_kwargs(
    kwargs: Mapping[str, Any], *, max_new_tokens: int, stop: Any, config: Any, passages: Any
) -> dict[str, Any]:
    """``NestEngine.generate`` arguments of one adapter call: what the adapter resolved (token
    budget, stop strings, config, passages), the call's retrieval ``query``, and its
    ``decoding``/``drafter_options`` when given (else the engine's)."""
    out = {"max_new_tokens": max_new_tokens, "stop": stop, "config": config,
           "passages": passages, "query": kwargs.get("query")}
    out.update((k, kwargs[k]) for k in ("decoding", "drafter_options") if kwargs.get(k) is not None)
    return out


def messages_to_dicts(messages: Any) -> list[dict[str, str]]:
    """Normalise ``(role, content)`` pairs / dicts to ``{"role", "content"}`` dicts with the
    roles chat templates expect (system, user, assistant)."""
    roles = {"human": "user", "ai": "assistant", "chatbot": "assistant", "model": "assistant"}
    out = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, Mapping) else m
        out.append({"role": roles.get(str(role), str(role)), "content": str(content)})
    return out
