"""Draft verification as pure functions: how many leading draft tokens are accepted.

Convention: ``p`` holds the target distribution (p_M for NEST, p_LM for lossless modes) at each
draft position: row i scores draft token i.
"""

from __future__ import annotations

import torch


def _leading_true(ok: torch.Tensor) -> int:
    """Length of the leading run of True values in a 1-D bool tensor."""
    bad = (~ok).nonzero()
    return int(bad[0, 0]) if bad.numel() else int(ok.shape[0])


def relaxed_accept_count(p: torch.Tensor, draft: torch.Tensor, gamma: float) -> int:
    """NEST Eq. 7, greedy form (Algorithm 1 stops when P(accept) <= 0.5).

    Accept draft token i iff ``p[i, w_i] > (gamma / 2) * max_w p[i, w]``, left to right,
    stopping at the first failure. Smaller gamma is more lenient.

    Args:
        p: ``(L, V)`` target probabilities; row i scores ``draft[i]``.
        draft: ``(L,)`` int64 draft tokens.
    """
    if draft.numel() == 0:
        return 0
    p_w = p.gather(1, draft[:, None]).squeeze(1)  # (L,)
    return _leading_true(p_w > 0.5 * gamma * p.max(dim=-1).values)


def strict_accept_count(p: torch.Tensor, draft: torch.Tensor) -> int:
    """Exact-match acceptance: draft token i must be the argmax of row i (lossless for greedy)."""
    if draft.numel() == 0:
        return 0
    return _leading_true(p.argmax(dim=-1) == draft)


def sampled_accept_count(
    p: torch.Tensor, draft: torch.Tensor, gamma: float, generator: torch.Generator | None
) -> int:
    """NEST Eq. 7 as a random test (sampling mode, not the paper's setting):
    accept token i with probability ``min(1, p[i, w_i] / (gamma * max p[i]))``."""
    if draft.numel() == 0:
        return 0
    p_w = p.gather(1, draft[:, None]).squeeze(1)
    prob = (p_w / (gamma * p.max(dim=-1).values)).clamp(max=1.0)
    u = torch.rand(prob.shape, generator=generator, device="cpu").to(prob.device)
    return _leading_true(u < prob)
