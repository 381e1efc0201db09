"""Attribution: per-token sources merged into span citations (NEST §8).

A source is ``(passage index, token position)``. Consecutive output tokens from the same
passage at consecutive positions form one citation. Char ranges come from the passage's token
offsets, so the cited text is always an exact slice of the passage (and of its source document).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from nest_integrations.types import Citation, Passage

Source = tuple[int, int] | None


def source_runs(sources: Sequence[Source]) -> list[tuple[int, int]]:
    """Maximal runs ``[i, j)`` of output tokens with consecutive positions in one passage."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(sources):
        if sources[i] is None:
            i += 1
            continue
        j = i + 1
        while j < len(sources):
            prev, cur = sources[j - 1], sources[j]
            if cur is None or prev is None or cur[0] != prev[0] or cur[1] != prev[1] + 1:
                break
            j += 1
        runs.append((i, j))
        i = j
    return runs


def build_citations(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    kind: str = "copy",
) -> list[Citation]:
    """Span citations for an output whose token ``i`` ends at char ``token_ends[i]``.

    Args:
        sources: per output token, ``(passage index, token position)`` or None.
        token_ends: char offset in the output text where each token ends.
        passages: the memory's passages, by index.
        offsets: per passage, the ``(m, 2)`` char range of each token in the passage text.
    """
    return [
        _citation(sources, token_ends, passages, offsets, i, j, kind)
        for i, j in source_runs(sources)
    ]


def last_citation(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    kind: str = "copy",
) -> Citation | None:
    """The citation of the run that ends at the last output token (None when that token has no
    source). Walks back over that run only, so streaming costs O(run length) per chunk."""
    j = len(sources)
    if not j or sources[j - 1] is None:
        return None
    i = j - 1
    while i > 0:
        prev, cur = sources[i - 1], sources[i]
        if prev is None or cur[0] != prev[0] or cur[1] != prev[1] + 1:  # type: ignore[index]
            break
        i -= 1
    return _citation(sources, token_ends, passages, offsets, i, j, kind)


def _citation(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    i: int,
    j: int,
    kind: str,
) -> Citation:
    p, first = sources[i]  # type: ignore[misc]
    last = sources[j - 1][1]  # type: ignore[index]
    passage = passages[p]
    ps, pe = int(offsets[p][first, 0]), int(offsets[p][last, 1])
    src_start = passage.char_start + ps if passage.char_start is not None else None
    return Citation(
        text=passage.text[ps:pe],
        start=token_ends[i - 1] if i > 0 else 0,
        end=token_ends[j - 1],
        passage_id=passage.id,
        doc_id=passage.doc_id,
        passage_start=ps,
        passage_end=pe,
        source_start=src_start,
        source_end=src_start + (pe - ps) if src_start is not None else None,
        n_tokens=j - i,
        metadata=dict(passage.metadata),
        kind=kind,
    )
