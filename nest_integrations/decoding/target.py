"""The target model's passes for one generation: the prompt's prefill, a fed token, a verify
chain or tree, with or without key rows, as logits or as each row's argmax.

What the LM can do beyond ``forward`` is read from its typed port (``lm.port.LMPort``, resolved
once by the assembly); the decode loop asks ``Target`` for a pass and never probes the LM:

- **regime**: relaxed decoding (NEST) runs every pass inside the LM's ``inexact_rows`` (faster,
  not bit-exact rows), and a decoding with no drafter inside its ``steps_only``;
- **argmax rows**: lossless greedy verification reads only each row's argmax, which an LM with
  ``forward_argmax`` returns without copying logits out (``until_rejected``: it may stop at the
  first row that rejects the draft);
- **keys off**: a pass whose key rows nobody reads takes ``forward_logits`` where keys cost the
  LM a pass of their own;
- **rows one at a time**: ``rows_split_now`` says an exact verify pass now decodes its rows one
  by one (the loop then verifies a token tree as its first branch);
- **prompt vector**: the prefill can also capture the prompt's vector (KNN-SSD's route);
- **release**: the cache is given back when the generation ends.

Each pass is timed into ``NestStats.timing.lm`` and counted in ``forward_passes``.
``TargetDistribution`` turns a pass's rows into the target distribution: p_LM, or NEST's p_M
(Eq. 5, the LM mixed with the token memory's kNN distribution).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import torch

from nest_integrations.config import NestConfig
from nest_integrations.core.mixture import Distribution, LMDistribution, nest_distribution
from nest_integrations.core.sampling import host_row
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.lm.base import LanguageModel
from nest_integrations.lm.port import Rows, TreePasses, port_of
from nest_integrations.types import NestStats



class Target:
    """One generation's target LM and KV cache.

    Args:
        lm: the target ``LanguageModel``; its typed port (``lm.port.LMPort``) is the one the
            assembly resolved (``port_of``).
        stats: the generation's ``NestStats`` (pass time and count).
        relaxed: relaxed decoding: passes run inside the LM's ``inexact_rows``.
        drafts: whether anything is drafted; a decoding with no drafter runs inside the LM's
            ``steps_only`` (unless ``relaxed``).
        argmax: greedy on p_LM: a draft-first pass may return each row's argmax.
    """

    def __init__(self, lm: LanguageModel, stats: NestStats, *, relaxed: bool, drafts: bool,
                 argmax: bool) -> None:  # fmt: skip
        port = port_of(lm)
        self.lm, self.stats, self.port = lm, stats, port
        self.cache = lm.new_cache()
        self._regime: Callable[[], ContextManager[Any]] | None = None
        if relaxed:
            if port.inexact is not None:
                self._regime = port.inexact.inexact_rows
        elif port.steps_only is not None and not drafts:
            self._regime = port.steps_only.steps_only
        #: the LM's argmax rows, when passes asked for ``argmax`` return argmaxes (a list) in
        #: place of logits
        self._argmax = port.argmax if argmax else None
        self.argmax = self._argmax is not None
        #: whether the prefill can capture the prompt's vector (``prefill_with_vector``)
        self.captures_prompt_vector = port.prompt_vector is not None

    def run(
        self, ids: list[int], last: int | None = None, parents: list[int] | None = None,
        keys: bool = True, argmax: bool = False, until_rejected: bool = False,
    ) -> Rows:
        """A chain after the cache (only the ``last`` rows when set: the LM may skip its head
        on the others), or a token tree (``parents``, see ``lm.tree``). ``keys=False``: no key
        rows where the LM can skip them. ``argmax`` (a chain, where ``self.argmax``): each
        row's argmax in place of its logits; ``until_rejected``: a verify chain the LM may stop
        at its first rejected row."""
        lm, cache, port = self.lm, self.cache, self.port
        t0 = time.perf_counter()
        with self._regime() if self._regime is not None else nullcontext():
            if parents is not None:
                out = self._trees().forward_tree(ids, parents, cache)
            elif argmax and self._argmax is not None:
                out = (self._argmax.forward_argmax(ids, cache, last=last, keys=keys,
                                                   until_rejected=True) if until_rejected
                       else self._argmax.forward_argmax(ids, cache, last=last, keys=keys))
            elif not keys and port.logits_only is not None:
                out = port.logits_only.forward_logits(ids, cache, last=last)
            else:
                out = lm.forward(ids, cache, last=last)
        self.stats.timing.lm += time.perf_counter() - t0
        self.stats.forward_passes += 1
        return out

    def _trees(self) -> TreePasses:
        if self.port.trees is None:
            raise ValueError(f"a token tree needs a language model with forward_tree() "
                             f"(Capabilities.trees); {self.lm.name!r} has none: draft chains")
        return self.port.trees

    def prefill_with_vector(self, run: Callable[[], Rows]) -> tuple[Rows, torch.Tensor | None]:
        """``run()`` (the prefill) inside the LM's ``capture_prompt_vector``: its rows and the
        prompt's vector from the same pass (None when it captured nothing)."""
        if self.port.prompt_vector is None:
            return run(), None
        with self.port.prompt_vector.capture_prompt_vector() as slot:
            out = run()
        return out, (slot[-1] if slot else None)

    def rows_split_now(self) -> bool:
        """Whether an exact verify pass now decodes its rows one at a time (each row costs a
        step: a token tree is better verified as its first branch)."""
        return self.port.rows_split is not None and bool(self.port.rows_split.rows_split_now)

    def length(self) -> int:
        """Positions the cache holds."""
        return self.lm.cache_length(self.cache)

    def crop(self, length: int) -> None:
        """Keep the cache's first ``length`` positions."""
        self.lm.crop_cache(self.cache, length)

    def keep_path(self, start: int, keep: list[int]) -> None:
        """After a tree pass from ``start``: keep only the tree positions ``keep``."""
        self._trees().select_cache(self.cache, start, keep)

    def release(self) -> None:
        """The generation has ended: give the cache back where the LM can."""
        if self.port.release is not None:
            self.port.release.release_cache(self.cache)


