"""Real-world files: detected text encodings, PDFs with page metadata, bad PDFs named and skipped,
and Chroma's collection-name rule checked before anything is written.

No model: passages are measured by a whitespace word count. PDFs are made with fpdf2.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.ingest import IngestError, load_documents, split_document
from nest_integrations.ingest.charsets import decode_text
from nest_integrations.ingest.pdf import PAGE_SEPARATOR, pages_of_span


def words(text: str) -> int:
    return len(text.split())


def assert_exact(doc, passages) -> None:
    """Every passage is the slice of the stored source text at its offsets."""
    assert passages
    for p in passages:
        assert doc.text[p.char_start : p.char_end] == p.text
        assert p.metadata["char_start"] == p.char_start and p.metadata["char_end"] == p.char_end


def make_pdf(path: Path, pages: list[str | None], image: Path | None = None, **encryption) -> Path:
    """A PDF with one page per entry (``None``: a blank page, or the image when given)."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    if encryption:
        pdf.set_encryption(**encryption)
    for text in pages:
        pdf.add_page()
        if text is not None:
            pdf.multi_cell(0, 8, text)
        elif image is not None:
            pdf.image(str(image), x=10, y=10, w=60)
    path.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(path))
    return path


PAGES = [
    "Espresso is brewed by forcing hot water through finely ground coffee.",
    "A burr grinder gives an even grind. Grind size controls extraction time.",
    "Milk is steamed to about sixty degrees. Latte art needs microfoam.",
]


# ----------------------------------------------------------------------------- encodings

FRENCH = "Le café est une boisson. Crème brûlée à la française.\n\nNaïve façade, déjà vu à l'été.\n"
ENCODED = {
    # name: (text, bytes of the file, encodings accepted as the one recorded)
    "latin1": (FRENCH, FRENCH.encode("latin-1"), {"cp1252"}),  # cp1252 reads Latin-1 text
    "cp1252": (
        "He said \u201chello\u201d \u2014 it\u2019s a café in Zürich.\n\nIt costs 5\u20ac.\n",
        None,
        {"cp1252"},
    ),
    "utf16_bom_le": ("Grüße aus München.\n\nÖl und Äpfel, 日本語.\n", "utf-16", {"utf-16-le"}),
    "utf16_bom_be": ("Grüße aus München.\n\nÖl und Äpfel.\n", "utf-16-be-bom", {"utf-16-be"}),
    "utf8_bom": ("Ünïcode with a BOM.\n\nSecond paragraph.\n", "utf-8-sig", {"utf-8"}),
    "shift_jis": (
        "日本語のテキストです。東京は日本の首都です。\n\nひらがなとカタカナ。\n",
        "shift_jis",
        {"cp932", "shift_jis"},
    ),
    "cp1251": (
        "Привет мир, это текст на русском языке.\n\nМосква — столица России.\n",
        "cp1251",
        {"cp1251"},
    ),
}


def _encode(text: str, how: bytes | str | None, name: str) -> bytes:
    if isinstance(how, bytes):
        return how
    if how is None:
        return text.encode(name)
    if how == "utf-16-be-bom":
        return b"\xfe\xff" + text.encode("utf-16-be")
    return text.encode(how)


