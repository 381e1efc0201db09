"""Support scorers: a ``(units, candidates)`` score matrix per scorer. The embedding scorer
lives on ``Attributor`` (it caches the candidates' embeddings); these are the stateless ones."""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any, Sequence

import numpy as np

from nest_integrations.attribution.splitting import Candidate
from nest_integrations.types import Passage


def fuzzy_scores(units: Sequence[str], cands: Sequence[Candidate]) -> np.ndarray:
    """difflib: characters of the unit matched in the candidate, over the unit's length."""
    out = np.zeros((len(units), len(cands)), dtype=np.float32)
    for i, u in enumerate(units):
        ul = u.lower()
        for j, c in enumerate(cands):
            sm = SequenceMatcher(None, ul, c.text.lower(), autojunk=False)
            out[i, j] = sum(b.size for b in sm.get_matching_blocks()) / max(len(ul), 1)
    return out


def key_scores(lm: Any, key_store: Any, units: Sequence[str], cands: Sequence[Candidate],
               passages: Sequence[Passage]) -> np.ndarray:
    """BERTScore-style recall over LM keys: per unit token, the best cosine with the
    candidate's tokens, averaged; keys centred on the passages' mean key. Passage keys come
    from ``key_store`` (encoded into it when missing)."""
    from nest_integrations.index.keys import ensure_keys

    pkeys = ensure_keys(key_store, lm, list(passages))
    unit_ids = [list(lm.tokenize(u)) for u in units]
    ukeys = lm.encode_passages(unit_ids)
    allk = [np.asarray(pk.keys, dtype=np.float32) for pk in pkeys if len(pk)]
    if not allk:
        return np.zeros((len(units), len(cands)), dtype=np.float32)
    mean = np.concatenate(allk).mean(axis=0)
    cand_rows = []
    for c in cands:
        pk = pkeys[c.passage]
        off = np.asarray(pk.offsets).reshape(-1, 2)
        rows = np.nonzero((off[:, 1] > c.start) & (off[:, 0] < c.end))[0]
        k = np.asarray(pk.keys, dtype=np.float32)[rows] - mean
        cand_rows.append(k / np.maximum(np.linalg.norm(k, axis=1, keepdims=True), 1e-6))
    out = np.zeros((len(units), len(cands)), dtype=np.float32)
    for i, uk in enumerate(ukeys):
        if not len(uk):
            continue
        u = np.asarray(uk, dtype=np.float32) - mean
        u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-6)
        for j, ck in enumerate(cand_rows):
            if len(ck):
                out[i, j] = float((u @ ck.T).max(axis=1).mean())
    return out
