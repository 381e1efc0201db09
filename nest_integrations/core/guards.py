"""Output guards for answers: pure functions on the output text and its sources.

Relaxed acceptance lets a copy run on and a small model loop; three guards keep an open-ended
answer on its topic and make it end:

- **Repeat guard** (``repeat_start``, ``open_repeat_start``): a sentence or line whose
  normalised text (``normalize_sentence``: lower case, whitespace collapsed) equals an earlier
  one's ends the answer; the repeat itself is not emitted. A sentence is complete at ``.``,
  ``!`` or ``?`` (and closing quotes or brackets) followed by whitespace, or at a newline
  (``core.sentences.LINES``).
  Sentences shorter than ``MIN_REPEAT_CHARS`` normalised characters may repeat ("Yes.",
  list bullets, blank lines). While the unfinished last sentence is a prefix of an earlier one
  it may still become a repeat, so a stream holds it back. A list marker alone on the line
  before a repeat ("4.  ") goes with it.
- **Loop guard** (``loop_start``, ``open_loop_start``): a phrase of at least
  ``MIN_LOOP_WORDS`` words (``MIN_REPEAT_CHARS`` characters, two distinct words) followed at
  once by itself ("it is also referred to as, it is also referred to as") ends the answer
  before its second copy: a loop inside one sentence, which the repeat guard cannot see.
- **Junk guard** (``junk_start``, ``open_junk_start``): a run of ``JUNK_RUN`` or more
  separators (``,`` ``;`` ``:``, whitespace between them allowed) or of ``BLANK_LINES`` or more
  empty lines ends the answer before the run (a small model at small lambda emits these when
  the kNN mass lands on punctuation). So does a line that opens with ``SYMBOL_RUN`` or more
  copies of one symbol: the reStructuredText rules of the Python docs that relaxed copies run
  into after the content. A trailing run that may still grow into one is held back from a
  stream.
- **Document lock** (``first_copy_document``): the document of the first copied run of at least
  ``LOCK_MIN_TOKENS`` tokens. Once it is set, span proposals and token-mode citations from
  other documents are dropped (``drafters.nest``): a copy never continues into another
  document than the one the answer is about.
- **Citation minimum** (``citation_words``): a citation shows only when its text holds at least
  ``MIN_CITATION_WORDS`` words (shorter ones were frames and function words, not content:
  ``docs/decisions.md``). Shorter copies stay plain text with their per-token provenance
  (``NestResult.token_sources``).

The answer policy turns them on (``config.Guards``; the ``grounded`` and ``copy`` presets, none
under ``paper``). The repeat, loop and junk stops only end an answer early, so in a lossless
mode the answer stays a prefix of greedy's.
"""

from __future__ import annotations

import re
from typing import Sequence

from nest_integrations.config import GROUNDED_MIN_CITATION_WORDS
from nest_integrations.core.citations import trim_span
from nest_integrations.core.sentences import LINES, sentence_ends

#: Shortest sentence (normalised characters) whose repeat ends the answer.
MIN_REPEAT_CHARS = 12
#: Fewest words of a phrase whose immediate repeat is a loop.
MIN_LOOP_WORDS = 3
#: Longest phrase (words) the loop guard compares.
MAX_LOOP_WORDS = 40
#: Separators in a row (",,,,", ", , , ,") that end the answer.
JUNK_RUN = 4
#: Empty lines in a row that end the answer.
BLANK_LINES = 4
#: A line that opens with this many copies of one symbol ("************", "========") ends it.
SYMBOL_RUN = 8
_JUNK = re.compile(r"[,;:](?:\s*[,;:]){%d,}|\n(?:[ \t]*\n){%d,}|(?:^|\n)[ \t]*([^\w\s])\1{%d,}"
                   % (JUNK_RUN - 1, BLANK_LINES, SYMBOL_RUN - 1))
_OPEN_JUNK = re.compile(r"(?:[,;:](?:\s*[,;:]){0,%d}\s*|\n(?:[ \t]*\n){0,%d}[ \t]*"
                        r"|(?:^|\n)[ \t]*([^\w\s])\1{0,%d})$"
                        % (JUNK_RUN - 2, BLANK_LINES - 1, SYMBOL_RUN - 2))
#: Tokens of the first copied run that fix the answer's document.
LOCK_MIN_TOKENS = 4
#: Fewest words a shown citation holds under the grounded policies (module docstring).
MIN_CITATION_WORDS = GROUNDED_MIN_CITATION_WORDS

