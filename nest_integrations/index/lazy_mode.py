"""The key mode of a persist dir (eager or lazy) and the lazy key cache's codec.

Mode is recorded per persist dir in ``<persist_dir>/keys/lazy.json``
(``{"keys": "lazy", "max_bytes": ..., "codec": ...}``); without that file the dir is eager (the
append-only ``DiskKeyStore``). ``assembly.open_key_store`` returns a ``LazyKeyCache``
(``index.lazy_cache``) for a lazy dir, so ``nest ask``, ``NestEngine.from_defaults``, the
LangChain/LlamaIndex adapters and ``nest serve`` use it unchanged.

Switching modes (``nest ingest --keys ...``):

- eager -> lazy: the eager ``DiskKeyStore`` of the same model stays as a **read-through source**:
  passages it holds are read from it (never evicted, not counted in the cap); new ones are encoded
  into the cache only.
- lazy -> eager (explicit ``--keys eager``): allowed; ``lazy.json`` is removed, the ingested
  passages are encoded into the eager store, and the cache folder is left in place (unused; its
  path and size are logged; delete it to reclaim the space).
- no ``--keys``: the recorded mode is kept (``--key-cache-size`` alone changes a lazy dir's cap).

Codec wiring: a cache namespace's ``manifest.json`` names its codec; a trained codec (int8, pq)
gets its tables at ingest (``train_lazy_codec``, on a sample of passages), and ``open_codec``
loads and checks them when the cache opens.

Example::

    configure_lazy(keys_dir(persist_dir), max_bytes=parse_size("2GB"))
    read_mode(keys_dir(persist_dir))["max_bytes"]     # 2000000000
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from nest_integrations.index import _disk
from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.codecs import CODECS, DEFAULT_CODEC, KeyCodec, load_codec, make_codec
from nest_integrations.index.keys import encode_keys
from nest_integrations.index.namespaces import lazy_namespace_name
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

#: Format of ``lazy.json``, of the cache manifests and of the cache's ``.key`` files.
FORMAT_VERSION = 1
MODE_FILE = "lazy.json"
LAZY_DIR = "lazy"
#: Cap of ``--keys lazy`` without ``--key-cache-size``: about 1.7M tokens of fp16 d=576 keys.
DEFAULT_MAX_BYTES = 2 * 10**9
#: Passages encoded at ingest to train an int8/pq codec for the lazy cache.
CODEC_SAMPLE_PASSAGES = 300
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

__all__ = [
    "CODEC_SAMPLE_PASSAGES",
    "DEFAULT_MAX_BYTES",
    "LAZY_DIR",
    "MODE_FILE",
    "configure_lazy",
    "open_codec",
    "parse_size",
    "read_mode",
    "set_eager_mode",
    "train_lazy_codec",
    "write_manifest",
]


# --------------------------------------------------------------------------------- the mode


def parse_size(text: str | int) -> int:
    """Bytes of a size like ``2GB``, ``500MB``, ``1.5G``, ``64KiB`` or ``100000`` (decimal
    units; ``KiB``/``MiB``/``GiB``/``TiB`` are binary). Raises ValueError naming the rule."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ValueError(
                f"size {text!r} is invalid: allowed a number with an optional unit "
                "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
                "e.g. 2GB or 500MB"
            )
        unit = (m.group(2) or "").lower().removesuffix("b")
        if unit == "i":
            raise ValueError(f"size {text!r} is invalid: unit {m.group(2)!r} is unknown")
        base = 1024 ** ("kmgt".index(unit[0]) + 1) if unit.endswith("i") else _UNITS[unit]
        n = int(float(m.group(1)) * base)
    if n < 1:
        raise ValueError(f"size {text!r} is invalid: the key cache needs at least 1 byte")
    return n


