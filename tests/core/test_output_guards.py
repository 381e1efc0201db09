"""On-topic guards (issue 22, ``core.guards``): a repeated sentence ends the answer, a copy stays in
the answer's document, short citations are not shown. On in relaxed modes, opt-in in lossless."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core.proposers import span_start
from nest_integrations.core.token_memory import Hits
from nest_integrations.core.guards import (
    GuardScan,
    complete_words,
    junk_start,
    loop_start,
    open_junk_start,
    open_loop_start,
    first_copy_document,
    citation_words,
    open_repeat_start,
    repeat_start,
    sentence_spans,
)
from nest_integrations.decoding.text_stream import OutputText
from nest_integrations.policy import AnswerPolicy
from nest_integrations.types import Passage
from tests.engines import make_engine
from tests.fakes import FakeLM

LOOP = 'The "assert expression" is evaluated and returned.'


def test_repeat_start_finds_the_first_repeated_sentence_or_line():
    text = f"It checks a condition. {LOOP}\n{LOOP.upper()}  {LOOP}"
    assert repeat_start(text) == text.index(LOOP.upper())  # case and whitespace aside
    assert repeat_start("Yes. Yes. Yes. It works.") is None  # shorter than MIN_REPEAT_CHARS
    assert repeat_start("one line here\none line here") is None  # the last line is unfinished
    assert repeat_start("one line here\none line here", final=True) == 14
    spans, open_start = sentence_spans("A b c. D e f! Unfinished")
    assert spans == [(0, 6), (7, 13)] and open_start == 14


def test_open_repeat_start_holds_a_possible_repeat():
    text = f"{LOOP} The \"assert"
    assert open_repeat_start(text) == len(LOOP) + 1
    assert open_repeat_start(f"{LOOP} It then") is None
    assert open_repeat_start(f"{LOOP} ") is None  # nothing unfinished


def _words(text):
    return text.split(" ")


def test_output_text_cuts_a_repeat_and_never_streams_it():
    words = ["x"] + _words(f" {LOOP} {LOOP} tail")  # id i -> word i
    detok = lambda ids: "".join(words[i] if i == 0 else " " + words[i] for i in ids)  # noqa: E731
    out = OutputText(detok, repeat_guard=True)
    streamed = ""
    for i in range(1, len(words)):
        if out.stopped:
            break
        out.append([i], [None], False)
        streamed += out.delta(final=False)
    streamed += out.delta(final=True)
    assert out.repeated and out.stopped
    assert out.text.strip() == LOOP and streamed == out.text
    plain = OutputText(detok)
    plain.append(list(range(1, len(words))), [None] * (len(words) - 1), False)
    assert plain.text.count(LOOP) == 2 and not plain.repeated


class _CycleLM(FakeLM):
    """FakeLM whose top token follows a fixed cycle of words: it loops on one sentence."""

    CYCLE = [" A", " dog", " sat", " on", " a", " mat."]

    def __init__(self):
        super().__init__(key_dim=8, vocab_size=512, seed=1)
        ids = [self._token_id(w) for w in self.CYCLE]
        self._next = {a: b for a, b in zip(ids, ids[1:] + ids[:1])}

    def forward(self, ids, cache, *, last=None):
        logits, keys = super().forward(ids, cache, last=last)
        rows = list(ids)[-logits.shape[0]:]
        for r, t in enumerate(rows):
            if int(t) in self._next:
                logits[r, self._next[int(t)]] = logits[r].max() + 20.0
        return logits, keys


def test_a_repeated_sentence_ends_the_answer_in_any_mode_when_the_policy_says_so():
    """The repeat stop is prefix-exact: with it on, a lossless answer is greedy's cut at the
    repeat (``finish_reason == "repeat"``); with it off (``paper``), greedy's whole."""
    guarded = AnswerPolicy(guards=Guards(stop_on_repeat=True))
    engine = make_engine(_CycleLM(), policy=guarded)
    prompt = "Story: a mat."
    relaxed = engine.generate(prompt, max_new_tokens=30, passages=[])
    assert relaxed.text == " A dog sat on a mat." and relaxed.stats.finish_reason == "repeat"
    streamed = "".join(c.text for c in engine.stream(prompt, max_new_tokens=30, passages=[]))
    assert streamed == relaxed.text
    lossless = engine.generate(prompt, max_new_tokens=30, passages=[], decoding="greedy")
    assert lossless.text == relaxed.text and lossless.stats.finish_reason == "repeat"
    paper = make_engine(_CycleLM())  # no policy: the paper's algorithm, no guards
    greedy = paper.generate(prompt, max_new_tokens=30, passages=[], decoding="greedy")
    assert greedy.text.count("A dog sat on a mat.") == 5 and greedy.stats.finish_reason == "length"
    assert greedy.text.startswith(lossless.text)  # the guard only ended it early
    strict = paper.generate(prompt, max_new_tokens=30, passages=[],
                            config=NestConfig(strict_acceptance=True))
    assert strict.text == greedy.text
    off = paper.generate(prompt, max_new_tokens=30, passages=[])
    assert off.text == greedy.text


