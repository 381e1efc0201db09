"""FAISS inner-product index over DReSD's 64-d unit keys (the paper uses ScaNN; spec §2.8).

Kinds:
- ``"flat"``: exact ``IndexFlatIP``. On 2 CPU cores a search over 100k 64-d keys takes about a
  millisecond, far below a verify forward (~100 ms), so flat is the default below
  ``FLAT_MAX`` keys;
- ``"ivf"``: ``IndexIVFFlat`` with nlist = 5·√n (ScaNN's leaf count) and nprobe covering about
  5% of the lists (ScaNN's 250 of 5·√n leaves at n ≈ 1M), at least 8;
- ``"hnsw"``: ``IndexHNSWFlat`` (M = 32, efSearch = 128), no training.

``"auto"`` = flat below ``FLAT_MAX`` keys, else IVF.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from nest_integrations._optional import require

KINDS = ("auto", "flat", "ivf", "hnsw")
#: Up to this many keys, exact search is used by ``kind="auto"``.
FLAT_MAX = 300_000

__all__ = ["KINDS", "FLAT_MAX", "build_index", "read_index", "write_index", "recall_at"]


def _faiss() -> Any:
    return require("faiss", package="faiss-cpu")


def resolve_kind(kind: str, n: int) -> str:
    if kind not in KINDS:
        raise ValueError(f"index kind={kind!r} is invalid: allowed one of {KINDS}")
    if kind == "auto":
        return "flat" if n <= FLAT_MAX else "ivf"
    return kind


def build_index(keys: np.ndarray, kind: str = "auto", seed: int = 0) -> tuple[Any, dict]:
    """An inner-product index over ``(n, p)`` unit keys; returns ``(index, params)``."""
    faiss = _faiss()
    x = np.ascontiguousarray(keys, dtype=np.float32)
    n, d = x.shape
    kind = resolve_kind(kind, n)
    params: dict[str, Any] = {"kind": kind}
    if kind == "flat" or n < 64:
        params["kind"] = "flat"
        index = faiss.IndexFlatIP(d)
    elif kind == "ivf":
        nlist = max(1, min(int(5 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        train = x[rng.choice(n, size=min(n, max(nlist * 64, 50_000)), replace=False)]
        index.train(train)
        index.nprobe = min(nlist, max(8, math.ceil(0.05 * nlist)))
        params.update(nlist=nlist, nprobe=int(index.nprobe))
    else:
        index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 128
        params.update(M=32, efSearch=128)
    index.add(x)
    return index, params


def write_index(index: Any, path: str | Path) -> None:
    """Write atomically (temp file, then rename)."""
    tmp = Path(f"{path}.tmp")
    _faiss().write_index(index, str(tmp))
    os.replace(tmp, path)


def read_index(path: str | Path, params: dict | None = None) -> Any:
    index = _faiss().read_index(str(path))
    if params and params.get("kind") == "ivf":
        index.nprobe = int(params["nprobe"])
    if params and params.get("kind") == "hnsw":
        index.hnsw.efSearch = int(params["efSearch"])
    return index


def recall_at(index: Any, keys: np.ndarray, queries: np.ndarray, k: int = 50) -> float:
    """Recall@k of ``index`` against exact ``IndexFlatIP`` search over ``keys``."""
    faiss = _faiss()
    x = np.ascontiguousarray(keys, dtype=np.float32)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    exact = faiss.IndexFlatIP(x.shape[1])
    exact.add(x)
    _, truth = exact.search(q, k)
    _, got = index.search(q, k)
    hits = sum(len(set(t[t >= 0]) & set(g[g >= 0])) for t, g in zip(truth, got))
    return hits / max(1, int((truth >= 0).sum()))
