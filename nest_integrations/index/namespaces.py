"""Names and manifests of key-store namespaces, and which codec a store is opened with.

A persist dir's key folder (``paths.keys_dir``) holds one namespace per (model fingerprint, key
source, codec): the eager ``DiskKeyStore``'s under ``ns/`` and the lazy cache's under ``lazy/``.
One store serves both backends (``admits``): a torch and a llama.cpp model of the same corpus
each get their namespace beside the other's.
This module names their folders, reads and writes the eager store's manifests (``store.json``
and ``ns/<namespace>/manifest.json``, see ``index.store``), and resolves the codec asked for
(a name, a ``KeyCodec`` or the v1 ``dtype=``) against the one a store was built with. No model,
sqlite or shard access here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from nest_integrations.index import _disk
from nest_integrations.index import codecs as _codecs
from nest_integrations.index.base import KeyStoreCorruptError, KeyStoreMismatchError
from nest_integrations.index.codecs import KeyCodec

FORMAT_VERSION = 2  # 2: codec-coded keys (``codec`` in the manifest); 1: raw fp16/fp32
DTYPES = ("float16", "float32")
_DTYPE_CODECS = {"float16": "fp16", "float32": "fp32"}  # the v1 ``dtype=`` spelling
RAW_CODECS = ("fp16", "fp32")  # these share the v1 namespace name
#: Fields every eager namespace manifest has.
NS_FIELDS = ("format_version", "fingerprint", "key_source", "key_dim", "dtype")

__all__ = [
    "DTYPES",
    "FORMAT_VERSION",
    "RAW_CODECS",
    "admits",
    "codec_id",
    "codec_tag",
    "describe_codec",
    "fingerprint_backend",
    "lazy_namespace_name",
    "list_namespaces",
    "manifest_codec_params",
    "mismatch_message",
    "namespace_name",
    "open_namespace",
    "open_root",
    "read_json",
    "read_store_manifest",
    "recorded_codec",
    "requested_codec",
    "resolve_codec",
]


def read_store_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The root manifest (``store.json``: the fingerprint and key source the store was built
    with), or None for a store that does not exist yet."""
    f = Path(path) / "store.json"
    if not f.exists():
        return None
    return read_json(f, ("format_version", "fingerprint", "key_source"))


def list_namespaces(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The manifest of every namespace in the store at ``path``."""
    root = Path(path) / "ns"
    if not root.is_dir():
        return []
    return [
        {**read_json(d / "manifest.json", NS_FIELDS), "namespace": d.name}
        for d in sorted(root.iterdir())
        if d.is_dir()
    ]



def namespace_name(fingerprint: str, key_source: str | int, tag: str | None = None) -> str:
    """The eager store's folder name of a namespace (readable, filesystem-safe and
    collision-free). The raw codecs (``tag`` None) keep the v1 name; int8/pq namespaces get
    their own (``tag`` from ``codec_tag``)."""
    parts: list[Any] = [fingerprint, key_source] + ([tag] if tag else [])
    return _folder_name(parts, f"{fingerprint}--{key_source}", f"--{tag}" if tag else "")


def lazy_namespace_name(fingerprint: str, key_source: Any, codec: str) -> str:
    """The lazy key cache's folder name of a namespace (one per codec name)."""
    return _folder_name([fingerprint, key_source, codec], f"{fingerprint}--{key_source}--{codec}")


def _folder_name(parts: list[Any], readable: str, tag: str = "") -> str:
    """``<slug of readable, 64 chars at most><tag>--<16 hex digits of sha256(parts)>``."""
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip("-.")
    return f"{slug[:64]}{tag}--{digest}"


def requested_codec(codec: str | KeyCodec | None, dtype: str | None) -> Any:
    """The codec asked for: a name, a KeyCodec, or None; ``dtype`` is the v1 alias."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is invalid: allowed one of {DTYPES}")
        alias = _DTYPE_CODECS[dtype]
        name = codec.name if isinstance(codec, KeyCodec) else codec
        if codec is not None and name != alias:
            raise ValueError(f"dtype={dtype!r} and codec={name!r} disagree; pass only codec")
        return codec if codec is not None else alias
    if codec is not None and not isinstance(codec, KeyCodec) and codec not in _codecs.CODECS:
        raise ValueError(f"key codec {codec!r} is unknown: allowed one of {_codecs.CODECS}")
    return codec


def resolve_codec(
    want: str | KeyCodec | dict[str, Any], key_dim: int, recorded: dict[str, Any] | None
) -> dict[str, Any]:
    """Codec params (``KeyCodec.params()``) for ``want``: a bare name takes the recorded
    options when the recorded codec has that name, else the codec's defaults."""
    if isinstance(want, dict):
        return {**want, "key_dim": key_dim}
    if isinstance(want, KeyCodec):
        if want.key_dim != key_dim:
            raise KeyStoreMismatchError(f"codec {want!r} codes d={want.key_dim}, keys have d={key_dim}")
        return want.params()
    if recorded is not None and recorded["codec"] == want:
        return {**recorded, "key_dim": key_dim}
    return _codecs.make_codec(want, key_dim).params()