def test_span_start_can_be_restricted_to_allowed_passages():
    class _Mem:
        values = torch.tensor([7, 7, 7])
        passage_of = torch.tensor([1, 0, 2])
        values_host, passage_host = values.numpy(), passage_of.numpy()

    hits = Hits(torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[0, 1, 2]]))
    assert span_start(hits, _Mem(), 7) == 0
    assert span_start(hits, _Mem(), 7, allowed=torch.tensor([False, False, True])) == 2
    assert span_start(hits, _Mem(), 7, allowed=torch.tensor([True, False, False])) == 1
    assert span_start(hits, _Mem(), 7, allowed=torch.tensor([False, False, False])) is None


def test_first_copy_document_is_the_first_substantial_copy():
    assert first_copy_document(["A", "A", "A", "A"], 4) == "A"
    assert first_copy_document(["B"] * 3, 3) is None  # too short to fix the topic
    assert first_copy_document([], 0) is None


def _passage(text, pid, doc):
    return Passage(pid, text, doc_id=doc, char_start=0, char_end=len(text))


def _run_end(sources, min_len=4):
    """Index after the first run of >= min_len consecutive sources from one passage."""
    i = 0
    while i < len(sources):
        j = i + 1
        while (j < len(sources) and sources[i] is not None and sources[j] is not None
               and sources[j][0] == sources[i][0] and sources[j][1] == sources[j - 1][1] + 1):
            j += 1
        if sources[i] is not None and j - i >= min_len:
            return j, sources[i][0]
        i = j
    return None, None


def test_no_copy_from_another_document_after_the_answers_document_is_set():
    """Two documents; once a >= 4-token copy from A is accepted, nothing later comes from B
    (span proposals and token-mode citations are vetoed); with the lock off, B follows A."""
    engine = make_engine(FakeLM(key_dim=8, vocab_size=512, seed=1))
    # B's clause "zeta, eta theta iota" is whole, so the clause rule keeps its citation in an
    # answer about A (a scrap of B would be dropped with the lock off too)
    passages = [_passage("alpha beta gamma delta epsilon zeta.", "a", "A"),
                _passage("zeta, eta theta iota, kappa lambda mu", "b", "B")]
    cfg = NestConfig(rrc_offset=10.0)  # lambda ~ 0: p_M ~ p_kNN, copies whatever is near
    lock = AnswerPolicy(guards=Guards(lock_document=True, min_citation_words=3))
    locked = engine.generate("Story: alpha", max_new_tokens=14, passages=passages, config=cfg,
                             policy=lock)
    free = engine.generate("Story: alpha", max_new_tokens=14, passages=passages, config=cfg,
                           policy=lock.replace(guards={"lock_document": False}))
    end, pid = _run_end(locked.token_sources)
    assert end is not None and pid == "a"
    assert all(s is None or s[0] == "a" for s in locked.token_sources[end:])
    assert {c.doc_id for c in locked.citations} == {"A"}
    end_free, _ = _run_end(free.token_sources)
    assert any(s is not None and s[0] == "b" for s in free.token_sources[end_free:])
    assert [c.doc_id for c in free.citations] == ["A", "B"]  # B cited after A


def test_no_citation_below_the_policys_minimum():
    engine = make_engine(FakeLM(key_dim=8, vocab_size=512, seed=1),
                         policy=AnswerPolicy(guards=Guards(min_citation_words=3)))
    passages = [_passage("alpha beta gamma", "a", "A")]
    cfg = NestConfig(rrc_offset=10.0)
    short = engine.generate("Story: alpha", max_new_tokens=2, passages=passages, config=cfg)
    assert short.text == "alpha beta" and short.token_sources == [("a", 0), ("a", 1)]
    assert short.citations == []  # 2 words: plain text, provenance kept
    shown = engine.generate("Story: alpha", max_new_tokens=2, passages=passages, config=cfg,
                            policy=AnswerPolicy())  # the paper's: every citation shows
    assert [c.text for c in shown.citations] == ["alpha beta"]
    long = engine.generate("Story: alpha", max_new_tokens=3, passages=passages, config=cfg)
    assert [c.text for c in long.citations] == ["alpha beta gamma"]
    assert citation_words('The "assert') == 2 and citation_words('" expression') == 1


