"""Look-ahead for the target-first schedule (``NestConfig.lookahead``): fewer passes, same tokens.

The pass that feeds the last committed token also feeds a guess of what follows (prompt lookup
over the context). The cache keeps the guess after the fed tokens; a later pass over the same
tokens takes their rows instead of computing them, and a guess it only partly matches is
cropped. A guess never decides a token, so the output is the same as without it, up to the
numerics of a wider pass.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from nest_integrations.drafters.base import DecodeState, Draft
from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter
from nest_integrations.lm.base import LanguageModel
from nest_integrations.types import LookaheadStats

#: ``(logits, keys)`` rows of a target pass: ``(T, V)`` and ``(T, d)``.
Rows = tuple[torch.Tensor, torch.Tensor]


class LookAhead:
    """Wraps the loop's target pass (``run``): ``forward`` serves guessed rows first, ``feed``
    feeds a committed token together with the next guess."""

    def __init__(
        self, run: Callable[[list[int]], Rows], lm: LanguageModel, cache: Any,
        state: DecodeState, num_tokens: int, stats: LookaheadStats,
    ) -> None:
        self.run, self.lm, self.cache, self.state = run, lm, cache, state
        self.stats = stats
        self.guesser = PromptLookupDrafter(num_tokens=num_tokens)
        #: guessed tokens the cache holds after the fed ones, and their rows (row i follows
        #: tokens[i])
        self.tokens: list[int] = []
        self.rows: Rows | None = None
        self._guess: Draft | None = None
        self._used = 0

    def committed_length(self) -> int:
        """Cached positions before the guess: the tokens fed so far."""
        return self.lm.cache_length(self.cache) - len(self.tokens)

    def forward(self, ids: list[int]) -> Rows:
        """The rows of ``ids`` after the fed tokens: the guessed ones taken, the rest run."""
        reused = self.take(ids) if self.tokens else None
        if reused is None:
            return self.run(ids)
        n = reused[0].shape[0]
        if n == len(ids):
            return reused
        out = self.run(ids[n:])
        return torch.cat([reused[0], out[0]]), torch.cat([reused[1], out[1]])

    def feed(self, token: int, budget: int) -> Rows:
        """Feed the last committed token, and a guess of at most ``budget`` tokens after it:
        the token's output row."""
        if self.tokens and self.tokens[0] == token:
            return self.forward([token])  # the guess was right: no pass
        self.state.budget = budget
        guess = self.guesser.propose(self.state)
        # forward, not run: a wrong guess still in the cache is cropped first
        if guess is None:
            return self.forward([token])
        logits, keys = self.forward([token] + guess.tokens)
        self.tokens, self.rows = list(guess.tokens), (logits[1:], keys[1:])
        self._guess, self._used = guess, 0
        self.stats.fed += len(guess)
        return logits[:1], keys[:1]

    def take(self, ids: list[int]) -> Rows | None:
        """The guessed rows of ``ids``' common prefix with the guess (None when empty). A guess
        that ``ids`` only partly matches is cropped from the cache after that prefix."""
        ahead, rows = self.tokens, self.rows
        assert rows is not None
        j = 0
        while j < min(len(ahead), len(ids)) and ahead[j] == ids[j]:
            j += 1
        self._used += j
        self.stats.taken += j
        if j == len(ids) and j < len(ahead):  # all of ids was guessed: keep the rest
            self.tokens, self.rows = ahead[j:], (rows[0][j:], rows[1][j:])
        else:
            self.lm.crop_cache(self.cache, self.committed_length() + j)
            self.tokens, self.rows = [], None
            if self._guess is not None:
                self.guesser.update(self.state, self._guess, self._used)
            self._guess = None
        return (rows[0][:j], rows[1][:j]) if j else None