def recorded_codec(path: Path, fingerprint: str, key_source: str | int) -> dict[str, Any] | None:
    """The codec params the store at ``path`` was built with: ``store.json``'s ``key_codec``;
    for a v1 store, its namespace's dtype (fp16/fp32); None for a new store."""
    built = read_store_manifest(path)
    if built is None:
        return None
    if isinstance(built.get("key_codec"), dict):
        return dict(built["key_codec"])
    f = path / "ns" / namespace_name(fingerprint, key_source) / "manifest.json"
    if f.exists():
        return manifest_codec_params(read_json(f, NS_FIELDS))
    return {"codec": "fp16"}


def manifest_codec_params(m: dict[str, Any]) -> dict[str, Any]:
    """Codec params of a namespace manifest (v1: from its dtype)."""
    if isinstance(m.get("codec"), dict):
        return {**m["codec"], "key_dim": m["key_dim"]}
    if m.get("dtype") not in DTYPES:
        raise KeyStoreCorruptError(f"key store manifest has an unknown dtype: {m}")
    return {"codec": _DTYPE_CODECS[m["dtype"]], "key_dim": m["key_dim"]}


def codec_id(params: dict[str, Any]) -> dict[str, Any]:
    """Params that identify a codec independently of key_dim."""
    return {k: v for k, v in params.items() if k != "key_dim"}


def codec_tag(params: dict[str, Any]) -> str | None:
    """None for the raw codecs (v1 namespace name); else e.g. ``int8`` or ``pq-m72``."""
    name = params["codec"]
    if name in RAW_CODECS:
        return None
    default = _codecs.make_codec(name, params["key_dim"]).params()
    extra = {k: v for k, v in params.items() if default.get(k) != v}
    if name == "pq":
        extra.pop("m", None)
        return f"pq-m{params['m']}" + (f"-{_short(extra)}" if extra else "")
    return name + (f"-{_short(extra)}" if extra else "")


