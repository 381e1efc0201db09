"""Loading source documents: files and folders, raw strings, LangChain and LlamaIndex objects.

Every loader returns :class:`SourceDocument` objects whose ``text`` is the *stored source text*:
the exact text that passage offsets index into. For plain-text formats (.txt, .md, .rst, .jsonl
lines) that is the decoded file content, character for character: UTF-8 (a BOM dropped), else
UTF-16/32 with a BOM, else the encoding that ``charset-normalizer`` detects (see
``ingest.charsets.decode_text``); the encoding used is recorded (``SourceDocument.encoding``,
and the ``encoding`` key of every passage's metadata). For HTML it is the **extracted text** (tags
dropped, entities decoded, ``<script>``/``<style>`` skipped, block elements on their own lines);
offsets index that extracted text, not the markup, and such documents carry
``source_format="html"``. For PDF it is the extracted text of the pages joined by blank lines
(``source_format="pdf"``, see ``ingest/pdf.py``); the char offset of each page start is kept
(``SourceDocument.page_starts``), from which each passage gets its ``page`` (and ``page_end``
when it spans several).

Bad input never raises unless ``strict=True``: each problem becomes an :class:`IngestIssue`
naming the file (and line, for JSONL), is logged as a warning, and loading continues.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from nest_integrations.ingest.charsets import DecodeError, decode_text
from nest_integrations.ingest.html_text import html_to_text

LOG = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt": "text", ".md": "markdown", ".rst": "rst"}
HTML_SUFFIXES = {".html", ".htm"}
JSONL_SUFFIXES = {".jsonl"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = tuple(
    sorted({*TEXT_SUFFIXES, *HTML_SUFFIXES, *JSONL_SUFFIXES, *PDF_SUFFIXES})
)


@dataclass(frozen=True)
class SourceDocument:
    """One source document, before splitting.

    Attributes:
        doc_id: Stable id: the file path relative to the input's parent folder, a given id, or
            a hash of the text.
        text: The stored source text; passages are exact slices of it.
        source: Where it came from (relative file path, or ``"<text>"`` / the object's source).
        title: A human title (first heading, ``<title>``, file stem or given title).
        metadata: The user's own metadata (JSONL ``metadata``, LangChain/LlamaIndex metadata).
        scope: Replacement scope: re-ingesting a scope replaces all of its old passages
            (``"file:<source>"`` for files, ``"doc:<doc_id>"`` otherwise).
        source_format: ``"text"``, ``"markdown"``, ``"rst"``, ``"html"``, ``"jsonl"`` or
            ``"pdf"``.
        encoding: the text encoding the file was decoded with (``"utf-8"``, ``"cp1252"``,
            ``"utf-16-le"``, ...); ``None`` for PDFs and in-memory texts.
        page_starts: for PDFs, the offset in ``text`` where each page begins (page ``i + 1``
            at ``page_starts[i]``); empty otherwise.
    """

    doc_id: str
    text: str
    source: str
    title: str
    metadata: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    source_format: str = "text"
    encoding: str | None = None
    page_starts: tuple[int, ...] = ()

    @property
    def page_count(self) -> int | None:
        """Number of pages (PDFs), else ``None``."""
        return len(self.page_starts) if self.page_starts else None


@dataclass(frozen=True)
class IngestIssue:
    """A problem with one input item; ``str()`` gives ``file:line: message``."""

    location: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.location}:{self.line}" if self.line is not None else self.location
        return f"{where}: {self.message}"


class IngestError(ValueError):
    """Raised for bad input with ``strict=True`` (nothing has been written yet)."""

    def __init__(self, issue: IngestIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


class IssueLog:
    """Collects issues; raises the first one when strict."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.issues: list[IngestIssue] = []

    def add(self, location: str, message: str, line: int | None = None) -> None:
        issue = IngestIssue(str(location), message, line)
        if self.strict:
            raise IngestError(issue)
        LOG.warning("skipped %s", issue)
        self.issues.append(issue)


def text_hash_id(text: str) -> str:
    """Content-derived document id for text without a given id."""
    return "sha1-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:20]


# ----------------------------------------------------------------------------- files


def iter_files(
    paths: Iterable[str | os.PathLike[str]], issues: IssueLog
) -> Iterator[tuple[Path, str]]:
    """``(file, relative id)`` for every supported file under ``paths``, in sorted order.

    A folder is walked recursively (hidden entries skipped, unsupported suffixes ignored). The
    relative id is the path relative to the parent of the argument, so ``docs/`` and
    ``./docs`` and an absolute path all give ``docs/a.txt``.
    """
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            issues.add(str(raw), "no such file or folder")
            continue
        path = path.resolve()
        root = path.parent
        if path.is_file():
            if path.suffix.lower() not in SUPPORTED_SUFFIXES:
                issues.add(
                    str(raw),
                    f"unsupported file type {path.suffix or '(none)'!r}; "
                    f"supported: {', '.join(SUPPORTED_SUFFIXES)}",
                )
                continue
            yield path, path.relative_to(root).as_posix()
            continue
        found = 0
        for file in _walk(path):
            found += 1
            yield file, file.relative_to(root).as_posix()
        if not found:
            issues.add(str(raw), f"folder has no {'/'.join(SUPPORTED_SUFFIXES)} files")


def _walk(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and Path(name).suffix.lower() in SUPPORTED_SUFFIXES:
                yield Path(dirpath) / name


def read_text_file(path: Path, location: str, issues: IssueLog) -> tuple[str, str] | None:
    """``(decoded content, encoding)``, or ``None`` (issue recorded) if unreadable, binary or
    empty. See ``charsets.decode_text`` for how the encoding is chosen."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        issues.add(location, f"cannot read file: {exc.strerror or exc}")
        return None
    try:
        text, encoding = decode_text(data)
    except DecodeError as exc:
        issues.add(location, str(exc))
        return None
    if not text.strip():
        issues.add(location, "empty file")
        return None
    if encoding != "utf-8":
        LOG.info("%s: decoded as %s", location, encoding)
    return text, encoding


def load_file(path: Path, rel: str, issues: IssueLog) -> list[SourceDocument]:
    """Documents of one supported file (several for JSONL)."""
    suffix = path.suffix.lower()
    scope = f"file:{rel}"
    if suffix in PDF_SUFFIXES:
        return _load_pdf(path, rel, issues)
    read = read_text_file(path, rel, issues)
    if read is None:
        return []
    text, encoding = read
    if suffix in JSONL_SUFFIXES:
        return _load_jsonl(text, rel, issues, encoding)
    if suffix in HTML_SUFFIXES:
        title, body = html_to_text(text)
        if not body.strip():
            issues.add(rel, "HTML file has no text")
            return []
        return [SourceDocument(rel, body, rel, title or path.stem, {}, scope, "html", encoding)]
    fmt = TEXT_SUFFIXES[suffix]
    title = _heading(text, fmt) or path.stem
    return [SourceDocument(rel, text, rel, title, {}, scope, fmt, encoding)]


def _load_pdf(path: Path, rel: str, issues: IssueLog) -> list[SourceDocument]:
    from nest_integrations.ingest.pdf import PdfError, extract_pdf

    try:
        pdf = extract_pdf(path)
    except PdfError as exc:
        issues.add(rel, str(exc))
        return []
    title = pdf.title or path.stem
    return [
        SourceDocument(
            rel, pdf.text, rel, title, {}, f"file:{rel}", "pdf", page_starts=pdf.page_starts
        )
    ]


def _heading(text: str, fmt: str) -> str | None:
    """The first Markdown ``# heading`` or reST over/underlined title."""
    if fmt == "markdown":
        m = re.search(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.M)
        return m.group(1).strip() if m else None
    if fmt == "rst":
        lines = text.splitlines()
        for i in range(len(lines) - 1):
            title, under = lines[i].strip(), lines[i + 1].strip()
            if (
                title
                and re.fullmatch(r"([=\-~^\"'`#*+:.])\1{2,}", under)
                and len(under) >= len(title)
            ):
                return title
    return None


def _load_jsonl(
    text: str, rel: str, issues: IssueLog, encoding: str | None = None
) -> list[SourceDocument]:
    docs: list[SourceDocument] = []
    seen: dict[str, int] = {}
    issues_before = len(issues.issues)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            issues.add(rel, f"invalid JSON: {exc.msg} (column {exc.colno})", lineno)
            continue
        if not isinstance(record, dict):
            issues.add(rel, f"expected a JSON object, got {type(record).__name__}", lineno)
            continue
        body = record.get("text")
        if not isinstance(body, str):
            issues.add(rel, 'missing "text" string field', lineno)
            continue
        if not body.strip():
            issues.add(rel, 'empty "text"', lineno)
            continue
        meta = record.get("metadata", {})
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            issues.add(rel, '"metadata" must be a JSON object', lineno)
            continue
        key = "id" if record.get("id") is not None else "_id"  # BEIR's corpus.jsonl: "_id"
        given = record.get(key)
        if given is not None and not isinstance(given, (str, int)):
            issues.add(rel, f'"{key}" must be a string or an integer', lineno)
            continue
        top_title = record.get("title")  # BEIR and Hugging Face dumps keep it at the top level
        if top_title is not None and not isinstance(top_title, str):
            issues.add(rel, '"title" must be a string', lineno)
            continue
        if top_title and top_title.strip() and not meta.get("title"):
            meta = {**meta, "title": top_title.strip()}
        top_url = record.get("url")  # so do Hugging Face dumps with the page's URL
        if top_url is not None and not isinstance(top_url, str):
            issues.add(rel, '"url" must be a string', lineno)
            continue
        if top_url and top_url.strip() and not meta.get("url"):
            meta = {**meta, "url": top_url.strip()}
        doc_id = str(given) if given is not None else text_hash_id(body)
        if doc_id in seen:
            issues.add(rel, f"duplicate id {doc_id!r} (first on line {seen[doc_id]})", lineno)
            continue
        seen[doc_id] = lineno
        title = str(meta.get("title") or (given if given is not None else "") or rel)
        docs.append(
            SourceDocument(doc_id, body, rel, title, dict(meta), f"file:{rel}", "jsonl", encoding)
        )
    if not docs and len(issues.issues) == issues_before:
        issues.add(rel, "no documents in JSONL file")
    return docs


def load_paths(
    paths: Iterable[str | os.PathLike[str]], issues: IssueLog, progress: bool = False
) -> list[SourceDocument]:
    """Documents from files and folders (see :func:`iter_files`)."""
    from tqdm.auto import tqdm

    files = list(iter_files(paths, issues))
    docs: list[SourceDocument] = []
    for path, rel in tqdm(
        files, desc="reading", unit="file", disable=not progress or len(files) < 2
    ):
        docs.extend(load_file(path, rel, issues))
    return docs


# ----------------------------------------------------------------------------- objects


def load_texts(
    texts: Sequence[str],
    ids: Sequence[str] | None,
    metadatas: Sequence[dict[str, Any] | None] | None,
    issues: IssueLog,
) -> list[SourceDocument]:
    """Documents from raw strings (``ids`` default to a hash of each text)."""
    if ids is not None and len(ids) != len(texts):
        raise ValueError(f"got {len(ids)} ids for {len(texts)} texts")
    if metadatas is not None and len(metadatas) != len(texts):
        raise ValueError(f"got {len(metadatas)} metadatas for {len(texts)} texts")
    docs = []
    for i, text in enumerate(texts):
        meta = dict((metadatas[i] if metadatas else None) or {})
        given = ids[i] if ids is not None else None
        doc = _make_doc(text, given, meta, f"texts[{i}]", issues)
        if doc is not None:
            docs.append(doc)
    return docs


def load_object(obj: Any, index: int, issues: IssueLog) -> SourceDocument | None:
    """A LangChain ``Document``, a LlamaIndex node/``Document`` or a ``SourceDocument``.

    Frameworks are duck-typed, never imported. LangChain: ``page_content``, ``metadata``,
    ``id``. LlamaIndex: ``get_content()``/``text``, ``metadata`` and ``id_`` (only when the user
    set it: LlamaIndex's default id is a random UUID, which would defeat idempotent ingest).
    """
    if isinstance(obj, SourceDocument):
        return obj
    where = f"documents[{index}]"
    if hasattr(obj, "page_content"):  # LangChain Document
        return _make_doc(obj.page_content, getattr(obj, "id", None), obj.metadata, where, issues)
    if hasattr(obj, "get_content") or (hasattr(obj, "text") and hasattr(obj, "metadata")):
        text = _llama_text(obj)
        given = getattr(obj, "id_", None)
        fields_set = getattr(obj, "model_fields_set", None)
        if fields_set is not None and "id_" not in fields_set:
            given = None  # auto-generated UUID: not a stable id
        return _make_doc(text, given, getattr(obj, "metadata", None) or {}, where, issues)
    issues.add(where, f"unsupported document type {type(obj).__name__}")
    return None


def _llama_text(node: Any) -> str:
    if hasattr(node, "get_content"):
        try:
            from llama_index.core.schema import MetadataMode  # present if it is a llama node

            return str(node.get_content(metadata_mode=MetadataMode.NONE))
        except ImportError:
            return str(node.get_content())
    return str(node.text)


def _make_doc(
    text: Any, given: Any, meta: dict[str, Any], where: str, issues: IssueLog
) -> SourceDocument | None:
    if not isinstance(text, str):
        issues.add(where, f"text must be a string, got {type(text).__name__}")
        return None
    if not text.strip():
        issues.add(where, "empty text")
        return None
    meta = dict(meta or {})
    if given is None and meta.get("doc_id") is not None:
        given = meta["doc_id"]
    doc_id = str(given) if given is not None else text_hash_id(text)
    source = str(meta.get("source") or "<text>")
    first_line = text.strip().splitlines()[0].strip()
    fallback = Path(source).stem if source != "<text>" else first_line[:80]
    title = str(meta.get("title") or fallback)
    return SourceDocument(doc_id, text, source, title, meta, f"doc:{doc_id}", "text")


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
            .txt/.md/.rst/.html/.htm/.jsonl/.pdf files, and/or document objects (LangChain
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
