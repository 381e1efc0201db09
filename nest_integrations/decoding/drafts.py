"""The decode loop's side of a drafter: drafts validated, cut to the budget and timed; the
drafting counters; and what a drafter may say beyond the two-method interface
(``drafters.base.Drafter``):

- ``wants_prompt_vector = True``: the prefill also captures the prompt's vector;
- ``wants_hidden = False``: no pass needs key rows for it (they may cost the LM a pass);
- ``cite(state, token)``: the source of a token a plain step commits (a copy drafter whose
  draft that token would have been);
- ``opening_quote(state)``: a quote decided before any pass (evidence first), which the loop
  runs with the prompt in one pass.
"""

from __future__ import annotations

import time
from dataclasses import replace

from nest_integrations.drafters.base import (
    CitesTokens, DecodeState, Draft, Drafter, QuotesFirst, Source, WantsHidden, WantsPromptVector,
    as_sources, validate_draft,
)  # fmt: skip
from nest_integrations.types import NestStats


class Drafts:
    """The drafter of one generation (None: no drafts, every step an ordinary one) and the
    ``DecodeState`` it reads."""

    def __init__(self, drafter: Drafter | None, state: DecodeState, vocab_size: int,
                 stats: NestStats) -> None:  # fmt: skip
        self.drafter, self.state, self.vocab_size = drafter, state, vocab_size
        self.stats = stats
        # what it says beyond the two methods, found once (``drafters.base``'s protocols)
        self._cites = drafter if isinstance(drafter, CitesTokens) else None
        self._vector = drafter if isinstance(drafter, WantsPromptVector) else None
        self._hidden = drafter if isinstance(drafter, WantsHidden) else None
        self._quotes = drafter if isinstance(drafter, QuotesFirst) else None

    @property
    def wants_prompt_vector(self) -> bool:
        """Whether the drafter reads ``DecodeState.prompt_vector`` (default: no)."""
        return self._vector is not None and bool(self._vector.wants_prompt_vector)

    def wants_hidden(self) -> bool:
        """Whether the drafter reads ``DecodeState.hidden`` now (default: yes)."""
        if self.drafter is None:
            return False
        return self._hidden is None or bool(self._hidden.wants_hidden)

    def propose(self, budget: int) -> Draft | None:
        """The drafter's draft, validated and cut to ``budget`` (None, or a draft with no
        tokens that only carries ``new_passages``: an ordinary step)."""
        if self.drafter is None or budget < 1:
            return None
        state = self.state
        state.budget = budget
        t0 = time.perf_counter()
        draft = self.drafter.propose(state)
        self.stats.timing.draft += time.perf_counter() - t0
        if draft is not None:  # the drafter's own counters come back in its draft
            self.stats.drafting.forwards += draft.forwards
            self.stats.drafting.candidates += draft.candidates
            if draft.route is not None:
                self.stats.route = draft.route
        if draft is None or not draft.tokens:  # no draft (one with passages: the loop's to add)
            return draft if draft is not None and draft.new_passages else None
        validate_draft(draft, self.vocab_size)
        return self._cut(draft, budget)

    def opening_quote(self, budget: int) -> Draft | None:
        """The drafter's opening quote (``QuotesFirst``), decided before any pass and cut to
        ``budget``, or None."""
        if self._quotes is None or budget < 1:
            return None
        self.state.budget = budget
        t0 = time.perf_counter()
        draft = self._quotes.opening_quote(self.state)
        self.stats.timing.draft += time.perf_counter() - t0
        if draft is None or not draft.tokens:
            return None
        validate_draft(draft, self.vocab_size)
        return self._cut(draft, budget)

    def _cut(self, draft: Draft, budget: int) -> Draft:
        """A chain cut to ``budget`` tokens (the loop enforces the budget)."""
        if len(draft) <= budget or draft.parents is not None:
            return draft
        return replace(draft, tokens=draft.tokens[:budget],
                       sources=as_sources(draft.sources, len(draft))[:budget],
                       q=None if draft.q is None else draft.q[:budget])

    def update(self, draft: Draft, n_accepted: int) -> None:
        """Tell the drafter how much of ``draft`` was committed."""
        self.drafter.update(self.state, draft, n_accepted)  # type: ignore[union-attr]

    def cite(self, token: int) -> Source:
        """The source of a token a plain step commits: the drafter's ``cite`` when it has one,
        else None."""
        return None if self._cites is None else self._cites.cite(self.state, token)

    def count(self, draft: Draft) -> None:
        """Count a draft the target is about to verify."""
        d = self.stats.drafting
        d.verify_steps += 1
        d.drafted_tokens += len(draft)
        if draft.parents is not None:
            d.tree_steps += 1
            d.tree_nodes += len(draft)
