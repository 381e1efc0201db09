"""Short import path for the LangChain integration (``nest_integrations.integrations.langchain``).

Usage::

    from nest_integrations.langchain import ChatNest, NestEmbeddings, citations_to_documents
"""

from nest_integrations.integrations.langchain import (
    ChatNest,
    LangChainPassageRetriever,
    NestCitationRetriever,
    NestEmbeddings,
    NestLLM,
    citations_to_documents,
)

__all__ = [
    "ChatNest",
    "LangChainPassageRetriever",
    "NestCitationRetriever",
    "NestEmbeddings",
    "NestLLM",
    "citations_to_documents",
]
