"""Shared by the framework adapters (and a server): one citation format, one record -> Passage
mapping, and one streaming citation tracker. Framework-free: imports no LangChain/LlamaIndex.

Adapters convert in (framework documents/nodes -> ``Passage``), call the engine, and convert out
(``Citation`` -> the framework's native slot) with these helpers, so every framework reports
the same fields. Citations of every ``kind`` are handled alike: ``"copy"`` (NEST copied the
span) and ``"verbatim"`` (a lossless method generated text that matches a passage verbatim:
provenance, not copying); ``extras["kind"]`` says which, ``extras["copied"]`` is True only for
copies.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from nest_integrations.types import Citation, NestResult, Passage

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


def citation_extras(c: Citation) -> dict[str, Any]:
    """Source-side fields that the frameworks' citation types have no slot for."""
    return {
        "doc_id": c.doc_id,
        "passage_id": c.passage_id,
        "source": c.metadata.get("source"),
        "source_start_char": c.source_start,
        "source_end_char": c.source_end,
        "passage_start_char": c.passage_start,
        "passage_end_char": c.passage_end,
        "n_tokens": c.n_tokens,
        "kind": c.kind,
        "copied": c.kind == "copy",
        **({"page": c.metadata["page"]} if c.metadata.get("page") is not None else {}),
    }


def citation_payload(c: Citation) -> dict[str, Any]:
    """The citation as a LangChain-style dict (``type="citation"``, response-text offsets,
    ``cited_text``, ``title``/``url`` when known, source offsets in ``extras``)."""
    out: dict[str, Any] = {
        "type": "citation",
        "id": c.passage_id,
        "start_index": c.start,
        "end_index": c.end,
        "cited_text": c.text,
        "extras": citation_extras(c),
    }
    for key in ("title", "url"):
        if c.metadata.get(key):
            out[key] = str(c.metadata[key])
    return out


def stats_payload(result: NestResult) -> dict[str, Any]:
    """Aggregate NEST statistics for ``response_metadata`` / ``additional_kwargs``."""
    s = result.stats.to_dict()
    s["mean_span_length"] = result.mean_span_length
    return s


def messages_to_dicts(messages: Any) -> list[dict[str, str]]:
    """Normalise ``(role, content)`` pairs / dicts to ``{"role", "content"}`` dicts with the
    roles chat templates expect (system, user, assistant)."""
    roles = {"human": "user", "ai": "assistant", "chatbot": "assistant", "model": "assistant"}
    out = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, Mapping) else m
        out.append({"role": roles.get(str(role), str(role)), "content": str(content)})
    return out


class CitationTracker:
    """Turns the engine's per-delta citations into each citation exactly once, complete.

    While streaming, the engine reports a growing span again with a larger ``end``; a span is
    complete when a later delta is not part of it. ``finish`` adds what the final result holds
    and was not reported yet, so the reported citations add up to ``result.citations``.

    Usage::

        tracker = CitationTracker()
        for chunk in engine.stream(prompt):
            done = tracker.finish(chunk.result) if chunk.result else tracker.step(chunk.citation)
            send(chunk.text, [citation_payload(c) for c in done])
    """

    def __init__(self) -> None:
        self.open: Citation | None = None
        self.reported: set[tuple[str, int, int, str]] = set()

    def step(self, citation: Citation | None) -> list[Citation]:
        """Citations completed before this delta (whose citation, if any, is ``citation``)."""
        done = []
        if self.open is not None and (
            citation is None or _span_start(citation) != _span_start(self.open)
        ):
            done.append(self.open)
            self.reported.add(_key(self.open))
            self.open = None
        if citation is not None:
            self.open = citation
        return done

    def finish(self, result: NestResult) -> list[Citation]:
        """The final result's citations not reported yet."""
        return [c for c in result.citations if _key(c) not in self.reported]


def _span_start(c: Citation) -> tuple[str, int, str]:
    return (c.passage_id, c.start, c.kind)


def _key(c: Citation) -> tuple[str, int, int, str]:
    return (c.passage_id, c.start, c.end, c.kind)
