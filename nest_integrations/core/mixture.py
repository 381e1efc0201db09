"""The per-step distribution of NEST: p_kNN (Eq. 2), RRC lambda (Eq. 4), the mixture (Eq. 3).

Symbols follow arXiv 2405.19325: mu is the kNN inverse temperature, alpha/tau the RRC offset
and scale, and lambda weights **p_LM** (NEST's convention, the opposite of kNN-LM's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nest_integrations.core.token_memory import Hits, TokenMemory


def knn_distribution(hits: Hits, values: torch.Tensor, vocab_size: int, mu: float) -> torch.Tensor:
    """Eq. 2: p_kNN(w) = sum_i 1[v_i = w] exp(-mu d_i) / sum_i exp(-mu d_i) over the hits.

    Neighbours that share a value add their weights. Rows without hits are all zero.

    Returns:
        ``(T, vocab_size)`` fp32, each row summing to 1 (or 0 when there are no hits).
    """
    t = hits.dist.shape[0]
    p = torch.zeros((t, vocab_size), dtype=torch.float32, device=hits.dist.device)
    if hits.empty:
        return p
    return p.scatter_add_(1, values[hits.rows], knn_weights(hits.dist, mu))


def knn_weights(dist: torch.Tensor, mu: float) -> torch.Tensor:
    """The weight of each neighbour in Eq. 2: a stable softmax of ``-mu * d`` over each row of
    ``(T, r)`` squared distances (in their dtype)."""
    return torch.softmax(-mu * dist, dim=-1)


def rrc_lambda(hits: Hits, alpha: float, tau: float) -> torch.Tensor:
    """Eq. 4: lambda = sigmoid((d_min / d_max - alpha) / tau) on absolute squared distances.

    A nearest neighbour much closer than the r-th gives a small ratio, a small lambda and more
    weight on p_kNN. No hits gives lambda = 1; d_max = 0 gives ratio 1.

    Returns:
        ``(T,)`` fp32 lambdas in (0, 1] (exactly 1 only without hits).
    """
    t = hits.dist.shape[0]
    if hits.empty:
        return torch.ones(t, dtype=torch.float32, device=hits.dist.device)
    return rrc_weight(rrc_ratio(hits.dist), alpha, tau)


def rrc_ratio(dist: torch.Tensor) -> torch.Tensor:
    """``d_min / d_max`` of each row of ``(T, r)`` squared distances sorted nearest first
    (1 where ``d_max = 0``): the retrieval confidence RRC turns into lambda."""
    d_min, d_max = dist[:, 0], dist[:, -1]
    return torch.where(d_max > 0, d_min / d_max.clamp_min(1e-30), torch.ones_like(d_max))


def rrc_weight(ratio: torch.Tensor, alpha: float, tau: float) -> torch.Tensor:
    """Eq. 4 on precomputed ratios: ``sigmoid((ratio - alpha) / tau)``."""
    return torch.sigmoid((ratio - alpha) / tau)


def mixture(p_lm: torch.Tensor, p_knn: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Eq. 3: p_M = lambda * p_LM + (1 - lambda) * p_kNN, row-wise."""
    lam = lam[:, None]
    return lam * p_lm + (1.0 - lam) * p_knn


def log_mixture(
    log_p_lm: torch.Tensor, p_knn: torch.Tensor, lam: torch.Tensor, *, min_weight: float = 0.0
) -> torch.Tensor:
    """Eq. 3 in log space, elementwise: ``log(lam * p_LM + (1 - lam) * p_kNN)`` from
    ``log p_LM``, ``p_kNN`` and ``lam`` of the same shape (e.g. at the true tokens).

    Computed as ``logaddexp(log lam + log p_LM, log(1 - lam) + log p_kNN)``, so tiny
    probabilities keep their precision; ``lam >= 1`` gives ``log p_LM`` exactly.
    ``min_weight > 0`` keeps both weights at least that (lam in ``[min_weight, 1 -
    min_weight]``) in the sum, so a position where lambda underflows and kNN misses the token
    stays finite (a grid search over lambdas needs that); 0 uses lam as it is.
    """
    lo = lam.clamp(min=min_weight) if min_weight else lam
    hi = lo.clamp(max=1 - min_weight) if min_weight else lo
    mixed = torch.logaddexp(torch.log(lo) + log_p_lm, torch.log1p(-hi) + torch.log(p_knn))
    return torch.where(lam >= 1.0, log_p_lm, mixed)


@dataclass
class StepDistribution:
    """p_M at T positions, plus what span selection and citations need."""

    p: torch.Tensor  # (T, V) p_M
    lam: torch.Tensor  # (T,) lambda
    hits: Hits  # (T, r_eff)
    p_lm: torch.Tensor  # (T, V) p_LM, for the relaxed rule's LM guards