@pytest.mark.parametrize("case", sorted(ENCODED))
def test_encoded_text_files_decode_with_exact_offsets(tmp_path: Path, case: str) -> None:
    """Non-UTF-8 files decode to the original text; passages are exact slices of the decoded
    text; the encoding used is recorded on the document and on every passage."""
    text, how, accepted = ENCODED[case]
    data = _encode(text, how, case)
    (tmp_path / f"{case}.txt").write_bytes(data)
    docs, issues = load_documents([tmp_path / f"{case}.txt"])
    assert not issues, issues
    (doc,) = docs
    assert doc.text == text
    assert doc.encoding in accepted, doc.encoding
    count = lambda s: max(words(s), len(s) // 6)  # noqa: E731 - CJK has no spaces
    passages = split_document(doc, count, max_tokens=4)
    assert len(passages) > 1
    assert_exact(doc, passages)
    assert {p.metadata["encoding"] for p in passages} == {doc.encoding}


def test_utf8_records_utf8_and_other_formats_decode_too(tmp_path: Path) -> None:
    """UTF-8 stays UTF-8 (recorded); .md, .html and .jsonl in cp1252 decode as well."""
    (tmp_path / "plain.md").write_text("# Title\n\nplain ascii\n", encoding="utf-8")
    (tmp_path / "page.html").write_bytes(
        "<html><head><title>Caf\u00e9</title></head><body><p>Cr\u00e8me br\u00fbl\u00e9e \u2014 "
        "\u00e0 la fran\u00e7aise.</p></body></html>".encode("cp1252")
    )
    (tmp_path / "rows.jsonl").write_bytes(
        '{"id": "r1", "text": "Na\u00efve fa\u00e7ade, d\u00e9j\u00e0 vu."}\n'.encode("cp1252")
    )
    docs, issues = load_documents([tmp_path])
    assert not issues, issues
    got = {d.source_format: d for d in docs}
    assert got["markdown"].encoding == "utf-8"
    assert got["html"].encoding == "cp1252" and got["html"].title == "Caf\u00e9"
    assert got["html"].text == "Cr\u00e8me br\u00fbl\u00e9e \u2014 \u00e0 la fran\u00e7aise.\n"
    assert got["jsonl"].encoding == "cp1252" and got["jsonl"].text == (
        "Na\u00efve fa\u00e7ade, d\u00e9j\u00e0 vu."
    )
    assert split_document(got["jsonl"], words)[0].metadata["encoding"] == "cp1252"


def test_binary_garbage_is_named_and_skipped(tmp_path: Path) -> None:
    """Random bytes (with and without NULs), a broken UTF-16 BOM file and a UTF-8 file with a
    stray byte (any other encoding would read it as mojibake) are issues naming the file; the
    good file next to them is ingested."""
    rng = random.Random(0)
    (tmp_path / "good.txt").write_text("fine text\n", encoding="utf-8")
    (tmp_path / "random.txt").write_bytes(rng.randbytes(4096))
    (tmp_path / "high.txt").write_bytes(bytes(rng.randrange(0x80, 0x100) for _ in range(600)))
    (tmp_path / "bad16.txt").write_bytes(b"\xff\xfe" + "odd".encode("utf-16-le") + b"\x00")
    (tmp_path / "elf.md").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64) + b"text" * 5)
    (tmp_path / "stray.txt").write_bytes(("Le café.\n" * 20).encode() + b"stray \xe9 byte\n")
    docs, issues = load_documents([tmp_path])
    assert [d.doc_id for d in docs] == [f"{tmp_path.name}/good.txt"]
    by_file = {i.location.rsplit("/", 1)[-1]: i.message for i in issues}
    assert sorted(by_file) == ["bad16.txt", "elf.md", "high.txt", "random.txt", "stray.txt"]
    assert by_file["stray.txt"].startswith("not valid UTF-8 (invalid UTF-8 byte 0xe9 at offset 206")
    assert by_file["bad16.txt"].startswith("starts with a utf-16-le byte-order mark but is not")
    for name in ("random.txt", "high.txt", "elf.md"):
        assert "binary file" in by_file[name], by_file[name]


def test_decode_text_prefers_boms_then_utf8() -> None:
    assert decode_text("ab\u00e9".encode("utf-8")) == ("ab\u00e9", "utf-8")
    assert decode_text("\ufeffab".encode("utf-8")) == ("ab", "utf-8")  # BOM not in the text
    assert decode_text("x\u00e9".encode("utf-32")) == ("x\u00e9", "utf-32-le")


# ----------------------------------------------------------------------------- PDF


def test_pdf_pages_and_offsets(tmp_path: Path) -> None:
    """A 3-page PDF: pages joined by a blank line, page starts kept, every passage an exact slice
    of the extracted text, on one page, with that page's number."""
    make_pdf(tmp_path / "guide.pdf", PAGES)
    docs, issues = load_documents([tmp_path / "guide.pdf"])
    assert not issues, issues
    (doc,) = docs
    assert doc.source_format == "pdf" and doc.encoding is None and doc.page_count == 3
    assert doc.text == PAGE_SEPARATOR.join(PAGES)
    for i, page in enumerate(PAGES):
        assert doc.text[doc.page_starts[i] :].startswith(page)

    def page_of(offset: int) -> int:  # oracle: which page's text holds this offset
        return max(i for i, s in enumerate(doc.page_starts) if s <= offset) + 1

    # Small budget: passages inside pages; one sentence each.
    small = split_document(doc, words, max_tokens=8)
    assert_exact(doc, small)
    assert [p.metadata["page"] for p in small] == [page_of(p.char_start) for p in small]
    assert {p.metadata["page"] for p in small} == {1, 2, 3}
    assert all("page_end" not in p.metadata and p.metadata["page_count"] == 3 for p in small)
    # A budget that fits the whole document: still one passage per page (never across a break).
    big = split_document(doc, words, max_tokens=1000)
    assert_exact(doc, big)
    assert [(p.text, p.metadata["page"], p.metadata.get("page_end")) for p in big] == [
        (page, n, None) for n, page in enumerate(PAGES, start=1)
    ]


