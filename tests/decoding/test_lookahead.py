"""The target-first schedule's look-ahead (``NestConfig.lookahead``, ``decoding.lookahead``).

A one-token pass that feeds the last committed token also feeds an n-gram guess of what
follows; a later pass over the same tokens takes the guessed rows instead of computing them.
A guess never decides a token, so:

- NEST with the look-ahead equals NEST without it, token for token, source for source (fp32:
  rows of a wider pass equal one-token rows to ~1e-6), in relaxed and strict acceptance;
- it saves forward passes when guesses are right (the counters say how many rows it reused);
- a test of the test: reusing rows whose guessed token was not the one fed changes the output.
"""

from __future__ import annotations

import dataclasses

import pytest

from nest_integrations.decoding.lookahead import LookAhead
from nest_integrations.config import NestConfig
from tests.engines import make_engine
from tests.passages import PASSAGE_TEXT, UNRELATED_TEXT, make_passage

PROMPTS = [PASSAGE_TEXT[:40], "The Mediterranean Sea in Europe and the city of Rome",
           UNRELATED_TEXT[:50]]
CONFIGS = {
    "relaxed-copying": NestConfig(span_threshold=1.0, min_citation_tokens=1, relaxation=0.9),
    "paper": NestConfig(),
    "strict": NestConfig(span_threshold=1.0, strict_acceptance=True),
    "token-mode": NestConfig(span_copying=False),
}


def _passages():
    return [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]


def _run(lm, cfg: NestConfig, prompt: str, lookahead: int, n: int = 40):
    engine = make_engine(lm, config=dataclasses.replace(cfg, lookahead=lookahead))
    return engine.generate(prompt, max_new_tokens=n, passages=_passages())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_lookahead_changes_no_token(tiny_lm, name):
    """Same tokens, sources and citations with and without the look-ahead; guesses were fed."""
    fed = 0
    for prompt in PROMPTS:
        off = _run(tiny_lm, CONFIGS[name], prompt, 0)
        on = _run(tiny_lm, CONFIGS[name], prompt, 8)
        assert on.token_ids == off.token_ids, prompt
        assert on.token_sources == off.token_sources
        assert [c.to_dict() for c in on.citations] == [c.to_dict() for c in off.citations]
        assert off.stats.ahead_fed == off.stats.ahead_tokens == 0
        assert on.stats.ahead_tokens <= on.stats.ahead_fed
        # every reused row is a pass saved or a narrower one: never more passes
        assert on.stats.forward_passes <= off.stats.forward_passes
        fed += on.stats.ahead_fed
    assert fed > 0


def test_right_guesses_save_passes(tiny_lm):
    """On a run whose output repeats itself (the random tiny model loops), n-gram guesses are
    right and the look-ahead saves forward passes."""
    cfg = CONFIGS["token-mode"]
    off = _run(tiny_lm, cfg, PROMPTS[0], 0, n=64)
    on = _run(tiny_lm, cfg, PROMPTS[0], 8, n=64)
    assert on.token_ids == off.token_ids
    assert on.stats.ahead_tokens > 0
    assert on.stats.forward_passes < off.stats.forward_passes


def test_reusing_rows_of_a_wrong_guess_is_caught(tiny_lm, monkeypatch):
    """A test of the tests above: a look-ahead that hands out its rows whatever token is fed
    (no comparison with the guess) changes the output."""
    take = LookAhead.take

    def blind(self, ids):
        if ids:
            ids = self.tokens[:len(ids)] + list(ids[len(self.tokens):])
        return take(self, ids)

    cfg = CONFIGS["token-mode"]
    changed = False
    for prompt in PROMPTS:
        monkeypatch.setattr(LookAhead, "take", take)
        off = _run(tiny_lm, cfg, prompt, 0, n=64)
        monkeypatch.setattr(LookAhead, "take", blind)
        on = _run(tiny_lm, cfg, prompt, 8, n=64)
        changed |= on.token_ids != off.token_ids
    assert changed


def test_lookahead_is_on_in_grounded_off_in_the_paper_and_validated():
    assert NestConfig().lookahead == 0
    assert NestConfig.from_preset("paper").lookahead == 0
    assert NestConfig.from_preset("grounded").lookahead == 8
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="lookahead"):
            NestConfig(lookahead=bad)