def read_mode(keys_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The lazy-mode record of a key-store folder, or None when the folder is eager."""
    f = Path(keys_dir) / MODE_FILE
    if not f.exists():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"lazy key mode file {f} is unreadable ({exc}); delete it and re-run "
                         "`nest ingest --keys lazy`") from exc
    if not isinstance(data, dict) or data.get("keys") != "lazy" or "max_bytes" not in data:
        raise ValueError(f"lazy key mode file {f} is not a lazy-mode record: {data!r}")
    data.setdefault("codec", DEFAULT_CODEC)
    return data


def configure_lazy(
    keys_dir: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    codec: str | None = None,
) -> dict[str, Any]:
    """Record lazy mode for ``keys_dir`` (``None`` keeps the recorded cap / codec, else the
    defaults). Returns the record. Changing the codec starts a new cache namespace; the old one's
    folder is left (logged)."""
    old = read_mode(keys_dir) or {}
    codec = codec or old.get("codec") or DEFAULT_CODEC
    if codec not in CODECS:
        raise ValueError(f"key codec {codec!r} is unknown: allowed one of {CODECS}")
    max_bytes = parse_size(max_bytes) if max_bytes is not None else int(
        old.get("max_bytes", DEFAULT_MAX_BYTES)
    )
    if old and old.get("codec") != codec:
        LOG.warning("lazy key cache codec changes %s -> %s: a new cache starts; the old one under "
                    "%s can be deleted", old.get("codec"), codec, Path(keys_dir) / LAZY_DIR)
    record = {"format_version": FORMAT_VERSION, "keys": "lazy", "max_bytes": max_bytes,
              "codec": codec}
    _disk.write_json_atomic(Path(keys_dir) / MODE_FILE, record)
    return record


def set_eager_mode(keys_dir: str | os.PathLike[str]) -> bool:
    """Switch ``keys_dir`` back to eager keys (removes ``lazy.json``). Returns whether it was
    lazy. The cache folder is left in place: unused from now on."""
    f = Path(keys_dir) / MODE_FILE
    if not f.exists():
        return False
    f.unlink()
    lazy = Path(keys_dir) / LAZY_DIR
    size = sum(p.stat().st_size for p in lazy.rglob("*") if p.is_file()) if lazy.is_dir() else 0
    LOG.warning("keys of %s are eager again; the lazy key cache %s (%.1f MB) is no longer used "
                "and can be deleted", keys_dir, lazy, size / 1e6)
    return True


# --------------------------------------------------------------------------------- codec wiring


@runtime_checkable
class _Keyed(Protocol):
    """A loaded model (``train_lazy_codec`` may get a function that loads one instead)."""

    fingerprint: str
    key_source: str | int
    key_dim: int


def train_lazy_codec(
    keys_dir: str | os.PathLike[str],
    lm: Any,
    codec: str,
    sample: Sequence[Passage],
    *,
    seed: int = 0,
) -> KeyCodec:
    """Train the lazy cache's ``int8``/``pq`` codec for ``lm`` (a model, or a function that
    loads it, called only for a trained codec) on up to
    ``CODEC_SAMPLE_PASSAGES`` passages of ``sample`` (encoded now) and save its tables in the
    cache namespace. Tables already saved there are kept (codes in the cache depend on them).
    Raw codecs (fp16, fp32) need nothing and are returned as they are."""
    if make_codec(codec, 1).needs_training is False:
        return make_codec(codec, lm.key_dim if isinstance(lm, _Keyed) else 1)
    if callable(lm) and not isinstance(lm, _Keyed):
        lm = lm()  # a loader: the model is loaded only for a trained codec
    ns = Path(keys_dir) / LAZY_DIR / lazy_namespace_name(lm.fingerprint, lm.key_source, codec)
    made = make_codec(codec, lm.key_dim)
    if (ns / "manifest.json").exists():
        return open_codec(ns, lm.fingerprint, lm.key_source, lm.key_dim, codec)
    if not sample:
        raise ValueError(f"the {codec} key codec must be trained on passages: ingest some")
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(sample), size=min(len(sample), CODEC_SAMPLE_PASSAGES), replace=False)
    chosen = [sample[i] for i in sorted(idx)]
    LOG.info("training the %s key codec on the keys of %d passages", codec, len(chosen))
    keys = [k.keys for i in range(0, len(chosen), 16)
            for k in encode_keys(lm, chosen[i : i + 16], np.dtype(np.float32)) if len(k)]
    made.train(np.concatenate(keys).astype(np.float32))
    ns.mkdir(parents=True, exist_ok=True)
    made.save(ns)
    write_manifest(ns, lm.fingerprint, lm.key_source, lm.key_dim, made)
    return made


def open_codec(ns: Path, fingerprint: str, key_source: Any, key_dim: int, codec: str) -> KeyCodec:
    """The namespace's codec: created for raw codecs, loaded (and checked) for trained ones."""
    f = ns / "manifest.json"
    if not f.exists():
        made = make_codec(codec, key_dim)
        if made.needs_training:
            raise ValueError(
                f"the lazy key cache's {codec} codec has no trained tables for model "
                f"{fingerprint}; run `nest ingest --keys lazy --key-codec {codec}` with this "
                "model first (it trains the codec on a sample of passages)"
            )
        ns.mkdir(parents=True, exist_ok=True)
        write_manifest(ns, fingerprint, key_source, key_dim, made)
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"lazy key cache manifest {f} is unreadable: {exc}") from exc
    if m.get("key_dim") != key_dim or m.get("codec", {}).get("codec") != codec:
        raise KeyStoreMismatchError(
            f"lazy key cache {ns} holds key_dim={m.get('key_dim')} {m.get('codec')} keys, but was "
            f"opened with key_dim={key_dim} codec {codec!r}"
        )
    loaded = load_codec(m["codec"], ns)
    if loaded.fingerprint() != m.get("codec_fingerprint"):
        raise ValueError(f"lazy key cache {ns}: codec tables do not match its manifest "
                         "(codec.npz changed); delete the folder to start the cache again")
    return loaded


def write_manifest(ns: Path, fingerprint: str, key_source: Any, key_dim: int,
                   codec: KeyCodec) -> None:
    """Create a cache namespace's ``manifest.json`` (an existing one is kept)."""
    _disk.write_json_atomic(ns / "manifest.json", {
        "format_version": FORMAT_VERSION, "fingerprint": fingerprint, "key_source": key_source,
        "key_dim": key_dim, "codec": codec.params(), "codec_fingerprint": codec.fingerprint(),
    }, exclusive=True)  # fmt: skip
