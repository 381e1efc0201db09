"""The one verify-and-commit loop: any drafter, one target LM, one KV cache.

Each step: the drafter proposes (``Drafter.propose``), the target scores the whole draft in ONE
forward pass, a verification rule accepts a prefix, the loop commits it plus one token of its own,
crops the KV cache to exactly the committed tokens, and tells the drafter (``Drafter.update``).

Two schedules, chosen by ``Method.needs_target``:

- **target first** (NEST): the drafter needs p_M at the next position before it can propose (it
  picks the span start from it), so the loop keeps ``cur`` = the model output at the last cached
  position. Invariant: either the cache holds every committed token and ``cur`` is set, or it
  holds all but the last committed token (``pending``), which the next step feeds alone. With
  ``NestConfig.lookahead`` that pass also feeds a prompt-lookup guess of what follows; the
  cache then holds the guess after the fed tokens (``_ahead``), and the next pass takes the
  rows of the part it matches and crops the rest (``feed``, ``_take_ahead``).
- **draft first** (lossless methods, as in HF's assisted decoding): the cache always holds the
  context except its last token (``pending``); each step feeds ``[pending] + draft`` in one pass,
  and row i of the output scores draft token i. A step with no draft is an ordinary decoding
  step. The first output token comes from the prefill.

Verification is a plug-in chosen by the method (``Method.verifier``, a name in ``VERIFIERS``):
``RelaxedVerifier`` (NEST, Eq. 7 with its LM guards from ``core.verification``) or
``LosslessVerifier`` (exact greedy, or speculative sampling, lossless in distribution for a
chain, when ``temperature > 0``).

``decode_ids`` runs the loop without an engine (no retrieval, no streaming): the KNN-SSD
skip-set search and the DReSD response-cache builder decode with it.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core.mixture import StepDistribution, nest_distribution
from nest_integrations.core.sampling import choose_token, warp
from nest_integrations.core.topic import citation_words
from nest_integrations.core.verification import (
    guard_veto,
    guarded_token,
    relaxed_accept_count,
    sampled_accept_count,
    speculative_sampling,
    strict_accept_count,
)
from nest_integrations.drafters.base import (
    LOSSLESS,
    RELAXED,
    DecodeState,
    Draft,
    Drafter,
    Method,
    as_sources,
    validate_draft,
)
from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter
from nest_integrations.decoding.text_stream import OutputText
from nest_integrations.types import NestStats, StreamChunk


@dataclass
class LMDistribution:
    """The target of methods without NEST's memory: p_LM rows (``p``: ``(T, V)``)."""

    p: torch.Tensor

    @property
    def p_lm(self) -> torch.Tensor:
        """p_LM itself (the target is p_LM)."""
        return self.p


#: A target distribution: ``.p`` (the target rows) and ``.p_lm`` (the LM's own rows).
Distribution = LMDistribution | StepDistribution


class Verifier:
    """How many draft tokens to accept, and the token to commit after them (the base: token
    choice with the generation's temperature, top-p and RNG; no guards)."""

    #: the ``Method.verifier`` name
    name = ""

    def __init__(
        self,
        config: NestConfig,
        generator: torch.Generator | None,
        eos_ids: frozenset[int] = frozenset(),
        guards: Guards | None = None,
    ):
        self.config = config
        self.guards = guards if guards is not None else Guards()
        self.eos_ids = sorted(eos_ids)
        self.generator = generator
        self.sampling = config.temperature > 0

    def target(self, p: torch.Tensor) -> torch.Tensor:
        """Rows of the distribution tokens are drawn from (warped when sampling)."""
        cfg = self.config
        return warp(p, cfg.temperature, cfg.top_p) if self.sampling else p

    def choose(self, p_row: torch.Tensor) -> int:
        cfg = self.config
        return choose_token(p_row, cfg.temperature, cfg.top_p, self.generator)

    def pick(self, dist: Distribution, row: int = 0) -> int:
        """The token to commit at ``row`` of a target distribution."""
        return self.choose(dist.p[row])

    def accept(self, dist: Distribution, draft: torch.Tensor) -> int:
        """Accepted prefix length of ``draft`` scored by the rows of ``dist`` (row i scores
        draft[i]); the rule of the target-first schedule."""
        raise NotImplementedError

    def verify_and_correct(
        self, p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None
    ) -> tuple[int, int]:
        """On ``(L + 1, V)`` target rows (row i scores draft[i], row L follows the draft):
        ``(n_accepted, next_token)``; the rule of the draft-first schedule."""
        raise NotImplementedError(f"the {self.name} verifier has no draft-first rule")


