"""LlamaIndex integration: NEST as an LLM, a query engine, retrievers and an offline embedder.

Re-exports only. Short import path: ``nest_integrations.llama_index``.
"""

from __future__ import annotations

from nest_integrations.integrations.llama_index.embeddings import NestEmbedding
from nest_integrations.integrations.llama_index.llms import NestLLM, citation_block
from nest_integrations.integrations.llama_index.query_engine import NestQueryEngine
from nest_integrations.integrations.llama_index.retrievers import (
    LlamaIndexPassageRetriever,
    NestCitationRetriever,
    citation_nodes,
    node_to_passage,
)

__all__ = [
    "LlamaIndexPassageRetriever",
    "NestCitationRetriever",
    "NestEmbedding",
    "NestLLM",
    "NestQueryEngine",
    "citation_block",
    "citation_nodes",
    "node_to_passage",
]
