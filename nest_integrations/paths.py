"""Where nest-integrations keeps its files: models, Chroma data and token keys.

``NEST_HOME`` (env) overrides the default, the user's cache dir. The default store (Chroma
plus key store side by side) is ``$NEST_HOME/store``.
"""

from __future__ import annotations

import os
from pathlib import Path


def nest_home() -> Path:
    env = os.environ.get("NEST_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("nest-integrations"))


class BrokenHomeError(OSError):
    """A folder nest-integrations needs is a dangling link or a file."""


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p path``, with an error naming the entry and the fix where a dangling symbolic
    link or a file stands in the way (``mkdir`` would only say ``File exists``)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except (FileExistsError, NotADirectoryError):
        pass
    for entry in (path, *path.parents):
        if entry.is_symlink() and not entry.exists():
            target = os.readlink(entry)
            raise BrokenHomeError(
                f"{entry} is a symbolic link to {target}, which does not exist: create "
                f"{target}, point the link at an existing folder, or remove the link (it is "
                "then made as a plain folder; a removed model cache is converted again)"
            ) from None
        if entry.exists() and not entry.is_dir():
            raise BrokenHomeError(
                f"{entry} is a file, but a folder is needed there: move the file away, or set "
                "NEST_HOME to another folder"
            ) from None
    raise BrokenHomeError(f"cannot create the folder {path}")


def models_dir() -> Path:
    return nest_home() / "models"


def default_persist_dir() -> Path:
    return nest_home() / "store"


def persist_root(persist_dir: str | os.PathLike[str] | None) -> Path:
    """The store folder: ``persist_dir``, else ``$NEST_HOME/store``."""
    return Path(persist_dir) if persist_dir is not None else default_persist_dir()


def chroma_dir(persist_dir: str | os.PathLike[str]) -> Path:
    """Chroma's PersistentClient folder inside a persist dir."""
    return Path(persist_dir) / "chroma"


def keys_dir(persist_dir: str | os.PathLike[str]) -> Path:
    """The token-key store folder inside a persist dir (next to the Chroma data)."""
    return Path(persist_dir) / "keys"
