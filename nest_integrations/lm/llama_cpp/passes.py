"""How the port's passes map onto decodes of the context: a verify pass or prefill (rows
together, a prefill's keys from a scratch decode, or rows one at a time) and passages encoded
in packed decodes of one sequence each."""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from nest_integrations.lm.llama_cpp.context import LlamaCppRuntime
from nest_integrations.lm.llama_cpp.sequences import MAX_SEQUENCES, LlamaCppCache


def run(rt: LlamaCppRuntime, cache: LlamaCppCache, ids: list[int], k: int, *, keys: bool,
        argmax: bool, split: bool, until_rejected: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode ``ids`` after the cache's positions and append them to it: the last ``k`` rows'
    logits (or argmaxes) and, with ``keys``, their keys (None without).

    - ``split`` (``ThreadRegime.rows_split``): each row is a one-token decode, stopping after
      the first rejected row with ``until_rejected`` (``one_at_a_time``);
    - keys of every row: one decode with embeddings on;
    - otherwise one decode with embeddings off and only the last k rows' logits, as
      ``Llama.create_completion`` processes a prompt; their keys, where wanted, come from a
      second k-token decode in a scratch sequence (``LlamaCppRuntime.scratch_states``).
    """
    n, start, seq = len(ids), cache.length, cache.seq
    pos = list(range(start, start + n))
    if split:
        logits, rows = one_at_a_time(rt, cache, ids, keys=keys, argmax=argmax,
                                     until_rejected=until_rejected)
        n = len(logits)
    elif keys and k == n:
        logits, rows = rt.decode(ids, [(seq,)] * n, pos, keys=True, argmax=argmax)
    else:
        logits, _ = rt.decode(ids, [(seq,)] * n, pos, keys=False, logits_last=k, argmax=argmax)
        rows = rt.scratch_states(seq, ids[n - k:], pos[n - k:]) if keys else None
    cache.length = start + n
    return logits, rows


def one_at_a_time(rt: LlamaCppRuntime, cache: LlamaCppCache, ids: list[int], *, keys: bool,
                  argmax: bool, until_rejected: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """A verify pass as one-token decodes (``ThreadRegime.rows_split``): each row is a step."""
    start, seq = cache.length, cache.seq
    out, states = [], []
    for i, t in enumerate(ids):
        row, state = rt.decode([t], [(seq,)], [start + i], keys=keys, logits_last=1,
                               argmax=argmax)
        out.append(row)
        states.append(state)
        if until_rejected and i + 1 < len(ids) and int(row[0]) != ids[i + 1]:
            break
    return np.concatenate(out), (np.concatenate(states) if keys else None)


def encode_passages(rt: LlamaCppRuntime, token_ids: Sequence[Sequence[int]], prefix: list[int],
                    max_context: int, batch_tokens: int) -> list[np.ndarray]:
    """Keys of passages read on their own after ``prefix`` (the port's ``encode_passages``),
    packed into decodes of up to ``batch_tokens`` tokens, one sequence each; no logits kept."""
    seqs = [prefix + [int(t) for t in d][:-1] for d in token_ids]
    too_long = [i for i, s in enumerate(seqs) if len(s) > max_context]
    if too_long:
        raise ValueError(f"passage(s) {too_long[:5]} exceed the model's context of "
                         f"{max_context} tokens: split passages before encoding them")
    result = [np.zeros((0, rt.n_embd), dtype=np.float32) for _ in token_ids]
    start = len(prefix) - 1  # the key predicting d[0] sits at the last prefix position
    todo = collections.deque(i for i, d in enumerate(token_ids) if len(d))
    while todo:
        group = [todo.popleft()]
        used = len(seqs[group[0]])
        while (todo and len(group) < MAX_SEQUENCES // 2
               and used + len(seqs[todo[0]]) <= batch_tokens):
            used += len(seqs[todo[0]])
            group.append(todo.popleft())
        states = rt.states_from_start([seqs[i] for i in group])
        for i, keys in zip(group, states):
            result[i] = keys[start: start + len(token_ids[i])].copy()
    return result


__all__ = ["encode_passages", "one_at_a_time", "run"]
