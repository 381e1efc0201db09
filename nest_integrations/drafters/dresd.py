"""DReSD drafting (DReSD spec §2.3): nearest neighbours of the current hidden state in a
corpus-wide datastore propose what followed them in the corpus; the loop verifies exactly.

Per step:

1. query = PCA((DecodeState.hidden - μ)/σ), L2-normalised (the vector that produced the last
   committed token ``x``; it comes from the verify pass already run);
2. top-``k`` rows by cosine similarity (FAISS inner product);
3. first-token filter: keep row g only if ``tokens[g] == x`` (index order kept);
4. up to ``num_drafts`` drafts ``tokens[g+1 : g+1+draft_len]`` (cut at the passage end and at
   EOS), merged into a token tree on their shared prefixes (``shape="tree"``), or only the best
   one as a chain (``shape="chain"``).

Every draft token carries its corpus position as its source, so accepted tokens come back as
verbatim-match provenance (``Citation.kind == "verbatim"``).

Options (``drafter_options``): ``DresdOptions`` (``datastore``, ``k``, ``num_drafts``,
``draft_len``, ``shape``, ``max_nodes``, ``min_score``). Per-generation counters go to the
result's ``NestStats.drafting`` (``candidates``, ``tree_steps``, ``tree_nodes``) and
``timing.draft``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from nest_integrations.core.tokens import cut_at_eos
from nest_integrations.drafters.base import LOSSLESS, DecodeState, Draft, DrafterContext, Method
from nest_integrations.drafters.corpus import (
    CorpusOptions,
    check_at_least,
    corpus_draft,
    datastore_of,
    parse_options,
)

LOG = logging.getLogger(__name__)


@dataclass
class DresdOptions(CorpusOptions):
    """``drafter_options`` of ``decoding="dresd"`` (and the ``CorpusOptions``).

    Defaults as measured on CPU (``docs/decisions.md``): one chain beats a tree (a verify pass
    grows about linearly with its tokens), and drafts whose best neighbour is below cosine 0.8
    are rarely accepted, so they are skipped.

    Attributes:
        k: neighbours searched per step.
        min_score: no draft when the best surviving neighbour's cosine similarity is below it
            (-1 = off).
        cost_model: None (default): the backend's rule, drafts of ``draft_len`` on torch and
            ``"auto"`` on llama.cpp (``lm.cost.BACKEND_COST_MODEL``). ``"off"``: drafts of
            ``draft_len`` on any backend. ``"auto"``, a ``lm.cost.CostCurve``, its JSON dict
            or a list of c(T)/c(1) ratios: each draft's length (up to ``draft_len``; a chain's,
            a tree's depth) is the one the measured verify cost pays for at the acceptance
            measured so far in the generation (``lm.cost.DraftPlanner``; 0 = a plain step).
    """

    k: int = 50
    min_score: float = 0.8
    cost_model: Any = None

    def __post_init__(self) -> None:
        self.check("dresd")
        check_at_least("dresd", self, ("k",))


class DresdDrafter:
    """Dense-retrieval drafts for one generation (``DresdDrafter(ds, k=..., shape=...)`` or
    ``DresdDrafter(ds, options)``)."""

    def __init__(self, datastore: Any, options: DresdOptions | None = None, **kwargs: Any) -> None:
        self.datastore = datastore
        self.options = options if options is not None else DresdOptions(**kwargs)
        self._registered: dict[int, int] = {}
        self.planner: Any = None

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "DresdDrafter":
        from nest_integrations.lm.cost import backend_default, planner_for

        opts = parse_options(DresdOptions, ctx.options, "dresd")
        drafter = cls(datastore_of(ctx, opts), opts)
        drafter.planner = planner_for(backend_default(opts.cost_model, ctx.lm), ctx.lm,
                                      opts.draft_len)
        return drafter

    # ----------------------------------------------------------------------------- drafting

    def candidates(
        self, hidden: Any, last: int, length: int, eos: frozenset[int]
    ) -> list[tuple[int, list[int]]]:
        """``(row, draft tokens)`` of up to ``num_drafts`` neighbours that pass the first-token
        filter, best first (duplicates dropped)."""
        ds, opts = self.datastore, self.options
        scores, rows = ds.search(hidden, opts.k)
        scores = scores[rows >= 0]
        rows = rows[rows >= 0]
        if len(rows) == 0:
            return []
        keep = np.asarray(ds.tokens[rows]) == last
        rows, scores = rows[keep], scores[keep]
        best = float(scores[0]) if len(scores) else -1.0
        if best < opts.min_score:  # no neighbour is close enough to be worth a verify
            return []
        out: list[tuple[int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for g in rows:
            g = int(g)
            end = int(ds.bounds[ds.passage_of(g) + 1])
            seq = cut_at_eos(ds.tokens[g + 1 : min(g + 1 + length, end)], eos)
            if not seq or tuple(seq) in seen:
                continue
            seen.add(tuple(seq))
            out.append((g, seq))
            if len(out) >= opts.num_drafts:
                break
        return out

    @property
    def wants_hidden(self) -> bool:
        """Whether the loop's next pass returns the key vector ``propose`` searches with: not
        while the cost planner drafts nothing (on llama.cpp a step then runs without keys, and
        the prompt's pass without the scratch decode of its last key)."""
        return self.planner is None or self.planner.length() > 0

    def propose(self, state: DecodeState) -> Draft | None:
        if state.hidden is None:
            return None
        length = min(self.options.draft_len, state.budget)  # the loop left room for its token
        if self.planner is not None:
            length = self.planner.length(length)
        if length < 1:
            return None
        ctx = state.context_ids
        if not ctx:
            return None
        cands = self.candidates(state.hidden, ctx[-1], length, state.eos)
        return corpus_draft(state, cands, self.datastore, self._registered, self.options)

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        if self.planner is not None:
            depth = len(draft) if draft.parents is None else _depth(draft.parents)
            self.planner.observe(depth, n_accepted)


def _depth(parents: list[int]) -> int:
    """Depth of a token tree (``parents[i]`` < i, -1 for a root)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth, default=0)


#: ``decoding="dresd"`` (registered in ``drafters/__init__.py``).
METHOD = Method(
    "dresd", DresdDrafter.from_context, verifier=LOSSLESS,
    description="lossless DReSD: dense-retrieval drafts from a corpus-wide token datastore",
)  # fmt: skip
