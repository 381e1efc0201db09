"""Benchmark stores built once: ``ingest_once`` writes a collection's sources and ingests them
into a Chroma store unless a marker says it was done (``benchmarks.robust``,
``benchmarks.answers``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

LOG = logging.getLogger("benchmarks.stores")


def ingest_once(root: Path, work: Path, collection: str, write: Callable[[Path], list[Path]],
                lm: Any, keys: bool = False) -> bool:
    """Ingest ``collection`` under ``root`` once (``root/.<collection>.done`` marks it):
    ``write(folder)`` writes the sources under ``work/src/<collection>`` and returns the paths
    to ingest; ``keys``: with token keys (as ``nest ingest --sample``). Returns whether it
    ingested now."""
    from nest_integrations import assembly
    from nest_integrations.ingest.pipeline import IngestPipeline

    marker = root / f".{collection}.done"
    if marker.exists():
        return False
    src = work / "src" / collection
    src.mkdir(parents=True, exist_ok=True)
    sources = write(src)
    store = assembly.open_store(collection, root)
    report = IngestPipeline(store, lm, with_keys=keys).ingest(sources, progress=True)
    LOG.info("%s: %s", collection, report)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return True
