"""The one verify-and-commit loop: any drafter, one target LM, one KV cache.

Each step the drafter proposes, the target scores the whole draft in ONE forward pass, the
method's verifier (``verifiers.py``) accepts a prefix, and the loop commits it plus one token of
its own, crops the cache to exactly the committed tokens and tells the drafter. Two schedules,
chosen by ``Method.needs_target``:

- **target first** (NEST): the drafter needs p_M at the next position before it proposes, so
  the loop keeps ``cur``, the output at the last cached position. Either the cache holds every
  committed token and ``cur`` is set, or it holds all but the last one (``pending``), which the
  next step feeds alone (with ``NestConfig.lookahead``, together with a guess: ``lookahead.py``).
- **draft first** (lossless methods, as HF's assisted decoding): the cache holds the context
  but its last token (``pending``); each step feeds ``[pending] + draft`` in one pass, and row i
  scores draft token i. A step with no draft is an ordinary decoding step.

The target's passes are ``target.py``'s, the drafter's side ``drafts.py``'s. ``run()`` yields an
immutable ``Commit`` per commit, the only channel out (a consumer stops the loop by closing it),
and returns its output as data; stop strings and output guards are a ``StoppingCriteria`` passed
in (``commits.py``). ``decoding.plain.decode_ids`` runs it without an engine.
"""

from __future__ import annotations

from typing import Any, Generator, Iterator, Sequence

import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core.mixture import Distribution
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.core.verification import greedy_accept, greedy_tree_path
from nest_integrations.decoding.commits import (
    Commit, Committed, Decoded, StoppingCriteria,
)  # fmt: skip
from nest_integrations.decoding.lookahead import LookAhead
from nest_integrations.decoding.target import Rows, Target, TargetDistribution
from nest_integrations.decoding.verifiers import check_quote, make_verifier, rows_are_exact
from nest_integrations.decoding.drafts import Drafts
from nest_integrations.drafters.base import (
    RELAXED, DecodeState, Draft, Drafter, Method, ScratchPasses, Source, as_sources, first_branch,
)  # fmt: skip
from nest_integrations.lm.base import LanguageModel
from nest_integrations.types import NestStats, Passage