def test_pages_of_span_edges() -> None:
    starts = (0, 10, 25)
    assert pages_of_span(starts, 0, 10) == (1, 1)  # ends right where page 2 starts
    assert pages_of_span(starts, 9, 11) == (1, 2)
    assert pages_of_span(starts, 10, 11) == (2, 2)
    assert pages_of_span(starts, 5, 40) == (1, 3)
    assert pages_of_span(starts, 30, 31) == (3, 3)


@pytest.fixture
def mixed_folder(tmp_path: Path) -> Path:
    """Good files (a PDF, a Latin-1 .txt, a .md) beside a blank PDF, an image-only PDF, a
    corrupt PDF, an empty PDF and a password-protected PDF."""
    from PIL import Image

    root = tmp_path / "docs"
    make_pdf(root / "good.pdf", PAGES[:2])
    (root / "latin.txt").write_bytes(FRENCH.encode("latin-1"))
    (root / "notes.md").write_text("# Notes\n\nSome notes.\n", encoding="utf-8")
    make_pdf(root / "blank.pdf", [None, None])
    image = tmp_path / "red.png"
    Image.new("RGB", (40, 40), (200, 20, 20)).save(image)
    make_pdf(root / "scanned.pdf", [None], image=image)
    good = (root / "good.pdf").read_bytes()
    (root / "corrupt.pdf").write_bytes(good[: len(good) // 2])
    (root / "empty.pdf").write_bytes(b"")
    make_pdf(root / "locked.pdf", ["secret"], owner_password="o", user_password="u")
    make_pdf(root / "restricted.pdf", ["Only editing is restricted."], owner_password="o")
    return root


def test_bad_pdfs_are_named_and_skipped(mixed_folder: Path) -> None:
    """Each bad PDF is one issue with a clear reason; every good file is loaded (nothing lost);
    a PDF encrypted with an empty user password (editing restricted) opens."""
    docs, issues = load_documents([mixed_folder])
    assert sorted(d.doc_id for d in docs) == [
        "docs/good.pdf", "docs/latin.txt", "docs/notes.md", "docs/restricted.pdf",
    ]  # fmt: skip
    by_file = {i.location: i.message for i in issues}
    assert sorted(by_file) == [
        "docs/blank.pdf", "docs/corrupt.pdf", "docs/empty.pdf", "docs/locked.pdf",
        "docs/scanned.pdf",
    ]  # fmt: skip
    assert by_file["docs/blank.pdf"].startswith("no extractable text in 2 page(s)")
    assert "OCR it first" in by_file["docs/scanned.pdf"]
    assert by_file["docs/corrupt.pdf"].startswith("not a valid PDF: ")
    assert by_file["docs/empty.pdf"].startswith("not a valid PDF: ")
    assert by_file["docs/locked.pdf"].startswith("encrypted PDF (needs a password)")
    restricted = next(d for d in docs if d.doc_id == "docs/restricted.pdf")
    assert restricted.text == "Only editing is restricted."
    with pytest.raises(IngestError, match=r"^docs/blank.pdf: no extractable text"):
        load_documents([mixed_folder], strict=True)


# ----------------------------------------------------------------------------- Chroma


@pytest.fixture
def no_default_embedding_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if Chroma's downloading default embedding function is ever called."""
    from chromadb.utils import embedding_functions

    def boom(self, input):  # noqa: ANN001
        raise AssertionError("Chroma's default (downloading) embedding function was called")

    monkeypatch.setattr(embedding_functions.DefaultEmbeddingFunction, "__call__", boom)


def test_end_to_end_pdf_pages_reach_chroma_and_citations(
    tmp_path: Path, mixed_folder: Path, no_default_embedding_function: None
) -> None:
    """Through the real IngestPipeline into a real embedded Chroma (our embedder, no keys):
    the good files are stored, bad ones reported; a retrieved PDF passage carries its page and
    exact offsets into the extracted text, and a citation of it carries the page too."""
    from nest_integrations.core.citations import build_citations
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(tmp_path / "store", "files")
    pipe = IngestPipeline(store, None, with_keys=False, token_count=words, max_passage_tokens=12)
    report = pipe.ingest([mixed_folder])
    assert report.documents == 4 and len(report.issues) == 5
    assert report.added == report.passages == store.count()
    assert report.formats["pdf"] == "2 (3 pages)" and "1 cp1252" in report.formats["text"]
    docs, _ = load_documents([mixed_folder])
    sources = {d.doc_id: d.text for d in docs}

    hits = store.retrieve("How does grind size control extraction?", k=3)
    top = hits[0]
    assert top.doc_id == "docs/good.pdf" and "Grind size" in top.text
    assert top.metadata["page"] == 2 and top.metadata["page_count"] == 2
    assert top.metadata["source_format"] == "pdf"
    assert sources[top.doc_id][top.char_start : top.char_end] == top.text
    latin = store.retrieve("crème brûlée à la française", k=1)[0]
    assert latin.doc_id == "docs/latin.txt" and latin.metadata["encoding"] == "cp1252"
    assert sources[latin.doc_id][latin.char_start : latin.char_end] == latin.text

    # A citation of the whole retrieved passage (as if the model copied it) names the page.
    spans = [m.span() for m in re.finditer(r"\S+", top.text)]
    offsets = [np.array(spans, dtype=np.int64)]
    (cite,) = build_citations(
        [(0, i) for i in range(len(spans))], [e for _, e in spans], [top], offsets,
        text=top.text,
    )  # fmt: skip
    assert cite.metadata["page"] == 2
    assert sources[cite.doc_id][cite.source_start : cite.source_end] == cite.text
    # ... and so do the framework objects made from citations.
    from nest_integrations.integrations.langchain.retrievers import citations_to_documents
    from nest_integrations.integrations.llama_index.retrievers import citation_nodes
    from nest_integrations.types import NestResult, NestStats

    (lc_doc,) = citations_to_documents([cite])
    assert lc_doc.metadata["page"] == 2 and lc_doc.page_content == cite.text
    result = NestResult(top.text, [], [cite], NestStats(), passages=[top])
    (node,) = citation_nodes(result)
    assert node.node.metadata["page"] == 2 and node.node.metadata["source_format"] == "pdf"
    # ... the CLI's source list, the frameworks' citation extras and the server's annotation.
    from nest_integrations.cli.formatting import source_lines
    from nest_integrations.integrations._common import citation_extras
    from nest_integrations.server.protocol import annotation

    assert "page 2, chars" in "\n".join(source_lines(result, min_tokens=1))
    assert citation_extras(cite)["page"] == 2
    assert annotation(cite)["url_citation"]["page"] == 2

    # Re-ingest: unchanged files add nothing; a PDF that became corrupt is reported and its
    # stored passages are kept (bad input never deletes data).
    stored = {p.id for p in store.iter_passages()}
    good = mixed_folder / "good.pdf"
    good.write_bytes(good.read_bytes()[:200])
    again = pipe.ingest([mixed_folder])
    assert (again.added, again.removed) == (0, 0)
    assert "docs/good.pdf" in {i.location for i in again.issues}
    assert {p.id for p in store.iter_passages()} == stored


NAMES = [
    "a b", "x", "ab", "a" * 513, "_abc", "abc-", "a..b", "1.2.3.4", "héllo", "tab\tname",
    "abc", "a.b", "my-docs_2", "A9z", "a" * 512, "999.1.1.1", "1.2.3",
]  # fmt: skip


def test_collection_name_rule_matches_chroma(tmp_path: Path) -> None:
    """Oracle: our check accepts exactly the names the installed Chroma accepts."""
    import chromadb
    from chromadb.config import Settings

    from nest_integrations.retrieval.chroma import (
        InvalidCollectionNameError,
        validate_collection_name,
    )

    client = chromadb.PersistentClient(
        path=str(tmp_path / "db"), settings=Settings(anonymized_telemetry=False)
    )
    for name in NAMES:
        try:
            client.create_collection(name)
            chroma_ok = True
        except Exception:
            chroma_ok = False
        try:
            validate_collection_name(name)
            ours = True
        except InvalidCollectionNameError as exc:
            ours = False
            assert "3-512 characters from [a-zA-Z0-9._-]" in str(exc)
        assert ours == chroma_ok, name


@pytest.mark.parametrize("name", ["a b", "x", "a" * 600])
def test_bad_collection_name_writes_nothing(
    tmp_path: Path, mixed_folder: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """API: a clear ValueError before the store folder exists. CLI: one line, exit status 2,
    nothing written."""
    from nest_integrations.cli import main
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    persist = tmp_path / "store"
    with pytest.raises(ValueError, match=r"invalid collection name .*3-512 characters"):
        ChromaPassageStore.from_persist_dir(persist, name)
    assert not persist.exists()
    code = main(["ingest", str(mixed_folder), "--collection", name,
                 "--persist-dir", str(persist), "--no-keys"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and not persist.exists()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nest ingest: error: invalid collection name ")
    assert "starting and ending with a letter or digit" in err
    assert len(err) < 400
