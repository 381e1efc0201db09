"""``benchmarks.first_answer``: its question sets, and the report it writes from each cold
``nest ask`` (the process itself is replaced here by a function of the question: the report's
medians, rotation and same-answer column are what is checked; ``nest --help`` runs for real))."""

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
                "ttft": 0.25 if fast else None,  # None: the other checkout predates the field
                "text": "same" if "lambda" not in question else checkout.name,
                "spans": [("same", "p1" if "Atacama" not in question or fast else "p2")],
                "cites": 1, "flagged": 0}

    monkeypatch.setattr(first_answer, "ask", ask)
    monkeypatch.setattr(first_answer, "RESULTS", tmp_path)
    other = tmp_path / "other-checkout"
    other.mkdir()
    monkeypatch.setattr(first_answer, "help_seconds", lambda checkout, runs: [0.1 * runs] * runs)
    assert first_answer.main(["--set", "held-out", "--backend", "torch", "--compare",
                              str(other), "--stem", "fa", "--help-runs", "3"]) == 0
    report = (tmp_path / "fa.md").read_text()
    # every question ran once per checkout, the checkouts taking turns going first
    assert len(calls) == 16 and calls[0][0] != calls[2][0]
    lengths = sorted(len(q) for q in first_answer.HELD_OUT)
    median = (lengths[3] + lengths[4]) / 2
    assert f"| **median** | {median:.1f} | 0.25 | 1.0 | {median / 2:.1f} | n/a | 2.0 |" in report
    # another text or another citation is another answer
    assert report.count("| yes |") == 6 and report.count("| NO |") == 2
    assert "`nest --help`, median of 3 cold processes: this 0.30 s" in report


def test_help_is_timed_in_cold_processes() -> None:
    times = first_answer.help_seconds(first_answer.ROOT, 2)
    assert len(times) == 2 and all(0 < t < 60 for t in times)