@dataclass
class LMDistribution:
    """The target of methods without NEST's memory: p_LM itself at T positions."""

    p: torch.Tensor  # (T, V) p_LM

    @property
    def p_lm(self) -> torch.Tensor:
        return self.p


#: A target distribution at T positions: ``.p`` (the target rows) and ``.p_lm`` (the LM's).
Distribution = LMDistribution | StepDistribution


def nest_distribution(
    logits: torch.Tensor,
    queries: torch.Tensor,
    memory: TokenMemory | None,
    *,
    n_neighbors: int,
    alpha: float,
    tau: float,
    lm_temperature: float = 1.0,
    mu: float | None = None,
    fixed_lm_weight: float | None = None,
) -> StepDistribution:
    """p_M for each row of ``logits`` (T, V) with query vectors ``queries`` (T, d).

    ``mu=None`` uses 1/sqrt(d). ``fixed_lm_weight`` replaces RRC with a constant lambda (the
    two-stage kNN-LM baseline). An empty or absent memory gives p_M = p_LM exactly.
    """
    scaled = logits.float() if lm_temperature == 1.0 else logits.float() / lm_temperature
    p_lm = torch.softmax(scaled, dim=-1)  # x / 1.0 is x: the division is skipped, not changed
    if memory is None or memory.n_available == 0:
        t = logits.shape[0]
        empty = torch.zeros((t, 0), device=logits.device)
        ones = torch.ones(t, device=logits.device)
        return StepDistribution(p_lm, ones, Hits(empty, empty.long()), p_lm)
    hits = memory.search(queries, n_neighbors)
    mu = mu if mu is not None else 1.0 / math.sqrt(queries.shape[-1])
    if memory.device.type == "cpu" and p_lm.device.type == "cpu":
        p, lam = mixture_host(p_lm, hits, memory.values_host, mu=mu, alpha=alpha, tau=tau,
                              fixed_lm_weight=fixed_lm_weight)
        return StepDistribution(p, lam, hits, p_lm)
    if fixed_lm_weight is not None:
        lam = torch.full((logits.shape[0],), float(fixed_lm_weight), device=logits.device)
    else:
        lam = rrc_lambda(hits, alpha, tau)
    p_knn = knn_distribution(hits, memory.values, p_lm.shape[-1], mu)
    return StepDistribution(_mixture_into(p_lm, p_knn, lam), lam, hits, p_lm)


def _mixture_into(p_lm: torch.Tensor, p_knn: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``mixture(p_lm, p_knn, lam)`` bit for bit, with ``p_knn`` (a fresh tensor, consumed)
    scaled in place: one vocabulary-wide temporary instead of three. On a CPU step of a small
    model (llama.cpp, about 10 ms) each such buffer is a fresh allocation read and written
    while the decode has evicted the caches."""
    lam = lam[:, None]
    return (lam * p_lm).add_(p_knn.mul_(1.0 - lam))


def mixture_host(
    p_lm: torch.Tensor, hits: Hits, values: np.ndarray, *, mu: float, alpha: float, tau: float,
    fixed_lm_weight: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 2-4 in numpy on CPU rows: ``(p_M, lambda)`` from p_LM ``(T, V)``, hits with at
    least one neighbour per row and the memory's values ``(N,)``.

    The same formulas as ``rrc_lambda``, ``knn_weights`` and ``mixture``, equal to them up to
    fp32 rounding: p_M is ``lambda * p_LM`` with each neighbour's ``(1 - lambda) * w_i`` added at
    its token, so p_kNN is never written out over the vocabulary. Right after a decode (caches
    evicted) each torch op costs 10-50 us; for one row over 900 neighbours this takes about
    0.12 ms where ``rrc_lambda``, ``knn_distribution`` and the mixture took 0.2-0.3 ms.
    """
    dist = hits.dist.numpy()  # (T, r) sorted nearest first
    t = dist.shape[0]
    if fixed_lm_weight is not None:
        lam = np.full(t, fixed_lm_weight, dtype=np.float32)
    else:
        d_min, d_max = dist[:, 0], dist[:, -1]
        ratio = np.ones(t, dtype=np.float32)
        np.divide(d_min, d_max, out=ratio, where=d_max > 0)
        with np.errstate(over="ignore"):  # exp -> inf gives lambda 0, as torch.sigmoid does
            lam = (1.0 / (1.0 + np.exp(-(ratio - np.float32(alpha)) / np.float32(tau)))).astype(
                np.float32)
    logit = dist * np.float32(-mu)
    w = np.exp(logit - logit[:, :1])  # the nearest has the largest weight
    w *= ((1.0 - lam) / w.sum(-1))[:, None]
    p = p_lm.numpy() * lam[:, None]
    tokens = values[hits.rows.numpy()]
    for i in range(t):  # add.at on one row takes numpy's fast 1-D path
        np.add.at(p[i], tokens[i], w[i])
    return torch.from_numpy(p), torch.from_numpy(lam)
