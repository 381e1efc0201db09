"""Teacher-forced scoring of calibration texts (``score_text``) and the pooled tokens a grid
point is evaluated on (``ScorePool``): p_LM of the true tokens, and the nearest keys in the memory
of each text's retrieved passages. The mixture maths is ``core.mixture``'s (RRC ratio, p_kNN
weights, ``log_mixture``), so the objective is the engine's p_M."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from nest_integrations.calibrate.splitting import CalibrationText
from nest_integrations.core.mixture import knn_weights, log_mixture, rrc_ratio, rrc_weight
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.index.keys import ensure_keys

__all__ = ["ScorePool", "ScoredText", "score_text"]


@dataclass
class ScoredText:
    """Teacher-forced quantities of one text (everything the grid needs)."""

    in_corpus: bool
    log_lm: torch.Tensor  # (R,) float64 log p_LM(true)
    dist: torch.Tensor  # (R, r) float32 squared distances, nearest first
    match: torch.Tensor  # (R, r) bool: neighbour value == true token
    values: torch.Tensor  # (R, r) int64 neighbour values
    p_lm_hits: torch.Tensor  # (R, r) float64 p_LM of each neighbour's value
    p_lm_true: torch.Tensor  # (R,) float64
    p_lm_max: torch.Tensor  # (R,) float64


@torch.inference_mode()
def score_text(
    lm: Any,
    key_store: Any,
    passages: Sequence[Any],
    text: CalibrationText,
    n_neighbors: int = 1024,
    lm_temperature: float = 1.0,
) -> ScoredText:
    """One teacher-forced forward over ``prefix + rest`` and the nearest keys of the memory of
    ``passages`` at every scored position (prompt = the raw prefix, as a completion)."""
    p_ids = list(lm.tokenize(text.prefix))
    r_ids = list(lm.tokenize(text.rest))
    logits, queries = lm.forward(p_ids + r_ids, lm.new_cache())
    rows = slice(len(p_ids) - 1, len(p_ids) - 1 + len(r_ids))
    logits, queries = logits[rows], queries[rows]
    target = torch.as_tensor(r_ids, device=logits.device)
    log_p = torch.log_softmax(logits.double() / lm_temperature, dim=-1)
    p_lm = log_p.exp()
    log_lm = log_p.gather(1, target[:, None])[:, 0]
    memory = TokenMemory(ensure_keys(key_store, lm, list(passages)), device=lm.device) if passages \
        else None
    if memory is None or memory.n_available == 0:
        r = len(r_ids)
        z = torch.zeros((r, 0))
        return ScoredText(text.in_corpus, log_lm.cpu(), z, z.bool(), z.long(), z.double(),
                       log_lm.exp().cpu(), p_lm.max(-1).values.cpu())
    hits = memory.search(queries, n_neighbors)
    values = memory.values[hits.rows]  # (R, r)
    return ScoredText(
        text.in_corpus,
        log_lm.cpu(),
        hits.dist.float().cpu(),
        (values == target[:, None]).cpu(),
        values.cpu(),
        p_lm.gather(1, values).cpu(),
        log_lm.exp().cpu(),
        p_lm.max(-1).values.cpu(),
    )


class ScorePool:
    """The scored tokens of a set of texts, concatenated, for fast grid evaluation."""

    def __init__(self, scored: Sequence[ScoredText]):
        self.scored = list(scored)
        self.log_lm = torch.cat([s.log_lm for s in scored]) if scored else torch.zeros(0)
        self.n = int(self.log_lm.numel())
        self.has_hits = torch.cat(
            [torch.full((len(s.log_lm),), s.dist.shape[1] > 0) for s in scored]
        ) if scored else torch.zeros(0, dtype=torch.bool)
        ratios = [rrc_ratio(s.dist) if s.dist.shape[1] else torch.ones(len(s.log_lm))
                  for s in scored]
        self.ratio = torch.cat(ratios).double() if ratios else torch.zeros(0)

    def p_knn_true(self, mu: float) -> torch.Tensor:
        """p_kNN(true token) at every scored position for inverse temperature ``mu``."""
        out = []
        for s in self.scored:
            if s.dist.shape[1] == 0:
                out.append(torch.zeros(len(s.log_lm), dtype=torch.float64))
                continue
            out.append((knn_weights(s.dist.double(), mu) * s.match).sum(-1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

    def lam(self, alpha: float, tau: float) -> torch.Tensor:
        """RRC lambda at every scored position (1 where there are no hits)."""
        return torch.where(self.has_hits, rrc_weight(self.ratio, alpha, tau),
                           torch.ones_like(self.ratio))

    def nll(self, p_knn: torch.Tensor, alpha: float, tau: float) -> float:
        """Mean negative log p_M(true) (lambda = 1 where there are no hits)."""
        if self.n == 0:
            return math.nan
        logp = log_mixture(self.log_lm, p_knn, self.lam(alpha, tau), min_weight=1e-12)
        return float(-logp.mean())

    def base_nll(self) -> float:
        return float(-self.log_lm.mean()) if self.n else math.nan
