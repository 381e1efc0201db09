"""A corpus-wide FAISS index over every token key of a key store (for DReSD-style drafting).

NEST itself searches only the top-b passages' keys exactly (``core/token_memory.py``); this
index is for methods that search the whole corpus. It is built from ``DiskKeyStore.iter_all`` and maps each
FAISS row back to ``(content_hash, position)``: the passage text's hash and the position of the
value token inside it.

Example::

    index = build_faiss_index(store, kind="ivf")
    index.save(default_index_path(store, "ivf"))
    distances, ids = index.search(queries, k=8)     # ids[i][j] == (content_hash, position)
    index = CorpusTokenIndex.load(default_index_path(store, "ivf"), store=store)
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from nest_integrations._optional import require
from nest_integrations.index.base import KeyStoreMismatchError

LOG = logging.getLogger(__name__)

KINDS = ("flat", "ivf")
METRICS = ("l2", "ip")

__all__ = ["CorpusTokenIndex", "build_faiss_index", "default_index_path"]


def _faiss() -> Any:
    return require("faiss", package="faiss-cpu")


class CorpusTokenIndex:
    """A FAISS index over token keys, with each row's passage hash, position and value token.

    Attributes:
        index: The FAISS index (row i is the i-th stored key in ``store.iter_all`` order).
        content_hashes: Passage content hashes; ``passage_of_row`` indexes into it.
        passage_of_row: ``(n,)`` int32.
        positions: ``(n,)`` int32, the value token's position in its passage.
        token_ids: ``(n,)`` int32, the value token of each key.
        meta: fingerprint, key_source, key_dim, kind, metric and the store size it was built from.
    """

    def __init__(
        self,
        index: Any,
        content_hashes: list[str],
        passage_of_row: np.ndarray,
        positions: np.ndarray,
        token_ids: np.ndarray,
        meta: dict[str, Any],
    ) -> None:
        if not (index.ntotal == len(passage_of_row) == len(positions) == len(token_ids)):
            raise ValueError("index rows and row maps differ in length")
        self.index = index
        self.content_hashes = content_hashes
        self.passage_of_row = passage_of_row
        self.positions = positions
        self.token_ids = token_ids
        self.meta = meta

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw FAISS search: ``(n, k)`` distances and row numbers (-1 where fewer than k)."""
        q = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.meta["key_dim"])
        return self.index.search(q, k)

    def search(
        self, queries: np.ndarray, k: int
    ) -> tuple[np.ndarray, list[list[tuple[str, int]]]]:
        """The k nearest keys of each query: ``(n, k)`` distances (squared L2, or inner product
        for ``metric="ip"``) and, per query, ``(content_hash, position)`` of each hit, best
        first. Missing hits (fewer than k keys reachable) are dropped from the id lists."""
        distances, rows = self.search_rows(queries, k)
        hashes = self.content_hashes
        ids = [
            [(hashes[self.passage_of_row[r]], int(self.positions[r])) for r in row if r >= 0]
            for row in rows
        ]
        return distances, ids

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``index.faiss``, ``rows.npz`` and ``meta.json`` into folder ``path``."""
        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        _faiss().write_index(self.index, str(d / "index.faiss"))
        np.savez(
            d / "rows.npz",
            content_hashes=np.array(self.content_hashes, dtype="S64"),
            passage_of_row=self.passage_of_row,
            positions=self.positions,
            token_ids=self.token_ids,
        )
        (d / "meta.json").write_text(json.dumps(self.meta, indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, store: Any = None) -> CorpusTokenIndex:
        """Read an index saved by ``save``; with ``store``, refuse one built for another model
        or key source, and warn when the store has changed since the build."""
        d = Path(path)
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        if store is not None:
            _check_store(meta, store)
        rows = np.load(d / "rows.npz")
        return cls(
            _faiss().read_index(str(d / "index.faiss")),
            [h.decode("ascii") for h in rows["content_hashes"]],
            rows["passage_of_row"],
            rows["positions"],
            rows["token_ids"],
            meta,
        )


def build_faiss_index(
    store: Any,
    *,
    kind: str = "flat",
    metric: str = "l2",
    nlist: int | None = None,
    nprobe: int = 16,
    train_size: int = 262144,
    batch_rows: int = 65536,
    seed: int = 0,
) -> CorpusTokenIndex:
    """A FAISS index over every key in ``store`` (a ``DiskKeyStore`` namespace).

    Args:
        kind: ``"flat"`` (exact) or ``"ivf"`` (IVF-Flat: ``nlist`` lists, ``nprobe`` probed).
        metric: ``"l2"`` (squared L2, as NEST) or ``"ip"`` (inner product, for unit vectors).
        nlist: IVF lists; default about 4·√n, with at least 39 training points per list.
        train_size: IVF training sample size (drawn uniformly from the store).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is invalid: allowed one of {KINDS}")
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is invalid: allowed one of {METRICS}")
    faiss = _faiss()
    t0 = time.perf_counter()
    stats = store.stats()
    n, d = stats["n_tokens"], store.key_dim
    faiss_metric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    if kind == "flat" or n == 0:
        index = faiss.IndexFlat(d, faiss_metric)
    else:
        nlist = nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlat(d, faiss_metric), d, nlist, faiss_metric)
        index.train(_training_sample(store, min(train_size, n), n, batch_rows, seed))
        index.nprobe = min(nprobe, nlist)
    hashes: list[str] = []
    passage_of_row, positions, token_ids = [], [], []
    for chunk in store.iter_all(batch_rows=batch_rows):
        index.add(chunk.keys)
        # rows of a passage are contiguous: a new passage starts where position == 0
        starts = np.flatnonzero(chunk.positions == 0)
        hashes.extend(chunk.content_hashes[i] for i in starts)
        passage_of_row.append(len(hashes) - len(starts) - 1 + np.cumsum(chunk.positions == 0))
        positions.append(chunk.positions)
        token_ids.append(chunk.token_ids.astype(np.int32))
    meta = {
        "fingerprint": store.fingerprint,
        "key_source": store.key_source,
        "key_dim": d,
        "kind": kind,
        "metric": metric,
        "nlist": nlist if kind == "ivf" else None,
        "n_passages": stats["n_passages"],
        "n_tokens": n,
    }
    LOG.info("built %s/%s FAISS index of %d keys in %.2fs", kind, metric, n,
             time.perf_counter() - t0)  # fmt: skip
    return CorpusTokenIndex(
        index,
        hashes,
        _cat(passage_of_row, np.int32),
        _cat(positions, np.int32),
        _cat(token_ids, np.int32),
        meta,
    )


