"""FAISS inner-product index over DReSD's 64-d unit keys (the paper uses ScaNN; spec §2.8).

Vectors are stored as fp16 (``ScalarQuantizer.QT_fp16``), the keys' own precision, so the index
is the only copy of the keys on disk (128 B per token at 64 dimensions).

Kinds:
- ``"flat"``: exact search (``IndexScalarQuantizer`` fp16, inner product). On 2 CPU cores a search over 100k 64-d keys takes about a
  millisecond, far below a verify forward (~100 ms), so flat is the default below
  ``FLAT_MAX`` keys;
- ``"ivf"``: ``IndexIVFScalarQuantizer`` (fp16) with nlist = 5·√n (ScaNN's leaf count) and nprobe covering about
  5% of the lists (ScaNN's 250 of 5·√n leaves at n ≈ 1M), at least 8;
- ``"hnsw"``: ``IndexHNSWSQ`` (fp16, M = 32, efSearch = 128), no training.

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

__all__ = ["KINDS", "FLAT_MAX", "build_index", "read_index", "reconstruct_all", "write_index",
           "recall_at"]


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
    ip, fp16 = faiss.METRIC_INNER_PRODUCT, faiss.ScalarQuantizer.QT_fp16
    if kind == "flat" or n < 64:
        params["kind"] = "flat"
        index = faiss.IndexScalarQuantizer(d, fp16, ip)  # exact: the keys are fp16 already
    elif kind == "ivf":
        nlist = max(1, min(int(5 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, fp16, ip)
        rng = np.random.default_rng(seed)
        train = x[rng.choice(n, size=min(n, max(nlist * 64, 50_000)), replace=False)]
        index.train(train)
        index.nprobe = min(nlist, max(8, math.ceil(0.05 * nlist)))
        params.update(nlist=nlist, nprobe=int(index.nprobe))
    else:
        index = faiss.IndexHNSWSQ(d, fp16, 32, ip)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 128
        params.update(M=32, efSearch=128)
    if not index.is_trained:
        index.train(x[: min(n, 65536)])  # the fp16 quantizer needs no statistics
    index.add(x)
    return index, params


def reconstruct_all(index: Any) -> np.ndarray:
    """Every stored vector, ``(n, d)`` fp32, in row order."""
    if hasattr(index, "make_direct_map"):  # IVF: row -> (list, offset) map
        index.make_direct_map()
    return index.reconstruct_n(0, index.ntotal)


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
