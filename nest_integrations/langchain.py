"""Short import path for the LangChain integration (``nest_integrations.integrations.langchain``).

Usage::

    from nest_integrations.langchain import ChatNest, NestEmbeddings, citations_to_documents
"""

from nest_integrations.integrations.langchain import *  # noqa: F403  (the same public names)
from nest_integrations.integrations.langchain import __all__  # noqa: F401
