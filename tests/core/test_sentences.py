"""The one sentence-end rule (``core.sentences``, issue 61): its three readers, and that no other
module of the package compiles a sentence-end expression of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from nest_integrations.core.sentences import (
    LINES,
    OUTPUT,
    PASSAGE,
    SENTENCE_END,
    SentenceRule,
    sentence_ends,
    sentence_spans,
)

PACKAGE = Path(__file__).resolve().parents[2] / "nest_integrations"
#: What only a sentence-end expression holds: terminal punctuation in a character class.
_SENTENCE_CLASS = re.compile(r"\[[^\]]*\.[^\]]*![^\]]*\?|\[[^\]]*[!?][^\]]*\.|。")


def _pieces(text: str, rule: SentenceRule) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text, rule)]


def sentence_regex_modules(root: Path) -> list[str]:
    """Modules under ``root`` that compile (``re.compile``) or search with a pattern holding
    sentence punctuation (``.``, ``!`` and ``?`` in one class, or a CJK full stop)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.args):
                pattern = "".join(c.value for c in ast.walk(node.args[0])
                                  if isinstance(c, ast.Constant) and isinstance(c.value, str))
                if _SENTENCE_CLASS.search(pattern):
                    found.append(path.relative_to(root).as_posix())
                    break
    return found


def test_one_module_compiles_a_sentence_end() -> None:
    found = sentence_regex_modules(PACKAGE)
    assert found == ["core/sentences.py"]


def test_the_check_finds_a_second_sentence_end(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('import re\nEND = re.compile(r"[.!?]+(?=\\s)")\n')
    (tmp_path / "b.py").write_text('import re\nX = re.search(r"(?<=[!?.])x", "")\n')
    (tmp_path / "c.py").write_text('import re\nY = re.compile(r"[,;:]\\s")\n')
    assert sentence_regex_modules(tmp_path) == ["a.py", "b.py"]


TEXT = 'He said "stop." Then he left!  Dr. Watson came, e.g. at 5 p.m. today.\nNext line'


def test_terminal_punctuation_and_blank_lines_end_a_sentence_under_every_rule() -> None:
    for rule in (PASSAGE, OUTPUT, LINES):
        assert _pieces('One. "Two!" Three?\n\nFour', rule) == ['One.', '"Two!"', "Three?",
                                                               "Four"], rule
        # a curly closer stays with its sentence
        assert _pieces("It ends.” Then", rule) == ["It ends.”", "Then"], rule
        assert _pieces("3.14 and x.y", rule) == ["3.14 and x.y"], rule  # no space: no end


def test_the_readers_differ_only_where_their_rules_say() -> None:
    # PASSAGE: a line that goes on in lower case continues; a capital or a colon line ends
    assert _pieces("Capital: Mapudo\nPopulation: 3\nwrapped on", PASSAGE) == [
        "Capital: Mapudo", "Population: 3\nwrapped on"]
    assert _pieces("Rules:\n  - one", PASSAGE) == ["Rules:", "- one"]
    # OUTPUT: abbreviations and initials end nothing, list items and CJK stops do
    assert _pieces(TEXT, OUTPUT) == ['He said "stop."', "Then he left!",
                                     "Dr. Watson came, e.g. at 5 p.m. today.", "Next line"]
    assert _pieces("Intro\n- one\n- two", OUTPUT) == ["Intro", "- one", "- two"]
    assert _pieces("第一。第二", OUTPUT) == ["第一。", "第二"]
    assert _pieces("第一。第二", PASSAGE) == ["第一。第二"]
    # LINES: every line break ends one; periods after abbreviations do too
    assert _pieces("a\nb\nc", LINES) == ["a", "b", "c"]
    assert _pieces("Dr. Watson", LINES) == ["Dr.", "Watson"]


def test_stray_punctuation_joins_in_answers_and_is_dropped_in_passages() -> None:
    text = "It ends. ... And goes on."
    assert _pieces(text, OUTPUT) == ["It ends. ...", "And goes on."]
    assert _pieces(text, PASSAGE) == ["It ends.", "And goes on."]


def test_ends_read_from_a_position_and_are_final_for_the_guards() -> None:
    text = "One two. Three\nfour. Fi"
    ends = list(sentence_ends(text, LINES))
    assert ends == [8, 15, 20]
    assert list(sentence_ends(text, LINES, 9)) == [15, 20]
    assert list(sentence_ends("a\n \nb", LINES)) == [2, 4]  # each line break of a blank line
    assert list(sentence_ends("a\n \nb", PASSAGE)) == [4]
    # an end the guards saw stays an end whatever comes next (they read a growing text)
    for i in range(len(text) + 1):
        assert set(sentence_ends(text[:i], LINES)) <= set(ends)


def test_a_rule_names_its_line_breaks() -> None:
    with pytest.raises(ValueError, match="lines"):
        SentenceRule(lines="some")
    assert SENTENCE_END.groupindex.keys() == {"stop", "cjk", "colon", "blank", "line"}
