"""Evaluation corpora as NEST passages: Wikipedia leads (corpus B, read by
``nest_integrations.wikipedia``) or any corpus folder.

The datastore is the train split of the leads (``split_of``: data.md's ``sha1(title) % 100``).

Usage::

    leads, provenance = load_wiki_leads()
    train = [l for l in leads.values() if split_of(l.title) == "train"]
    passages = lead_passages(train)            # <= 200 SmolLM2 tokens each, doc_id = title
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from nest_integrations.types import Passage
from nest_integrations.wikipedia import (
    WHEEL_SHA256,
    WikiLead,
    load_wiki_leads,
    sha1_key,
    split_of,
)

LOG = logging.getLogger(__name__)


def lead_passages(
    leads: Sequence[WikiLead], token_count: Any = None, progress: bool = False
) -> list[Passage]:
    """NEST passages (<= 200 tokens, exact char offsets) of ``leads``; ``doc_id`` is the title."""
    from nest_integrations.ingest import default_token_counter, load_documents, split_documents

    docs, issues = load_documents(
        texts=[lead.extract for lead in leads],
        ids=[lead.title for lead in leads],
        metadatas=[{"title": lead.title, "topic": lead.topic} for lead in leads],
    )
    for issue in issues:
        LOG.warning("corpus: %s", issue)
    return split_documents(docs, token_count or default_token_counter(), progress=progress)


def folder_passages(
    paths: Sequence[str | os.PathLike[str]], token_count: Any = None, progress: bool = False
) -> list[Passage]:
    """NEST passages of a corpus folder or files (anything ``nest ingest`` reads)."""
    from nest_integrations.ingest import default_token_counter, load_documents, split_documents

    docs, issues = load_documents(list(paths), progress=progress)
    for issue in issues:
        LOG.warning("corpus: %s", issue)
    if not docs:
        raise ValueError(f"no documents found in {[str(p) for p in paths]}")
    return split_documents(docs, token_count or default_token_counter(), progress=progress)


__all__ = [
    "WHEEL_SHA256",
    "WikiLead",
    "folder_passages",
    "lead_passages",
    "load_wiki_leads",
    "sha1_key",
    "split_of",
]
