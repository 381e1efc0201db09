"""The acceptance rules of the decode loop: how many draft tokens to keep, and which token to
commit after them. Each method names its rule (``Method.verifier``, a key of ``VERIFIERS``);
the math is ``core.verification``'s, called here with the generation's settings.
"""

from __future__ import annotations

import warnings

import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core import verification
from nest_integrations.core.mixture import Distribution
from nest_integrations.core.sampling import choose_token, warp
from nest_integrations.drafters.base import LOSSLESS, RELAXED, Method
from nest_integrations.lm.base import LanguageModel, capabilities_of


class Verifier:
    """The base rule: token choice with the generation's temperature, top-p and RNG, no guards.

    ``accept_count`` serves the target-first schedule (the draft's rows are scored before it is
    fed), ``verify_and_correct`` the draft-first one (one pass over ``[pending] + draft``)."""

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

    def choose_token(self, p_row: torch.Tensor) -> int:
        """A token from one ``(V,)`` target row: argmax, or a draw when sampling."""
        cfg = self.config
        return choose_token(p_row, cfg.temperature, cfg.top_p, self.generator)

    def next_token(self, dist: Distribution, row: int = 0) -> int:
        """The token to commit at ``row`` of a target distribution."""
        return self.choose_token(dist.p[row])

    def accept_count(self, dist: Distribution, draft: torch.Tensor) -> int:
        """Accepted prefix length of ``draft`` scored by the rows of ``dist`` (row i scores
        draft[i])."""
        raise NotImplementedError

    def verify_and_correct(
        self, p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None
    ) -> tuple[int, int]:
        """On ``(L + 1, V)`` target rows (row i scores draft[i], row L follows the draft):
        ``(n_accepted, next_token)``."""
        raise NotImplementedError(f"the {self.name} verifier has no draft-first rule")


class LosslessVerifier(Verifier):
    """Exact greedy acceptance, or speculative sampling when ``temperature > 0``: the output
    follows p_LM exactly (token for token when greedy)."""

    name = LOSSLESS

    def accept_count(self, dist: Distribution, draft: torch.Tensor) -> int:
        if self.sampling:
            raise ValueError("lossless sampling verifies drafts with the pending token: "
                             "the method must not set needs_target")
        return verification.strict_accept_count(dist.p, draft)

    def verify_and_correct(
        self, p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None
    ) -> tuple[int, int]:
        if self.sampling:
            return verification.speculative_sampling(self.target(p), draft, q, self.generator)
        n = int(draft.numel())
        m = verification.strict_accept_count(p[:n], draft) if n else 0
        row = p[m]  # numpy's argmax: the same index (the first maximum), 8x faster on a CPU row
        fast = row.device.type == "cpu" and row.dtype == torch.float32 and not row.requires_grad
        return m, int(row.numpy().argmax() if fast else row.argmax())


class RelaxedVerifier(Verifier):
    """NEST's relaxed acceptance (Eq. 7) of p_M with the policy's LM guards
    (``Guards.confidence_guard``, ``eos_guard``); exact with ``strict_acceptance``, a random
    Eq. 7 test when sampling."""

    name = RELAXED

    def next_token(self, dist: Distribution, row: int = 0) -> int:
        g = self.guards
        return verification.guarded_token(self.choose_token(dist.p[row]), dist.p_lm[row],
                                          self.eos_ids, g.confidence_guard, g.eos_guard)

    def accept_count(self, dist: Distribution, draft: torch.Tensor) -> int:
        cfg, g = self.config, self.guards
        if cfg.strict_acceptance:
            return verification.strict_accept_count(dist.p, draft)
        if self.sampling:  # Eq. 7 as a random test, on the distribution tokens are drawn from
            return verification.sampled_accept_count(self.target(dist.p), draft, cfg.relaxation,
                                                     self.generator)
        n = verification.guarded_accept_count(dist.p, dist.p_lm, draft.tolist(), cfg.relaxation,
                                              self.eos_ids, g.confidence_guard, g.eos_guard)
        if n is not None:
            return n
        veto = verification.guard_veto(dist.p_lm, draft, self.eos_ids, g.confidence_guard,
                                       g.eos_guard)
        return verification.relaxed_accept_count(dist.p, draft, cfg.relaxation, veto)


def check_quote(bar: float | None, p_first: torch.Tensor, logits: torch.Tensor,
                tokens: list[int]) -> tuple[float, bool]:
    """The model's say in an evidence quote (``Guards.quote_check``): its mean log-probability
    under p_LM (``verification.quote_score``: the first token from ``p_first``, the rest read
    off the quote's own pass ``logits``) and whether it reaches ``bar`` (None: always kept)."""
    score = verification.quote_score(p_first, logits, tokens)
    return score, bar is None or score >= bar


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


def rows_are_exact(lm: LanguageModel, method: str) -> bool:
    """``lm.exact_rows`` (False for an LM that does not say: ``Capabilities.exact_rows_checked``).
    Warns once per LM and method when a lossless method drafts where verify rows are not
    bit-exact: then its output can leave greedy's at a near-tie."""
    exact = capabilities_of(lm).exact_rows_checked and bool(lm.exact_rows)
    if not exact and (id(lm), method) not in _warned_inexact:
        _warned_inexact.add((id(lm), method))
        warnings.warn(
            f"decoding={method!r} equals greedy decoding only where a verify pass gives each "
            f"row the bits of a one-token step, and {lm.name!r} "
            f"on {lm.device} does not guarantee that: the output may "
            "leave greedy's at a near-tie (result.stats.exact_rows is False; `nest info` "
            "shows the check)", RuntimeWarning, stacklevel=2)
    return exact
