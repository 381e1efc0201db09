"""Loading and splitting: exact offsets, the token budget, ids, metadata and bad-input messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nest_integrations.ingest import (
    IngestError,
    SourceDocument,
    html_to_text,
    load_documents,
    sample_corpus_inputs,
    sample_corpus_path,
    split_document,
    split_documents,
    split_text,
    token_counter_for,
)


def words(text: str) -> int:
    return len(text.split())


def check_spans(text: str, spans: list[tuple[int, int]], count, budget: int) -> None:
    """Spans are ordered, disjoint, trimmed, non-empty and within budget; nothing but whitespace
    is left out."""
    prev = 0
    for start, end in spans:
        assert prev <= start < end <= len(text)
        piece = text[start:end]
        assert piece == piece.strip() and piece
        assert count(piece) <= budget, (count(piece), piece)
        assert not text[prev:start].strip(), "non-whitespace text dropped"
        prev = end
    assert not text[prev:].strip()


# ----------------------------------------------------------------------------- splitting


def test_split_prefers_paragraphs() -> None:
    """Short paragraphs are packed; a paragraph boundary is used before a sentence one."""
    para = "One two three. Four five six."  # 6 words
    text = f"{para}\n\n{para}\n\n{para}\n"
    spans = split_text(text, words, max_tokens=12)
    assert [text[s:e] for s, e in spans] == [f"{para}\n\n{para}", para]


def test_split_falls_back_to_sentences_words_and_chars() -> None:
    """Oversized paragraph -> sentences; long sentence -> words; long word -> characters."""
    text = "Alpha beta gamma. Delta epsilon zeta eta theta iota kappa. " + "x" * 50 + " end."
    count = lambda s: len(s.split()) + len(s) // 10  # noqa: E731 - long words cost more
    spans = split_text(text, count, max_tokens=4)
    check_spans(text, spans, count, 4)
    assert text[spans[0][0] : spans[0][1]] == "Alpha beta gamma."
    x_spans = [text[s:e] for s, e in spans if "x" in text[s:e]]
    assert len(x_spans) > 1 and "".join(x_spans).replace(" end.", "") == "x" * 50


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab .!?\n\t\u00e9", max_size=400), st.integers(1, 12))
def test_split_invariants(text: str, budget: int) -> None:
    """Any text: exact, trimmed, disjoint slices within budget (word count, chars for words)."""
    count = lambda s: max(words(s), (len(s) + 9) // 10)  # noqa: E731
    check_spans(text, split_text(text, count, budget), count, budget)


def test_passages_fit_200_real_tokens(tiny_lm) -> None:
    """Sample pydoc topics split to <= 200 SmolLM2 tokens, each an exact slice of the file."""
    docs, issues = load_documents([sample_corpus_path() / "pydoc"])
    assert not issues
    count = token_counter_for(tiny_lm)  # the real SmolLM2 tokenizer
    by_id = {d.doc_id: d for d in docs}
    passages = split_documents(docs[:8], count)
    assert len(passages) > 8
    for p in passages:
        assert by_id[p.doc_id].text[p.char_start : p.char_end] == p.text
        assert len(tiny_lm.tokenize(p.text)) <= 200
        assert p.metadata["n_tokens"] == len(tiny_lm.tokenize(p.text))


def test_passage_ids_are_content_derived() -> None:
    """Same doc id + offset + text gives the same id; different text a different one."""
    a = split_document(SourceDocument("d", "Hello there.\n\nBye now.", "<text>", "t"), words, 2)
    b = split_document(SourceDocument("d", "Hello there.\n\nBye now.", "<text>", "t"), words, 2)
    c = split_document(SourceDocument("d", "Hello there.\n\nBye later.", "<text>", "t"), words, 2)
    assert [p.id for p in a] == [p.id for p in b]
    assert a[0].id == c[0].id and a[1].id != c[1].id
    assert [p.metadata["chunk_index"] for p in a] == [0, 1]


# ----------------------------------------------------------------------------- loading


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_load_formats_and_titles(tmp_path: Path) -> None:
    """txt/md/rst keep the file text; titles come from headings; ids are relative paths."""
    root = tmp_path / "docs"
    write(root / "a.txt", "plain text\r\nwith CRLF\n")
    write(root / "sub" / "b.md", "intro\n\n## The Title ##\n\nbody\n")
    write(root / "c.rst", "Heading\n=======\n\nText.\n")
    write(root / ".hidden.txt", "skipped")
    write(root / "skip.docx", "not ingested from folders")
    docs, issues = load_documents([root])
    assert not issues
    got = {d.doc_id: d for d in docs}
    assert sorted(got) == ["docs/a.txt", "docs/c.rst", "docs/sub/b.md"]
    assert got["docs/a.txt"].text == "plain text\r\nwith CRLF\n"
    assert got["docs/a.txt"].title == "a"
    assert got["docs/sub/b.md"].title == "The Title"
    assert got["docs/c.rst"].title == "Heading"
    assert got["docs/a.txt"].scope == "file:docs/a.txt"
    # The same folder named differently gives the same ids.
    again, _ = load_documents([f"{tmp_path}/./docs/"])
    assert sorted(d.doc_id for d in again) == sorted(got)


def test_html_source_text_is_extracted_text(tmp_path: Path) -> None:
    """HTML passages index the extracted text (tags, scripts, entities handled)."""
    page = (
        "<html><head><title>My &amp; Page</title><script>var x = 1;</script></head>"
        "<body><h1>Head</h1><p>First &lt;para&gt;.</p><p>Second   para.</p></body></html>"
    )
    title, text = html_to_text(page)
    assert title == "My & Page"
    assert text == "Head\n\nFirst <para>.\n\nSecond para.\n"
    write(tmp_path / "p.html", page)
    docs, _ = load_documents([tmp_path / "p.html"])
    assert docs[0].text == text and docs[0].source_format == "html"
    for p in split_document(docs[0], words, 3):
        assert text[p.char_start : p.char_end] == p.text


def test_jsonl_ids_and_metadata(tmp_path: Path) -> None:
    """JSONL: one doc per line, given ids, user metadata kept (flattened / JSON-encoded), our
    reserved keys never overwrite theirs."""
    lines = [
        {
            "id": "Paris",
            "text": "Paris is in France.",
            "metadata": {"url": "u", "tags": ["a", 1], "geo": {"lat": 48.8}},
        },
        {"text": "No id here.", "metadata": {"doc_id": "given", "source": "theirs", "title": "T"}},
        {"text": "Anonymous.", "metadata": {"chunk_index": 99}},
    ]
    write(tmp_path / "c.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    docs, issues = load_documents([tmp_path / "c.jsonl"])
    assert not issues
    assert docs[0].doc_id == "Paris" and docs[0].title == "Paris"
    assert docs[2].doc_id.startswith("sha1-")
    meta0 = split_document(docs[0], words)[0].metadata
    assert meta0["url"] == "u" and meta0["geo.lat"] == 48.8 and meta0["tags"] == '["a", 1]'
    assert meta0["source"] == "c.jsonl" and meta0["nest_scope"] == "file:c.jsonl"
    meta1 = split_document(docs[1], words)[0].metadata
    assert meta1["source"] == "theirs" and meta1["title"] == "T"
    assert meta1["user_doc_id"] == "given" and meta1["doc_id"] == docs[1].doc_id
    meta2 = split_document(docs[2], words)[0].metadata
    assert meta2["user_chunk_index"] == 99 and meta2["chunk_index"] == 0


def test_texts_and_framework_documents() -> None:
    """Raw strings, LangChain Documents and LlamaIndex Documents (ids only when set)."""
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import Document as LIDocument

    docs, issues = load_documents(
        [
            LCDocument(page_content="From LangChain.", metadata={"source": "lc.txt"}, id="lc-1"),
            LCDocument(page_content="No LC id."),
            LIDocument(text="From LlamaIndex.", id_="li-1", metadata={"k": "v"}),
            LIDocument(text="Random LI id."),
        ],
        texts=["raw one", "raw two"],
        ids=["r1", None],  # type: ignore[list-item]
        metadatas=[{"m": 1}, None],
    )
    assert not issues
    ids = [d.doc_id for d in docs]
    assert ids[0] == "lc-1" and ids[2] == "li-1" and ids[4] == "r1"
    assert ids[1].startswith("sha1-") and ids[3].startswith("sha1-") and ids[5].startswith("sha1-")
    assert docs[0].source == "lc.txt" and docs[2].metadata == {"k": "v"}
    again, _ = load_documents([LIDocument(text="Random LI id.")])
    assert again[0].doc_id == ids[3]  # stable across runs


# ----------------------------------------------------------------------------- bad input


BAD_CASES = {
    "missing": (None, "missing.txt: no such file or folder"),
    "binary": (b"\x00\x01\x02abc", "bin.txt: binary file"),
    "bad_utf16": (b"\xff\xfe" + "odd".encode("utf-16-le") + b"\x00",
                  "bad_utf16.txt: starts with a utf-16-le byte-order mark but is not"),
    "empty": ("  \n\n", "empty.txt: empty file"),
    "bad_jsonl": ('{"text": "ok"}\n{"text": oops}\n', "bad_jsonl.jsonl:2: invalid JSON"),
    "no_text": ('{"text": "ok"}\n\n{"id": 3}\n', 'no_text.jsonl:3: missing "text" string field'),
    "not_object": ('{"text": "ok"}\n[1]\n', "not_object.jsonl:2: expected a JSON object, got list"),
    "dup_id": ('{"id": "x", "text": "a"}\n{"id": "x", "text": "b"}\n',
               "dup_id.jsonl:2: duplicate id 'x' (first on line 1)"),
    "pdf": (b"%PDF-1.4", "pdf.pdf: not a valid PDF"),
    "docx": (b"PK\x03\x04", "docx.docx: unsupported file type '.docx'"),
}  # fmt: skip
_SUFFIX = {"missing": ".txt", "binary": ".txt", "bad_utf16": ".txt", "empty": ".txt", "pdf": ".pdf",
           "docx": ".docx"}


def _bad_file(tmp_path: Path, case: str) -> Path:
    content, _ = BAD_CASES[case]
    stem = {"missing": "missing", "binary": "bin"}.get(case, case)
    path = tmp_path / f"{stem}{_SUFFIX.get(case, '.jsonl')}"
    if content is not None:
        write(path, content)
    return path


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_reported_and_skipped(tmp_path: Path, case: str) -> None:
    """Each bad input gives a message naming the file (and line); good inputs still load."""
    good = write(tmp_path / "good.txt", "fine text")
    bad = _bad_file(tmp_path, case)
    docs, issues = load_documents([bad, good])
    assert "good.txt" in [d.doc_id for d in docs]
    assert len(issues) == 1, issues
    assert BAD_CASES[case][1] in str(issues[0]), str(issues[0])


@pytest.mark.parametrize("case", ["missing", "bad_jsonl", "binary"])
def test_strict_raises_on_first_issue(tmp_path: Path, case: str) -> None:
    bad = _bad_file(tmp_path, case)
    with pytest.raises(IngestError, match=BAD_CASES[case][1].split(":")[0]):
        load_documents([bad], strict=True)


def test_bad_objects_and_texts() -> None:
    docs, issues = load_documents([object()], texts=["", "ok"])
    assert [d.title for d in docs] == ["ok"]
    assert [str(i) for i in issues] == [
        "documents[0]: unsupported document type object",
        "texts[0]: empty text",
    ]


# ----------------------------------------------------------------------------- sample corpus


def test_sample_corpus_shape_and_notice() -> None:
    """The shipped sample: 40 pydoc topics + 300 Wikipedia leads, all loadable, all attributed."""
    root = sample_corpus_path()
    manifest = json.loads((root / "MANIFEST.json").read_text())
    docs, issues = load_documents(sample_corpus_inputs())
    assert not issues
    pydoc = [d for d in docs if d.doc_id.startswith("pydoc/")]
    wiki = [d for d in docs if d.source == "wikipedia.jsonl"]
    assert len(pydoc) == manifest["pydoc"]["topics"] == 40
    assert len(wiki) == manifest["wikipedia"]["leads"] == 300
    assert len({d.metadata["topic"] for d in wiki}) == 12
    notice = (root / "NOTICE.md").read_text()
    assert "CC BY-SA 4.0" in notice and "Python Software Foundation" in notice
    for d in wiki:
        assert d.doc_id == d.metadata["title"]
        assert d.metadata["url"].startswith("https://en.wikipedia.org/wiki/")
        assert f"[{d.doc_id}]({d.metadata['url']})" in notice
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert 100_000 < size < 600_000


def test_jsonl_layouts_nest_beir_and_hugging_face(tmp_path: Path) -> None:
    """The three layouts of docs/own_corpus.md: the project's own (``id``, ``metadata``), BEIR's
    ``corpus.jsonl`` (``_id``, top-level ``title``) and a Hugging Face dump (``id``, top-level
    ``title`` and ``url``); "metadata" wins over the top level where both are given."""
    lines = [
        {"id": "zephyr-x2", "text": "The Zephyr X2 weighs 1.2 kg.",
         "metadata": {"title": "Zephyr X2", "url": "https://example.com/x2"}},
        {"_id": "doc7", "title": "Orbit Kettle", "text": "The Orbit Kettle boils in 90 s."},
        {"id": "12", "url": "https://example.com/lumen", "title": "Lumen Lamp",
         "text": "The Lumen Lamp runs 40 hours."},
        {"id": "both", "title": "Top", "url": "https://top", "text": "Both given.",
         "metadata": {"title": "Meta"}},
    ]
    write(tmp_path / "c.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    docs, issues = load_documents([tmp_path / "c.jsonl"])
    assert not issues
    got = {d.doc_id: d for d in docs}
    assert set(got) == {"zephyr-x2", "doc7", "12", "both"}
    assert [got[i].title for i in ("zephyr-x2", "doc7", "12", "both")] == [
        "Zephyr X2", "Orbit Kettle", "Lumen Lamp", "Meta"]
    urls = {i: split_document(d, words)[0].metadata.get("url") for i, d in got.items()}
    assert urls == {"zephyr-x2": "https://example.com/x2", "doc7": None,
                    "12": "https://example.com/lumen", "both": "https://top"}
    write(tmp_path / "bad.jsonl", json.dumps({"text": "x", "url": 3}) + "\n")
    _, issues = load_documents([tmp_path / "bad.jsonl"])
    assert [i.message for i in issues][:1] == ['"url" must be a string']
