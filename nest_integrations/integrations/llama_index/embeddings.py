"""``NestEmbedding``: LlamaIndex ``BaseEmbedding`` over the embedded, offline MiniLM embedder.

LlamaIndex defaults to OpenAI embeddings; set this one instead so a ``VectorStoreIndex`` (in
memory or on a ``ChromaVectorStore``) is built and queried without any network. It shares the
process-wide model with ``NestEmbeddingFunction``, so vectors match the ones ``nest ingest``
wrote to Chroma.
"""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from nest_integrations.embedders.minilm import shared_embedder


class NestEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm), packaged and loaded on first use.

    Instantiate:
        .. code-block:: python

            from llama_index.core import Settings, VectorStoreIndex
            from nest_integrations.llama_index import NestEmbedding

            Settings.embed_model = NestEmbedding()   # nothing is loaded yet
            index = VectorStoreIndex.from_documents(docs)

    Embed:
        .. code-block:: python

            NestEmbedding().get_query_embedding("What is a list?")  # 384 floats
    """

    model_name: str = Field(default="all-MiniLM-L6-v2", description="Embedder name.")
    model_path: str | None = Field(
        default=None, description="A sentence-transformers folder; None = the packaged model."
    )
    embed_batch_size: int = Field(default=32, gt=0, le=2048)
    _embedder: Any = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "NestEmbedding"

    @property
    def embedder(self) -> Any:
        """The shared ``MiniLMEmbedder`` (its weights load on the first embedding)."""
        if self._embedder is None:
            self._embedder = shared_embedder(self.model_path)
        return self._embedder

    def _get_query_embedding(self, query: str) -> Embedding:
        return self.embedder.embed([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> Embedding:
        return self.embedder.embed([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.embedder.embed(texts).tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
