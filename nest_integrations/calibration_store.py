"""Where `nest calibrate` keeps its results: one JSON file per collection under the persist dir,
one entry per model (fingerprint + key source). Read by the engine assembly, written by
``nest_integrations.calibrate``; no model or framework imports, so the assembly can read it cheaply."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

LOG = logging.getLogger(__name__)

CALIBRATION_VERSION = 1


def calibration_path(persist_dir: str | os.PathLike[str] | None, collection: str) -> Path:
    """``<persist_dir>/calibration/<collection>.json`` (persist dir default: $NEST_HOME/store)."""
    from nest_integrations import paths

    root = paths.persist_root(persist_dir)
    if not collection or "/" in collection or "\\" in collection or collection.startswith("."):
        raise ValueError(f"collection={collection!r} is not a valid collection name")
    return root / "calibration" / f"{collection}.json"


def model_key(lm: Any) -> str:
    """The calibration entry of a model: ``"<fingerprint>|<key_source>"``."""
    return f"{lm.fingerprint}|{lm.key_source}"


def save_calibration(
    persist_dir: str | os.PathLike[str] | None, collection: str, lm: Any, result: dict[str, Any]
) -> Path:
    """Store ``result`` for ``lm`` (other models' entries are kept); atomic replace."""
    f = calibration_path(persist_dir, collection)
    data = _read(f) or {"version": CALIBRATION_VERSION, "collection": collection, "models": {}}
    data["models"][model_key(lm)] = {
        **result,
        "model": lm.name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(f)
    return f


def _read(f: Path) -> dict[str, Any] | None:
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        LOG.warning("ignoring unreadable calibration file %s: %s", f, exc)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        LOG.warning("ignoring calibration file %s: unexpected layout", f)
        return None
    return data


def load_calibration_record(
    persist_dir: str | os.PathLike[str] | None, collection: str, lm: Any
) -> dict[str, Any] | None:
    """The whole stored result for ``lm`` (or None)."""
    data = _read(calibration_path(persist_dir, collection))
    if data is None:
        return None
    rec = data["models"].get(model_key(lm))
    return rec if isinstance(rec, dict) else None


def load_calibration(
    persist_dir: str | os.PathLike[str] | None,
    collection: str,
    lm: Any,
    *,
    include_suggested: bool = False,
) -> dict[str, Any] | None:
    """The ``NestConfig`` overrides fitted for ``lm`` on ``collection``, or None when there is
    no calibration for this model (another model's entry is never used). With
    ``include_suggested`` the suggested ``span_threshold`` and ``relaxation`` are included."""
    rec = load_calibration_record(persist_dir, collection, lm)
    if rec is None:
        return None
    out = dict(rec.get("overrides") or {})
    if include_suggested:
        out.update(rec.get("suggested") or {})
    from nest_integrations.config import NestConfig

    try:
        NestConfig(**out)
    except (TypeError, ValueError) as exc:
        LOG.warning("ignoring invalid calibration for %s/%s: %s", persist_dir, collection, exc)
        return None
    return out

