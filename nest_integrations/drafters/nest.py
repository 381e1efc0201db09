"""NEST's span proposer as a drafter (arXiv 2405.19325, Eqs. 5-6 and §3.3).

At each decision point, with p_M at the next position known:

- after a fully accepted span, continue copying the same passage from the next row (its first
  token is then checked against p_M before any forward pass);
- else choose the token w from p_M; if lambda <= delta (Eq. 6) and a retrieved neighbour carries
  w, draft the corpus span starting at the nearest such neighbour (Eq. 5): w is already decided,
  so the draft's first token is committed without a check (``chosen_first``);
- else emit w alone ("token mode"), cited to the nearest neighbour when it carries w (§8).

Span length: ``NestConfig.max_span``, or, with a cost model (``drafter_options={"cost_model":
...}``; on llama.cpp ``"auto"`` by default, ``lm.cost.BACKEND_COST_MODEL``), at most one more
than the draft length the measured verify cost pays for at the acceptance seen so far
(``lm.cost.DraftPlanner``); a span that ends before that length is verified only where its
own length pays (``DraftPlanner.pays``). A span cut to one token is copied on row by row: its
next row is proposed at the next step and checked against p_M before any forward pass, so the
copy and its citation go on, and that check feeds the acceptance estimate.

Accepted rows are masked so the same keys are never proposed again (unless strict acceptance
keeps p_M history-free for the lossless preset).

Answer document (``Guards.lock_document``; ``core.guards.first_copy_document``): the first
accepted copy of at least ``LOCK_MIN_TOKENS`` tokens fixes the document the answer is about.
From then on spans start, and token-mode tokens are cited, only in that document's passages:
a copy never continues into another document (a "What is belly dance?" answer drifting into a
music article).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from nest_integrations.core.evidence import EvidenceSpan, evidence_rows
from nest_integrations.core.proposers import span_draft, span_start, use_span
from nest_integrations.core.guards import first_copy_document
from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Source


class NestDrafter:
    """Span drafts from the per-query token memory (one instance per generation)."""

    def __init__(self, ctx: DrafterContext) -> None:
        self.memory = ctx.memory
        self.config = ctx.config
        self._rows: list[int] | None = None  # memory rows of the last draft (None: token mode)
        self._stream_row: int | None = None  # continue copying here after a full acceptance
        #: the evidence window's rows, quoted before any draft: its first sentence (the draft
        #: the loop checks, ``Guards.quote_check``), then the rest of the window
        self._quotes: list[list[int]] = []
        self._window_last: int | None = None  # the evidence window's last memory row
        self._end = False  # the evidence window is copied to its end: the answer ends
        self._quoting = False  # the last draft was the quote (no acceptance to learn from)
        self._lock = ctx.guards.lock_document and not self.config.strict_acceptance
        self.document: str | None = None  # the answer's document, once a copy fixes it
        self._allowed: torch.Tensor | None = None  # (passages,) bool: that document's passages
        from nest_integrations.lm import cost
        from nest_integrations.lm.port import port_of

        option = cost.backend_default(ctx.options.get("cost_model"), ctx.lm)
        # relaxed decoding runs its passes inside the LM's inexact_rows (the loop's), so its
        # curve is the one measured there (llama.cpp at 2+ threads: steps on every thread)
        port = port_of(ctx.lm)
        with port.inexact_context() if not self.config.strict_acceptance else nullcontext():
            self.planner = cost.planner_for(option, ctx.lm, max(1, self.config.max_span - 1))
        doc_of = {p.id: p.doc_id for p in ctx.passages}
        ids = self.memory.passage_ids if self.memory is not None else []
        self._doc_of = [doc_of.get(pid) for pid in ids]  # per memory passage index
        if ctx.evidence is not None and self.memory is not None:
            self._quote_first(ctx.evidence)

    def _quote_first(self, evidence: EvidenceSpan) -> None:
        """Evidence first (``core.evidence``, ``policy.evidence``): the memory keeps only the
        evidence window's rows, and the answer is the window, quoted: its first sentence in one
        pass (a ``quoted`` draft: every token decided, each cited to its row; the loop checks
        it, ``Guards.quote_check``), then the rest of the window in one more; the answer then
        ends (``_end``). A window cut by the budget ends with it."""
        memory = self.memory
        if evidence.passage_id not in memory.passage_ids:
            return
        p = memory.passage_ids.index(evidence.passage_id)
        a, b = evidence_rows(memory.offsets[p], evidence.start, evidence.end)
        if a >= b:
            return
        first, last = memory.starts[p] + a, memory.starts[p] + b
        memory.mask([r for r in range(len(memory)) if not first <= r < last])
        q_end = evidence.sentence_end if evidence.sentence_end is not None else evidence.end
        _, qb = evidence_rows(memory.offsets[p], evidence.start, q_end)
        split = memory.starts[p] + max(qb, a + 1)
        self._quotes = [list(range(first, split)), list(range(split, last))]
        self._window_last = last - 1
        if self._lock:
            self.document = self._doc_of[p]
            self._allowed = torch.tensor([d == self.document for d in self._doc_of],
                                         dtype=torch.bool)

    def propose(self, state: DecodeState) -> Draft | None:
        memory, cfg = self.memory, self.config
        if memory is None:
            return None
        limit = min(cfg.max_span, state.budget)
        if self.planner is not None:  # the first token is decided: a span verifies the rest
            limit = min(limit, 1 + self.planner.length())
        if self._end and state.eos:  # the evidence is said: the answer ends with it
            return Draft([min(state.eos)], [None], chosen_first=True)
        quote = self.opening_quote(state)  # evidence first: its sentence, then the rest of it
        if quote is not None:
            return quote
        if self._stream_row is not None:  # continuation of the last fully accepted span
            rows = self._paying(span_draft(memory, self._stream_row, limit, state.eos))
            self._stream_row = None
            if rows:
                return self._draft(rows, chosen_first=False)
        dist = state.dist
        w = (state.next_token(dist, 0) if state.next_token is not None
             else state.choose_token(dist.p[0]))
        start = None
        if cfg.span_copying and use_span(float(dist.lam[0]), cfg.span_threshold):
            start = span_start(dist.hits, memory, w, max_passage=cfg.span_passages,
                               allowed=self._allowed)
        rows = span_draft(memory, start, limit, state.eos) if start is not None else []
        rows = self._paying(rows)
        if not rows or w in state.eos:  # token mode: w alone, cited when its neighbour carries it
            self._rows = None
            src = self._token_source(dist, w)
            if src is not None and cfg.mask_token_mode:  # that key is used up, like a copy's
                memory.mask([int(dist.hits.rows[0, 0])])
            return Draft([w], [src], chosen_first=True)
        return self._draft(rows, chosen_first=True)

    def opening_quote(self, state: DecodeState) -> Draft | None:
        """The evidence window's next quote (``drafters.base.QuotesFirst``): a ``quoted`` draft
        of its rows, every token decided and cited, or None when none is left."""
        while self._quotes and not self._quotes[0]:
            self._quotes.pop(0)
        if self.memory is None or not self._quotes:
            return None
        self._quoting = True
        draft = self._draft(self._quotes.pop(0), chosen_first=True)
        draft.quoted = True
        return draft

    def _paying(self, rows: list[int]) -> list[int]:
        """``rows``, or only the first where a cost model says their verify pass does not pay:
        a span the planner sized but that ends sooner (at its passage's end, before an end
        token) has fewer rows than planned, and a short verify pass can cost more steps than
        it saves (on llama.cpp here a 2-row pass costs 2.7 steps). The copy then goes on row
        by row, each checked against p_M before any pass."""
        if self.planner is not None and len(rows) > 1 and not self.planner.pays(len(rows) - 1):
            return rows[:1]
        return rows

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        rows, memory = self._rows, self.memory
        if rows is None:
            return
        quoted, self._quoting = self._quoting, False
        if self.planner is not None and not quoted:  # a chosen first token was not a draft token
            first = 1 if draft.chosen_first else 0
            self.planner.observe(len(rows) - first, max(0, n_accepted - first))
        if not self.config.strict_acceptance:  # strict mode keeps p_M history-free (lossless)
            memory.mask(rows[:n_accepted])
        if self._window_last is not None and self._window_last in rows[:n_accepted]:
            self._end = True
        if self._lock and self.document is None:
            docs = [self._doc_of[memory.source(r)[0]] for r in rows[:n_accepted]]
            doc = first_copy_document(docs, n_accepted)
            if doc is not None:
                self.document = doc
                self._allowed = torch.tensor([d == doc for d in self._doc_of], dtype=torch.bool)
        if n_accepted == len(rows):
            nxt = rows[-1] + 1
            if nxt < len(memory) and memory.source(nxt)[0] == memory.source(rows[-1])[0]:
                self._stream_row = nxt

    def _draft(self, rows: list[int], chosen_first: bool) -> Draft:
        self._rows = rows
        memory = self.memory
        tokens = [memory.value(r) for r in rows]
        sources: list[Source] = [memory.source(r) for r in rows]
        return Draft(tokens, sources, chosen_first=chosen_first)

    def _token_source(self, dist, w: int) -> Source:
        memory = self.memory
        if dist.hits.empty or not self.config.cite_token_mode:
            return None
        row = int(dist.hits.rows[0, 0])
        if memory.value(row) != w:
            return None
        src = memory.source(row)
        if self._allowed is not None and not bool(self._allowed[src[0]]):
            return None  # another document than the answer's: plain LM text
        return src


__all__ = ["NestDrafter"]
