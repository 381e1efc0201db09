"""Calibration runs end to end: split a corpus and fit (``calibrate_passages``), or calibrate a
``nest ingest`` collection and store the result (``calibrate_collection``)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from nest_integrations import paths
from nest_integrations.calibrate.fitting import fit_calibration
from nest_integrations.calibrate.splitting import split_corpus
from nest_integrations.calibration_store import save_calibration
from nest_integrations.index.store import DiskKeyStore

__all__ = ["calibrate_collection", "calibrate_passages"]


def calibrate_passages(
    lm: Any,
    key_store: Any,
    retriever: Any,
    passages: Sequence[Any],
    *,
    n_texts: int = 24,
    prefix_tokens: int = 32,
    score_tokens: int = 64,
    n_passages: int = 40,
    n_neighbors: int = 1024,
    seed: int = 0,
    default: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Split ``passages`` (the whole corpus behind ``retriever``) and fit: held-out documents
    are dropped from every retrieval (over-fetching to keep k passages)."""
    in_texts, out_texts, held = split_corpus(
        passages, lm, n_texts=n_texts, prefix_tokens=prefix_tokens, score_tokens=score_tokens,
        seed=seed,
    )
    n_held = sum(1 for p in passages if (p.doc_id or p.id) in held)

    def retrieve(query: str, k: int) -> list[Any]:
        got = retriever.retrieve(query, k + n_held)
        return [p for p in got if (p.doc_id or p.id) not in held][:k]

    result = fit_calibration(
        lm, key_store, retrieve, in_texts, out_texts, n_passages=n_passages,
        n_neighbors=n_neighbors, default=default, progress=progress,
    )
    result["split"] = {"seed": seed, "held_out_documents": len(held),
                       "documents": len({p.doc_id or p.id for p in passages}),
                       "prefix_tokens": prefix_tokens, "score_tokens": score_tokens}
    return result


def calibrate_collection(
    persist_dir: str | os.PathLike[str] | None = None,
    collection: str = "nest",
    lm: Any = None,
    *,
    n_texts: int = 24,
    n_passages: int = 40,
    seed: int = 0,
    save: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Calibrate the embedded store's ``collection`` (``nest ingest`` output) for ``lm``
    (default: the embedded model) and store the result unless ``save`` is False."""
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    root = paths.persist_root(persist_dir)
    if not paths.chroma_dir(root).is_dir():
        raise FileNotFoundError(
            f"no store at {root}; create one with `nest ingest PATH... --collection {collection}`"
        )
    store = ChromaPassageStore.from_persist_dir(root, collection)
    store.count()  # a missing collection fails here, naming the existing ones
    if lm is None:
        from nest_integrations.assembly import shared_model

        lm = shared_model()
    passages = list(store.iter_passages())
    keys = DiskKeyStore.open(paths.keys_dir(root), lm, allow_new_namespace=True)
    try:
        result = calibrate_passages(
            lm, keys, store, passages, n_texts=n_texts, n_passages=n_passages, seed=seed,
            progress=progress,
        )
    finally:
        keys.close()
    result["collection"] = collection
    if save:
        result["path"] = str(save_calibration(root, collection, lm, result))
    return result
