"""PDF text extraction for ingest (``pypdf``), page by page, with the char offset of every page.

The stored source text of a PDF is its **extracted text**: the text of each page (as ``pypdf``
extracts it, surrounding whitespace trimmed) joined by :data:`PAGE_SEPARATOR`. Passage offsets
index that text, and ``page_starts[i]`` is where page ``i + 1`` begins in it, so the page(s) a
passage spans follow from its offsets (:func:`pages_of_span`).

Usage::

    pdf = extract_pdf(Path("guide.pdf"))      # raises PdfError with a one-line reason
    pdf.text, pdf.page_starts, pdf.page_count
    pages_of_span(pdf.page_starts, 120, 480)   # (first page, last page), 1-based
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from pathlib import Path

LOG = logging.getLogger(__name__)

#: Between the texts of two pages: a paragraph break, so the splitter prefers page boundaries.
PAGE_SEPARATOR = "\n\n"


class PdfError(ValueError):
    """A PDF that cannot be ingested; the message says why (encrypted, corrupt, no text)."""


@dataclass(frozen=True)
class PdfText:
    """The extracted text of a PDF.

    Attributes:
        text: the pages' texts joined by :data:`PAGE_SEPARATOR`.
        page_starts: char offset in ``text`` where each page begins (one per page, ascending).
        title: the document-information title, or ``""``.
    """

    text: str
    page_starts: tuple[int, ...]
    title: str = ""

    @property
    def page_count(self) -> int:
        return len(self.page_starts)


def extract_pdf(path: Path) -> PdfText:
    """The text of every page of the PDF at ``path``.

    pypdf's own warnings (``EOF marker not found``, ...) are logged at debug level under this
    module's logger with the file name, instead of as bare lines on stderr; the first one is
    appended to the reason of a ``PdfError``.

    Raises:
        PdfError: not a valid PDF, encrypted (and not openable with an empty password), or no
            extractable text at all (scanned images need OCR first).
    """
    with _PypdfLog(path) as notes:
        try:
            return _extract(path)
        except PdfError as exc:
            if notes.messages and "not a valid PDF" in str(exc):
                raise PdfError(f"{exc} ({notes.messages[0]})") from exc.__cause__
            raise


class _PypdfLog(logging.Handler):
    """Collects the ``pypdf`` logger's records while one file is read (not propagated)."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        self.messages: list[str] = []
        self._logger = logging.getLogger("pypdf")
        self._propagate = True

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().strip()
        if record.levelno >= logging.WARNING and message:
            self.messages.append(message)
        LOG.debug("pypdf on %s: %s", self.path, message)

    def __enter__(self) -> "_PypdfLog":
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate


def _extract(path: Path) -> PdfText:
    try:
        from pypdf import PdfReader
        from pypdf.errors import DependencyError, FileNotDecryptedError
    except ImportError as exc:  # pragma: no cover - pypdf is a core dependency
        raise PdfError("reading PDFs needs pypdf: pip install 'pypdf>=5'") from exc

    try:
        reader = PdfReader(str(path))
    except OSError as exc:
        raise PdfError(f"cannot read file: {exc.strerror or exc}") from exc
    except Exception as exc:  # pypdf raises many types on damaged files
        raise PdfError(f"not a valid PDF: {_reason(exc)}") from exc
    try:
        if reader.is_encrypted:
            # Many PDFs are encrypted with an empty user password (only editing is restricted):
            # those open without asking anyone.
            if not reader.decrypt(""):
                raise PdfError(
                    "encrypted PDF (needs a password); decrypt it first, e.g. "
                    "`qpdf --decrypt --password=... in.pdf out.pdf`"
                )
        n_pages = len(reader.pages)
    except DependencyError as exc:
        raise PdfError(
            f"encrypted PDF that pypdf cannot open here ({_reason(exc)}); decrypt it first"
        ) from exc
    except FileNotDecryptedError as exc:
        raise PdfError(f"encrypted PDF (needs a password): {_reason(exc)}") from exc
    except PdfError:
        raise
    except Exception as exc:  # pypdf raises many types on damaged files
        raise PdfError(f"not a valid PDF: {_reason(exc)}") from exc
    if n_pages == 0:
        raise PdfError("PDF has no pages")

    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for number, page in enumerate(reader.pages, start=1):
        try:
            page_text = page.extract_text() or ""
        except Exception as exc:  # a damaged content stream: name the page
            raise PdfError(f"cannot extract the text of page {number}: {_reason(exc)}") from exc
        page_text = page_text.replace("\x00", "").strip()
        if parts:
            parts.append(PAGE_SEPARATOR)
            pos += len(PAGE_SEPARATOR)
        starts.append(pos)
        parts.append(page_text)
        pos += len(page_text)
    text = "".join(parts)
    if not text.strip():
        raise PdfError(
            f"no extractable text in {n_pages} page(s) (scanned images?); OCR it first, "
            "e.g. `ocrmypdf in.pdf out.pdf`"
        )
    title = ""
    try:
        info = reader.metadata
        title = str(info.title).strip() if info is not None and info.title else ""
    except Exception:  # a broken info dictionary only costs the title
        LOG.debug("no readable title in %s", path, exc_info=True)
    return PdfText(text, tuple(starts), title)


def pages_of_span(
    page_starts: tuple[int, ...] | list[int], start: int, end: int
) -> tuple[int, int]:
    """``(first, last)`` 1-based pages that the text span ``[start, end)`` touches."""
    first = max(1, bisect.bisect_right(page_starts, start))
    last = max(first, bisect.bisect_right(page_starts, max(start, end - 1)))
    return first, last


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
