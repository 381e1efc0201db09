"""Lazy key caches for ``nest info``: the mode, cap and use of every cache namespace of a persist
dir, read from its manifests and sqlite indexes without loading a model.

Split out of ``index.lazy_cache`` (which re-exports ``lazy_cache_stats``); ``LazyKeyCache.stats``
reads its own index with ``_db_stats``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from nest_integrations.index.lazy_mode import LAZY_DIR, read_mode

__all__ = ["lazy_cache_stats"]


def lazy_cache_stats(keys_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Mode, cap and use of every lazy cache namespace in ``keys_dir`` without loading a model,
    or None for an eager folder."""
    mode = read_mode(keys_dir)
    if mode is None:
        return None
    root = Path(keys_dir) / LAZY_DIR
    spaces = []
    for ns in sorted(root.iterdir()) if root.is_dir() else []:
        if not (ns / "index.sqlite").exists() or not (ns / "manifest.json").exists():
            continue
        m = json.loads((ns / "manifest.json").read_text(encoding="utf-8"))
        db = sqlite3.connect(f"file:{ns / 'index.sqlite'}?mode=ro", uri=True, timeout=30.0)
        try:
            s = _db_stats(db)
        finally:
            db.close()
        spaces.append({"path": str(ns), "fingerprint": m["fingerprint"],
                       "key_source": m["key_source"], "key_dim": m["key_dim"],
                       "codec": m["codec"]["codec"], **s})  # fmt: skip
    return {"mode": "lazy", "max_bytes": int(mode["max_bytes"]), "codec": mode["codec"],
            "namespaces": spaces}  # fmt: skip


def _db_stats(db: sqlite3.Connection) -> dict[str, Any]:
    n, tokens, used = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(n_rows), 0), COALESCE(SUM(bytes), 0) FROM entries"
    ).fetchone()
    return {"n_entries": int(n), "n_tokens": int(tokens), "bytes_used": int(used),
            "bytes_per_token": used / tokens if tokens else 0.0}  # fmt: skip
