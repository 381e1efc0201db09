"""How much stage 1's top passage is about a prompt, on a scale that does not depend on the
corpus: the answer policy's relevance gate for raw text (``AnswerPolicy.completion_relevance``).

The raw cosine between a prompt and its top passage is not comparable across corpora: the
openings of the sample corpus's Wikipedia leads reach 0.88 against their own passage, those of
its Python documentation 0.74, and Wikipedia leads the corpus does not hold 0.38 against the
Wikipedia passage they retrieve but up to 0.6 (``benchmarks.completion_gate``). So the cosine is
divided by the cosine that the passage's own opening, cut to the prompt's length in words, has
against the passage: 1.0 means "as close to this passage as its own first words are", whatever
the corpus and the prompt's length.

    relevance(prompt, top) = cos(prompt, top) / cos(top's first n words, top),  n = words(prompt)

Pure but for the embedder, which is the store's own where the retriever exposes it (the one that
ranked stage 1; its stored vector of the passage is read, not recomputed), else the packaged
MiniLM.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def opening(text: str, n_words: int) -> str:
    """The first ``n_words`` whitespace-separated words of ``text`` (all of it if shorter)."""
    return " ".join(text.split()[: max(1, n_words)])


def relevance(embed: Any, prompt: str, passage_text: str, passage_vector: Any = None) -> float:
    """``cos(prompt, passage) / cos(opening(passage, words(prompt)), passage)`` under ``embed``
    (a function of a list of texts returning one vector per text; see the module docstring);
    ``passage_vector``: the passage's stored vector under the same embedder (else it is
    embedded here: a whole passage costs several times the two short texts). 0.0 for an empty
    prompt or passage; the plain cosine where the reference is not positive."""
    if not prompt.strip() or not passage_text.strip():
        return 0.0
    texts = [prompt, opening(passage_text, len(prompt.split()))]
    e = np.asarray(embed(texts), dtype=np.float64)
    vec = None if passage_vector is None else np.asarray(passage_vector, dtype=np.float64)
    if vec is None or vec.size != e.shape[1]:  # none stored, or another embedder's: embed it
        vec = np.asarray(embed([passage_text]), dtype=np.float64)
    e = np.vstack([e, vec.reshape(1, -1)])
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    cos, ref = float(e[0] @ e[2]), float(e[1] @ e[2])
    return cos / ref if ref > 1e-6 else cos


def stored_vector(retriever: Any, passage_id: str) -> Any:
    """The stored vector of ``passage_id`` where ``retriever`` (or a hybrid's dense side)
    keeps one (``stored_embeddings``), else None."""
    r, seen = retriever, 0
    while r is not None and seen < 4:
        get = getattr(r, "stored_embeddings", None)
        if callable(get):
            try:
                found = get([passage_id])
            except Exception:  # noqa: BLE001 - a store that cannot answer: embed the text
                found = None
            return found[0] if found else None
        r, seen = getattr(r, "dense", None), seen + 1
    return None


def embedder_of(retriever: Any) -> Any:
    """The embedder that ranks ``retriever``'s passages (Chroma's, an in-memory retriever's, a
    hybrid's dense side) when it has one with ``embed``, else None."""
    seen = 0
    r = retriever
    while r is not None and seen < 4:
        for found in (getattr(r, "embedder", None),
                      getattr(getattr(r, "embedding_function", None), "embedder", None)):
            if found is not None and callable(getattr(found, "embed", None)):
                return found
        r, seen = getattr(r, "dense", None), seen + 1
    return None


def retriever_relevance(retriever: Any, prompt: str, passage: Any) -> float:
    """``relevance`` of ``passage`` (stage 1's top) under ``retriever``'s own embedder, with the
    passage's stored vector when the store keeps one; under the packaged MiniLM
    (``embeddings.shared_embedder``), embedding the passage, when the retriever has no
    embedder of its own (a stored vector of another embedder is never mixed in)."""
    own = embedder_of(retriever)
    if own is None:
        from nest_integrations.embedders.minilm import shared_embedder

        return relevance(shared_embedder().embed, prompt, passage.text)
    return relevance(own.embed, prompt, passage.text, stored_vector(retriever, passage.id))


__all__ = ["embedder_of", "opening", "relevance", "retriever_relevance", "stored_vector"]
