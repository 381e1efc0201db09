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
