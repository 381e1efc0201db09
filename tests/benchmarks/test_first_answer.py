"""``benchmarks.first_answer``: its question sets, and the report it writes from each cold
``nest ask`` (the process itself is replaced here by a function of the question: the report's
medians, rotation and same-text column are what is checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import first_answer


def test_the_sets_are_the_readme_questions_and_a_held_out_family() -> None:
    from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS

    assert first_answer.questions("sample") == [q.question for q in SAMPLE_QUESTIONS]
    held = first_answer.questions("held-out")
    assert len(held) == 8 and not set(held) & set(first_answer.questions("sample"))
    assert all(q.startswith(("Tell me about ", "Explain ")) for q in held)
    with pytest.raises(SystemExit, match="unknown set"):
        first_answer.questions("dev")


def test_the_report_pairs_checkouts_and_takes_medians(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def ask(checkout: Path, question: str, backend: str, max_new_tokens: int) -> dict:
        calls.append((checkout.name, question))
        fast = checkout == first_answer.ROOT
        n = len(question)
        return {"tok_s": float(n if fast else n / 2), "tokens": n, "wall": 1.0 if fast else 2.0,
                "text": "same" if "lambda" not in question else checkout.name,
                "cites": 1, "flagged": 0}

    monkeypatch.setattr(first_answer, "ask", ask)
    monkeypatch.setattr(first_answer, "RESULTS", tmp_path)
    other = tmp_path / "other-checkout"
    other.mkdir()
    assert first_answer.main(["--set", "held-out", "--backend", "torch", "--compare",
                              str(other), "--stem", "fa"]) == 0
    report = (tmp_path / "fa.md").read_text()
    # every question ran once per checkout, the checkouts taking turns going first
    assert len(calls) == 16 and calls[0][0] != calls[2][0]
    lengths = sorted(len(q) for q in first_answer.HELD_OUT)
    median = (lengths[3] + lengths[4]) / 2
    assert f"| **median** | {median:.1f} | 1.0 | {median / 2:.1f} | 2.0 |" in report
    assert report.count("| yes |") == 7 and report.count("| NO |") == 1
