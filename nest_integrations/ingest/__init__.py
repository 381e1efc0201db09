"""Corpus ingestion: load documents, split them into NEST passages, report problems.

Writing passages to a store lives with the store (``ChromaPassageStore.ingest``); this package
only turns inputs into :class:`~nest_integrations.types.Passage` objects.

Usage::

    from nest_integrations.ingest import load_documents, split_documents, default_token_counter

    docs, issues = load_documents(["docs/", "notes.jsonl"])
    passages = split_documents(docs, default_token_counter())  # <= 200 SmolLM2 tokens each
    for p in passages:
        assert docs_by_id[p.doc_id].text[p.char_start:p.char_end] == p.text
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from nest_integrations.ingest.documents import (
    SUPPORTED_SUFFIXES,
    IngestError,
    IngestIssue,
    IssueLog,
    SourceDocument,
    html_to_text,
    load_object,
    load_paths,
    load_texts,
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
    "SourceDocument",
    "TokenCounter",
    "default_token_counter",
    "flatten_metadata",
    "html_to_text",
    "load_documents",
    "passage_id",
    "sample_corpus_inputs",
    "sample_corpus_path",
    "split_document",
    "split_documents",
    "split_text",
    "token_counter_for",
]


def load_documents(
    sources: Iterable[Any] = (),
    *,
    texts: Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    metadatas: Sequence[dict[str, Any] | None] | None = None,
    strict: bool = False,
    progress: bool = False,
) -> tuple[list[SourceDocument], list[IngestIssue]]:
    """Load every input into :class:`SourceDocument` objects.

    Args:
        sources: paths (``str`` or ``PathLike``; files or folders, walked recursively) of
            .txt/.md/.rst/.html/.htm/.jsonl files, and/or document objects (LangChain
            ``Document``, LlamaIndex nodes/``Document``, ``SourceDocument``).
        texts: raw strings, one document each (ids default to a hash of the text).
        ids: optional document ids for ``texts``.
        metadatas: optional metadata dicts for ``texts``.
        strict: raise :class:`IngestError` on the first bad item instead of skipping it.
        progress: show a tqdm bar (stderr) while reading files.

    Returns:
        ``(documents, issues)``; a document id seen twice is kept once (an issue names the
        second).
    """
    log = IssueLog(strict)
    paths: list[str | os.PathLike[str]] = []
    objects: list[SourceDocument] = []
    for i, item in enumerate(sources):
        if isinstance(item, (str, os.PathLike)):
            paths.append(item)
        else:
            doc = load_object(item, i, log)
            if doc is not None:
                objects.append(doc)
    docs = load_paths(paths, log, progress) + objects
    if texts is not None:
        docs += load_texts(texts, ids, metadatas, log)
    unique: dict[str, SourceDocument] = {}
    for doc in docs:
        if doc.doc_id in unique:
            log.add(
                doc.source,
                f"duplicate document id {doc.doc_id!r} (already loaded from "
                f"{unique[doc.doc_id].source}); kept the first",
            )
            continue
        unique[doc.doc_id] = doc
    return list(unique.values()), log.issues


def sample_corpus_path() -> Path:
    """Folder of the sample corpus shipped in the package (see its NOTICE.md)."""
    return Path(__file__).resolve().parent.parent / "data" / "sample"


def sample_corpus_inputs() -> list[Path]:
    """The sample corpus's inputs for ``load_documents`` (its pydoc folder and Wikipedia JSONL;
    NOTICE.md and MANIFEST.json are not corpus text)."""
    root = sample_corpus_path()
    return [root / "pydoc", root / "wikipedia.jsonl"]
