"""Every default of the package, in one place (no imports: every layer may read it).

``nest_integrations.assembly`` re-exports these and is where they are applied: it resolves an
``EngineSpec`` (collection, preset, decoding) and supplies the parts (model, key store) that
``NestEngine`` requires. The engine reads only ``DEFAULT_MAX_NEW_TOKENS`` (the budget of a call
that names none); the server, the CLIs and both framework adapters read the rest.
"""

#: Chroma collection of ``nest ingest`` / ``nest ask`` / ``from_defaults`` (and of the framework
#: adapters when they are given a persist dir or Chroma URL without a collection).
DEFAULT_COLLECTION = "nest"
#: New tokens per generation when no budget is given (engine, CLI, server, both adapters).
DEFAULT_MAX_NEW_TOKENS = 256
#: The decoding method (``nest_integrations.drafters.METHODS``) when none is given: None, the
#: preset's answer policy decides (``grounded``: ``rag-copy``; ``paper``: ``nest``).
DEFAULT_DECODING = None
#: The preset (a ``NestConfig`` and an ``AnswerPolicy``) when none is given (a bare
#: ``NestConfig()`` is still ``paper``'s).
DEFAULT_PRESET = "grounded"

__all__ = ["DEFAULT_COLLECTION", "DEFAULT_DECODING", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_PRESET"]