def test_topic_knobs_are_validated():
    for field, bad in [("stop_on_repeat", "yes"), ("lock_document", 1),
                       ("min_citation_words", 0), ("min_citation_words", True)]:
        with pytest.raises(ValueError, match=field):
            Guards(**{field: bad})
    assert Guards() == AnswerPolicy.from_preset("paper").guards  # the paper: no guards
    grounded = AnswerPolicy.from_preset("grounded").guards
    assert grounded.stop_on_repeat and grounded.min_citation_words == 3


def test_loop_start_finds_a_phrase_that_follows_itself():
    text = "It is a dance, it is also referred to as, it is also referred to as, it is"
    cut = loop_start(text)
    assert cut == text.index("it is also referred to as,", 20)
    assert loop_start("a b a b a b a b") is None  # too short to be a phrase
    assert loop_start("one two three four five six") is None
    tail = "It is a dance, it is also referred to as, it is"
    assert open_loop_start(tail + " ") == tail.index("it is", 20)
    assert open_loop_start("It is a dance, it was ") is None
    assert open_loop_start("It is a dance, it ") == 15  # it may still become a loop


def test_a_repeat_after_a_list_marker_takes_the_marker_with_it():
    text = f"1.  {LOOP}\n2.  {LOOP}"
    assert repeat_start(text, final=True) == text.index("2.")


def test_an_unfinished_possible_repeat_at_the_budget_is_dropped_not_called_a_repeat():
    words = ["x"] + _words(f" {LOOP} The \"assert")
    detok = lambda ids: "".join(words[i] if i == 0 else " " + words[i] for i in ids)  # noqa: E731
    out = OutputText(detok, repeat_guard=True)
    out.append(list(range(1, len(words))), [None] * (len(words) - 1), False)
    assert out.delta(final=False).strip() == LOOP  # the possible repeat is held back
    assert out.finish() is False and not out.repeated
    assert out.text.strip() == LOOP


def test_junk_guard_finds_separator_runs_and_blank_line_runs():
    from nest_integrations.core.guards import junk_start, open_junk_start

    text = "Belly dance is a Middle Eastern dance.,,,,,,,,,,,,,,,,"
    assert junk_start(text) == text.index(",")
    assert junk_start("x, , , ,") == 1
    assert junk_start("end.\n\n\n\n\n\nmore") == 4
    for fine in ("a, b, c, d", "list:\n\n- a\n\n- b", "a:b;c,d", "one,, two", "x\n\n\n\ny"):
        assert junk_start(fine) is None, fine
    assert open_junk_start("abc, ,") == 3 and open_junk_start("abc\n\n") == 3
    assert open_junk_start("abc") is None and open_junk_start("abc ") is None
    # a line opening with 8+ copies of one symbol: a copied reStructuredText rule
    assert junk_start("The\n************") == 3
    assert junk_start("In version 3.10.\n\n\n============ x") == len("In version 3.10.\n\n")
    assert junk_start("************ first") == 0
    for fine in ("a **bold** word", "line\n--- rule", "----- five", "a\n|---|---|",
                 "code ``` here", "dots........ mid-line"):
        assert junk_start(fine) is None, fine
    assert open_junk_start("abc\n***") == 3 and open_junk_start("abc\n  ==") == 3
    assert open_junk_start("abc\n**x") is None and open_junk_start("abc*") is None


