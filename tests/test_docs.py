"""The documentation holds together: the README stays a short guide that links every page of
docs/, every link resolves, every result file cited anywhere exists, and every file in
benchmarks/results is cited by the README or docs/ (and the folder stays small: only
summaries, raw records gzipped). Guides are guides and history is history (issue 54): every
page of docs/ but the decision log is at most ``GUIDE_MAX_LINES`` lines with no dated lab notes
(measurement history lives in docs/decisions.md and docs/history/), the README has at most
``README_MAX_LONG_LINES`` lines over ``LONG_LINE`` characters, and its Measured section has at
most ``MEASURED_MAX_ROWS`` one-line rows, each linking to its result file. Reads files only.
Each check also runs on planted bad text. (Every code block of the README and docs/ runs in
``tests/test_readme.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README_MAX_LINES = 267  # 250 before issue 62's "Bring your own corpus" section
RESULTS_MAX_FILES = 50  # 36 when the folder was pruned (issue 34); each new file is cited
#                        (48: answers_dev/answers_test, summary + records, issue 60; 50:
#                        followups (was followups_dev) and startup, issues 60 and 63)
RESULTS_MAX_BYTES = 1_500_000
RAW_MAX_BYTES = 1_000_000
GUIDE_MAX_LINES = 350
LONG_LINE = 200
README_MAX_LONG_LINES = 5
MEASURED_MAX_ROWS = 8
#: The pages that hold history: dated measurements are theirs (the guides link to them).
HISTORY = ("decisions.md", "history/")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
CITED = re.compile(r"benchmarks/results/([\w.*/-]+\w)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def doc_pages() -> dict[Path, str]:
    """README.md, the pages of docs/ and the measurement logs of docs/history/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs" / "history").glob("*.md"))]
    return {p: p.read_text(encoding="utf-8") for p in pages}


def guide_problems(pages: dict[str, str]) -> list[str]:
    """Guides (docs pages by name relative to docs/, other than the history ones) over
    ``GUIDE_MAX_LINES`` lines, or holding a dated note (``YYYY-MM-DD``)."""
    bad = []
    for name, text in pages.items():
        if name.startswith(HISTORY):
            continue
        if len(text.splitlines()) > GUIDE_MAX_LINES:
            bad.append(f"{name}: {len(text.splitlines())} lines")
        bad += [f"{name}: dated {m.group(0)}" for m in DATE.finditer(text)]
    return bad


def long_lines(text: str) -> list[int]:
    """Line numbers of the lines over ``LONG_LINE`` characters."""
    return [i for i, line in enumerate(text.splitlines(), 1) if len(line) > LONG_LINE]


def measured_problems(readme: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the README's Measured table: more than ``MEASURED_MAX_ROWS`` rows, a
    row that is not one line of at most ``LONG_LINE`` characters, or a row that links no
    existing file under benchmarks/results/."""
    section = readme.split("## Measured", 1)[1].split("\n## ", 1)[0]
    lines = section.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    table = []
    for line in lines[start:]:
        if not line.strip():
            break
        table.append(line)
    rows = table[2:]  # past the header and its rule
    bad = [] if rows else ["no Measured table"]
    if len(rows) > MEASURED_MAX_ROWS:
        bad.append(f"{len(rows)} rows")
    for row in rows:
        if not (row.startswith("| ") and row.rstrip().endswith("|")):
            bad.append(f"not a one-line row: {row[:60]}")
        if len(row) > LONG_LINE:
            bad.append(f"{len(row)} characters: {row[:60]}")
        linked = [t for t in LINK.findall(row) if t.startswith("benchmarks/results/")]
        if not linked:
            bad.append(f"no result file: {row[:60]}")
        bad += [f"missing: {t}" for t in linked if not (root / t).is_file()]
    return bad


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


def test_guides_are_guides_and_history_is_history() -> None:
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix(): p.read_text(encoding="utf-8")
             for p in docs.rglob("*.md")}
    assert "decisions.md" in pages and any(n.startswith("history/") for n in pages)
    assert guide_problems(pages) == []
    # history pages are read, not run: tests/test_readme.py runs the blocks of docs/*.md only
    for name, text in pages.items():
        if name.startswith("history/"):
            assert not re.search(r"^```(bash|python)", text, re.M), name


def test_the_readme_has_few_long_lines_and_a_short_measured_table() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(long_lines(text)) <= README_MAX_LONG_LINES, long_lines(text)
    assert measured_problems(text) == []
    # the README's two set-up commands, as they are
    for command in ('bash scripts/quickstart.sh "How does the assert statement work in Python?"',
                    "bash scripts/test.sh"):
        assert f"```bash\n{command}\n```" in text


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



def test_the_guide_and_readme_checks_fail_on_planted_problems(tmp_path: Path) -> None:
    """A long guide, a dated note in a guide, long README lines and a Measured table with too
    many rows, a wrapped row, a row without a result file or with a missing one are each
    reported; the same in the decision log or a history page is not."""
    long_page = "x\n" * (GUIDE_MAX_LINES + 1)
    dated = "Measured 2026-12-03 on the AMD EPYC.\n"
    assert guide_problems({"ok.md": "fine\n", "decisions.md": long_page + dated,
                           "history/llama_cpp.md": long_page + dated}) == []
    assert guide_problems({"long.md": long_page, "lab.md": dated}) == [
        f"long.md: {GUIDE_MAX_LINES + 1} lines", "lab.md: dated 2026-12-03"]
    assert long_lines("a\n" + "b" * (LONG_LINE + 1) + "\nc") == [2]
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.md").write_text("x")
    row = "| what | result ([r.md](benchmarks/results/r.md)) |"
    table = "## Measured\n\nintro\n\n| what | result |\n|---|---|\n{}\n\n## Next\n"
    assert measured_problems(table.format(row), tmp_path) == []
    assert measured_problems(table.format("\n".join([row] * 9)), tmp_path) == ["9 rows"]
    assert measured_problems(table.format("| a | b |"), tmp_path) == [
        "no result file: | a | b |"]
    gone = "| a | b ([g](benchmarks/results/gone.md)) |"
    assert measured_problems(table.format(gone), tmp_path) == [
        "missing: benchmarks/results/gone.md"]
    wide = row.replace("what", "w" * LONG_LINE)
    assert [p.split(":")[0] for p in measured_problems(table.format(wide), tmp_path)] == [
        f"{len(wide)} characters"]
    wrapped = "| what | result\ncontinued ([r.md](benchmarks/results/r.md)) |"
    assert "not a one-line row: | what | result" in measured_problems(table.format(wrapped),
                                                                      tmp_path)