class LosslessVerifier(Verifier):
    """Exact greedy acceptance, or speculative sampling when ``temperature > 0``: the output
    follows p_LM exactly (token for token when greedy)."""

    name = LOSSLESS

    def accept(self, dist: Distribution, draft: torch.Tensor) -> int:
        if self.sampling:
            raise ValueError("lossless sampling verifies drafts with the pending token: "
                             "the method must not set needs_target")
        return strict_accept_count(dist.p, draft)

    def verify_and_correct(
        self, p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None
    ) -> tuple[int, int]:
        n = int(draft.numel())
        if self.sampling:
            return speculative_sampling(self.target(p), draft, q, self.generator)
        m = strict_accept_count(p[:n], draft) if n else 0
        return m, int(p[m].argmax())


class RelaxedVerifier(Verifier):
    """NEST's relaxed acceptance (Eq. 7) of p_M, with the policy's LM guards
    (``Guards.confidence_guard`` / ``eos_guard``: ``core.verification.guard_veto`` /
    ``guarded_token``); exact acceptance with ``strict_acceptance``, a random Eq. 7 test when
    sampling."""

    name = RELAXED

    def pick(self, dist: Distribution, row: int = 0) -> int:
        g = self.guards
        return guarded_token(self.choose(dist.p[row]), dist.p_lm[row], self.eos_ids,
                             g.confidence_guard, g.eos_guard)

    def accept(self, dist: Distribution, draft: torch.Tensor) -> int:
        cfg = self.config
        if cfg.strict_acceptance:
            return strict_accept_count(dist.p, draft)
        if self.sampling:  # Eq. 7 as a random test, on the distribution tokens are drawn from
            return sampled_accept_count(self.target(dist.p), draft, cfg.relaxation,
                                        self.generator)  # fmt: skip
        g = self.guards
        veto = guard_veto(dist.p_lm, draft, self.eos_ids, g.confidence_guard, g.eos_guard)
        return relaxed_accept_count(dist.p, draft, cfg.relaxation, veto)


#: Verifiers by ``Method.verifier`` name (register a new rule here).
VERIFIERS: dict[str, type[Verifier]] = {RELAXED: RelaxedVerifier, LOSSLESS: LosslessVerifier}


def make_verifier(
    method: Method, config: NestConfig, generator: torch.Generator | None,
    eos_ids: frozenset[int] = frozenset(), guards: Guards | None = None,
) -> Verifier:
    """The verifier ``method`` names; a ValueError lists the known ones."""
    try:
        cls = VERIFIERS[method.verifier]
    except KeyError:
        raise ValueError(f"method {method.name!r} names an unknown verifier "
                         f"{method.verifier!r}: choose one of {sorted(VERIFIERS)}") from None
    return cls(config, generator, eos_ids, guards)


_warned_inexact: set[tuple[int, str]] = set()


def rows_are_exact(lm: Any, method: str) -> bool:
    """``lm.exact_rows`` (False for an LM that does not say). Warns once per LM and method
    when a lossless method drafts where verify rows are not bit-exact: then its output can
    leave greedy's at a near-tie."""
    exact = bool(getattr(lm, "exact_rows", False))
    if not exact and (id(lm), method) not in _warned_inexact:
        _warned_inexact.add((id(lm), method))
        warnings.warn(
            f"decoding={method!r} equals greedy decoding only where a verify pass gives each "
            f"row the bits of a one-token step, and {getattr(lm, 'name', type(lm).__name__)!r} "
            f"on {getattr(lm, 'device', 'its device')} does not guarantee that: the output may "
            "leave greedy's at a near-tie (result.stats.exact_rows is False; `nest info` "
            "shows the check)", RuntimeWarning, stacklevel=2)
    return exact