def normalize_sentence(text: str) -> str:
    """Lower case, whitespace collapsed to single spaces, stripped."""
    return " ".join(text.lower().split())


def sentence_spans(text: str) -> tuple[list[tuple[int, int]], int]:
    """``(spans, open_start)``: the ``[start, end)`` char ranges of the complete sentences and
    lines of ``text`` (stripped of surrounding whitespace; empty ones skipped), and where the
    unfinished last sentence starts (``len(text)`` when there is none)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for end in sentence_ends(text, LINES):
        s, e = trim_span(text, pos, end)
        if s < e:
            spans.append((s, e))
        pos = end
    s, _ = trim_span(text, pos, len(text))
    return spans, s


def repeat_start(text: str, final: bool = False, min_chars: int = MIN_REPEAT_CHARS) -> int | None:
    """Start char of the first complete sentence or line of ``text`` that repeats an earlier
    one (normalised, at least ``min_chars`` characters), or None. With ``final`` the unfinished
    last sentence counts as complete (the text has ended)."""
    spans, open_start = sentence_spans(text)
    if final and open_start < len(text):
        spans.append(trim_span(text, open_start, len(text)))
    seen: set[str] = set()
    for s, e in spans:
        norm = normalize_sentence(text[s:e])
        if len(norm) < min_chars:
            continue
        if norm in seen:
            return _with_marker(text, s)
        seen.add(norm)
    return None


def _with_marker(text: str, s: int) -> int:
    """``s``, or the start of its line when only a list marker ("4.", "-") precedes it there."""
    line = text.rfind("\n", 0, s) + 1
    return line if not any(ch.isalpha() for ch in text[line:s]) else s


_WORD = re.compile(r"\S+")


def _words(text: str) -> tuple[list[str], list[int]]:
    found = list(_WORD.finditer(text))
    return [m.group().lower() for m in found], [m.start() for m in found]


def _loop_unit_ok(unit: Sequence[str]) -> bool:
    return len(set(unit)) >= 2 and len(" ".join(unit)) >= MIN_REPEAT_CHARS


def complete_words(text: str, final: bool = False) -> int:
    """Words of ``text`` that can no longer grow: all when ``final`` or whitespace ends it."""
    n = len(_WORD.findall(text))
    return n if final or not text or text[-1].isspace() else max(0, n - 1)


def loop_start(
    text: str, final: bool = False, min_words: int = MIN_LOOP_WORDS, first_end: int = 0
) -> int | None:
    """Start char of the second copy of the first phrase (``min_words`` to ``MAX_LOOP_WORDS``
    words, compared in lower case) that follows itself at once, or None. The last word counts
    only when whitespace follows it or ``final``; ``first_end`` skips phrases that end before
    that word (already checked)."""
    words, starts = _words(text)
    n = len(words) - (0 if final or not text or text[-1].isspace() else 1)
    return _loop_start(words, starts, n, min_words, first_end)


def _loop_start(words: Sequence[str], starts: Sequence[int], n: int, min_words: int,
                first_end: int) -> int | None:
    """``loop_start`` on the first ``n`` of ``words`` (lower case) starting at ``starts``."""
    for end in range(max(2 * min_words, first_end), n + 1):
        for k in range(min_words, min(end // 2, MAX_LOOP_WORDS) + 1):
            if words[end - k : end] == words[end - 2 * k : end - k] and _loop_unit_ok(
                words[end - k : end]
            ):
                return starts[end - k]
    return None


def open_loop_start(text: str, min_words: int = MIN_LOOP_WORDS) -> int | None:
    """Start char of the earliest unfinished tail (whole words) that repeats the phrase just
    before it, i.e. may still become a loop; None when there is none. A tail that ends inside
    a word counts only for its complete words."""
    words, starts = _words(text)
    n = len(words)
    if text and not text[-1].isspace():
        n -= 1  # the last word may still grow
    return _open_loop_start(words, starts, n, min_words)


def _open_loop_start(words: Sequence[str], starts: Sequence[int], n: int,
                     min_words: int) -> int | None:
    """``open_loop_start`` on the first ``n`` of ``words`` (lower case) at ``starts``."""
    for p in range(max(min_words, n - MAX_LOOP_WORDS), n):
        m, first = n - p, words[p]
        for k in range(max(min_words, m + 1), min(p, MAX_LOOP_WORDS) + 1):
            # the first words differ for most k: compare them before slicing
            if (words[p - k] == first and words[p:n] == words[p - k : p - k + m]
                    and _loop_unit_ok(words[p - k : p])):
                return starts[p]
    return None


def open_repeat_start(text: str, min_chars: int = MIN_REPEAT_CHARS) -> int | None:
    """Start char of the unfinished last sentence when its normalised text is a non-empty
    prefix of an earlier complete sentence of at least ``min_chars`` characters (it may still
    become a repeat), else None."""
    spans, open_start = sentence_spans(text)
    tail = normalize_sentence(text[open_start:])
    if not tail:
        return None
    for s, e in spans:
        norm = normalize_sentence(text[s:e])
        if len(norm) >= min_chars and norm.startswith(tail):
            return _with_marker(text, open_start)  # a cut takes the line's markers with it
    return None


class GuardScan:
    """The repeat, loop and junk guards of one growing text, incrementally: ``update(text)`` reads
    only what was added since the last call, and the methods then answer as the functions of
    the same name do on ``text`` (``tests/core/test_output_guards.py`` checks them against each
    other).

    The functions rescan the whole text, so a stream that calls them after every token spends
    O(n^2) on an answer of n tokens (about 1 ms a token at 1,300 tokens). What they read only
    grows: a complete sentence (its boundary is followed by whitespace) and a complete word
    (followed by whitespace) stay as they are while text is appended. So the scan keeps the
    normalised complete sentences (the repeat guard compares against them), the first repeat
    among them, and the complete words in lower case (the loop guard reads the last
    ``2 * MAX_LOOP_WORDS``). The junk guard's expressions search from the start of the
    earliest trailing run that may still become junk (``open_junk_start``; where there is
    none, from the end): a junk run that was not in the last text overlaps its end, so what
    of it the last text holds was such a run (the one exception, spaces opening the text
    before a symbol line, keeps the search at 0). When a text does not extend what was read
    (a stop string cut it, or a tokenizer rewrote its tail), the scan starts over from it
    (the junk search alone when only the text after the last complete word changed).
    """

    def __init__(self, min_chars: int = MIN_REPEAT_CHARS) -> None:
        self.min_chars = min_chars
        self._reset()

    def _reset(self) -> None:
        self._read = ""  # the text up to where sentences and words were read
        self._pos = 0  # where the unfinished last sentence's region starts (a boundary's end)
        self._seen: set[str] = set()  # normalised complete sentences
        self._long: list[str] = []  # the distinct ones of at least min_chars characters
        self._repeat: int | None = None  # start of the first repeated one (repeat_start)
        self._wpos = 0  # just after the last complete word
        self.words: list[str] = []  # the complete words, lower case
        self.starts: list[int] = []
        self._partial: tuple[str, int] | None = None  # the unfinished last word
        self._open = 0  # where the unfinished last sentence starts (``sentence_spans``)
        self._junk_from = 0  # no junk run, nor the start of one, begins before this char
        self._junk: int | None = None
        self._open_junk: int | None = None

    def update(self, text: str) -> None:
        """Read ``text``, which normally extends the last one read."""
        if text is self._read:
            return
        # what was read, with the whitespace that completed it, must still be there
        if not text.startswith(self._read[: max(self._pos, self._wpos) + 1]):
            self._reset()
        elif not text.startswith(self._read):  # a rewritten tail: junk is searched again
            self._junk_from, self._junk = 0, None
        for end in sentence_ends(text, LINES, self._pos):
            s, e = trim_span(text, self._pos, end)
            if s < e:
                norm = normalize_sentence(text[s:e])
                if len(norm) >= self.min_chars:
                    if norm in self._seen:
                        if self._repeat is None:
                            self._repeat = _with_marker(text, s)
                    else:
                        self._seen.add(norm)
                        self._long.append(norm)
            self._pos = end
        self._open = trim_span(text, self._pos, len(text))[0]
        self._partial = None
        for m in _WORD.finditer(text, self._wpos):
            if m.end() < len(text):  # whitespace follows (words are maximal runs)
                self.words.append(m.group().lower())
                self.starts.append(m.start())
                self._wpos = m.end()
            else:
                self._partial = (m.group().lower(), m.start())
        if self._junk is None:
            found = _JUNK.search(text, self._junk_from)
            self._junk = found.start() if found else None
        held = _OPEN_JUNK.search(text, self._junk_from)
        self._open_junk = held.start() if held and held.end() > held.start() else None
        if self._junk is None:
            start = self._open_junk if self._open_junk is not None else len(text)
            if self._junk_from or text[:start].strip(" \t"):  # not only spaces before it
                self._junk_from = start  # (else a symbol line may still start at ^)
        self._read = text

    def repeat_start(self, text: str, final: bool = False) -> int | None:
        """``repeat_start(text, final)`` for the text last read."""
        if self._repeat is not None or not final or self._open >= len(text):
            return self._repeat
        s, e = trim_span(text, self._open, len(text))
        norm = normalize_sentence(text[s:e])
        return _with_marker(text, s) if len(norm) >= self.min_chars and norm in self._seen \
            else None

    def open_repeat_start(self, text: str) -> int | None:
        """``open_repeat_start(text)`` for the text last read."""
        tail = normalize_sentence(text[self._open:])
        if tail and any(norm.startswith(tail) for norm in self._long):
            return _with_marker(text, self._open)
        return None

    def junk_start(self) -> int | None:
        """``junk_start(text)`` for the text last read."""
        return self._junk

    def open_junk_start(self) -> int | None:
        """``open_junk_start(text)`` for the text last read."""
        return self._open_junk

    def complete_words(self) -> int:
        """``complete_words(text)`` (not final) for the text last read."""
        return len(self.words)

    def loop_start(self, final: bool = False, min_words: int = MIN_LOOP_WORDS,
                   first_end: int = 0) -> int | None:
        """``loop_start(text, final, min_words, first_end)`` for the text last read."""
        words, starts = self.words, self.starts
        if final and self._partial is not None:
            words, starts = words + [self._partial[0]], starts + [self._partial[1]]
        return _loop_start(words, starts, len(words), min_words, first_end)

    def open_loop_start(self, min_words: int = MIN_LOOP_WORDS) -> int | None:
        """``open_loop_start(text, min_words)`` for the text last read."""
        return _open_loop_start(self.words, self.starts, len(self.words), min_words)


def open_guarded_start(text: str) -> int | None:
    """Start char of the text that a guard may still cut whatever comes next: the unfinished
    last word (a loop's second copy may start with it) and, on a line holding no letter yet,
    that line (list markers go with a repeat that follows them on their line); None when
    neither is there. A stream holds it back."""
    line = text.rfind("\n") + 1
    if line < len(text) and not any(ch.isalpha() for ch in text[line:]):
        return line
    if text and not text[-1].isspace():
        return max(text.rfind(" "), text.rfind("\t"), text.rfind("\n")) + 1
    return None


def junk_start(text: str) -> int | None:
    """Start char of the first run of ``JUNK_RUN`` separators, of ``BLANK_LINES`` empty lines,
    or of a line opening with ``SYMBOL_RUN`` copies of one symbol (from its newline; see the
    module docstring), or None."""
    m = _JUNK.search(text)
    return m.start() if m else None


def open_junk_start(text: str) -> int | None:
    """Start char of a trailing run of separators or newlines that may still become junk (a
    stream holds it back until the next token decides), or None."""
    m = _OPEN_JUNK.search(text)
    return m.start() if m and m.end() > m.start() else None


def first_copy_document(
    doc_ids: Sequence[str | None], n_accepted: int, min_tokens: int = LOCK_MIN_TOKENS
) -> str | None:
    """The document a decoding locks to, from one accepted copy: the document of its first
    token when the copy is at least ``min_tokens`` tokens long (``doc_ids`` per accepted
    token), else None. Decided while decoding, once; not the citations' answer document
    (``core.citations.answer_document``: the evidence's, else the most cited, on the whole
    answer)."""
    if n_accepted < min_tokens or not doc_ids:
        return None
    return doc_ids[0]


def citation_words(text: str) -> int:
    """Words of a citation's text (runs of non-space characters holding a letter or digit)."""
    return sum(1 for w in text.split() if any(ch.isalnum() for ch in w))


__all__ = [
    "LOCK_MIN_TOKENS",
    "MAX_LOOP_WORDS",
    "MIN_LOOP_WORDS",
    "MIN_CITATION_WORDS",
    "MIN_REPEAT_CHARS",
    "SYMBOL_RUN",
    "citation_words",
    "complete_words",
    "first_copy_document",
    "junk_start",
    "open_guarded_start",
    "loop_start",
    "open_junk_start",
    "open_loop_start",
    "normalize_sentence",
    "open_repeat_start",
    "repeat_start",
    "sentence_spans",
]