class TargetDistribution:
    """The target distribution at each row of a pass: p_M for NEST-family methods
    (``uses_memory``; with no memory p_M is p_LM, lambda 1), else p_LM; timed into
    ``NestStats.timing.knn``. Keeps lambda's sum and count for ``NestStats.mean_lambda``."""

    def __init__(self, uses_memory: bool, memory: TokenMemory | None, config: NestConfig,
                 stats: NestStats) -> None:  # fmt: skip
        self.uses_memory, self.memory, self.config, self.stats = uses_memory, memory, config, stats
        self.lam_sum, self.lam_n = 0.0, 0

    def __call__(self, logits: torch.Tensor, keys: torch.Tensor) -> Distribution:
        t0 = time.perf_counter()
        if not self.uses_memory:
            dist: Distribution = LMDistribution(torch.softmax(logits.float(), dim=-1))
        else:
            cfg = self.config
            dist = nest_distribution(
                logits, keys, self.memory, n_neighbors=cfg.n_neighbors, alpha=cfg.rrc_offset,
                tau=cfg.rrc_scale, lm_temperature=cfg.lm_temperature, mu=cfg.knn_temperature,
                fixed_lm_weight=cfg.fixed_lm_weight,
            )  # fmt: skip
            lam = host_row(dist.lam)  # a numpy view on a CPU: no torch reduction per step
            self.lam_sum += float(lam.sum() if lam is not None else dist.lam.sum())
            self.lam_n += int(dist.lam.numel())
        self.stats.timing.knn += time.perf_counter() - t0
        return dist

    @property
    def mean_lambda(self) -> float:
        """Lambda's mean over the rows mixed so far (1.0 when none was)."""
        return self.lam_sum / self.lam_n if self.lam_n else 1.0


def session(lm: LanguageModel) -> ContextManager[Any]:
    """The context of one generation: the LM's ``decoding_session`` where it has one (an LM
    with its own thread pool keeps torch's few ops per step on one thread), else nothing."""
    port = port_of(lm)
    return port.session.decoding_session() if port.session is not None else nullcontext()
