"""Short import path for the LlamaIndex integration (``integrations.llama_index``).

Usage::

    from nest_integrations.llama_index import NestEmbedding, NestLLM, NestQueryEngine
"""

from __future__ import annotations

from nest_integrations.integrations.llama_index import *  # noqa: F403  (the same public names)
from nest_integrations.integrations.llama_index import __all__  # noqa: F401
