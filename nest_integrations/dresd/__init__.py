"""DReSD (Dense Retrieval for Speculative Decoding): a corpus-wide datastore of 64-d token keys
drafts continuations that the LM verifies exactly (lossless). See ``datastore`` for the layout
and key convention, ``drafters/dresd.py`` for drafting, ``cli/dresd.py`` for ``nest dresd``.

Usage::

    from nest_integrations.dresd import build_datastore, DresdDatastore, PassageSource

    ds = build_datastore(lm, PassageSource(passages, lm), "store/dresd/mydocs", progress=True)
    engine.generate(prompt, decoding="dresd", drafter_options={"datastore": "store/dresd/mydocs"})
"""

from nest_integrations.dresd.datastore import (
    DatastoreError,
    DatastoreMismatchError,
    DresdDatastore,
    PassageSource,
    SourceBatch,
    build_datastore,
    default_datastore_path,
)
from nest_integrations.dresd.responses import PromptSource, read_prompts

__all__ = [
    "DatastoreError",
    "DatastoreMismatchError",
    "DresdDatastore",
    "PassageSource",
    "PromptSource",
    "SourceBatch",
    "build_datastore",
    "default_datastore_path",
    "read_prompts",
]
