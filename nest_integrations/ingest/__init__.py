"""Corpus ingestion, the write path: load documents, split them into NEST passages, and write
them (with their token keys) into a Chroma store.

- ``documents``: loading files, JSONL, raw texts and framework document objects;
- ``charsets``: which encoding a text file is in (BOM, UTF-8, detected), binary refused;
- ``splitter``: passages of <= 200 LM tokens with exact source offsets;
- ``pipeline``: ``IngestPipeline`` (add, fill keys, remove stale passages, ``IngestReport``).
  The read side, ``retrieval.chroma.ChromaPassageStore``, holds no model.

Usage::

    from nest_integrations.ingest import IngestPipeline, load_documents, split_documents

    docs, issues = load_documents(["docs/", "notes.jsonl"])
    passages = split_documents(docs, default_token_counter())  # <= 200 SmolLM2 tokens each
    report = IngestPipeline(store, lm).ingest(["docs/"], progress=True)

``IngestPipeline`` and ``IngestReport`` are imported on first use (they need chromadb).
"""

from __future__ import annotations

from typing import Any

from nest_integrations.ingest.documents import (
    SUPPORTED_SUFFIXES,
    IngestError,
    IngestIssue,
    IssueLog,
    SourceDocument,
    html_to_text,
    load_documents,
    load_object,
    load_paths,
    load_texts,
    sample_corpus_inputs,
    sample_corpus_path,
)
from nest_integrations.ingest.splitter import (
    MAX_PASSAGE_TOKENS,
    TokenCounter,
    default_token_counter,
    flatten_metadata,
    passage_id,
    split_document,
    split_documents,
    split_text,
    token_counter_for,
)

__all__ = [
    "MAX_PASSAGE_TOKENS",
    "SUPPORTED_SUFFIXES",
    "IngestError",
    "IngestIssue",
    "IngestPipeline",
    "IngestReport",
    "IssueLog",
    "SourceDocument",
    "TokenCounter",
    "default_token_counter",
    "flatten_metadata",
    "html_to_text",
    "load_documents",
    "load_object",
    "load_paths",
    "load_texts",
    "passage_id",
    "sample_corpus_inputs",
    "sample_corpus_path",
    "split_document",
    "split_documents",
    "split_text",
    "token_counter_for",
]


def __getattr__(name: str) -> Any:
    if name in ("IngestPipeline", "IngestReport"):
        from nest_integrations.ingest import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'nest_integrations.ingest' has no attribute {name!r}")
