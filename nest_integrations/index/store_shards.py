"""The shard files of an on-disk key store (``index.store``): the storage dtypes of a row's
token ids and offsets, the sqlite index schema, and read-only memmaps of a shard's three files.

Split out of ``index.store``, which imports these names and holds the write protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from nest_integrations.index.store import DiskKeyStore

_ID_DTYPE = np.dtype("<i4")
_OFF_DTYPE = np.dtype("<i4")
_Rows = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # keys, token ids, offsets, n_chars
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    content_hash TEXT PRIMARY KEY, shard INTEGER NOT NULL, row_start INTEGER NOT NULL,
    n_rows INTEGER NOT NULL, n_chars INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards (shard INTEGER PRIMARY KEY, n_rows INTEGER NOT NULL);
"""


class _ShardMap(NamedTuple):
    rows: int
    keys: np.ndarray  # (rows, code_size) uint8 memmap
    ids: np.ndarray  # (rows,) memmap
    offs: np.ndarray  # (rows, 2) memmap

    @classmethod
    def open(cls, store: DiskKeyStore, shard: int) -> _ShardMap:
        paths = [store._shard_path(shard, c) for c in range(3)]
        sizes = [p.stat().st_size if p.exists() else 0 for p in paths]
        rows = min(sizes[0] // store._row_bytes, sizes[1] // 4, sizes[2] // 8)
        if rows == 0:
            empty = np.zeros((0, store._row_bytes), np.uint8)
            return cls(0, empty, np.zeros(0, _ID_DTYPE), np.zeros((0, 2), _OFF_DTYPE))
        return cls(
            rows,
            np.memmap(paths[0], dtype=np.uint8, mode="r", shape=(rows, store._row_bytes)),
            np.memmap(paths[1], dtype=_ID_DTYPE, mode="r", shape=(rows,)),
            np.memmap(paths[2], dtype=_OFF_DTYPE, mode="r", shape=(rows, 2)),
        )
