"""``nest calibrate``: fit NEST's kNN temperature and RRC to a model and a corpus.

NEST mixes ``p_M = lambda * p_LM + (1 - lambda) * p_kNN`` with ``p_kNN`` a softmax of
``-mu * d`` over the nearest token keys and ``lambda = sigmoid((d_min/d_max - alpha) / tau)``
(Relative Retrieval Confidence). The paper's mu, alpha, tau were chosen for a 7B model and
Wikipedia; with another model the key distances live on another scale and the defaults can make
p_M worse than p_LM. This module fits them on a split of the user's own corpus:

- a few documents are **held out** (their passages are dropped from every retrieval): their
  text is "not in corpus" text; a few other documents stay in: their text is "in corpus" text;
- each text is cut into a prefix (the retrieval query, as for a completion) and the tokens
  after it; ONE teacher-forced forward over prefix + rest gives p_LM and the query vector at
  every position, and the token memory of the top-k retrieved passages gives the nearest keys;
- a grid over (mu, alpha, tau) scores the true next tokens under p_M (exactly the engine's
  ``nest_distribution``, unmasked memory; the test suite checks the two agree);
- the chosen point **minimises in-corpus perplexity subject to held-out perplexity <= the base
  LM's** (if no grid point keeps held-out text at or below base, the one with the lowest
  held-out perplexity is taken and the result says so).

The (slightly flat) optimum is taken as: among feasible points within 1% of the best in-corpus
perplexity, the one with the lowest held-out perplexity.

It also *suggests* delta (span threshold: the largest grid value at which at most 10% of
held-out positions would start a span; the smallest grid value, flagged
``span_start_rate["criterion_met"] = False``, when none does) and gamma (relaxation: accept
95% of true in-corpus tokens, ``2 * q05(p_M(true) / max p_M)``, clipped to [5e-4, 1]).

The result is stored beside the key store, ``<persist_dir>/calibration/<collection>.json``,
one entry per model (``"<fingerprint>|<key_source>"``); ``load_calibration`` returns the
fitted ``NestConfig`` overrides for the model, or None.

Usage::

    nest calibrate --collection docs                 # CLI (progress bars, a summary table)

    from nest_integrations.calibrate import calibrate_collection, load_calibration
    result = calibrate_collection(persist_dir, "docs")     # fits and saves
    overrides = load_calibration(persist_dir, "docs", lm)  # {"knn_temperature": ..., ...}
    config = NestConfig.from_preset("paper", **overrides)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

LOG = logging.getLogger(__name__)

CALIBRATION_VERSION = 1
#: mu grid, as multiples of 1/sqrt(d) (the paper's reading of the default is 1x).
MU_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0)
ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
TAUS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
DELTAS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: held-out positions allowed to start a span at the suggested delta.
HELD_OUT_SPAN_RATE = 0.10


@dataclass(frozen=True)
class CalibrationText:
    """One text to score: the retrieval query / prompt ``prefix`` and the scored ``rest``."""

    doc_id: str
    prefix: str
    rest: str
    in_corpus: bool


@dataclass
class _Scored:
    """Teacher-forced quantities of one text (everything the grid needs)."""

    in_corpus: bool
    log_lm: torch.Tensor  # (R,) float64 log p_LM(true)
    dist: torch.Tensor  # (R, r) float32 squared distances, nearest first
    match: torch.Tensor  # (R, r) bool: neighbour value == true token
    values: torch.Tensor  # (R, r) int64 neighbour values
    p_lm_hits: torch.Tensor  # (R, r) float64 p_LM of each neighbour's value
    p_lm_true: torch.Tensor  # (R,) float64
    p_lm_max: torch.Tensor  # (R,) float64


# ----------------------------------------------------------------------------- texts


def _cut(lm: Any, text: str, prefix_tokens: int, score_tokens: int) -> tuple[str, str] | None:
    """Prefix (at most ``prefix_tokens``, at most a third of the text) and the next at most
    ``score_tokens`` tokens, cut on token boundaries."""
    ids, off = lm.tokenize_with_offsets(text)
    n = len(ids)
    p = min(prefix_tokens, n // 3)
    if p < 2 or n - p < 4:
        return None
    cut = int(off[p, 0])
    end_tok = min(n, p + score_tokens)
    end = int(off[end_tok - 1, 1]) if end_tok < n else len(text)
    prefix, rest = text[:cut], text[cut:end]
    stripped = prefix.rstrip()
    rest = prefix[len(stripped):] + rest
    if not stripped.strip() or not rest.strip():
        return None
    return stripped, rest


def split_corpus(
    passages: Sequence[Any],
    lm: Any,
    *,
    n_texts: int = 24,
    prefix_tokens: int = 32,
    score_tokens: int = 64,
    seed: int = 0,
) -> tuple[list[CalibrationText], list[CalibrationText], set[str]]:
    """Hold out ``n_texts`` documents (never more than half) and pick ``n_texts`` others:
    ``(in_texts, out_texts, held_out_doc_ids)``. A document's text is its first passage."""
    by_doc: dict[str, list[Any]] = {}
    for p in passages:
        by_doc.setdefault(p.doc_id or p.id, []).append(p)
    docs = sorted(by_doc)
    if len(docs) < 2:
        raise ValueError(
            f"calibration needs at least 2 documents (one held out, one in), found {len(docs)}"
        )
    rng = random.Random(f"calibrate:{seed}")
    rng.shuffle(docs)
    n_out = max(1, min(n_texts, len(docs) // 2))
    out_docs, in_docs = docs[:n_out], docs[n_out:]

    def first(doc: str) -> Any:
        ps = by_doc[doc]
        return min(ps, key=lambda p: (p.metadata.get("chunk_index", 0) or 0, p.char_start or 0))

    def texts(pool: list[str], in_corpus: bool, n: int) -> list[CalibrationText]:
        out = []
        for d in pool:
            if len(out) >= n:
                break
            cut = _cut(lm, first(d).text, prefix_tokens, score_tokens)
            if cut is not None:
                out.append(CalibrationText(d, cut[0], cut[1], in_corpus))
        return out

    in_texts = texts(in_docs, True, n_texts)
    out_texts = texts(out_docs, False, n_out)
    if not in_texts or not out_texts:
        raise ValueError(
            "no usable calibration text: documents are too short (need at least 12 tokens)"
        )
    return in_texts, out_texts, set(out_docs)


# ----------------------------------------------------------------------------- scoring


@torch.inference_mode()
def score_text(
    lm: Any,
    key_store: Any,
    passages: Sequence[Any],
    text: CalibrationText,
    n_neighbors: int = 1024,
    lm_temperature: float = 1.0,
) -> _Scored:
    """One teacher-forced forward over ``prefix + rest`` and the nearest keys of the memory of
    ``passages`` at every scored position (prompt = the raw prefix, as a completion)."""
    from nest_integrations.core.token_memory import TokenMemory
    from nest_integrations.index.keys import ensure_keys

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
        return _Scored(text.in_corpus, log_lm.cpu(), z, z.bool(), z.long(), z.double(),
                       log_lm.exp().cpu(), p_lm.max(-1).values.cpu())
    hits = memory.search(queries, n_neighbors)
    values = memory.values[hits.rows]  # (R, r)
    return _Scored(
        text.in_corpus,
        log_lm.cpu(),
        hits.dist.float().cpu(),
        (values == target[:, None]).cpu(),
        values.cpu(),
        p_lm.gather(1, values).cpu(),
        log_lm.exp().cpu(),
        p_lm.max(-1).values.cpu(),
    )


def _lam(ratio: torch.Tensor, alpha: float, tau: float) -> torch.Tensor:
    return torch.sigmoid((ratio - alpha) / tau)


class _Pool:
    """The scored tokens of a set of texts, concatenated, for fast grid evaluation."""

    def __init__(self, scored: Sequence[_Scored]):
        self.scored = list(scored)
        self.log_lm = torch.cat([s.log_lm for s in scored]) if scored else torch.zeros(0)
        self.n = int(self.log_lm.numel())
        self.has_hits = torch.cat(
            [torch.full((len(s.log_lm),), s.dist.shape[1] > 0) for s in scored]
        ) if scored else torch.zeros(0, dtype=torch.bool)
        ratios = []
        for s in scored:
            if s.dist.shape[1] == 0:
                ratios.append(torch.ones(len(s.log_lm)))
                continue
            d_min, d_max = s.dist[:, 0], s.dist[:, -1]
            ratios.append(torch.where(d_max > 0, d_min / d_max.clamp_min(1e-30),
                                      torch.ones_like(d_max)))
        self.ratio = torch.cat(ratios).double() if ratios else torch.zeros(0)

    def p_knn_true(self, mu: float) -> torch.Tensor:
        """p_kNN(true token) at every scored position for inverse temperature ``mu``."""
        out = []
        for s in self.scored:
            if s.dist.shape[1] == 0:
                out.append(torch.zeros(len(s.log_lm), dtype=torch.float64))
                continue
            w = torch.softmax(-mu * s.dist.double(), dim=-1)
            out.append((w * s.match).sum(-1))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

    def nll(self, p_knn: torch.Tensor, alpha: float, tau: float) -> float:
        """Mean negative log p_M(true) (lambda = 1 where there are no hits)."""
        if self.n == 0:
            return math.nan
        lam = torch.where(self.has_hits, _lam(self.ratio, alpha, tau), torch.ones_like(self.ratio))
        lam = lam.clamp(1e-12, 1.0)
        terms = torch.log(lam) + self.log_lm
        mixed = torch.logaddexp(terms, torch.log1p(-lam.clamp(max=1 - 1e-12)) + torch.log(p_knn))
        logp = torch.where(lam >= 1.0, self.log_lm, mixed)
        return float(-logp.mean())

    def base_nll(self) -> float:
        return float(-self.log_lm.mean()) if self.n else math.nan


# ----------------------------------------------------------------------------- fitting


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

    from nest_integrations.config import NestConfig

    default = default or {}
    d_cfg = NestConfig(**{k: v for k, v in default.items()
                          if k in ("knn_temperature", "rrc_offset", "rrc_scale")})
    t0 = time.perf_counter()
    scored: list[_Scored] = []
    texts = list(in_texts) + list(out_texts)
    for t in tqdm(texts, desc="calibrate: scoring texts", unit="text", disable=not progress,
                  dynamic_ncols=True):
        passages = list(retrieve(t.prefix, n_passages))
        scored.append(score_text(lm, key_store, passages, t, n_neighbors, lm_temperature))
    t_score = time.perf_counter() - t0
    pin = _Pool([s for s in scored if s.in_corpus])
    pout = _Pool([s for s in scored if not s.in_corpus])
    if pin.n == 0 or pout.n == 0:
        raise ValueError("calibration needs scored tokens both in and out of the corpus")
    key_dim = int(getattr(lm, "key_dim", 0) or 0) or _key_dim(key_store)
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


def _suggest_delta(pin: _Pool, pout: _Pool, alpha: float, tau: float) -> tuple[float, dict]:
    lam_in = torch.where(pin.has_hits, _lam(pin.ratio, alpha, tau), torch.ones_like(pin.ratio))
    lam_out = torch.where(pout.has_hits, _lam(pout.ratio, alpha, tau),
                          torch.ones_like(pout.ratio))
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


def _suggest_gamma(pin: _Pool, mu: float, alpha: float, tau: float) -> float:
    """2 * the 5th percentile over in-corpus tokens of p_M(true) / max p_M, in [5e-4, 1]."""
    ratios = []
    for s in pin.scored:
        if s.dist.shape[1] == 0:
            ratios.append(s.p_lm_true / s.p_lm_max)
            continue
        w = torch.softmax(-mu * s.dist.double(), dim=-1)  # (R, r)
        d_min, d_max = s.dist[:, 0].double(), s.dist[:, -1].double()
        ratio = torch.where(d_max > 0, d_min / d_max.clamp_min(1e-30), torch.ones_like(d_max))
        lam = _lam(ratio, alpha, tau)
        # p_kNN of each neighbour's value: sum of the weights of neighbours with that value.
        same = s.values[:, :, None] == s.values[:, None, :]  # (R, r, r)
        p_knn_v = (w[:, None, :] * same).sum(-1)  # (R, r)
        p_m_hits = lam[:, None] * s.p_lm_hits + (1 - lam[:, None]) * p_knn_v
        p_true = lam * s.p_lm_true + (1 - lam) * (w * s.match).sum(-1)
        p_max = torch.maximum(lam * s.p_lm_max, p_m_hits.max(-1).values)
        ratios.append(p_true / p_max)
    q = float(np.quantile(torch.cat(ratios).numpy(), 0.05)) if ratios else 1.0
    return float(min(1.0, max(5e-4, 2.0 * q)))


# ----------------------------------------------------------------------------- storage
# (in calibration_store.py, re-exported here)
from nest_integrations.calibration_store import (  # noqa: E402
    _read,
    calibration_path,
    load_calibration,
    load_calibration_record,
    model_key,
    save_calibration,
)


def calibrate_passages(
    lm: Any,
    key_store: Any,
    retriever: Any,
    passages: Sequence[Any],
    *,
    n_texts: int = 24,
    prefix_tokens: int = 32,
    score_tokens: int = 64,
    n_passages: int = 40,
    n_neighbors: int = 1024,
    seed: int = 0,
    default: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Split ``passages`` (the whole corpus behind ``retriever``) and fit: held-out documents
    are dropped from every retrieval (over-fetching to keep k passages)."""
    in_texts, out_texts, held = split_corpus(
        passages, lm, n_texts=n_texts, prefix_tokens=prefix_tokens, score_tokens=score_tokens,
        seed=seed,
    )
    n_held = sum(1 for p in passages if (p.doc_id or p.id) in held)

    def retrieve(query: str, k: int) -> list[Any]:
        got = retriever.retrieve(query, k + n_held)
        return [p for p in got if (p.doc_id or p.id) not in held][:k]

    result = fit_calibration(
        lm, key_store, retrieve, in_texts, out_texts, n_passages=n_passages,
        n_neighbors=n_neighbors, default=default, progress=progress,
    )
    result["split"] = {"seed": seed, "held_out_documents": len(held),
                       "documents": len({p.doc_id or p.id for p in passages}),
                       "prefix_tokens": prefix_tokens, "score_tokens": score_tokens}
    return result


def calibrate_collection(
    persist_dir: str | os.PathLike[str] | None = None,
    collection: str = "nest",
    lm: Any = None,
    *,
    n_texts: int = 24,
    n_passages: int = 40,
    seed: int = 0,
    save: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Calibrate the embedded store's ``collection`` (``nest ingest`` output) for ``lm``
    (default: the embedded model) and store the result unless ``save`` is False."""
    from nest_integrations import paths
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    root = Path(persist_dir) if persist_dir is not None else paths.default_persist_dir()
    if not paths.chroma_dir(root).is_dir():
        raise FileNotFoundError(
            f"no store at {root}; create one with `nest ingest PATH... --collection {collection}`"
        )
    store = ChromaPassageStore.from_persist_dir(root, collection)
    store.count()  # a missing collection fails here, naming the existing ones
    if lm is None:
        lm = _load_lm()
    passages = list(store.iter_passages())
    keys = DiskKeyStore.open(paths.keys_dir(root), lm, allow_new_namespace=True)
    try:
        result = calibrate_passages(
            lm, keys, store, passages, n_texts=n_texts, n_passages=n_passages, seed=seed,
            progress=progress,
        )
    finally:
        keys.close()
    result["collection"] = collection
    if save:
        result["path"] = str(save_calibration(root, collection, lm, result))
    return result


# ----------------------------------------------------------------------------- CLI


def _load_lm() -> Any:
    """The embedded model, shared with the rest of the process (tests replace this)."""
    try:
        from nest_integrations.assembly import shared_model
    except ImportError:  # pragma: no cover - before the assembly module
        from nest_integrations.lm.hf import HFLanguageModel

        return HFLanguageModel.from_default()
    return shared_model()

CALIBRATE_HELP = "fit the kNN temperature and RRC (mu, alpha, tau) to the model and a collection"


def add_calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collection", default="nest", help="Chroma collection (default: 'nest')")
    p.add_argument("--persist-dir", metavar="DIR",
                   help="store folder holding chroma/ and keys/ (default: $NEST_HOME/store)")
    p.add_argument("--n-texts", type=int, default=24,
                   help="documents held out, and documents kept in, to score (default 24)")
    p.add_argument("--passages", type=int, default=40, help="passages retrieved per text (b)")
    p.add_argument("--seed", type=int, default=0, help="split seed")
    p.add_argument("--dry-run", action="store_true", help="fit and print, store nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.n_texts < 1 or args.passages < 1:
        raise ValueError("--n-texts and --passages must be at least 1")
    lm = _load_lm()
    res = calibrate_collection(
        args.persist_dir, args.collection, lm, n_texts=args.n_texts, n_passages=args.passages,
        seed=args.seed, save=not args.dry_run, progress=not args.json,
    )
    out = sys.stdout.write
    if args.json:
        out(json.dumps(res, indent=2) + "\n")
        return 0
    o, s, ppl = res["overrides"], res["suggested"], res["ppl"]
    out(f"Calibrated collection {args.collection!r} "
        f"({res['n_texts']['in_corpus']} in-corpus + {res['n_texts']['held_out']} held-out texts,"
        f" {res['n_tokens']['in_corpus'] + res['n_tokens']['held_out']} tokens, "
        f"{res['seconds']['total']:.0f} s)\n")
    out(f"  knn_temperature (mu)  {o['knn_temperature']:.4g}   (default "
        f"{res['default']['knn_temperature']:.4g})\n")
    out(f"  rrc_offset (alpha)    {o['rrc_offset']:.3g}   "
        f"(default {res['default']['rrc_offset']})\n")
    out(f"  rrc_scale (tau)       {o['rrc_scale']:.3g}   (default {res['default']['rrc_scale']})\n")
    out(f"  suggested span_threshold (delta) {s['span_threshold']:.3g}, "
        f"relaxation (gamma) {s['relaxation']:.3g}\n")
    out("  p_M perplexity        base LM   default   calibrated\n")
    for name, key in (("in corpus", "in_corpus"), ("held out", "held_out")):
        v = ppl[key]
        out(f"    {name:<19} {v['base']:8.2f}  {v['default']:8.2f}  {v['calibrated']:10.2f}\n")
    if not res["feasible"]:
        out("  note: no grid point kept held-out perplexity at or below the base LM's; "
            "the lowest held-out perplexity was taken\n")
    out(f"  saved to {res['path']}\n" if "path" in res else "  (dry run: nothing stored)\n")
    return 0


__all__ = [
    "CALIBRATE_HELP",
    "CalibrationText",
    "add_calibrate_args",
    "calibrate_collection",
    "calibrate_passages",
    "calibration_path",
    "cmd_calibrate",
    "fit_calibration",
    "load_calibration",
    "load_calibration_record",
    "model_key",
    "save_calibration",
    "score_text",
    "split_corpus",
]
