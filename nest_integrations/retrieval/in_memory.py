"""A dependency-free in-memory passage retriever (tests, cookbook, small corpora).

Ranks by cosine similarity of an embedder when one is given (anything with
``embed_documents(texts)`` and ``embed_query(text)``, e.g. ``MiniLMEmbedder`` or a LangChain
``Embeddings``), otherwise by a small BM25 over lower-cased word tokens (only passages sharing
at least one word with the query are returned).

Usage::

    retriever = InMemoryRetriever(["Paris is the capital of France.", "Rome is in Italy."])
    retriever.retrieve("capital of France", k=1)[0].text
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from typing import Any, Sequence

import numpy as np

from nest_integrations.types import Passage

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (the BM25-lite vocabulary)."""
    return _WORD.findall(text.lower())


def as_passage(item: Passage | str) -> Passage:
    """A ``Passage`` as is; a string becomes a whole-document passage with a content id."""
    if isinstance(item, Passage):
        return item
    pid = hashlib.sha1(item.encode("utf-8")).hexdigest()[:32]
    return Passage(pid, item, doc_id=pid, char_start=0, char_end=len(item))


class InMemoryRetriever:
    """``PassageRetriever`` over a fixed list of passages.

    Args:
        passages: ``Passage`` objects, or strings (each becomes one passage).
        embedder: optional; ranks by cosine similarity of its embeddings instead of BM25.
        k1, b: BM25 parameters (used without an embedder).
    """

    def __init__(
        self,
        passages: Sequence[Passage | str],
        embedder: Any = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        self.passages = [as_passage(p) for p in passages]
        self.embedder = embedder
        self.k1, self.b = k1, b
        self._matrix: np.ndarray | None = None  # (n, dim) unit rows, built on first query
        self._tf = [Counter(words(p.text)) for p in self.passages]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = (sum(self._len) / len(self._len)) if self._len else 0.0
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(self.passages)
        self._idf = {w: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def retrieve(self, query: str, k: int) -> list[Passage]:
        """Top ``k`` passages, best first, ``score`` set (cosine or BM25)."""
        if k <= 0 or not self.passages:
            return []
        scores = self._dense(query) if self.embedder is not None else self._bm25(query)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep order
        if self.embedder is None:
            order = [i for i in order if scores[i] > 0]
        return [_with_score(self.passages[i], float(scores[i])) for i in order[:k]]

    def passages_titled(self, titles: Sequence[str], limit: int = 32) -> list[Passage]:
        """Up to ``limit`` passages whose metadata ``title`` is one of ``titles`` (compared
        case-folded; the answer policy's title match)."""
        from nest_integrations.retrieval.titles import normalize

        want = {normalize(t) for t in titles}
        out = [p for p in self.passages if normalize(p.metadata.get("title") or "") in want]
        return out[: max(0, limit)]

    def title_index(self) -> Any:
        """The ``retrieval.titles.TitleIndex`` of the passages' documents (built once)."""
        if getattr(self, "_titles", None) is None:
            from nest_integrations.retrieval.titles import TitleIndex

            self._titles = TitleIndex.from_passages(self.passages)
        return self._titles

    def _bm25(self, query: str) -> list[float]:
        terms = [w for w in set(words(query)) if w in self._idf]
        out = []
        for tf, length in zip(self._tf, self._len, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / self._avg) if self._avg else self.k1
            out.append(
                sum(self._idf[w] * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in terms if w in tf)
            )
        return out

    def stored_embeddings(self, ids: Sequence[str]) -> list[Any] | None:
        """The unit vectors of passages ``ids`` once a dense query built them; None before,
        without an embedder, or when an id is unknown (see ``ChromaPassageStore``)."""
        if self._matrix is None:
            return None
        row = {p.id: i for i, p in enumerate(self.passages)}
        return [self._matrix[row[i]] for i in ids] if all(i in row for i in ids) else None

    def _dense(self, query: str) -> list[float]:
        if self._matrix is None:
            self._matrix = _unit(
                np.asarray(
                    self.embedder.embed_documents([p.text for p in self.passages]), dtype=np.float32
                )
            )
        q = _unit(np.asarray([self.embedder.embed_query(query)], dtype=np.float32))[0]
        return (self._matrix @ q).tolist()


def _unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.maximum(norms, 1e-12)


def _with_score(p: Passage, score: float) -> Passage:
    import dataclasses

    return dataclasses.replace(p, score=score)