class DecodeLoop:
    """One generation's decoding: build it, then iterate ``run()`` for stream chunks."""

    def __init__(
        self,
        lm: Any,
        method: Method,
        drafter: Drafter | None,
        *,
        config: NestConfig,
        prompt_ids: list[int],
        memory: Any,
        passages: list,
        offsets: list,
        max_new_tokens: int,
        stop: list[str],
        stats: NestStats,
        generator: torch.Generator | None,
        on_delta: Any,
        eos: frozenset[int] | None = None,
        guards: Guards | None = None,
    ) -> None:
        self.lm, self.method, self.drafter, self.config = lm, method, drafter, config
        self.memory = memory if method.uses_memory else None
        self.stats = stats
        self.max_new_tokens = max_new_tokens
        self.eos = lm.eos_token_ids if eos is None else frozenset(eos)
        #: NEST's Eq. 7 acceptance: the modes whose on-topic guards are on by default
        self.relaxed = method.verifier == RELAXED and not config.strict_acceptance
        # relaxed decoding needs no bit-exact verify rows: the LM's faster passes, if it has them
        self._inexact_rows = getattr(lm, "inexact_rows", None) if self.relaxed else None
        if drafter is not None and not self.relaxed:  # lossless: greedy's output, bit for bit?
            stats.exact_rows = rows_are_exact(lm, method.name)
        self.guards = guards if guards is not None else Guards()
        self.out = OutputText(lm.detokenize, stop, repeat_guard=self.guards.stop_on_repeat)
        self.verifier = make_verifier(method, config, generator, self.eos, self.guards)
        self.cache = lm.new_cache()
        #: Look-ahead of the target-first schedule (``NestConfig.lookahead``, see ``feed``):
        #: guessed tokens the cache holds after the fed ones, with their output rows
        #: (row i follows ahead[i]), and the n-gram drafter that guesses them.
        self._ahead: list[int] = []
        self._ahead_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._guesser = (PromptLookupDrafter(num_tokens=config.lookahead)
                         if config.lookahead and method.needs_target else None)
        self._guess: Draft | None = None
        self._guess_used = 0
        self.done = False
        self.lam_sum = 0.0
        self.lam_n = 0
        self._on_delta = on_delta  # (loop, copied, ids) -> Iterator[StreamChunk]
        self.state = DecodeState(
            prompt_ids=list(prompt_ids),
            out_ids=self.out.ids,
            budget=max_new_tokens,
            config=config,
            eos=self.eos,
            passages=passages,
            offsets=offsets,
            lm=lm,
            cache=self.cache,
            choose=self.verifier.choose,
            pick=self.verifier.pick,
            memory=self.memory,
            generator=generator,
            stats=stats,
        )

    def shows(self, citation: Any) -> bool:
        """Whether a citation is reported: at least ``min_citation_tokens`` tokens and the
        guards' ``min_citation_words`` words (``core.topic``); shorter copies stay plain text."""
        return (citation.n_tokens >= self.config.min_citation_tokens
                and citation_words(citation.text) >= self.guards.min_citation_words)

    # ----------------------------------------------------------------- shared steps
    @property
    def budget(self) -> int:
        return self.max_new_tokens - len(self.out)

    def forward(
        self, ids: list[int], last: int | None = None, parents: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One target pass after the cache: a chain (only the ``last`` rows' logits when set:
        saves the LM head), or a token tree (``parents``, see ``lm.tree``). Timed and counted.

        A relaxed method does not need a verify pass's rows to equal one-token steps bit for
        bit, so where the LM offers it (``inexact_rows``, see ``lm.rowwise_attention``) the
        pass takes the faster attention."""
        reused = self._take_ahead(ids) if self._ahead else None
        if reused is not None:
            if reused[0].shape[0] == len(ids):
                return reused
            ids = ids[reused[0].shape[0]:]
        t0 = time.perf_counter()
        with self._inexact_rows() if self._inexact_rows is not None else nullcontext():
            if parents is not None:
                out = self.lm.forward_tree(ids, parents, self.cache)
            else:
                out = self.lm.forward(ids, self.cache, last=last)
        self.stats.time_lm += time.perf_counter() - t0
        self.stats.forward_passes += 1
        if reused is not None:
            out = (torch.cat([reused[0], out[0]]), torch.cat([reused[1], out[1]]))
        return out

    # ----------------------------------------------------------------- look-ahead
    def committed_length(self) -> int:
        """Cached positions before the look-ahead: the tokens fed so far."""
        return self.lm.cache_length(self.cache) - len(self._ahead)

    def feed(self, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the last committed token (target-first schedule): its output row.

        With ``NestConfig.lookahead`` the same pass also feeds a guess of what follows: the
        n-gram continuation of the context (prompt lookup over the prompt, its passages and the
        output). Its rows are kept, and a later pass over the same tokens (the next ordinary
        tokens, or the start of a span) takes them instead of computing them again. A guess
        never decides a token, so the output is the same as without it, up to the numerics of
        a wider pass; only the number of passes changes."""
        if self._ahead and self._ahead[0] == token:
            return self.forward([token])  # the guess was right: no pass
        if self._ahead:
            self._take_ahead([])  # a wrong guess: drop it
        guess = self._guesser.propose(self._guess_state()) if self._guesser is not None else None
        if guess is None:
            return self.forward([token])
        logits, keys = self.forward([token] + guess.tokens)
        self._ahead, self._ahead_rows = list(guess.tokens), (logits[1:], keys[1:])
        self._guess, self._guess_used = guess, 0
        self.stats.ahead_fed += len(guess)
        return logits[:1], keys[:1]

    def _guess_state(self) -> DecodeState:
        self.state.budget = self.budget - 1  # the guess follows the token being fed
        return self.state

    def _take_ahead(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The look-ahead rows of ``ids``' common prefix with it (None when empty). A look-ahead
        that ``ids`` only partly matches is dropped from the cache after that prefix."""
        ahead, rows = self._ahead, self._ahead_rows
        assert rows is not None
        j = 0
        while j < min(len(ahead), len(ids)) and ahead[j] == ids[j]:
            j += 1
        self._guess_used += j
        self.stats.ahead_tokens += j
        if j == len(ids) and j < len(ahead):  # all of ids was guessed: keep the rest
            self._ahead, self._ahead_rows = ahead[j:], (rows[0][j:], rows[1][j:])
        else:
            self.lm.crop_cache(self.cache, self.committed_length() + j)
            self._ahead, self._ahead_rows = [], None
            if self._guesser is not None and self._guess is not None:
                self._guesser.update(self.state, self._guess, self._guess_used)
            self._guess = None
        return (rows[0][:j], rows[1][:j]) if j else None

    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's forward pass (last row only). When the drafter wants the prompt's
        vector (``wants_prompt_vector``) and the LM can capture it, the same pass also fills
        ``state.prompt_vector``: no extra forward."""
        capture = (getattr(self.lm, "capture_prompt_vector", None)
                   if getattr(self.drafter, "wants_prompt_vector", False) else None)
        if capture is None:
            return self.forward(self.state.prompt_ids, last=1)
        with capture() as slot:
            out = self.forward(self.state.prompt_ids, last=1)
        self.state.prompt_vector = slot[-1] if slot else None
        return out

    def distribution(self, logits: torch.Tensor, keys: torch.Tensor) -> Distribution:
        """The target at each row: p_M for NEST-family methods, else p_LM."""
        t0 = time.perf_counter()
        if not self.method.uses_memory:
            dist: Distribution = LMDistribution(torch.softmax(logits.float(), dim=-1))
        else:
            cfg = self.config
            dist = nest_distribution(
                logits,
                keys,
                self.memory,
                n_neighbors=cfg.n_neighbors,
                alpha=cfg.rrc_offset,
                tau=cfg.rrc_scale,
                lm_temperature=cfg.lm_temperature,
                mu=cfg.knn_temperature,
                fixed_lm_weight=cfg.fixed_lm_weight,
            )
            self.lam_sum += float(dist.lam.sum())
            self.lam_n += int(dist.lam.numel())
        self.stats.time_knn += time.perf_counter() - t0
        return dist

    def commit(self, ids: list[int], sources: list, copied: bool = False) -> Iterator[StreamChunk]:
        """Append tokens, cut at EOS, the budget and stop strings; stream the new text."""
        keep_ids, keep_src = [], []
        for tok, src in zip(ids, sources):
            if tok in self.eos:
                self.done = True
                self.stats.finish_reason = "stop"
                break
            if len(self.out) + len(keep_ids) >= self.max_new_tokens:
                break
            keep_ids.append(tok)
            keep_src.append(src)
        if keep_ids:
            self.out.append(keep_ids, keep_src, copied)
        if self.out.stopped:
            self.done = True
            self.stats.finish_reason = "repeat" if self.out.repeated else "stop"
        if len(self.out) >= self.max_new_tokens:
            self.done = True
            self.stats.finish_reason = self.stats.finish_reason or "length"
        self.state.budget = self.budget
        yield from self._on_delta(self, bool(keep_src) and keep_src[0] is not None, keep_ids)

    def propose(self, budget: int) -> Draft | None:
        if self.drafter is None or budget < 1:
            return None
        self.state.budget = budget
        t0 = time.perf_counter()
        draft = self.drafter.propose(self.state)
        self.stats.time_draft += time.perf_counter() - t0
        if draft is None or not draft.tokens:
            return None
        validate_draft(draft, self.lm.vocab_size)
        if len(draft) > budget and draft.parents is None:  # the loop enforces the budget
            draft = Draft(draft.tokens[:budget], as_sources(draft.sources, len(draft))[:budget],
                          None if draft.q is None else draft.q[:budget], None, draft.chosen_first)
        return draft

    def count_draft(self, draft: Draft) -> None:
        """Count a draft the target is about to verify."""
        self.stats.verify_steps += 1
        self.stats.drafted_tokens += len(draft)
        if draft.parents is not None:
            self.stats.tree_steps += 1
            self.stats.tree_nodes += len(draft)

    # ----------------------------------------------------------------- schedules
    def run(self) -> Iterator[StreamChunk]:
        if self.method.needs_target:
            yield from self._target_first()
        else:
            yield from self._draft_first()
        if self.out.finish():  # the repeat guard cut the last sentence
            self.done = True
            self.stats.finish_reason = "repeat"

    def _ordinary_token(
        self, dist: Distribution, draft: Draft | None
    ) -> tuple[int, Any, int] | None:
        """Target-first: ``(token, source, n_accepted)`` when this step commits one token
        without a verify pass (no draft; a drafter's own ordinary step, i.e. a one-token
        ``chosen_first`` draft; or a draft whose first token the target rejects), else None."""
        if draft is None:
            return self.verifier.pick(dist), None, 0
        if draft.chosen_first and len(draft) == 1:
            return draft.tokens[0], as_sources(draft.sources, 1)[0], 1
        if draft.parents is not None:
            raise ValueError(f"{self.method.name}: token trees need a draft-first method")
        self.count_draft(draft)
        first = torch.as_tensor(draft.tokens[:1], device=dist.p.device)
        if not draft.chosen_first and self.verifier.accept(dist, first) == 0:
            return self.verifier.pick(dist), None, 0
        return None

    def _target_first(self) -> Iterator[StreamChunk]:
        """NEST's schedule (see the module docstring)."""
        lm, v, stats = self.lm, self.verifier, self.stats
        logits, keys = self.prefill()
        cur: tuple[torch.Tensor, torch.Tensor] | None = (logits[-1:], keys[-1:])
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
                    self.drafter.update(self.state, draft, n)  # type: ignore[union-attr]
                yield from self.commit([w], [src])
                pending, cur = w, None
                continue
            assert draft is not None
            tokens, sources = draft.tokens, as_sources(draft.sources, len(draft))
            d = torch.as_tensor(tokens, device=dist.p.device)
            before = self.committed_length()
            logits, keys = self.forward(tokens)  # ONE pass: (L, V), (L, d)
            vdist = self.distribution(logits[:-1], keys[:-1]) if len(tokens) > 1 else None
            # row i of vdist scores draft token i + 1 (token 0 was accepted above)
            m = 1 + (v.accept(vdist, d[1:]) if vdist is not None else 0)
            stats.accepted_tokens += m
            self.drafter.update(self.state, draft, m)  # type: ignore[union-attr]
            yield from self.commit(tokens[:m], sources[:m], copied=True)
            if m == len(tokens):
                cur = (logits[-1:], keys[-1:])  # the cache holds the whole draft
                continue
            lm.crop_cache(self.cache, before + m)  # keep exactly the accepted tokens
            cur = None
            if self.done or self.budget <= 0:
                break
            c = v.pick(vdist, m - 1)  # type: ignore[arg-type]
            yield from self.commit([c], [None])
            pending = c

    def _draft_first(self) -> Iterator[StreamChunk]:
        """Lossless schedule: feed ``[pending] + draft`` in one pass (see the module docstring)."""
        lm, v, stats = self.lm, self.verifier, self.stats
        no_draft = torch.zeros(0, dtype=torch.long)
        logits, keys = self.prefill()
        p = self.distribution(logits[-1:], keys[-1:]).p
        _, first = v.verify_and_correct(p, no_draft.to(p.device), None)
        self.state.hidden = keys[-1]
        yield from self.commit([first], [None])
        pending = first
        while not self.done and self.budget > 0:
            self.state.pending, self.state.dist = pending, None
            draft = self.propose(self.budget - 1)  # leave room for the token after the draft
            before = lm.cache_length(self.cache)
            if draft is None:
                logits, keys = self.forward([pending])
                p = self.distribution(logits, keys).p
                _, c = v.verify_and_correct(p, no_draft.to(p.device), None)
                self.state.hidden = keys[-1]
                yield from self.commit([c], [None])
                pending = c
                continue
            self.count_draft(draft)
            if draft.parents is not None:
                path, c, hidden = self._verify_tree(pending, draft, before)
            else:
                path, c, hidden = self._verify_chain(pending, draft, before)
            stats.accepted_tokens += len(path)
            self.state.hidden = hidden
            self.drafter.update(self.state, draft, len(path))  # type: ignore[union-attr]
            sources = as_sources(draft.sources, len(draft))
            yield from self.commit([draft.tokens[i] for i in path], [sources[i] for i in path],
                                   copied=True)
            if self.done or self.budget <= 0:
                break
            yield from self.commit([c], [None])
            pending = c

    def _verify_chain(self, pending: int, draft: Draft, before: int) -> tuple[list[int], int, Any]:
        tokens = draft.tokens
        logits, keys = self.forward([pending] + tokens)  # (L + 1, V): row i scores draft[i]
        p = self.distribution(logits, keys).p
        d = torch.as_tensor(tokens, device=p.device)
        m, c = self.verifier.verify_and_correct(p, d, draft.q)
        self.lm.crop_cache(self.cache, before + 1 + m)  # pending + the accepted draft tokens
        return list(range(m)), c, keys[m]

    def _verify_tree(self, pending: int, draft: Draft, before: int) -> tuple[list[int], int, Any]:
        """Greedy verification of a token tree in one pass (REST/SpecInfer style): follow the
        child equal to the target's argmax from the root; keep only that path in the cache."""
        if self.verifier.sampling:
            raise ValueError("token-tree drafts are verified greedily: use temperature 0")
        parents = [-1] + [pp + 1 if pp >= 0 else 0 for pp in draft.parents]  # type: ignore[union-attr]
        logits, keys = self.forward([pending] + draft.tokens, parents=parents)
        p = self.distribution(logits, keys).p
        children: dict[int, list[int]] = {}
        for i, pp in enumerate(parents[1:], start=1):
            children.setdefault(pp, []).append(i)
        node, path = 0, []
        while True:
            best = int(p[node].argmax())
            nxt = next((ch for ch in children.get(node, []) if draft.tokens[ch - 1] == best), None)
            if nxt is None:
                break
            path.append(nxt - 1)
            node = nxt
        self.lm.select_cache(self.cache, before, [0] + [i + 1 for i in path])
        return path, int(p[node].argmax()), keys[node]


def _no_stream(loop: DecodeLoop, copied: bool, ids: Any) -> Iterator[StreamChunk]:
    return iter(())


def decode_ids(
    lm: Any,
    method: Method,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    drafter: Drafter | None = None,
    config: NestConfig | None = None,
    stats: NestStats | None = None,
    generator: torch.Generator | None = None,
    eos: frozenset[int] | None = None,
) -> tuple[list[int], NestStats]:
    """Decode ``prompt_ids`` with ``method`` (and ``drafter``) and no engine: no retrieval,
    no memory, no stop strings, no streaming. ``eos`` overrides the model's end tokens
    (``frozenset()``: never stop early). Returns the output ids (without the end token) and
    the generation's stats."""
    if method.uses_memory:
        raise ValueError(f"decode_ids runs methods without NEST's memory, not {method.name!r}")
    stats = stats if stats is not None else NestStats()
    if max_new_tokens < 1:
        return [], stats
    loop = DecodeLoop(
        lm, method, drafter, config=config if config is not None else NestConfig(temperature=0.0),
        prompt_ids=list(prompt_ids), memory=None, passages=[], offsets=[],
        max_new_tokens=max_new_tokens, stop=[], stats=stats, generator=generator,
        on_delta=_no_stream, eos=eos,
    )  # fmt: skip
    for _ in loop.run():
        pass
    stats.prompt_tokens = len(prompt_ids)
    stats.new_tokens = len(loop.out.ids)
    stats.finish_reason = stats.finish_reason or "length"
    return list(loop.out.ids), stats
