"""Reading JSON Lines input files (tasks, prompt files): one JSON value per non-blank line, and
an error that names the file and line of the first one that does not parse."""

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
