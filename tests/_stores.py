"""Helpers for the session's sample store (the ``sample_store`` fixture in conftest.py)."""

from __future__ import annotations

from pathlib import Path


def copy_sample_store(sample_store: Path, dest: Path) -> Path:
    """A private copy of the session's sample store at ``dest`` (about 70 MB, a fraction of a
    second); the original stays untouched for the other tests."""
    import shutil

    shutil.copytree(sample_store, dest)
    return dest
