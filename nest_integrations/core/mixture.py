"""The per-step distribution of NEST: p_kNN (Eq. 2), RRC lambda (Eq. 4), the mixture (Eq. 3).

Symbols follow arXiv 2405.19325: mu is the kNN inverse temperature, alpha/tau the RRC offset
and scale, and lambda weights **p_LM** (NEST's convention, the opposite of kNN-LM's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    w = torch.softmax(-mu * hits.dist, dim=-1)  # (T, r): stable softmax over -mu*d
    return p.scatter_add_(1, values[hits.rows], w)


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
    d_min = hits.dist[:, 0]
    d_max = hits.dist[:, -1]
    ratio = torch.where(d_max > 0, d_min / d_max.clamp_min(1e-30), torch.ones_like(d_max))
    return torch.sigmoid((ratio - alpha) / tau)


def mixture(p_lm: torch.Tensor, p_knn: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Eq. 3: p_M = lambda * p_LM + (1 - lambda) * p_kNN, row-wise."""
    lam = lam[:, None]
    return lam * p_lm + (1.0 - lam) * p_knn


@dataclass
class StepDistribution:
    """p_M at T positions, plus what span selection and citations need."""

    p: torch.Tensor  # (T, V) p_M
    lam: torch.Tensor  # (T,) lambda
    hits: Hits  # (T, r_eff)
    p_lm: torch.Tensor  # (T, V) p_LM, for the relaxed rule's LM guards


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
    p_lm = torch.softmax(logits.float() / lm_temperature, dim=-1)
    if memory is None or memory.n_available == 0:
        t = logits.shape[0]
        empty = torch.zeros((t, 0), device=logits.device)
        ones = torch.ones(t, device=logits.device)
        return StepDistribution(p_lm, ones, Hits(empty, empty.long()), p_lm)
    hits = memory.search(queries, n_neighbors)
    mu = mu if mu is not None else 1.0 / math.sqrt(queries.shape[-1])
    p_knn = knn_distribution(hits, memory.values, p_lm.shape[-1], mu)
    if fixed_lm_weight is not None:
        lam = torch.full((logits.shape[0],), float(fixed_lm_weight), device=logits.device)
    else:
        lam = rrc_lambda(hits, alpha, tau)
    return StepDistribution(mixture(p_lm, p_knn, lam), lam, hits, p_lm)
