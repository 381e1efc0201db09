"""The grid search: mu, alpha, tau that minimise in-corpus perplexity subject to held-out
perplexity <= the base LM's (``fit_calibration``), and the suggested delta and gamma."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from nest_integrations.calibrate import scoring
from nest_integrations.calibrate.scoring import ScoredText, ScorePool
from nest_integrations.calibrate.splitting import CalibrationText
from nest_integrations.config import NestConfig
from nest_integrations.core.mixture import knn_weights, mixture, rrc_ratio, rrc_weight

__all__ = ["ALPHAS", "DELTAS", "HELD_OUT_SPAN_RATE", "MU_MULTIPLES", "TAUS", "fit_calibration"]

#: mu grid, as multiples of 1/sqrt(d) (the paper's reading of the default is 1x).
MU_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0)
ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
TAUS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
DELTAS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: held-out positions allowed to start a span at the suggested delta.
HELD_OUT_SPAN_RATE = 0.10


def fit_calibration(
    lm: Any,
    key_store: Any,
    retrieve: Callable[[str, int], Sequence[Any]],
    in_texts: Sequence[CalibrationText],
    out_texts: Sequence[CalibrationText],
    *,
    n_passages: int = 40,
    n_neighbors: int = 1024,
    lm_temperature: float = 1.0,
    default: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Score ``in_texts`` and ``out_texts`` (``retrieve(prefix, k)`` gives each text's
    passages; it must already leave held-out documents out) and grid-search mu, alpha, tau.

    Returns a JSON-ready dict: ``overrides`` (knn_temperature, rrc_offset, rrc_scale),
    ``suggested`` (span_threshold, relaxation), ``ppl`` (base / default / calibrated, in and
    out of corpus), ``feasible``, ``n_tokens`` and the grid size.
    """
    from tqdm.auto import tqdm

    default = default or {}
    d_cfg = NestConfig(**{k: v for k, v in default.items()
                          if k in ("knn_temperature", "rrc_offset", "rrc_scale")})
    t0 = time.perf_counter()
    scored: list[ScoredText] = []
    texts = list(in_texts) + list(out_texts)
    for t in tqdm(texts, desc="calibrate: scoring texts", unit="text", disable=not progress,
                  dynamic_ncols=True):
        passages = list(retrieve(t.prefix, n_passages))
        scored.append(scoring.score_text(lm, key_store, passages, t, n_neighbors,
                                         lm_temperature))
    t_score = time.perf_counter() - t0
    pin = ScorePool([s for s in scored if s.in_corpus])
    pout = ScorePool([s for s in scored if not s.in_corpus])
    if pin.n == 0 or pout.n == 0:
        raise ValueError("calibration needs scored tokens both in and out of the corpus")
    key_dim = int(lm.key_dim or 0) or _key_dim(key_store)
    base_mu = 1.0 / math.sqrt(key_dim) if key_dim else 1.0 / math.sqrt(576)
    mus = sorted({base_mu * m for m in MU_MULTIPLES})
    base_in, base_out = pin.base_nll(), pout.base_nll()

    grid: list[tuple[float, float, float, float, float]] = []  # mu, alpha, tau, in, out
    for mu in tqdm(mus, desc="calibrate: grid", unit="mu", disable=not progress,
                   dynamic_ncols=True):
        k_in, k_out = pin.p_knn_true(mu), pout.p_knn_true(mu)
        for a in ALPHAS:
            for tau in TAUS:
                grid.append((mu, a, tau, pin.nll(k_in, a, tau), pout.nll(k_out, a, tau)))
    feasible = [g for g in grid if g[4] <= base_out + 1e-9]
    if feasible:  # within 1% of the best in-corpus PPL, the lowest held-out PPL
        floor = min(g[3] for g in feasible) + math.log(1.01)
        best = min((g for g in feasible if g[3] <= floor), key=lambda g: (g[4], g[3]))
    else:
        best = min(grid, key=lambda g: (g[4], g[3]))
    mu, alpha, tau = best[0], best[1], best[2]
    d_mu = d_cfg.knn_temperature or base_mu
    d_in = pin.nll(pin.p_knn_true(d_mu), d_cfg.rrc_offset, d_cfg.rrc_scale)
    d_out = pout.nll(pout.p_knn_true(d_mu), d_cfg.rrc_offset, d_cfg.rrc_scale)

    delta, rates = _suggest_delta(pin, pout, alpha, tau)
    gamma = _suggest_gamma(pin, mu, alpha, tau)
    return {
        "overrides": {"knn_temperature": mu, "rrc_offset": alpha, "rrc_scale": tau},
        "suggested": {"span_threshold": delta, "relaxation": gamma},
        "ppl": {
            "in_corpus": {"base": math.exp(base_in), "default": math.exp(d_in),
                          "calibrated": math.exp(best[3])},
            "held_out": {"base": math.exp(base_out), "default": math.exp(d_out),
                         "calibrated": math.exp(best[4])},
        },
        "span_start_rate": rates,
        "feasible": bool(feasible),
        "objective": "min in-corpus PPL s.t. held-out PPL <= base",
        "default": {"knn_temperature": d_mu, "rrc_offset": d_cfg.rrc_offset,
                    "rrc_scale": d_cfg.rrc_scale},
        "key_dim": key_dim,
        "n_texts": {"in_corpus": len(in_texts), "held_out": len(out_texts)},
        "n_tokens": {"in_corpus": pin.n, "held_out": pout.n},
        "n_passages": n_passages,
        "n_neighbors": n_neighbors,
        "lm_temperature": lm_temperature,
        "grid": {"mu": mus, "alpha": list(ALPHAS), "tau": list(TAUS), "points": len(grid)},
        "seconds": {"scoring": t_score, "total": time.perf_counter() - t0},
    }


