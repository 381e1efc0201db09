"""OutputText (incremental detokenisation, token ends, stop strings, deltas) against brute force.

The oracle is the definition: after every commit, ``text == detokenize(ids)`` and
``ends[i] == len(common prefix of detokenize(ids[:i + 1]) and text)``, recomputed from scratch;
decoding work is counted to show it grows linearly, not quadratically.
"""

from __future__ import annotations

import os.path
import random

import pytest

from nest_integrations.decoding.text_stream import OutputText

TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. 東京は日本の首都です。"
    " Emoji 🙂🎉👩‍💻 and café naïve. It included large territorial holdings around the "
    "Mediterranean Sea in Europe, North Africa, and Western Asia.\n\nNew paragraph: 北京 🙂."
)


@pytest.fixture(scope="module")
def tok(tiny_lm):
    return tiny_lm


def _brute_ends(detok, ids, text):
    return [len(os.path.commonprefix([detok(ids[: i + 1]), text])) for i in range(len(ids))]


def _batches(ids, seed):
    rng = random.Random(seed)
    i = 0
    while i < len(ids):
        n = rng.choice([1, 1, 2, 3, 7, 16])
        yield ids[i : i + n]
        i += n


@pytest.mark.parametrize("seed", [0, 1])
def test_incremental_text_and_ends_match_brute_force(tok, seed):
    ids = tok.tokenize(TEXT)
    out = OutputText(tok.detokenize)
    for batch in _batches(ids, seed):
        out.append(batch, [None] * len(batch), False)
        assert out.text == tok.detokenize(out.ids)
        assert list(out.ends) == _brute_ends(tok.detokenize, out.ids, out.text)
        assert out.ends.text == out.text
    assert out.text == TEXT
    assert all(a <= b for a, b in zip(out.ends, out.ends[1:]))
    # a split character belongs to the token that completes it: no end falls inside "\ufffd"
    assert all("\ufffd" not in out.text[: e] for e in out.ends)


def test_decoding_is_linear(tok):
    """Committing n tokens one at a time decodes O(n) tokens in total (was O(n^2))."""
    decoded = [0]

    def counting(ids):
        decoded[0] += len(ids)
        return tok.detokenize(ids)

    ids = (tok.tokenize(TEXT) * 6)[:600]
    out = OutputText(counting)
    for t in ids:
        out.append([t], [None], False)
    assert out.text == tok.detokenize(ids)
    assert decoded[0] < 60 * len(ids), decoded[0]  # quadratic would be ~ n^2 / 2 = 180,000


def test_stop_string_cuts_at_a_token_boundary_and_counts_kept_tokens(tok):
    """The text after a stop string is cut at the end of the last whole token before it; the
    text holds nothing absent from the kept ids, and copied flags follow the kept tokens."""
    ids = tok.tokenize(TEXT)
    full = tok.detokenize(ids)
    stop = "state of"
    out = OutputText(tok.detokenize, [stop])
    for k, batch in enumerate(_batches(ids, 3)):
        out.append(batch, [(0, 0)] * len(batch), True)
        if out.stopped:
            break
    assert out.stopped and stop not in out.text
    assert full.startswith(out.text) and len(out.text) <= full.index(stop)
    assert out.text == tok.detokenize(out.ids)  # nothing beyond the kept tokens
    assert len(out.ids) == len(out.sources) == len(out.copied) == len(out.ends)
    assert sum(out.copied) == len(out.ids)
    assert out.ends[-1] == len(out.text)


def test_deltas_add_up_and_never_stream_a_stop_string(tok):
    ids = tok.tokenize(TEXT)
    stop = "Rome. 東"
    out = OutputText(tok.detokenize, [stop])
    streamed = []
    for batch in _batches(ids, 5):
        out.append(batch, [None] * len(batch), False)
        streamed.append(out.delta(final=False))
        assert stop not in "".join(streamed)
        assert not "".join(streamed).endswith("\ufffd")
        if out.stopped:
            break
    streamed.append(out.delta(final=True))
    assert "".join(streamed) == out.text
    assert out.stopped and stop not in out.text


#: Pieces that make repeats, loops, list markers, junk runs and rule lines in any order.
GUARD_PIECES = ["The", " cat", " sat", " on", " the", " mat", ".", " ", "\n", "\n\n", "1.", " 2.",
                "-", ",", ";", "***", "**", " a", " vast", " endless", " blue", "!", " It",
                " is", " was", " here", "?", "  ", "4.", " Yes."]


def _guarded_stream(seed: int) -> tuple[str, OutputText]:
    rng = random.Random(seed)
    # a few sentences, then repeats of them and of their phrases, with noise in between
    base = [rng.choice(GUARD_PIECES) for _ in range(rng.randint(4, 14))]
    pieces = base + [rng.choice(GUARD_PIECES) for _ in range(rng.randint(0, 6))] + base * 2
    vocab = {p: i for i, p in enumerate(GUARD_PIECES)}
    ids = [vocab[p] for p in pieces]
    out = OutputText(lambda xs: "".join(GUARD_PIECES[i] for i in xs), repeat_guard=True)
    streamed = ""
    for batch in _batches(ids, seed):
        if out.stopped:
            break
        out.append(batch, [None] * len(batch), False)
        streamed += out.delta(final=False)
    out.finish()
    return streamed + out.delta(final=True), out


def test_a_guarded_stream_never_shows_text_the_answer_drops():
    """With the guards on (repeat, loop, junk, list markers), the streamed deltas add up to the
    final text exactly, on 300 random sequences fed a few tokens at a time; the guards cut
    many of them (the test has teeth)."""
    fired = 0
    for seed in range(300):
        streamed, out = _guarded_stream(seed)
        assert streamed == out.text, (seed, streamed, out.text)
        fired += out.repeated
    assert fired > 100