class DecodeLoop:
    """One generation's decoding: build it, then iterate ``run()`` for its commits."""

    def __init__(
        self, lm: LanguageModel, method: Method, drafter: Drafter | None, *, config: NestConfig,
        prompt_ids: list[int], memory: TokenMemory | None, passages: Sequence[Passage],
        offsets: Sequence[Any], max_new_tokens: int, stats: NestStats,
        generator: torch.Generator | None, eos: frozenset[int] | None = None,
        guards: Guards | None = None, stopping: StoppingCriteria | None = None,
    ) -> None:  # fmt: skip
        self.lm, self.method, self.drafter, self.config = lm, method, drafter, config
        self.memory = memory if method.uses_memory else None
        self.stats = stats
        self.max_new_tokens = max_new_tokens
        self.eos = lm.eos_token_ids if eos is None else frozenset(eos)
        #: NEST's Eq. 7 acceptance: the modes whose on-topic guards are on by default
        self.relaxed = method.verifier == RELAXED and not config.strict_acceptance
        if drafter is not None and not self.relaxed:  # lossless: greedy's output, bit for bit?
            stats.exact_rows = rows_are_exact(lm, method.name)
        self.guards = guards if guards is not None else Guards()
        self.stopping = stopping
        self.output = Committed(passages, offsets, stats)  # its output, passages (commits.py)
        self.verifier = make_verifier(method, config, generator, self.eos, self.guards)
        #: lossless greedy on p_LM reads the logits' argmax (as greedy decoding picks a token:
        #: no softmax, which could also merge two nearly equal logits into one probability);
        #: draft-first passes then ask for the argmaxes alone where the LM returns them
        self._argmax_logits = (not method.uses_memory and method.verifier != RELAXED
                               and not self.verifier.sampling)
        # relaxed decoding needs no bit-exact verify rows (the LM's faster passes), nor does a
        # decoding with no drafts (its steps as the backend's own generate's): ``Target``
        self.target = Target(lm, stats, relaxed=self.relaxed, drafts=drafter is not None,
                             argmax=self._argmax_logits and not method.needs_target)
        self.cache = self.target.cache
        self.done = False  # set by the loop itself: EOS, a stop string, the budget
        self.quote_rejected = False  # the model rejected the evidence quote (check_quote)
        #: the target at each row: p_M for NEST-family methods, else p_LM
        self.distribution = TargetDistribution(method.uses_memory, self.memory, config, stats)
        self.state = DecodeState(  # the drafter's read view: no LM, cache or stats to write
            prompt_ids=list(prompt_ids), out_ids=self.output.ids, budget=max_new_tokens,
            config=config, eos=self.eos, passages=tuple(passages), offsets=tuple(offsets),
            choose_token=self.verifier.choose_token, next_token=self.verifier.next_token,
            memory=self.memory, generator=generator,
            scratch=ScratchPasses(lm, self.cache, self.target.port.layer_skip),
        )  # fmt: skip
        self.drafts = Drafts(drafter, self.state, lm.vocab_size, stats)
        self.ahead = (LookAhead(self.target.run, lm, self.cache, self.state, config.lookahead,
                                stats.lookahead) if config.lookahead and method.needs_target
                      else None)

    # ----------------------------------------------------------------- shared steps
    @property
    def budget(self) -> int:
        return self.max_new_tokens - len(self.output)

    def forward(
        self, ids: list[int], last: int | None = None, parents: list[int] | None = None,
        argmax: bool = False, until_rejected: bool = False,
    ) -> Rows:
        """One target pass after the cache (look-ahead rows first, when there are any)."""
        if self.ahead is not None and self.ahead.tokens:
            return self.ahead.forward(ids)
        return self.target.run(ids, last, parents, argmax=argmax, until_rejected=until_rejected)

    def feed(self, token: int) -> Rows:
        """Feed the last committed token alone (target-first), or with a look-ahead guess."""
        if self.ahead is not None:
            return self.ahead.feed(token, self.budget - 1)  # the guess follows the token
        return self.forward([token])

    def committed_length(self) -> int:
        """Cached positions that hold committed tokens (a look-ahead guess follows them)."""
        if self.ahead is not None:
            return self.ahead.committed_length()
        return self.target.length()

    def prefill(self, argmax: bool = False, quote: Sequence[int] = ()) -> Rows:
        """The prompt's forward pass (last row only; with an opening ``quote``, the quote's
        tokens in the same pass, and their rows). When the drafter wants the prompt's vector
        (``wants_prompt_vector``) and the LM can capture it, the same pass also fills
        ``state.prompt_vector``: no extra forward. ``argmax``: as in ``Target.run``."""
        prompt, last = self.state.prompt_ids + list(quote), 1 + len(quote)
        if self.drafts.wants_prompt_vector and self.target.captures_prompt_vector:
            out, self.state.prompt_vector = self.target.prefill_with_vector(
                lambda: self.forward(prompt, last=last, argmax=argmax))
            return out
        if not self._wants_keys():
            return self.target.run(prompt, last=last, keys=False, argmax=argmax)
        return self.forward(prompt, last=last, argmax=argmax)

    def _wants_keys(self) -> bool:
        """Whether the prompt's last key vector is read: by NEST's memory, or as
        ``DecodeState.hidden`` by a drafter that does not say ``wants_hidden = False``."""
        if self.method.uses_memory or self.ahead is not None:
            return True
        return self.drafts.wants_hidden()

    def target_rows(self, logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """What a lossless draft-first step verifies against: the logits themselves for greedy
        on p_LM (only their argmax is read), else the target distribution's rows."""
        return logits if self._argmax_logits else self.distribution(logits, keys).p

    def verify_rows(self, rows: torch.Tensor | list[int], keys: torch.Tensor,
                    draft: list[int], q: torch.Tensor | None) -> tuple[int, int]:
        """A draft-first pass's ``(n_accepted, next_token)``: on its logits, by the method's
        verifier (``target_rows``); on each row's argmax (a list: ``Target.argmax``), by
        greedy acceptance, the same rule on what it reads."""
        if isinstance(rows, list):
            return greedy_accept(rows, draft)
        p = self.target_rows(rows, keys)
        d = torch.as_tensor(draft, dtype=torch.long, device=p.device)
        return self.verifier.verify_and_correct(p, d, q)

    def propose(self, budget: int) -> Draft | None:
        """The drafter's draft (``Drafts.propose``) after registering the passages it brings
        (``Draft.new_passages``); None for an ordinary step."""
        draft = self.drafts.propose(budget)
        if draft is not None and draft.new_passages:  # the state's view follows the loop's list
            self.state.passages, self.state.offsets = self.output.register(draft.new_passages)
        return draft if draft is not None and draft.tokens else None

    def commit(self, ids: list[int], sources: list[Source], copied: bool = False) -> Commit:
        """Append tokens, cut at EOS, the budget and the stopping criterion: what was
        committed."""
        commit, reason = self.output.add(ids, sources, copied, self.eos, self.max_new_tokens,
                                         self.stopping)
        if reason:  # the output has ended: "stop", "repeat" or "length"
            self.done = True
            if reason != "length" or not self.stats.finish_reason:
                self.stats.finish_reason = reason
        self.state.budget = self.budget
        return commit

    # ----------------------------------------------------------------- schedules
    def run(self) -> Generator[Commit, None, Decoded]:
        """Decode to the end, yielding each commit (the last one, ``final`` and empty, ends
        the text), and return the output. The cache is given back when decoding ends or the
        consumer closes the generator (``Target.release``)."""
        try:
            yield from self._target_first() if self.method.needs_target else self._draft_first()
        finally:
            self.target.release()
        if self.stopping is not None and self.output.finish(self.stopping):
            self.done = True  # the output guards cut its last sentence
            self.stats.finish_reason = "repeat"
        yield self.output.commit(True, final=True)  # the text has ended: show what was held
        return self.output.decoded(self.distribution.mean_lambda, self.quote_rejected)

    def _ordinary_token(self, dist: Distribution, draft: Draft | None
                        ) -> tuple[int, Source, int] | None:  # fmt: skip
        """Target-first: ``(token, source, n_accepted)`` when this step commits one token
        without a verify pass (no draft; a drafter's own ordinary step, i.e. a one-token
        ``chosen_first`` draft; or a draft whose first token the target rejects), else None."""
        if draft is None:
            return self.verifier.next_token(dist), None, 0
        if draft.chosen_first and len(draft) == 1:
            return draft.tokens[0], as_sources(draft.sources, 1)[0], 1
        if draft.parents is not None:
            raise ValueError(f"{self.method.name}: token trees need a draft-first method")
        self.drafts.count(draft)
        first = torch.as_tensor(draft.tokens[:1], device=dist.p.device)
        if not draft.chosen_first and self.verifier.accept_count(dist, first) == 0:
            return self.verifier.next_token(dist), None, 0
        return None

    def _quote(self, quote: Draft) -> Commit:
        """Commit an evidence quote whole: every token decided by the drafter, and cited."""
        self.stats.drafting.accepted_tokens += len(quote)
        self.drafts.update(quote, len(quote))
        return self.commit(quote.tokens, as_sources(quote.sources, len(quote)), copied=True)

    def _target_first(self) -> Iterator[Commit]:
        """NEST's schedule (see the module docstring). An opening evidence quote runs in the
        prompt's pass; where nothing checks it (``Guards.quote_check`` off) it is shown first."""
        v, stats = self.verifier, self.stats
        quote = self.drafts.opening_quote(self.budget)  # decided before any pass
        if quote is not None:
            self.drafts.count(quote)
        shown = quote is not None and self.guards.quote_check is None
        if quote is not None and shown:
            yield self._quote(quote)
            if self.done:
                return
        logits, keys = self.prefill(quote=quote.tokens if quote is not None else ())
        cur: Rows | None = (logits[-1:], keys[-1:])
        if quote is not None:  # the model's say: row 0 scores its first token (check_quote)
            first = self.distribution(logits[:1], keys[:1]).p_lm[0]
            stats.quote_score, kept = check_quote(self.guards.quote_check, first, logits[1:],
                                                  quote.tokens)
            if not kept:  # nothing committed: the engine answers without the evidence
                self.quote_rejected = self.done = True
                self.target.crop(len(self.state.prompt_ids))
                return self.drafts.update(quote, 0)
            if not shown:
                yield self._quote(quote)
        pending: int | None = None
        while not self.done and self.budget > 0:
            if cur is None:  # feed the pending token: the cache then holds every commit
                cur = self.feed(pending)  # type: ignore[arg-type]
            dist = self.distribution(*cur)
            self.state.dist, self.state.hidden, self.state.pending = dist, cur[1][-1], None
            draft = self.propose(self.budget)
            step = self._ordinary_token(dist, draft)
            if step is not None:  # an ordinary step: one token, no verify pass
                w, src, n = step
                if draft is not None:
                    self.drafts.update(draft, n)
                yield self.commit([w], [src])
                pending, cur = w, None
                continue
            assert draft is not None
            tokens, sources = draft.tokens, as_sources(draft.sources, len(draft))
            d = torch.as_tensor(tokens, device=dist.p.device)
            before = self.committed_length()
            logits, keys = self.forward(tokens)  # ONE pass: (L, V), (L, d)
            if draft.quoted:  # the rest of an evidence quote (its opening was checked): all
                vdist, m = None, len(tokens)
            else:  # row i of vdist scores draft token i + 1 (token 0 was accepted above)
                vdist = self.distribution(logits[:-1], keys[:-1]) if len(tokens) > 1 else None
                m = 1 + (v.accept_count(vdist, d[1:]) if vdist is not None else 0)
            stats.drafting.accepted_tokens += m
            self.drafts.update(draft, m)
            yield self.commit(tokens[:m], sources[:m], copied=True)
            if m == len(tokens):
                cur = (logits[-1:], keys[-1:])  # the cache holds the whole draft
                continue
            self.target.crop(before + m)  # keep exactly the accepted tokens
            cur = None
            if self.done or self.budget <= 0:
                break
            c = v.next_token(vdist, m - 1)  # type: ignore[arg-type]
            yield self.commit([c], [None])
            pending = c

    def _draft_first(self) -> Iterator[Commit]:
        """Lossless schedule: feed ``[pending] + draft`` in one pass (see the module docstring)."""
        stats, argmax = self.stats, self.target.argmax
        logits, keys = self.prefill(argmax=argmax)
        _, first = self.verify_rows(logits[-1:], keys[-1:], [], None)
        self.state.hidden = keys[-1] if len(keys) else None  # none: nobody reads it (prefill)
        yield self.commit([first], [None])
        pending = first
        while not self.done and self.budget > 0:
            self.state.pending, self.state.dist = pending, None
            draft = self.propose(self.budget - 1)  # room for the token after the draft
            before = self.target.length()
            if draft is None:
                logits, keys = self.target.run([pending], keys=self._wants_keys(), argmax=argmax)
                _, c = self.verify_rows(logits, keys, [], None)
                self.state.hidden = keys[-1] if len(keys) else None
                yield self.commit([c], [self.drafts.cite(c)], copied=True)
                pending = c
                continue
            if draft.parents is not None and self.target.rows_split_now():
                draft = first_branch(draft)  # rows one at a time: a tree's rows cost a step each
            self.drafts.count(draft)
            if draft.parents is not None:
                path, c, hidden = self._verify_tree(pending, draft, before)
            else:
                path, c, hidden = self._verify_chain(pending, draft, before)
            stats.drafting.accepted_tokens += len(path)
            self.state.hidden = hidden
            self.drafts.update(draft, len(path))
            sources = as_sources(draft.sources, len(draft))
            yield self.commit([draft.tokens[i] for i in path], [sources[i] for i in path],
                              copied=True)
            if self.done or self.budget <= 0:
                break
            yield self.commit([c], [None])
            pending = c

    def _verify_chain(self, pending: int, draft: Draft, before: int
                       ) -> tuple[list[int], int, torch.Tensor]:  # fmt: skip
        """Verify a chain in one pass: the accepted draft indices, the next token, the key
        vector at the last accepted position; the cache keeps pending and the accepted."""
        tokens = draft.tokens
        # (L + 1, V) logits, or L + 1 argmaxes: row i scores draft[i]
        argmax = self.target.argmax
        logits, keys = self.forward([pending] + tokens, argmax=argmax, until_rejected=argmax)
        m, c = self.verify_rows(logits, keys, tokens, draft.q)
        self.target.crop(before + 1 + m)  # pending + the accepted draft tokens
        return list(range(m)), c, keys[m]

    def _verify_tree(self, pending: int, draft: Draft, before: int
                      ) -> tuple[list[int], int, torch.Tensor]:  # fmt: skip
        """Greedy verification of a token tree in one pass (REST/SpecInfer style): follow the
        child equal to the target's argmax from the root; keep only that path in the cache."""
        if self.verifier.sampling:
            raise ValueError("token-tree drafts are verified greedily: use temperature 0")
        tree = draft.parents or []
        parents = [-1] + [pp + 1 if pp >= 0 else 0 for pp in tree]  # pending is the root
        logits, keys = self.forward([pending] + draft.tokens, parents=parents)
        p = self.target_rows(logits, keys)  # row 0 follows pending, row i + 1 node i
        path = greedy_tree_path(p, draft.tokens, tree)
        node = path[-1] + 1 if path else 0
        self.target.keep_path(before, [0] + [i + 1 for i in path])
        return path, int(p[node].argmax()), keys[node]

