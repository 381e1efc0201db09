"""A toy tokenizer for citation tests without a model (``tests/core/test_citations.py``,
``tests/decoding/test_text_stream.py``)."""

from __future__ import annotations

import numpy as np


def toy_tokens(text: str) -> tuple[list[str], np.ndarray]:
    """``text`` as words with their leading space and every other character on its own, and
    the ``(n, 2)`` char range of each token (so ``"".join(tokens) == text``)."""
    toks, offs, i = [], [], 0
    while i < len(text):
        j = i + 1
        if text[i].isalnum() or text[i] == " ":
            while j < len(text) and text[j].isalnum():
                j += 1
        toks.append(text[i:j])
        offs.append((i, j))
        i = j
    return toks, np.array(offs, dtype=np.int64).reshape(-1, 2)