def test_junk_run_ends_a_relaxed_answer_and_is_never_streamed():
    """An output text with the guard on, fed one piece at a time: the run of commas is cut
    (``repeated``), no streamed delta held a comma of it, and the guard off keeps it all."""
    from nest_integrations.decoding.text_stream import OutputText

    pieces = ["Belly", " dance", " is", " a", " dance", ".", ",", ",", ",", ",", ",", ","]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    inv = {i: p for p, i in vocab.items()}

    def run(guard):
        out, streamed = OutputText(lambda ids: "".join(inv[i] for i in ids),
                                   repeat_guard=guard), ""
        for p in pieces:
            if out.stopped:
                break
            out.append([vocab[p]], [None], False)
            streamed += out.delta(final=False)
        out.finish()
        return out, streamed + out.delta(final=True)

    cut, streamed = run(True)
    assert cut.repeated and cut.text == "Belly dance is a dance." and streamed == cut.text
    free, all_text = run(False)
    assert not free.repeated and all_text == "Belly dance is a dance.,,,,,,"
    # a copied rule line, arriving a few symbols at a time, is cut at its newline, unstreamed
    pieces[:] = ["The", " assert", " statement", ".", "\n", "***", "***", "**", "***", "\n"]
    vocab.clear(), vocab.update({p: i for i, p in enumerate(dict.fromkeys(pieces))})
    inv.clear(), inv.update({i: p for p, i in vocab.items()})
    cut, streamed = run(True)
    assert cut.repeated and cut.text == "The assert statement." and streamed == cut.text
    assert run(False)[1] == "".join(pieces)


TRIALS = 300
_PIECES = ["The polar bear", " is a large bear.", " It lives in the Arctic.", " it is also called",
           " the sea bear,", " the sea bear,", " the sea bear", ". ", "!", "?\n", '."', ".)",
           "\n", "\n\n", "   ", " 4. ", "- ", ", , ,", ";", "*****", "\u00e9t\u00e9", " \ufffd",
           " The polar bear is a large bear.", " It lives in the Arctic.", " Yes.", " Yes.",
           "  ", "\t", "*", "=", ",", " ,", ":", "\n \n", "x"]


def _scan_agrees(scan: GuardScan, text: str, first_end: int) -> None:
    scan.update(text)
    assert scan.repeat_start(text) == repeat_start(text), text
    assert scan.repeat_start(text, final=True) == repeat_start(text, final=True), text
    assert scan.open_repeat_start(text) == open_repeat_start(text), text
    assert scan.complete_words() == complete_words(text), text
    assert scan.open_loop_start() == open_loop_start(text), text
    assert scan.junk_start() == junk_start(text), text
    assert scan.open_junk_start() == open_junk_start(text), text
    for final in (False, True):
        assert (scan.loop_start(final=final, first_end=first_end)
                == loop_start(text, final=final, first_end=first_end)), text


def test_the_incremental_guard_scan_answers_as_the_functions_do():
    """``GuardScan`` (what the output stream runs after each token, reading only the new text)
    gives the repeat, open-repeat, loop and open-loop starts and the word count that the pure
    functions give on the whole text, on every prefix of random texts grown a few characters
    at a time (sentences, repeats, loops, lists, quotes, junk, a replacement character); and a
    text that does not extend the last one (a cut, a rewritten tail) starts the scan over."""
    import random

    rng = random.Random(0)
    for trial in range(TRIALS):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14)))
        scan, at = GuardScan(), 0
        while at < len(text):
            at = min(len(text), at + rng.randint(1, 7))
            _scan_agrees(scan, text[:at], rng.randint(0, 12))
        cut = rng.randint(0, len(text))  # shorter or rewritten: read again from the start
        _scan_agrees(scan, text[:cut], 0)
        _scan_agrees(scan, text[:cut] + "X" + text[cut:], 0)


def test_the_stream_cuts_as_before_with_the_scan():
    """The output stream's guard decisions (text kept, the repeat flag, what a stream holds
    back) are those of the pure functions run on the whole text after each token."""
    import random

    rng = random.Random(1)
    for trial in range(100):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14)))
        chars = list(text)
        out = OutputText(lambda ids: "".join(chars[i] for i in ids), [], repeat_guard=True)
        checked = 0
        for i in range(len(chars)):
            before = out.text + chars[i]
            out.append([i], [None], False)
            want = _first_cut(before, checked)
            checked = complete_words(before)
            if want is not None:
                assert out.stopped and out.text == before[:want], (before, out.text)
                break
            assert out.text == before
            out.delta(False)
        else:
            text = out.text
            cut = _first_cut(text, checked, final=True)
            held = open_repeat_start(text) if cut is None else None
            assert out.finish() == (cut is not None)
            assert out.text == text[: cut if cut is not None else held]


def _first_cut(text: str, checked: int, final: bool = False) -> int | None:
    found = [c for c in (repeat_start(text, final=final),
                         loop_start(text, final=final, first_end=checked + 1),
                         junk_start(text)) if c is not None]
    return min(found) if found else None

