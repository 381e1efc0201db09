"""Named invariants shared by tests (NEST spec §16). Each returns None or raises AssertionError."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from nest_integrations.types import Citation, NestResult, Passage


def mixture_is_distribution(p: torch.Tensor, atol: float = 1e-5) -> None:
    """Every row of p_M is non-negative and sums to 1."""
    assert bool((p >= 0).all()), "negative probability"
    sums = p.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=atol), f"row sums {sums}"


def lambda_in_unit_interval(lam: torch.Tensor) -> None:
    """RRC lambda lies strictly inside (0, 1)."""
    assert bool(((lam > 0) & (lam < 1)).all()), f"lambda out of (0,1): {lam}"


def accepted_is_prefix(accepted: Sequence[int], draft: Sequence[int]) -> None:
    """The accepted tokens are a prefix of the proposed draft."""
    assert list(accepted) == list(draft[: len(accepted)])


def cited_text_matches_source(
    result: NestResult, sources: dict[str, str] | None = None
) -> None:
    """Each citation's text is the exact passage slice, the exact output slice (a support
    citation's: its answer span is a sentence or clause of the output, ``split_units``), and
    (when the source document text is given by doc id) the exact source slice."""
    from nest_integrations.attribution import split_units

    by_id: dict[str, Passage] = {p.id: p for p in result.passages}
    units = set(split_units(result.text))
    for c in result.citations:
        p = by_id[c.passage_id]
        assert p.text[c.passage_start : c.passage_end] == c.text, c
        if c.kind == "support":  # the passage sentence that backs an answer sentence
            assert (c.start, c.end) in units, (result.text[c.start : c.end], c)
        else:
            assert result.text[c.start : c.end] == c.text, (result.text[c.start : c.end], c.text)
        if sources is not None and c.source_start is not None:
            assert sources[c.doc_id][c.source_start : c.source_end] == c.text, c


def citations_cover_copied_tokens(result: NestResult, lm: Any = None, exact: bool = False) -> None:
    """Citations cover the attributed tokens and no others: their token counts add up to at most
    the attributed tokens (a copied sub-word run is no citation, and a citation keeps to whole
    words: ``core.citations.snap_to_words``), and no citation edge is inside a word.

    With ``lm`` (the model that wrote ``result``) each count is checked token by token, with
    the output's token ends as ``decoding.text_stream`` defines them (the common prefix of
    ``detokenize(ids[:i + 1])`` and the text, never decreasing): a citation counts at least one
    token, at least the tokens of its passage whose text (whitespace trimmed) lies inside it and
    holds a letter or digit (whitespace between two merged pieces counts for neither), and at
    most those that overlap it.

    ``exact``: the citations count every attributed token (the check before issue 53, for an
    output whose copies are all whole words: a memory holding the model's own continuation)."""
    from nest_integrations.core.citations import trim_span, word_edge

    attributed = sum(s is not None for s in result.token_sources)
    runs = [c for c in result.citations if c.kind != "support"]  # support: no copied tokens
    assert sum(c.n_tokens for c in runs) <= attributed
    if exact:
        assert sum(c.n_tokens for c in runs) == attributed > 0, (runs, attributed)
    assert result.stats.attributed_tokens == attributed
    for c in runs:
        assert word_edge(result.text, c.start) and word_edge(result.text, c.end), c
    if lm is None:
        return
    text, ends = result.text, []
    for i in range(len(result.token_ids)):
        decoded = lm.detokenize(result.token_ids[: i + 1])
        k = next((n for n, (a, b) in enumerate(zip(decoded, text)) if a != b),
                 min(len(decoded), len(text)))
        ends.append(max(k, ends[-1] if ends else 0))
    starts = [0] + ends[:-1]
    for c in runs:
        mine = [i for i, src in enumerate(result.token_sources)
                if src is not None and src[0] == c.passage_id]
        inside = sum(1 for i in mine if c.start <= trim_span(text, starts[i], ends[i])[0]
                     and trim_span(text, starts[i], ends[i])[1] <= c.end
                     and any(ch.isalnum() for ch in text[starts[i] : ends[i]]))
        overlapping = sum(1 for i in mine if starts[i] < c.end and ends[i] > c.start)
        assert c.n_tokens >= 1 and inside <= c.n_tokens <= overlapping, (c, inside, overlapping)



def citations_ordered(citations: Sequence[Citation]) -> None:
    """Citations are in output order and do not overlap."""
    for a, b in zip(citations, citations[1:]):
        assert a.end <= b.start, (a, b)


def hf_greedy(lm, ids: list[int], n: int) -> list[int]:
    """The oracle: HF ``generate`` greedy output (new tokens, cut before the first end token)."""
    out = lm.model.generate(
        torch.tensor([ids], device=lm.device),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=lm.device),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=sorted(lm.eos_token_ids),
        pad_token_id=sorted(lm.eos_token_ids)[0],
    )
    new = out[0, len(ids) :].tolist()
    for i, t in enumerate(new):
        if t in lm.eos_token_ids:
            return new[:i]
    return new


def chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square goodness of fit of ``n`` draws (``counts`` per cell) to the exact
    ``probs`` per cell; p-value by Wilson-Hilferty (cells pooled, rarest first, to E >= 5)."""
    stat, df, pool_o, pool_e = 0.0, -1, 0.0, 0.0
    for cell, p in sorted(probs.items(), key=lambda kv: kv[1]):
        pool_o += counts.get(cell, 0)
        pool_e += p * n
        if pool_e >= 5:
            stat += (pool_o - pool_e) ** 2 / pool_e
            df += 1
            pool_o = pool_e = 0.0
    k = max(df, 1)
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def keys_agree(got, want, rtol: float) -> None:
    """Every key vector of ``got`` lies within ``rtol`` of ``want``'s, relative to its norm
    (``lm.exactness.KEY_RTOL`` states it per encoding dtype)."""
    import numpy as np

    got, want = np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.linalg.norm(got - want, axis=-1) / np.maximum(np.linalg.norm(want, axis=-1), 1e-12)
    assert float(err.max(initial=0.0)) <= rtol, f"key off by {float(err.max()):.3g} > {rtol}"
