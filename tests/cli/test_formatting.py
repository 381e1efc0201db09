"""Rendering of answers with numbered markers and sources (what `nest ask` prints)."""

from __future__ import annotations

import re

from nest_integrations.cli.formatting import number_sources, render, with_markers
from nest_integrations.types import Citation, NestResult, NestStats, Passage


def _cite(pid: str, start: int, end: int, text: str) -> Citation:
    return Citation(text, start, end, pid, f"doc-{pid}", 0, len(text), 10, 10 + len(text), 2,
                    {"title": f"Title {pid}"})


def test_markers_number_passages_not_spans():
    text = "Rome was big. It had emperors. Plants photosynthesise."
    cites = [_cite("a", 0, 13, "Rome was big."), _cite("b", 31, 54, "Plants photosynthesise."),
             _cite("a", 14, 30, "It had emperors.")]
    cites.sort(key=lambda c: c.start)
    res = NestResult(text, [1] * 10, cites, NestStats(new_tokens=10), [Passage("a", "x"), Passage("b", "y")])
    assert number_sources(cites) == {"a": 1, "b": 2}
    assert with_markers(res) == "Rome was big.[1] It had emperors.[1] Plants photosynthesise.[2]"
    out = render(res)
    assert "[1] Title a" in out and "[2] Title b" in out
    assert 'chars 10-23 of the source, 2 tokens: "Rome was big."' in out


def test_single_token_matches_are_not_marked():
    text = "The cat sat."
    cites = [Citation("The", 0, 3, "a", "doc-a", 0, 3, 0, 3, 1, {})]
    res = NestResult(text, [1, 2, 3], cites, NestStats(new_tokens=3))
    assert with_markers(res) == "The cat sat."
    assert with_markers(res, min_tokens=1) == "The[1] cat sat."
    assert "Sources: none" in render(res)


def test_render_without_citations_says_so():
    res = NestResult("hello", [1], [], NestStats(new_tokens=1))
    assert "Sources: none" in render(res)
    assert with_markers(res) == "hello"


def test_markers_never_inside_a_word_or_a_line_of_code():
    """A span that ends inside a line of code is marked where the line ends (the quickstart's
    "if[1] not expression"); one that ends inside a word, where the word ends
    ("expression[1]1")."""
    text = ('The simple form is equivalent to\n\n   if not expression: raise AssertionError\n'
            'The form "assert expression1, expression2" is equivalent to this')
    a = text.index("if not")
    b = text.index("expression1")
    cites = [_cite("a", 0, a + 2, text[: a + 2]), _cite("b", text.index("The form"), b + 10,
                                                         text[text.index("The form"): b + 10])]
    res = NestResult(text, [1] * 10, cites, NestStats(new_tokens=10))
    marked = with_markers(res)
    assert "if[" not in marked and "expression[" not in marked
    assert marked.startswith("The simple form is equivalent to\n\n   if not expression: raise "
                             "AssertionError[1]\n")
    assert 'The form "assert expression1,[2] expression2" is equivalent to this' in marked
    for m in re.finditer(r"\[\d\]", marked):  # a marker follows no letter inside a word
        after = marked[m.end(): m.end() + 1]
        assert not after.isalnum()


def test_no_marker_after_uncited_words():
    """Issue 62: a marker goes right after its cited span (and the punctuation attached to
    it), never after the uncited words of the rest of the sentence; a span that runs on from
    the same passage's last one shares its marker."""
    text = "Rome was big and had many people. It had emperors, said the book."
    cites = [_cite("a", 0, 12, "Rome was big"), _cite("b", 34, 50, "It had emperors,")]
    res = NestResult(text, [1] * 10, cites, NestStats(new_tokens=10))
    assert with_markers(res) == ("Rome was big[1] and had many people. It had emperors,[2] "
                                 "said the book.")
    run_on = [_cite("a", 0, 8, "Rome was"), _cite("a", 8, 12, " big")]
    res = NestResult(text, [1] * 10, run_on, NestStats(new_tokens=10))
    assert with_markers(res) == ("Rome was big[1] and had many people. It had emperors, said "
                                 "the book.")
    # a span whose last character is a space is marked before it
    res = NestResult(text, [1] * 10, [_cite("a", 0, 13, "Rome was big ")], NestStats(new_tokens=4))
    assert with_markers(res).startswith("Rome was big[1] and")
    # inside a ``` fence, a span is marked at the end of its line
    code = "Use it:\n```\nx = assert_ok(y)\n```\nDone."
    res = NestResult(code, [1] * 4, [_cite("a", 12, 17, "x = a")], NestStats(new_tokens=4))
    assert with_markers(res) == "Use it:\n```\nx = assert_ok(y)[1]\n```\nDone."


def test_unsupported_sentences_are_flagged_and_support_is_labelled():
    """Support citations on (the default): a support citation is marked like a copy and
    labelled with its score; a sentence no passage supports gets ``[!]`` and is listed."""
    from nest_integrations.types import UnsupportedSentence

    text = "Rome was big. Cats fly to the moon."
    sup = Citation("Rome was a large city.", 0, 13, "a", "doc-a", 0, 22, 10, 32, 4,
                   {"title": "Title a"}, kind="support", score=0.71)
    flag = UnsupportedSentence("Cats fly to the moon.", 14, 35, 0.2)
    res = NestResult(text, [1] * 8, [sup], NestStats(new_tokens=8), [Passage("a", "x")],
                     unsupported=[flag])
    assert with_markers(res) == "Rome was big.[1] Cats fly to the moon.[!]"
    out = render(res)
    assert 'supports (score 0.71), 4 tokens: "Rome was a large city."' in out
    assert '[!] Unsupported: no passage supports 1 sentence(s):\n    "Cats fly to the moon."' in out
    res.unsupported = []
    assert "[!]" not in render(res)
