"""LangChain integration: ``ChatNest``, ``NestLLM``, ``NestAttributor``, retrievers, embeddings,
citation helpers.

Needs ``langchain-core`` (a core dependency). ``nest_integrations.langchain`` re-exports this.
"""

from nest_integrations.integrations.langchain.attribution import NestAttributor
from nest_integrations.integrations.langchain.chat_models import ChatNest
from nest_integrations.integrations.langchain.embeddings import NestEmbeddings
from nest_integrations.integrations.langchain.llms import NestLLM
from nest_integrations.integrations.langchain.retrievers import (
    LangChainPassageRetriever,
    NestCitationRetriever,
    citations_to_documents,
)

__all__ = [
    "ChatNest",
    "LangChainPassageRetriever",
    "NestAttributor",
    "NestCitationRetriever",
    "NestEmbeddings",
    "NestLLM",
    "citations_to_documents",
]
