"""Reading JSON Lines input files (tasks, prompt files): one JSON value per non-blank line, and
an error that names the file and line of the first one that does not parse; and the
format/version check of the JSON files the package writes (KNN-SSD profiles, cost curves)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator


def jsonl_values(path: str | os.PathLike[str], lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of ``lines``, the text of ``path``
    (named in errors). Raises ValueError ``"{path}:{n}: not JSON (...)"`` at the first line
    that is not JSON."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        yield n, value


def check_format(data: Any, fmt: str, version: int, where: str, kind: str,
                 error: type[ValueError] = ValueError) -> None:  # fmt: skip
    """Raise ``error`` unless ``data`` is a dict with ``"format": fmt`` and ``"version":
    version`` (``kind`` names the file type in the message, e.g. "a KNN-SSD profile")."""
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise error(f"{where} is not {kind} (no \"format\": {fmt!r})")
    if data.get("version") != version:
        raise error(f"{where} has version {data.get('version')!r}; this code reads "
                    f"version {version}")
