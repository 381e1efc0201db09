"""DReSD (Dense Retrieval for Speculative Decoding): a corpus-wide datastore of 64-d token keys
drafts continuations that the LM verifies exactly (lossless). This package is the datastore
(``datastore``: layout, key convention, resumable build from passages; ``pca``; ``index``), read
by ``drafters/dresd.py``; the response cache of a prompts file, which decodes, is
``builders/dresd_responses.py``; ``nest dresd`` is ``cli/dresd.py``.

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

__all__ = [
    "DatastoreError",
    "DatastoreMismatchError",
    "DresdDatastore",
    "PassageSource",
    "SourceBatch",
    "build_datastore",
    "default_datastore_path",
]
