"""Shared by the framework adapters: the citation payload both frameworks report, the record ->
Passage mapping, and chat-message normalisation. Framework-free: imports no LangChain/LlamaIndex.

Adapters convert in (framework documents/nodes -> ``Passage``), call the engine, and convert out
(``Citation`` -> the framework's native slot). The payload is a rename of
``nest_integrations.output.citation_fields`` (the one citation dict, shared with the server):
answer offsets and text under their own names, the source side in ``extras`` with the offsets
renamed ``*_char`` (``EXTRAS_KEYS``, the names the adapters document). Citations of every
``kind`` are handled alike: ``"copy"`` (NEST copied the span), ``"verbatim"`` (generated text
that matches a passage verbatim: provenance, not copying) and ``"support"`` (a passage sentence
that supports an answer sentence written in other words; ``cited_text`` is the passage sentence,
the answer offsets span the supported sentence); ``extras["kind"]`` says which,
``extras["copied"]`` is True only for copies, ``extras["score"]`` is the support score (None for
the other kinds).
"""

from __future__ import annotations

import hashlib
import warnings
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


# --------------------------------------------------------------------- parameter names

#: The token limit's names at the LangChain edges: LangChain's (``ChatOpenAI``'s ``max_tokens``,
#: with its alias ``max_completion_tokens``) first, then the Hugging Face / LlamaIndex name.
LANGCHAIN_TOKEN_NAMES = ("max_tokens", "max_completion_tokens", "max_new_tokens")
#: The token limit's names at the LlamaIndex edges: LlamaIndex's local LLMs' (``HuggingFaceLLM``,
#: ``LlamaCPP``: ``max_new_tokens``) first, then OpenAI's and ``LLMMetadata``'s.
LLAMA_INDEX_TOKEN_NAMES = ("max_new_tokens", "max_tokens", "num_output")


def canonical_names(
    values: Mapping[str, Any], names: tuple[str, ...], who: str
) -> dict[str, Any]:
    """``values`` with every alias in ``names[1:]`` renamed to ``names[0]`` (docs/parameters.md).

    A name given as None counts as not given. Two names given with different values raise a
    ``ValueError`` naming both; the same value twice is accepted.
    """
    out = dict(values)
    given = [(n, out.pop(n)) for n in names if n in out]
    set_ = [(n, v) for n, v in given if v is not None]
    for n, v in set_[1:]:
        if v != set_[0][1]:
            first, value = set_[0]
            raise ValueError(
                f"{who} got {first}={value!r} and {n}={v!r}: both name the same setting "
                f"({', '.join(names[1:])} are aliases of {names[0]}); pass one of them"
            )
    if given:
        out[names[0]] = set_[0][1] if set_ else None
    return out


# --------------------------------------------------------------------- no corpus, said so

#: ``grounding``'s reasons.
NO_CORPUS = "no corpus"
NO_PASSAGES = "no passages"


def grounding(result: Any, retrieves: bool, who: str) -> dict[str, Any]:
    """``{"grounded": bool, "reason": str | None}`` of one answer: grounded when it was decoded
    over at least one passage. ``retrieves``: the edge has a passage source (a retriever, a
    collection); without one the reason is ``NO_CORPUS``, else ``NO_PASSAGES`` (the source
    returned nothing for this query). The reason is a sentence that says what to do."""
    if result.passages:
        return {"grounded": True, "reason": None}
    if not retrieves:
        return {"grounded": False, "reason": (
            f"{NO_CORPUS}: {who} has no retriever and no collection, so the answer comes from the "
            "model alone; pass retriever=... or collection=... (a store filled by `nest ingest`)")}
    return {"grounded": False, "reason": (
        f"{NO_PASSAGES}: {who}'s retriever returned no passages for this query, so the answer "
        "comes from the model alone; check that the store holds documents (nest info) and that "
        "it was filled with the same embedding")}


class UngroundedWarning(UserWarning):
    """An answer was decoded without any passage (``grounding``): warned once per model."""


