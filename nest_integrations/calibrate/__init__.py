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

Modules: ``splitting`` (held-out / in-corpus texts), ``scoring`` (teacher-forced p_LM and
nearest keys), ``fitting`` (the grid and the suggestions), ``runs`` (a corpus or a collection end
to end); results are stored by ``calibration_store``; ``nest calibrate`` is
``nest_integrations/cli/calibrate.py``.
"""

from __future__ import annotations

from nest_integrations.calibrate.fitting import fit_calibration
from nest_integrations.calibrate.runs import calibrate_collection, calibrate_passages
from nest_integrations.calibrate.scoring import score_text
from nest_integrations.calibrate.splitting import CalibrationText, split_corpus
from nest_integrations.calibration_store import (
    calibration_path,
    load_calibration,
    load_calibration_record,
    model_key,
    save_calibration,
)

__all__ = [
    "CalibrationText",
    "calibrate_collection",
    "calibrate_passages",
    "calibration_path",
    "fit_calibration",
    "load_calibration",
    "load_calibration_record",
    "model_key",
    "save_calibration",
    "score_text",
    "split_corpus",
]
