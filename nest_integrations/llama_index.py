"""Short import path for the LlamaIndex integration (``integrations.llama_index``).

Usage::

    from nest_integrations.llama_index import NestEmbedding, NestLLM, NestQueryEngine
"""

from __future__ import annotations

from nest_integrations.integrations.llama_index import (
    LlamaIndexPassageRetriever,
    NestCitationRetriever,
    NestEmbedding,
    NestLLM,
    NestQueryEngine,
    citation_block,
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