def _short(d: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def describe_codec(params: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in codec_id(params).items() if k != "codec")
    return f"{params['codec']}" + (f" ({extra})" if extra else "")


def fingerprint_backend(fingerprint: str) -> str:
    """The backend a model fingerprint names: ``"llama.cpp"`` for ``"<name>@llama.cpp-..."``
    (``lm.llama_cpp``), else ``"torch"``."""
    return "llama.cpp" if "@llama.cpp-" in str(fingerprint) else "torch"


def admits(path: str | os.PathLike[str], built: dict[str, Any], lm: Any) -> bool:
    """Whether ``lm`` may read and fill the store at ``path`` (``built``: its ``store.json``).

    One store serves both backends: keys live per (model fingerprint, key source) namespace, so
    a model of the backend that has no namespace here yet gets its own (filled on first use, or
    by ``nest ingest --backend ...``, which adds keys without re-adding passages). A namespace
    that exists already is its model's. Another model or key source *of a backend present* is
    refused: most likely a wrong ``--model`` or preset, whose keys would be encoded silently."""
    ours = (lm.fingerprint, lm.key_source)
    if ours == (built["fingerprint"], built["key_source"]):
        return True  # the store's own model: its namespace is not even listed
    present = [(built["fingerprint"], built["key_source"])] + [
        (n["fingerprint"], n["key_source"]) for n in list_namespaces(path)
    ]
    if ours in present:
        return True
    backend = fingerprint_backend(lm.fingerprint)
    return all(fingerprint_backend(f) != backend for f, _ in present)


def mismatch_message(path: str | os.PathLike[str], built: dict[str, Any], lm: Any) -> str:
    """Why ``admits`` refused ``lm``: the namespaces present and the fixes."""
    backend = fingerprint_backend(lm.fingerprint)
    present = sorted({(n["fingerprint"], n["key_source"]) for n in list_namespaces(path)}
                     | {(built["fingerprint"], built["key_source"])})
    listed = "; ".join(f"{f} (key source {k!r}, {fingerprint_backend(f)} backend)"
                       for f, k in present)
    return (
        f"key store at {path} was built by model {built['fingerprint']} (key source "
        f"{built['key_source']!r}) and holds keys of: {listed}. This engine uses model "
        f"{lm.fingerprint} (key source {lm.key_source!r}), another model or key source of the "
        f"{backend} backend. Use the model and key source it was ingested with, or re-run "
        "`nest ingest` with this model into a different persist dir."
    )


def open_root(
    path: Path, fingerprint: str, key_source: str | int, codec: dict[str, Any],
    model_dtype: str | None = None,
) -> dict[str, Any]:
    """Read ``store.json``, creating it for a new store (this namespace is then 'built with',
    and its codec is the store's ``key_codec``; ``model_dtype``, e.g. ``"fp32"``, is the dtype
    the model that encodes its first keys runs in, recorded when known)."""
    built = read_store_manifest(path)
    if built is not None:
        return built
    ns_root = path / "ns"
    if ns_root.is_dir() and any(ns_root.iterdir()):
        raise KeyStoreCorruptError(
            f"key store at {path} has data but no store.json manifest; delete {path} and "
            "re-run `nest ingest`, or pass a different persist dir"
        )
    # A raw-codec store stays readable by v1 code (which ignores ``key_codec``).
    version = 1 if codec["codec"] in RAW_CODECS else FORMAT_VERSION
    manifest = {"format_version": version, "fingerprint": fingerprint}
    _disk.write_json_atomic(
        path / "store.json",
        {**manifest, "key_source": key_source, "key_codec": codec_id(codec),
         **({"model_dtype": model_dtype} if model_dtype else {})},
        exclusive=True,
    )
    return read_store_manifest(path) or manifest


def open_namespace(
    ns: Path,
    fingerprint: str,
    key_source: str | int,
    key_dim: int,
    codec: dict[str, Any],
    explicit: bool,
) -> dict[str, Any]:
    """Read or create a namespace manifest; refuse one that disagrees on key_dim or (when the
    codec was asked for explicitly) on the codec."""
    f = ns / "manifest.json"
    if not f.exists():
        if (ns / "index.sqlite").exists():
            raise KeyStoreCorruptError(
                f"key store namespace {ns} has an index but no manifest.json; delete {ns} and "
                "re-run `nest ingest`"
            )
        ns.mkdir(parents=True, exist_ok=True)
        decoded = "float16" if codec["codec"] == "fp16" else "float32"
        _disk.write_json_atomic(f, {
            "format_version": FORMAT_VERSION, "fingerprint": fingerprint,
            "key_source": key_source, "key_dim": key_dim, "dtype": decoded,
            "codec": codec_id(codec),
        }, exclusive=True)  # fmt: skip
    m = read_json(f, NS_FIELDS)
    if (m["fingerprint"], m["key_source"]) != (fingerprint, key_source):
        raise KeyStoreCorruptError(f"key store manifest {f} does not describe its folder: {m}")
    theirs = manifest_codec_params(m)
    if m["key_dim"] != key_dim or (explicit and codec_id(theirs) != codec_id(codec)):
        raise KeyStoreMismatchError(
            f"key store namespace {ns} holds key_dim={m['key_dim']} {describe_codec(theirs)} keys "
            f"(dtype {m['dtype']}) of {fingerprint} (key source {key_source!r}) but was opened "
            f"with key_dim={key_dim} codec {describe_codec(codec)}; use the same model and codec, "
            "or a different persist dir"
        )
    return m


def read_json(f: Path, required: Sequence[str]) -> dict[str, Any]:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KeyStoreCorruptError(f"key store manifest {f} is unreadable: {exc}") from exc
    missing = [k for k in required if not isinstance(data, dict) or k not in data]
    if missing:
        raise KeyStoreCorruptError(f"key store manifest {f} lacks {missing}; it is corrupt")
    if not isinstance(data["format_version"], int) or data["format_version"] > FORMAT_VERSION:
        raise KeyStoreCorruptError(
            f"key store manifest {f} has format_version {data['format_version']}; this version "
            f"of nest-integrations reads up to {FORMAT_VERSION}: upgrade the package"
        )
    return data
