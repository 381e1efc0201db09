"""The one place optional dependencies are imported with an install hint."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str | None = None, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise an ImportError that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only without the package
        pkg = package or module.split(".")[0].replace("_", "-")
        hint = f"pip install 'nest-integrations[{extra}]'" if extra else f"pip install {pkg}"
        raise ImportError(f"{module} is required for this feature: {hint}") from exc
