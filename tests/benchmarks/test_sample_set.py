"""The sample corpus's questions live with the benchmarks, not in the wheel (issue 61): their
``must_not`` lists were written from wrong answers observed on them."""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS, KeywordQuestion

ROOT = Path(__file__).resolve().parents[2]


def defines(root: Path, name: str) -> list[str]:
    """Modules under ``root`` that assign, define or import ``name``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names = [node.name]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.asname or a.name for a in node.names]
            if name in names:
                found.append(path.relative_to(root).as_posix())
                break
    return found


def test_the_package_holds_no_sample_questions() -> None:
    assert defines(ROOT / "nest_integrations", "SAMPLE_QUESTIONS") == []
    assert defines(ROOT / "nest_integrations", "KeywordQuestion") == []
    assert defines(ROOT / "benchmarks" / "sets", "SAMPLE_QUESTIONS") == ["sample_questions.py"]


def test_the_check_finds_a_definition(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("SAMPLE_QUESTIONS: tuple = ()\n")
    (tmp_path / "b.py").write_text("from x import SAMPLE_QUESTIONS\n")
    (tmp_path / "c.py").write_text("OTHER = 'SAMPLE_QUESTIONS'\n")
    assert defines(tmp_path, "SAMPLE_QUESTIONS") == ["a.py", "b.py"]


def test_the_sample_set() -> None:
    ids = [q.id for q in SAMPLE_QUESTIONS]
    assert len(ids) == 8 == len(set(ids)) and all(isinstance(q, KeywordQuestion)
                                                  for q in SAMPLE_QUESTIONS)
    assert all(q.must and q.question.endswith("?") for q in SAMPLE_QUESTIONS)