def _key_dim(key_store: Any) -> int:
    return int(getattr(key_store, "key_dim", 0) or 0)


def _suggest_delta(pin: ScorePool, pout: ScorePool, alpha: float, tau: float) -> tuple[float, dict]:
    lam_in, lam_out = pin.lam(alpha, tau), pout.lam(alpha, tau)
    rates: dict[str, Any] = {}
    chosen = DELTAS[0]
    met = False
    for d in DELTAS:
        r_in = float((lam_in <= d).double().mean())
        r_out = float((lam_out <= d).double().mean())
        rates[str(d)] = {"in_corpus": r_in, "held_out": r_out}
        if r_out <= HELD_OUT_SPAN_RATE:
            chosen, met = d, True
    rates["criterion_met"] = met
    return chosen, rates


def _suggest_gamma(pin: ScorePool, mu: float, alpha: float, tau: float) -> float:
    """2 * the 5th percentile over in-corpus tokens of p_M(true) / max p_M, in [5e-4, 1]."""
    ratios = []
    for s in pin.scored:
        if s.dist.shape[1] == 0:
            ratios.append(s.p_lm_true / s.p_lm_max)
            continue
        w = knn_weights(s.dist.double(), mu)  # (R, r)
        lam = rrc_weight(rrc_ratio(s.dist.double()), alpha, tau)
        # p_kNN of each neighbour's value: sum of the weights of neighbours with that value.
        same = s.values[:, :, None] == s.values[:, None, :]  # (R, r, r)
        p_knn_v = (w[:, None, :] * same).sum(-1)  # (R, r)
        p_m_hits = mixture(s.p_lm_hits, p_knn_v, lam)  # (R, r)
        p_true = lam * s.p_lm_true + (1 - lam) * (w * s.match).sum(-1)
        p_max = torch.maximum(lam * s.p_lm_max, p_m_hits.max(-1).values)
        ratios.append(p_true / p_max)
    q = float(np.quantile(torch.cat(ratios).numpy(), 0.05)) if ratios else 1.0
    return float(min(1.0, max(5e-4, 2.0 * q)))
