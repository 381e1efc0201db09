"""Titles from where users keep them: a JSONL record's top-level ``title`` (BEIR's
``corpus.jsonl``, Hugging Face dumps) counts as ``metadata.title``, and BEIR's ``_id`` as ``id``;
``nest ingest`` reports how many documents have a title other than their id."""

from __future__ import annotations

import json

from nest_integrations.ingest.documents import load_documents


def _write(path, records) -> None:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")


def test_beir_and_hugging_face_layouts_keep_their_titles(tmp_path) -> None:
    path = tmp_path / "corpus.jsonl"
    _write(path, [
        {"_id": "d1", "title": "Aruba", "text": "The chief of state of Aruba is a king."},
        {"id": "d2", "title": "Niue", "text": "Niue is an island country."},
        {"id": "d3", "title": "ignored", "text": "Kept.", "metadata": {"title": "Own title"}},
        {"_id": "d4", "title": "", "text": "No title at all."},
    ])
    docs, issues = load_documents([path])
    assert not issues
    by_id = {d.doc_id: d for d in docs}
    assert set(by_id) == {"d1", "d2", "d3", "d4"}  # "_id" is the id
    assert by_id["d1"].title == "Aruba" and by_id["d1"].metadata["title"] == "Aruba"
    assert by_id["d2"].title == "Niue"
    assert by_id["d3"].title == "Own title"  # metadata.title wins over the top-level one
    assert by_id["d4"].title == "d4"  # no title: the id, as before


def test_a_title_that_is_not_a_string_is_a_clear_issue(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    _write(path, [{"id": "x", "title": 7, "text": "Some text."},
                  {"id": "y", "title": "Fine", "text": "Other text."}])
    docs, issues = load_documents([path])
    assert [d.doc_id for d in docs] == ["y"]
    assert any('"title" must be a string' in str(i) for i in issues)


def test_urls_from_the_record_or_its_metadata_reach_the_citation(tmp_path) -> None:
    """Issue 62: a Hugging Face dump's top-level ``url`` counts as ``metadata.url``; a
    citation's ``url`` is the document's URL (``url``, ``source_url``, ``link`` or an http(s)
    ``source``), else None, and the server's ``url_citation.url`` falls back to the source path
    (then the doc id) only then."""
    from nest_integrations import output
    from nest_integrations.server.protocol import annotation
    from nest_integrations.types import Citation

    path = tmp_path / "dump.jsonl"
    _write(path, [
        {"id": "1", "url": "https://en.wikipedia.org/wiki/Aruba", "title": "Aruba", "text": "A."},
        {"id": "2", "url": "https://x.org/ignored", "text": "B.",
         "metadata": {"url": "https://x.org/own"}},
        {"id": "3", "url": 5, "text": "C."},
    ])
    docs, issues = load_documents([path])
    by_id = {d.doc_id: d for d in docs}
    assert by_id["1"].metadata["url"] == "https://en.wikipedia.org/wiki/Aruba"
    assert by_id["2"].metadata["url"] == "https://x.org/own"  # metadata wins
    assert "3" not in by_id and any('"url" must be a string' in str(i) for i in issues)

    def url(meta: dict) -> tuple:
        c = Citation("A.", 0, 2, "p", "doc", 0, 2, 0, 2, 1, {"source": "dump.jsonl", **meta})
        return output.citation_fields(c)["url"], annotation(c)["url_citation"]["url"]

    assert url({"url": "https://a"}) == ("https://a", "https://a")
    assert url({"source_url": "https://b"}) == ("https://b", "https://b")
    assert url({"link": "https://c", "source_url": ""}) == ("https://c", "https://c")
    assert url({"source": "https://d/page"}) == ("https://d/page", "https://d/page")
    assert url({}) == (None, "dump.jsonl")  # no URL: the server names the source file
