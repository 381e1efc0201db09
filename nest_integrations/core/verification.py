"""Draft verification as pure functions: how many leading draft tokens are accepted.

Convention: ``p`` holds the target distribution (p_M for NEST, p_LM for lossless modes) at each
draft position: row i scores draft token i.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from nest_integrations.core.sampling import host_row, top_of


def _leading_true(ok: torch.Tensor) -> int:
    """Length of the leading run of True values in a 1-D bool tensor."""
    bad = (~ok).nonzero()
    return int(bad[0, 0]) if bad.numel() else int(ok.shape[0])


def eq7_threshold(p: torch.Tensor, gamma: float, keepdim: bool = False) -> torch.Tensor:
    """NEST Eq. 7's bar for each row of ``(..., V)`` probabilities: ``(gamma / 2) * max_w p``;
    a token passes where its probability is above it."""
    return 0.5 * gamma * p.max(dim=-1, keepdim=keepdim).values


def relaxed_accept_count(
    p: torch.Tensor, draft: torch.Tensor, gamma: float, veto: torch.Tensor | None = None
) -> int:
    """NEST Eq. 7, greedy form (Algorithm 1 stops when P(accept) <= 0.5).

    Accept draft token i iff ``p[i, w_i] > (gamma / 2) * max_w p[i, w]``, left to right,
    stopping at the first failure. Smaller gamma is more lenient.

    Args:
        p: ``(L, V)`` target probabilities; row i scores ``draft[i]``.
        draft: ``(L,)`` int64 draft tokens.
        veto: optional ``(L,)`` bool rows to reject regardless (``confident_lm_veto``).
    """
    if draft.numel() == 0:
        return 0
    p_w = p.gather(1, draft[:, None]).squeeze(1)  # (L,)
    ok = p_w > eq7_threshold(p, gamma)
    return _leading_true(ok & ~veto if veto is not None else ok)


def quote_score(p_first: torch.Tensor, logits: torch.Tensor, tokens: Sequence[int]) -> float:
    """The LM's mean log-probability of a quote's tokens as the text after the current
    position: ``p_first`` is p_LM there (``(V,)``, probabilities), ``logits`` the quote pass's
    rows (row i scores token i + 1; the last row, after the quote, is not read). The model's say
    in an evidence quote (``Guards.quote_check``): a sentence the model would not give as the
    answer scores low, although every one of its tokens is in the prompt."""
    if not tokens:
        return 0.0
    logp = [float(torch.log(p_first[tokens[0]].clamp_min(1e-30)))]
    if len(tokens) > 1:
        rows = torch.log_softmax(logits[: len(tokens) - 1].float(), dim=-1)
        idx = torch.as_tensor(list(tokens[1:]), dtype=torch.long, device=rows.device)
        logp += rows.gather(1, idx[:, None]).squeeze(1).tolist()
    return sum(logp) / len(logp)


def guarded_accept_count(
    p: torch.Tensor,
    p_lm: torch.Tensor,
    draft: Sequence[int],
    gamma: float,
    eos_ids: Sequence[int],
    confidence_guard: float | None,
    eos_guard: float | None,
) -> int | None:
    """``relaxed_accept_count(p, draft, gamma, guard_veto(p_lm, draft, ...))``, row by row
    through numpy on CPU fp32 rows, stopping at the first rejected row; None for other rows
    (then use the batch functions).

    The same count bit for bit: the bar and the guards' thresholds are fp32, as torch compares
    an fp32 tensor with a Python number. Most NEST checks are one row (the next token of a copy,
    checked before any pass), where the batch functions' five torch reductions over the
    vocabulary cost about 0.4 ms right after a decode; a leading run also stops reading rows at
    its first rejection.
    """
    a, b = host_row(p), host_row(p_lm)
    if a is None or b is None or a.dtype != np.float32 or b.dtype != np.float32:
        return None
    half = np.float32(0.5 * gamma)
    sure = None if confidence_guard is None else np.float32(confidence_guard)
    ends = list(eos_ids) if eos_guard is not None else []
    end_mass = np.float32(eos_guard) if ends else None
    for i, w in enumerate(draft):
        row = a[i]
        if not row[w] > half * row.max():  # Eq. 7
            return i
        if sure is not None or ends:
            lm = b[i]
            top = int(lm.argmax())
            if sure is not None and lm[top] > sure and top != w:  # confident_lm_veto
                return i
            if ends and (top in ends or lm[ends].sum() > end_mass):  # eos_veto
                return i
    return len(draft)


def confident_lm_veto(p_lm: torch.Tensor, draft: torch.Tensor, threshold: float) -> torch.Tensor:
    """Rows where a confident LM disagrees with the draft: ``max p_LM > threshold`` and the draft
    token is not the LM's argmax. Relaxed acceptance (Eq. 7) lets the kNN mass that proposed a
    span also vote for it; this guard (after Medusa's entropy-adaptive rule) gives the LM a veto
    where it is sure, e.g. of an end of answer or of the entity the question names.

    Returns:
        ``(L,)`` bool, True where the draft token must be rejected.
    """
    top = p_lm.max(dim=-1)
    return (top.values > threshold) & (top.indices != draft)


def eos_veto(p_lm: torch.Tensor, eos_ids: list[int], threshold: float) -> torch.Tensor:
    """Rows where the LM alone would end the text: an end token is its top token, or end
    tokens carry more than ``threshold`` of its mass. A copy must not run on there (LLMA's
    "stop where the model stops").

    Returns:
        ``(L,)`` bool, True where the draft token must be rejected.
    """
    eos = torch.as_tensor(eos_ids, device=p_lm.device)
    top_is_end = torch.isin(p_lm.argmax(dim=-1), eos)
    return top_is_end | (p_lm[:, eos].sum(-1) > threshold)


def guard_veto(
    p_lm: torch.Tensor,
    draft: torch.Tensor,
    eos_ids: Sequence[int],
    confidence_guard: float | None,
    eos_guard: float | None,
) -> torch.Tensor | None:
    """NEST's LM guards on draft rows: ``confident_lm_veto`` when ``confidence_guard`` is set,
    or-ed with ``eos_veto`` when ``eos_guard`` is set (and there are end tokens).

    Returns:
        ``(L,)`` bool rows to reject regardless of Eq. 7, or None when no guard is on.
    """
    veto = None
    if confidence_guard is not None:
        veto = confident_lm_veto(p_lm, draft, confidence_guard)
    if eos_guard is not None and eos_ids:
        end = eos_veto(p_lm, list(eos_ids), eos_guard)
        veto = end if veto is None else veto | end
    return veto


def guarded_token(
    token: int,
    p_lm_row: torch.Tensor,
    eos_ids: Sequence[int],
    confidence_guard: float | None,
    eos_guard: float | None,
) -> int:
    """NEST's LM guards on a chosen token: a confident LM (top p_LM above ``confidence_guard``)
    overrules it with its own top token, and where the LM alone would end the text
    (``eos_veto`` with ``eos_guard``) the most likely end token replaces it.

    Args:
        token: the token chosen from the target (p_M) row.
        p_lm_row: ``(V,)`` p_LM at the same position.
        eos_ids: the end tokens, sorted.
    """
    ends = list(eos_ids) if eos_guard is not None else []
    if confidence_guard is None and not ends:
        return token
    top, top_p = top_of(p_lm_row)  # one pass over the row serves both guards
    if confidence_guard is not None and top_p > confidence_guard and top != token:
        token = top
    if ends:  # eos_veto on this row: the end tokens' mass, read where the row lives
        row = host_row(p_lm_row)
        mass = row[ends] if row is not None else p_lm_row[ends]
        if top in ends or float(mass.sum()) > eos_guard:
            token = ends[int(mass.argmax())]
    return token


def strict_accept_count(p: torch.Tensor, draft: torch.Tensor) -> int:
    """Exact-match acceptance: draft token i must be the argmax of row i (lossless for greedy)."""
    if draft.numel() == 0:
        return 0
    return _leading_true(p.argmax(dim=-1) == draft)


def greedy_accept(argmax_rows: Sequence[int], draft: Sequence[int]) -> tuple[int, int]:
    """``strict_accept_count`` and the next token, on rows given as their argmax (row i's
    argmax scores draft token i; there is one row more than draft tokens):
    ``(n_accepted, argmax_rows[n_accepted])``."""
    m = 0
    for best, tok in zip(argmax_rows, draft):
        if best != tok:
            break
        m += 1
    return m, int(argmax_rows[m])


def greedy_tree_path(p: torch.Tensor, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Greedy acceptance of a token tree (REST, SpecInfer): from the current position, follow
    the child equal to the argmax of its parent's row, as long as there is one.

    Args:
        p: ``(N + 1, V)`` target rows: row 0 follows the current position, row i + 1 node i.
        tokens: the tree's N node tokens; ``parents[i]`` is node i's parent (-1: the root).

    Returns:
        The accepted nodes, root first. The next token is the argmax of row
        ``path[-1] + 1`` (row 0 when nothing is accepted).
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    path: list[int] = []
    node = -1
    while True:
        best = int(p[node + 1].argmax())
        nxt = next((c for c in children.get(node, []) if tokens[c] == best), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def speculative_sampling(
    p: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023): lossless in
    distribution for a single chain. Names follow the paper: target ``p``, draft ``q``.

    Draft token ``x_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the
    first rejection the next token is drawn from the residual ``norm(max(0, p_i - q_i))``; if all
    ``L`` tokens are accepted, it is drawn from ``p_L`` (the "bonus" token).

    Args:
        p: ``(L + 1, V)`` target distributions (already warped by temperature/top-p): row i
            scores ``draft[i]``, row L follows the last draft token.
        draft: ``(L,)`` draft tokens.
        q: ``(L, V)`` draft distributions, or None for a deterministic draft (one-hot q: then
            x_i is accepted with probability p_i(x_i) and the residual is p_i without x_i).
        generator: the generation's RNG (CPU).

    Returns:
        ``(n_accepted, next_token)``.
    """
    n = int(draft.numel())
    idx = torch.arange(n, device=p.device)
    p_x = p[idx, draft] if n else p.new_zeros(0)  # (L,)
    q_x = q[idx, draft] if q is not None and n else torch.ones_like(p_x)
    ratio = (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0)
    u = torch.rand(n, generator=generator, dtype=torch.float64).to(p.device)
    m = _leading_true(u < ratio) if n else 0
    if m < n:  # rejected: resample from the residual max(0, p - q)
        if q is None:
            residual = p[m].clone()
            residual[draft[m]] = 0.0
        else:
            residual = (p[m] - q[m]).clamp_min(0.0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[m]
    else:
        dist = p[n]
    return m, int(torch.multinomial(dist.float().cpu(), 1, generator=generator))


def sampled_accept_count(
    p: torch.Tensor, draft: torch.Tensor, gamma: float, generator: torch.Generator | None
) -> int:
    """NEST Eq. 7 as a random test (sampling mode, not the paper's setting):
    accept token i with probability ``min(1, p[i, w_i] / (gamma * max p[i]))``."""
    if draft.numel() == 0:
        return 0
    p_w = p.gather(1, draft[:, None]).squeeze(1)
    prob = (p_w / (gamma * p.max(dim=-1).values)).clamp(max=1.0)
    u = torch.rand(prob.shape, generator=generator, device="cpu").to(prob.device)
    return _leading_true(u < prob)
