"""The embedder port of the ``"embedding"`` scorer: any object with ``embed_documents`` (or
``embed``); the package's MiniLM by default."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Anything with ``embed_documents(texts) -> list[list[float]]`` (LangChain's
    ``Embeddings``, ``MiniLMEmbedder``); ``embed(texts) -> ndarray`` is used when present."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...


def default_embedder() -> Any:
    """The package's registered MiniLM embedder (the one Chroma collections use), shared."""
    from nest_integrations.embedders.minilm import shared_embedder

    return shared_embedder()


def embed(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """L2-normalised ``(len(texts), d)`` embeddings of ``texts``."""
    if callable(getattr(embedder, "embed", None)):
        m = np.asarray(embedder.embed(list(texts)), dtype=np.float32)
    elif callable(getattr(embedder, "embed_documents", None)):
        m = np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)
    else:
        raise TypeError(
            f"embedder {type(embedder).__name__} has neither embed(texts) nor "
            "embed_documents(texts)"
        )
    m = m.reshape(len(texts), -1)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