def warn_ungrounded(owner: Any, ground: dict[str, Any]) -> None:
    """Warn once per ``owner`` (an adapter instance with a ``_warned_ungrounded`` private
    attribute) that an answer had no passages."""
    if ground["grounded"] or owner._warned_ungrounded:
        return
    owner._warned_ungrounded = True
    warnings.warn(f"{type(owner).__name__}: {ground['reason']}", UngroundedWarning, stacklevel=4)


# --------------------------------------------------------------------- attribution (any answer)


class LazyAttributor:
    """The core ``Attributor`` of an attributing adapter, built on first use (thread-safe).

    ``attributor`` as given; else, with a passage source (``retriever``: a NEST
    ``PassageRetriever``; or ``collection``/``persist_dir``: the store filled by ``nest
    ingest``), ``assembly.attributor_from_defaults`` (the engine's parts: the shared embedder,
    and the model and stored token keys when the config's scorer needs them); else an
    ``Attributor(config)`` for calls that bring their passages (the embedder loads on first
    use)."""

    def __init__(
        self,
        attributor: Any = None,
        *,
        retriever: Any = None,
        collection: str | None = None,
        persist_dir: str | None = None,
        config: Any = None,
    ) -> None:
        import threading

        self.given = attributor
        self.retriever = retriever
        self.collection, self.persist_dir, self.config = collection, persist_dir, config
        self._built: Any = None
        self._lock = threading.Lock()

    @property
    def retrieves(self) -> bool:
        """Whether the attributor finds passages itself (a given one is trusted to)."""
        return self.given is not None or any(
            v is not None for v in (self.retriever, self.collection, self.persist_dir)
        )

    def get(self) -> Any:
        if self.given is not None:
            return self.given
        with self._lock:
            if self._built is None:
                self._built = self._build()
        return self._built

    def _build(self) -> Any:
        if self.retriever is None and self.collection is None and self.persist_dir is None:
            from nest_integrations.attribution import Attributor

            return Attributor(self.config)
        from nest_integrations import assembly

        return assembly.attributor_from_defaults(
            self.collection, persist_dir=self.persist_dir, config=self.config,
            retriever=self.retriever,
        )


def no_passages_error(who: str) -> ValueError:
    return ValueError(
        f"{who} has no passages to attribute against: send documents with the answer, or give "
        "it a retriever, a collection (or persist_dir) or a ready attributor"
    )


#: ``output.attribution_fields``' unsupported-sentence keys -> the payload's (the answer offsets
#: named as in ``citation_payload``).
UNSUPPORTED_KEYS = {"text": "text", "start": "start_index", "end": "end_index", "score": "score"}
#: The same for its per-sentence verdicts.
SENTENCE_KEYS = {**UNSUPPORTED_KEYS, "verdict": "verdict", "passage_id": "passage_id"}


def unsupported_payload(attribution: Any) -> list[dict[str, Any]]:
    """The sentences nothing supports, as LangChain/LlamaIndex payloads (``UNSUPPORTED_KEYS``)."""
    return [output.renamed(u, UNSUPPORTED_KEYS)
            for u in output.attribution_fields(attribution)["unsupported"]]


def sentences_payload(attribution: Any) -> list[dict[str, Any]]:
    """Each sentence's verdict (``"verbatim"``, ``"support"``, ``"unsupported"``), score and
    passage, as LangChain/LlamaIndex payloads (``SENTENCE_KEYS``)."""
    return [output.renamed(u, SENTENCE_KEYS)
            for u in output.attribution_fields(attribution)["sentences"]]


def attribution_summary(attribution: Any, citations: list[Citation]) -> dict[str, int]:
    """Counts of one attribution as the adapters report it: sentences, the citations reported
    (``citations``), of which support and verbatim, and unsupported sentences."""
    return {
        "sentences": len(attribution.sentences),
        "citations": len(citations),
        "support": sum(c.kind == "support" for c in citations),
        "verbatim": sum(c.kind == "verbatim" for c in citations),
        "unsupported": len(attribution.unsupported),
    }
