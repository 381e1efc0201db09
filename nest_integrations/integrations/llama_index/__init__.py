"""LlamaIndex integration: NEST as an LLM, a query engine, retrievers and an offline embedder;
attribution of any LLM's answers (``attribute_response``, ``NestAttributionQueryEngine``).

Re-exports only. Short import path: ``nest_integrations.llama_index``.
"""

from __future__ import annotations

from nest_integrations.integrations.llama_index.attribution import (
    NestAttributionQueryEngine,
    attribute_response,
)
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
    "NestAttributionQueryEngine",
    "NestCitationRetriever",
    "NestEmbedding",
    "NestLLM",
    "NestQueryEngine",
    "attribute_response",
    "citation_block",
    "citation_nodes",
    "node_to_passage",
]
