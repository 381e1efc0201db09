"""What every edge reports about a ``NestResult``: one citation dict, usage, stats, and one
streaming citation tracker; and about an ``attribution.Attribution`` (``attribution_fields``).
Framework-free (imports only ``types``; an ``Attribution`` is read by duck typing).

The edges are thin renames of these:

- LangChain and LlamaIndex payloads (``integrations/_common.citation_payload``: ``extras``
  renames the offsets ``source_start`` -> ``source_start_char`` etc., the names their docs
  promise), LangChain ``usage_metadata`` (``input_tokens``/``output_tokens``), LlamaIndex
  ``CitationBlock``s (``*_char`` location keys) and ``raw["usage"]``;
- the server's OpenAI format (``server/protocol``: ``url_citation`` annotations use these key
  names as they are, ``usage`` is this ``usage``, the ``nest`` extension holds these ``stats``);
- the terminal (``formatting``: titles and locations).

Citation fields (``citation_fields``)::

    passage_id, doc_id       which passage (and source document) the span is from
    start_index, end_index   the span in the answer text: answer[start_index:end_index]
    cited_text               == the answer slice == source[source_start:source_end]
    title, source            the passage's metadata, None when unknown
    url                      the document's URL (``document_url``: metadata ``url``,
                             ``source_url``, ``link``, or a ``source`` that is an http(s)
                             URL), None when it has none
    source_start, source_end the span in the source document (None when not known)
    passage_start, passage_end  the span in the passage text
    n_tokens                 tokens in the span
    kind, copied             "copy" (NEST copied it; copied=True), "verbatim" (text that
                             matches the passage verbatim: provenance) or "support" (a passage
                             sentence that supports an answer sentence written in other words:
                             cited_text is the PASSAGE sentence, start/end_index the answer's)
    score                    the support score ("support" only; None for copy/verbatim)
    page                     only when the passage metadata has one (PDF ingest)

Formats that need a non-empty title or link (OpenAI's ``url_citation``, LlamaIndex's
``CitationBlock``) use ``citation_label`` (title, else source, else doc id) and
``citation_link`` (url, else source, else doc id).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from nest_integrations.types import Citation, NestResult

#: How streamed citations are reported (``CitationStream``).
STREAM_MODES = ("growing", "completed")


def citation_fields(c: Citation) -> dict[str, Any]:
    """The one citation dict (see the module docstring for its keys)."""
    meta = c.metadata or {}
    fields: dict[str, Any] = {
        "passage_id": c.passage_id,
        "doc_id": c.doc_id,
        "start_index": c.start,
        "end_index": c.end,
        "cited_text": c.text,
        "title": str(meta["title"]) if meta.get("title") else None,
        "url": document_url(meta),
        "source": meta.get("source"),
        "source_start": c.source_start,
        "source_end": c.source_end,
        "passage_start": c.passage_start,
        "passage_end": c.passage_end,
        "n_tokens": c.n_tokens,
        "kind": c.kind,
        "copied": c.kind == "copy",
        "score": c.score,
    }
    if meta.get("page") is not None:
        fields["page"] = meta["page"]
    return fields


#: Metadata keys read as a document's URL, first found first (then a ``source`` that is one).
URL_KEYS = ("url", "source_url", "link")


def document_url(meta: Mapping[str, Any]) -> str | None:
    """The document's URL in passage metadata ``meta``: the first non-empty ``URL_KEYS`` value,
    else ``source`` when it is an http(s) URL (LangChain's web loaders put it there), else
    None."""
    for key in URL_KEYS:
        value = meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    source = meta.get("source")
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return source
    return None


def attribution_fields(a: Any) -> dict[str, Any]:
    """What the edges report about an ``attribution.Attribution``::

        text          the attributed text
        citations     ``citation_fields`` of each verbatim and support citation, in text order
        unsupported   ``{"text", "start", "end", "score"}`` per sentence nothing supports
        sentences     ``{"text", "start", "end", "verdict", "score", "passage_id"}`` per
                      sentence (or clause): verdict "verbatim", "support" or "unsupported"
    """
    return {
        "text": a.text,
        "citations": [citation_fields(c) for c in a.citations],
        "unsupported": [
            {"text": u.text, "start": u.start, "end": u.end, "score": u.score}
            for u in a.unsupported
        ],
        "sentences": [
            {"text": s.text, "start": s.start, "end": s.end, "verdict": s.verdict,
             "score": s.score, "passage_id": s.passage_id}
            for s in a.sentences
        ],
    }


def citation_label(fields: Mapping[str, Any]) -> str:
    """A citation's display title: its title, else its source, else its doc id."""
    return str(fields.get("title") or fields.get("source") or fields["doc_id"])


def citation_link(fields: Mapping[str, Any]) -> str:
    """Where a citation points: its url, else its source, else its doc id."""
    return str(fields.get("url") or fields.get("source") or fields["doc_id"])


def renamed(fields: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``fields`` under a format's key names (``names``: field -> key); fields the mapping
    does not list, or that are absent (``page``), are left out."""
    return {key: fields[field] for field, key in names.items() if field in fields}


def usage(result: NestResult) -> dict[str, int]:
    """Token counts of one generation (OpenAI's names)."""
    s = result.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.new_tokens,
        "total_tokens": s.prompt_tokens + s.new_tokens,
    }


def add_usage(*usages: Mapping[str, int]) -> dict[str, int]:
    """The sum of several ``usage`` dicts (a batch)."""
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {k: sum(u[k] for u in usages) for k in keys}


def stats(result: NestResult) -> dict[str, Any]:
    """NEST's statistics of one generation (``NestStats.to_dict`` and ``mean_span_length``), and
    ``unsupported``: ``{"text", "start", "end", "score"}`` per answer sentence no passage
    supports (``NestResult.stats_dict``; with support citations on, the default, every other
    sentence has a citation)."""
    return result.stats_dict()


class CitationStream:
    """Which citations a streamed delta reports, in one of two modes.

    While streaming, the engine gives each copied delta its citation *as known so far*: a span
    that keeps growing comes again with the same ``passage_id`` and ``start`` and a larger
    ``end``.

    - ``"growing"`` (the server's annotations, LlamaIndex's ``citation``): every copied delta
      reports its citation as known so far; a client keeps the last one per
      ``(passage_id, start)``. ``finish`` returns the final citations not reported in their
      final form, so the merged stream equals ``result.citations``.
    - ``"completed"`` (LangChain, LlamaIndex's ``completed_citations``): each citation is
      reported once, complete, with the first delta that is not part of it. ``finish`` returns
      the final citations not reported yet, so the reports add up to ``result.citations``.

    Support citations (``NestConfig.attribute``: ``StreamChunk.support``) are final when they
    come, with the delta that completes their sentence: both modes report them at once.

    Usage::

        tracker = CitationStream("completed")
        for chunk in engine.stream(prompt):
            if chunk.result:
                cites = tracker.finish(chunk.result)
            else:
                cites = tracker.step(chunk.citation, chunk.support)
    """

    def __init__(self, mode: str) -> None:
        if mode not in STREAM_MODES:
            raise ValueError(f"unknown citation stream mode {mode!r}: use one of {STREAM_MODES}")
        self.mode = mode
        self.open: Citation | None = None  # "completed": the span still growing
        self.reported: dict[tuple[str, int, str], tuple[int, str]] = {}

    def step(
        self, citation: Citation | None, support: Sequence[Citation] = ()
    ) -> list[Citation]:
        """The citations to report with a delta whose citation is ``citation`` (None: LM text)
        and which completes the sentences of the ``support`` citations."""
        for c in support:
            self._report(c)
        if self.mode == "growing":
            if citation is None:
                return list(support)
            self._report(citation)
            return [citation, *support]
        done = list(support)
        if self.open is not None and (citation is None or _span(citation) != _span(self.open)):
            done.append(self.open)
            self._report(self.open)
            self.open = None
        if citation is not None:
            self.open = citation
        return done

    def finish(self, result: NestResult) -> list[Citation]:
        """The final citations not yet reported in their final form."""
        return [c for c in result.citations if self.reported.get(_span(c)) != (c.end, c.text)]

    def _report(self, c: Citation) -> None:
        self.reported[_span(c)] = (c.end, c.text)


def _span(c: Citation) -> tuple[str, int, str]:
    return (c.passage_id, c.start, c.kind)


__all__ = [
    "STREAM_MODES",
    "CitationStream",
    "add_usage",
    "attribution_fields",
    "citation_fields",
    "citation_label",
    "citation_link",
    "renamed",
    "stats",
    "usage",
]