def default_index_path(store: Any, kind: str = "flat", metric: str = "l2") -> Path:
    """Where an index of ``store`` lives by default: next to the store's shards."""
    return Path(store.namespace_dir) / "faiss" / f"{kind}-{metric}"


def _training_sample(store: Any, size: int, n: int, batch_rows: int, seed: int) -> np.ndarray:
    """About ``size`` keys drawn uniformly without replacement, in one pass over the store."""
    rng = np.random.default_rng(seed)
    keep = np.zeros(n, dtype=bool)
    keep[rng.choice(n, size=size, replace=False)] = True
    parts, seen = [], 0
    for chunk in store.iter_all(batch_rows=batch_rows):
        parts.append(chunk.keys[keep[seen : seen + len(chunk.keys)]])
        seen += len(chunk.keys)
    return np.ascontiguousarray(np.concatenate(parts))


def _check_store(meta: dict[str, Any], store: Any) -> None:
    ours = (meta["fingerprint"], meta["key_source"], meta["key_dim"])
    theirs = (store.fingerprint, store.key_source, store.key_dim)
    if ours != theirs:
        raise KeyStoreMismatchError(
            f"FAISS index was built from keys of {ours[0]} (key source {ours[1]!r}, d={ours[2]}); "
            f"the key store holds {theirs[0]} (key source {theirs[1]!r}, d={theirs[2]}): rebuild it"
        )
    if store.stats()["n_tokens"] != meta["n_tokens"]:
        LOG.warning("FAISS index covers %d keys but the store now holds %d: rebuild it",
                    meta["n_tokens"], store.stats()["n_tokens"])  # fmt: skip


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
