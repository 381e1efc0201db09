"""The README's module map matches the tree: every module of the package is listed (by its path
or by a package folder that holds it), every listed path exists, and so does every test file the
map names. Reads files only: fast."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nest_integrations"


def map_rows(readme: str) -> list[list[str]]:
    """The cells of every row of the table under ``## Module map``."""
    section = readme.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]  # past the header


def listed_paths(cell: str) -> list[str]:
    """Backticked paths of a module cell, relative to the package. A name after a
    ``folder/...`` path is in that folder when it exists there, else relative to the package."""
    out, folder = [], ""
    for token in re.findall(r"`([^`]+)`", cell):
        path = folder + token if folder and (PACKAGE / folder / token).exists() else token
        if "/" in path:
            folder = path if path.endswith("/") else path.rpartition("/")[0] + "/"
        out.append(path)
    return out


def check(readme: str) -> list[str]:
    problems, covered, folders = [], set(), []
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    for cells in map_rows(readme):
        for path in listed_paths(cells[0]):
            if not (PACKAGE / path).exists():
                problems.append(f"listed but missing: {path}")
            elif path.endswith("/"):
                folders.append(path)
            covered.add(path)
        for test in re.findall(r"`(tests/[^`]+)`", cells[-1]):
            if not (ROOT / test).exists():
                problems.append(f"test file missing: {test}")
    for m in sorted(modules):
        # a subpackage's __init__ is shown by its folder's modules
        folder = m.removesuffix("__init__.py") if "/" in m else None
        if folder and any(c.startswith(folder) for c in covered):
            continue
        if m not in covered and not any(m.startswith(f) for f in folders):
            problems.append(f"not in the map: {m}")
    return problems


def test_module_map_matches_the_tree() -> None:
    assert check((ROOT / "README.md").read_text(encoding="utf-8")) == []


def test_the_check_finds_a_stale_and_a_missing_row() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stale = readme.replace("`decoding/loop.py`", "`loop.py`", 1)
    assert "listed but missing: loop.py" in check(stale)
    assert "not in the map: decoding/loop.py" in check(stale)
    stale = readme.replace("`tests/decoding/test_text_stream.py`", "`tests/test_gone.py`", 1)
    assert check(stale) == [
        "test file missing: tests/test_gone.py"]
