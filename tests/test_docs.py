"""The documentation holds together: the README stays a short guide that links every page of
docs/, every link resolves, every result file cited anywhere exists, and every file in
benchmarks/results is cited by the README or docs/ (and the folder stays small: only
summaries, raw records gzipped). Reads files only. Each check also runs on planted bad text.
(Every code block of the README and docs/ runs in ``tests/test_readme.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README_MAX_LINES = 250
RESULTS_MAX_FILES = 40
RESULTS_MAX_BYTES = 1_500_000
RAW_MAX_BYTES = 1_000_000
CITED = re.compile(r"benchmarks/results/([\w.*/-]+\w)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def doc_pages() -> dict[Path, str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {p: p.read_text(encoding="utf-8") for p in pages}


def cited_results(texts: list[str]) -> set[str]:
    """Names under benchmarks/results/ that ``texts`` cite (globs kept as written)."""
    return {m.group(1) for t in texts for m in CITED.finditer(t)}


def missing_citations(cited: set[str], folder: Path) -> list[str]:
    """Cited names (or globs) that match no file in ``folder`` (``X`` is there when only its
    gzipped ``X.gz`` is: the benchmarks read either)."""
    return sorted(c for c in cited if not any(folder.glob(c)) and not any(folder.glob(c + ".gz")))


def uncited_files(cited: set[str], folder: Path) -> list[str]:
    """Files of ``folder`` that no citation names (or matches as a glob)."""
    names = {p.name for c in cited for p in folder.glob(c)}
    return sorted(p.name for p in folder.iterdir() if p.name not in names)


def broken_links(pages: dict[Path, str], root: Path = ROOT) -> list[str]:
    """Relative markdown links whose target does not exist (page names relative to ``root``)."""
    bad = []
    for path, text in pages.items():
        for target in LINK.findall(text):
            if "://" not in target and not (path.parent / target).exists():
                bad.append(f"{path.relative_to(root)}: {target}")
    return bad


def test_the_readme_is_a_short_guide_linking_every_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(LINK.findall(text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and pages <= linked, sorted(pages - linked)
    for section in ("## Two commands", "## A five-minute tour", "## Measured", "## Module map"):
        assert section in text


def test_every_link_resolves() -> None:
    assert broken_links(doc_pages()) == []


def test_every_cited_result_exists_and_every_result_is_cited() -> None:
    docs = list(doc_pages().values())
    # what the library, tests, scripts and cookbook cite (the benchmarks name what they write)
    code = [p.read_text(encoding="utf-8") for folder in ("nest_integrations", "tests", "scripts",
                                                          "cookbook")
            for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".sh", ".md") and p.name != "test_docs.py"]
    assert missing_citations(cited_results(docs + code), RESULTS) == []
    assert uncited_files(cited_results(docs), RESULTS) == []


def test_results_hold_summaries_and_gzipped_records_only() -> None:
    files = [p for p in RESULTS.iterdir()]
    assert all(p.is_file() for p in files)  # no sub-folders of old runs
    assert len(files) <= RESULTS_MAX_FILES
    assert sum(p.stat().st_size for p in files) <= RESULTS_MAX_BYTES
    assert not [p.name for p in files if p.suffix in (".json", ".jsonl")]  # raw: gzipped
    assert sum(p.stat().st_size for p in files if p.suffix == ".gz") <= RAW_MAX_BYTES


def test_the_checks_fail_on_planted_problems(tmp_path: Path) -> None:
    """A citation of a missing file, a file nobody cites, a glob that matches nothing and a
    broken link are each reported; a glob that matches counts as citing."""
    (tmp_path / "a.md").write_text("x")
    (tmp_path / "b.md").write_text("y")
    cited = cited_results(["see `benchmarks/results/a.md` and benchmarks/results/gone.md",
                           "and benchmarks/results/old_*.md."])
    assert cited == {"a.md", "gone.md", "old_*.md"}
    assert missing_citations(cited, tmp_path) == ["gone.md", "old_*.md"]
    assert uncited_files(cited, tmp_path) == ["b.md"]
    (tmp_path / "r.jsonl.gz").write_bytes(b"")
    assert missing_citations({"r.jsonl", "r.json"}, tmp_path) == ["r.json"]
    assert uncited_files({"*.md", "r.jsonl.gz"}, tmp_path) == []
    page = tmp_path / "page.md"
    pages = {page: "[ok](a.md) [web](https://x.org/y) [bad](docs/nope.md) [anchor](b.md#top)"}
    assert [b.split(": ")[1] for b in broken_links(pages, tmp_path)] == ["docs/nope.md"]

