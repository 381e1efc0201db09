"""The sample corpus's questions (``nest ingest --sample``): the README's and the cookbook's,
with the words a right answer contains and the words of the wrong answers observed on them.

Kept out of the package (issue 61): the ``must_not`` lists were written from wrong answers seen
on these very questions, so they are a regression set for the tests and the benchmarks
(``tests/test_sample_questions.py``, ``benchmarks.quality --set sample``), never data a library
user's answers are judged or tuned by.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeywordQuestion:
    """A question over the shipped sample corpus, scored by keywords: the answer must contain
    every ``must`` word (normalised, whole words) and none of the ``must_not`` words; an
    ``absent`` subject's answer must cite nothing (no document is about it)."""

    id: str
    question: str
    gold_doc_id: str | None
    must: tuple[str, ...]
    must_not: tuple[str, ...] = ()
    #: no document of the corpus is about the question's subject: a right answer cites none
    absent: bool = False


#: The README's and the cookbook's questions over the sample corpus
#: (``nest ingest --sample``), with the words a right answer contains and a wrong one does not.
#: The ``must`` words come from the gold document (e.g. "debugging" for assert), so the LM's
#: own vague answer usually fails them; run-on is not meaningful for these free-form answers.
SAMPLE_QUESTIONS: tuple[KeywordQuestion, ...] = (
    KeywordQuestion("sample/generator", "What is a generator?", None,
                    ("generator",), ("writing system", "numbers without words", "pension"),
                    absent=True),
    KeywordQuestion("sample/assert", "How does the assert statement work in Python?",
                    "pydoc/assert.txt", ("assert", "debugging"), ()),
    KeywordQuestion("sample/with", "How does the with statement work?", "pydoc/with.txt",
                    ("with", "context manager"), ()),
    KeywordQuestion("sample/global", "What does the global statement do?", "pydoc/global.txt",
                    ("global", "identifiers"), ("economic",)),
    KeywordQuestion("sample/roman-empire", "What is the Roman Empire?", None,
                    ("roman", "empire"),
                    ("privately owned", "titus ulises", "great turkish war", "ottoman"),
                    absent=True),
    KeywordQuestion("sample/dickens", "Who was Charles Dickens?", "Charles Dickens",
                    ("english",), ("french", "sculptor")),
    KeywordQuestion("sample/pinball", "What is pinball?", "Pinball", ("ball", "table"), ()),
    KeywordQuestion("sample/cell-membrane", "What is a cell membrane?", "Cell membrane",
                    ("membrane",), ("sphere",)),
)


__all__ = ["SAMPLE_QUESTIONS", "KeywordQuestion"]
