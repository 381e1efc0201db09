"""Ten one-sentence passages and a DReSD ``PassageSource`` that counts (and can fail)
its calls. Used by ``tests/dresd/test_dresd.py`` and ``tests/index/test_crashes.py``."""

from __future__ import annotations

from nest_integrations.dresd import PassageSource


TEXTS = [
    "The Roman Empire was the post-Republican state of ancient Rome.",
    "Python is a high-level, general-purpose programming language.",
    "The assert statement is a convenient way to insert debugging assertions into a program.",
    "A generator function returns an iterator that yields values one at a time.",
    "Paris is the capital and most populous city of France.",
    "The mitochondrion is an organelle found in the cells of most eukaryotes.",
    "The for statement is used to iterate over the elements of a sequence.",
    "Mount Everest is Earth's highest mountain above sea level.",
    "The lambda expression creates an anonymous function in Python.",
    "Photosynthesis converts light energy into chemical energy in plants.",
]


class CountingSource(PassageSource):
    def __init__(self, *a, fail_after: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.calls: list[int] = []
        self.fail_after = fail_after

    def batch(self, i):
        self.calls.append(i)
        return super().batch(i)
