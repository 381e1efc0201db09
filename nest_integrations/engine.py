"""NestEngine: retrieve passages, load their token keys, then decode with NEST.

One generation is: stage 1 (passages) -> stage 2 (token memory from stored keys) -> a loop of
``distribution -> propose -> verify -> commit``:

- distribution: p_M = lambda * p_LM + (1 - lambda) * p_kNN at the current position (Eqs. 2-4);
- propose: a continuation of the last fully accepted span, else a span from the nearest
  neighbour carrying the chosen token when lambda <= delta (Eqs. 5-6), else one token;
- verify: ONE forward pass over the draft, p_M at every draft position, relaxed acceptance
  (Eq. 7), or exact-match acceptance with ``strict_acceptance``;
- commit: accepted tokens (cited, their keys masked), then on a rejection the argmax of p_M at
  the rejected position; the KV cache is cropped to exactly the committed tokens.

KV-cache invariant: either the cache holds every committed token and ``cur`` holds the model
output for the next position, or the cache holds all but the last committed token
(``pending``), which the next step feeds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from nest_integrations.config import NestConfig
from nest_integrations.core.citations import Source, build_citations
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.core.mixture import StepDistribution, nest_distribution
from nest_integrations.core.proposers import span_draft, span_start, use_span
from nest_integrations.core.sampling import choose_token
from nest_integrations.core.verification import (
    relaxed_accept_count,
    sampled_accept_count,
    strict_accept_count,
)
from nest_integrations.types import NestResult, NestStats, Passage, StreamChunk

LOG = logging.getLogger(__name__)

Prompt = str | Sequence[dict[str, str]]

RA_CHAT_TEMPLATE = (
    "Answer the question with the background context as reference.\n"
    "Background:\n{context}\n\nQuestion: {question}"
)
RA_TEXT_TEMPLATE = "Background:\n{context}\n\n{prompt}"


@dataclass
class _Run:
    """Mutable state of one generation (kept out of the engine so engines are reentrant)."""

    config: NestConfig
    memory: TokenMemory | None
    passages: list[Passage]
    max_new_tokens: int
    stop: list[str]
    stats: NestStats
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    token_ends: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # chars of text already streamed
    done: bool = False
    lam_sum: float = 0.0
    lam_n: int = 0


class NestEngine:
    """Nearest Neighbor Speculative Decoding over a passage retriever and a key store.

    Setup:
        .. code-block:: bash

            nest ingest --sample          # embedded Chroma + token keys of the sample corpus

    Instantiate:
        .. code-block:: python

            from nest_integrations import NestEngine, NestConfig
            engine = NestEngine.from_defaults(collection="nest")
            # or, with ready parts:
            engine = NestEngine(lm, retriever, key_store, NestConfig.from_preset("paper"))

    Generate:
        .. code-block:: python

            result = engine.generate([{"role": "user", "content": "What is a list?"}])
            result.text, result.citations, result.stats.attribution_ratio

    Stream:
        .. code-block:: python

            for chunk in engine.stream("The assert statement", max_new_tokens=64):
                print(chunk.text, end="")

    Args:
        lm: a ``LanguageModel`` (e.g. ``HFLanguageModel``).
        retriever: a ``PassageRetriever`` or None (no corpus: plain decoding of p_LM).
        key_store: a ``KeyStore``; passages without stored keys are encoded once and
            persisted. None keeps keys in memory for the engine's lifetime.
        config: ``NestConfig`` (default: the ``paper`` preset).

    String prompts are completed as raw text; a list of ``{"role", "content"}`` messages gets the
    model's chat template. NEST's relaxed acceptance changes the output distribution on purpose
    (it is not lossless); ``strict_acceptance=True`` makes it exactly greedy decoding of p_M.
    """

    def __init__(
        self,
        lm: Any,
        retriever: Any = None,
        key_store: Any = None,
        config: NestConfig | None = None,
    ):
        self.config = config if config is not None else NestConfig()
        if str(self.config.key_source) != str(lm.key_source):
            raise ValueError(
                f"NestConfig.key_source={self.config.key_source!r} but the language model "
                f"computes keys from {lm.key_source!r}: build the model with the same key_source"
            )
        if key_store is None:
            from nest_integrations.index.in_memory_store import InMemoryKeyStore

            key_store = InMemoryKeyStore()
        self.lm = lm
        self.retriever = retriever
        self.key_store = key_store

    @classmethod
    def from_defaults(
        cls,
        collection: str = "nest",
        persist_dir: str | None = None,
        chroma_url: str | None = None,
        config: NestConfig | str | None = None,
        model: str | None = None,
        device: str | None = None,
    ) -> "NestEngine":
        """The embedded default: SmolLM2-135M-Instruct + Chroma + the on-disk key store.

        ``persist_dir`` defaults to ``$NEST_HOME/store`` (filled by ``nest ingest``); with
        ``chroma_url`` passages come from a Chroma server and keys stay in ``persist_dir``.
        ``config`` is a ``NestConfig`` or a preset name.
        """
        from nest_integrations import paths
        from nest_integrations.index.store import DiskKeyStore
        from nest_integrations.lm.hf import HFLanguageModel
        from nest_integrations.retrieval.chroma import ChromaPassageStore

        cfg = NestConfig.from_preset(config) if isinstance(config, str) else config or NestConfig()
        root = persist_dir or paths.default_persist_dir()
        if chroma_url:  # passages on the server; token keys stay in the local persist dir
            retriever = ChromaPassageStore.from_url(chroma_url, collection, persist_dir=root)
        else:
            retriever = ChromaPassageStore.from_persist_dir(root, collection)
        retriever.count()  # a missing collection fails here, with the existing ones listed
        if model is None:
            lm = HFLanguageModel.from_default(device=device, key_source=cfg.key_source)
        else:
            lm = HFLanguageModel.from_pretrained(model, device=device, key_source=cfg.key_source)
        retriever.lm = lm  # one model for ingest-time and query-time keys
        return cls(lm, retriever, DiskKeyStore.open(paths.keys_dir(root), lm), cfg)

    # ----------------------------------------------------------------- stage 1 and 2
    def retrieve(self, query: str, k: int | None = None) -> list[Passage]:
        """Stage 1: the top-k passages for ``query`` (k defaults to ``n_passages``)."""
        if self.retriever is None or not query.strip():
            return []
        passages = self.retriever.retrieve(query, k or self.config.n_passages)
        seen: set[str] = set()
        unique = []
        for p in passages:
            if p.id not in seen:
                seen.add(p.id)
                unique.append(p)
        return unique

    def build_memory(self, passages: Sequence[Passage]) -> TokenMemory:
        """Stage 2: the token memory of ``passages`` from the key store (encoding new ones)."""
        from nest_integrations.index.store import ensure_keys

        keys = ensure_keys(self.key_store, self.lm, list(passages))
        return TokenMemory(keys, device=self.lm.device)

    # ----------------------------------------------------------------- public API
    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        config: NestConfig | None = None,
        passages: Sequence[Passage] | None = None,
        query: str | None = None,
    ) -> NestResult:
        """Generate for a string prompt (completion) or chat messages (``[{"role","content"}]``).

        ``passages`` skips stage-1 retrieval; ``query`` overrides the retrieval query (default:
        the prompt, or the last user message). ``config`` overrides the engine's config for
        this call.
        """
        result = None
        for chunk in self.stream(
            prompt,
            max_new_tokens=max_new_tokens,
            stop=stop,
            config=config,
            passages=passages,
            query=query,
        ):
            result = chunk.result or result
        assert result is not None
        return result

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        config: NestConfig | None = None,
        passages: Sequence[Passage] | None = None,
        query: str | None = None,
    ) -> Iterator[StreamChunk]:
        """Like ``generate`` but yields text deltas with their citation; the last chunk has
        empty text and carries the ``NestResult``."""
        cfg = config if config is not None else self.config
        if str(cfg.key_source) != str(self.lm.key_source):
            raise ValueError(
                f"config.key_source={cfg.key_source!r} differs from the model's "
                f"{self.lm.key_source!r}"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use an integer >= 1")
        stop_list = [s for s in (stop or []) if s]
        t_start = time.perf_counter()
        stats = NestStats()
        question = _query_of(prompt)
        if not question.strip():
            raise ValueError("the prompt is empty: pass a non-empty string or user message")

        t0 = time.perf_counter()
        if passages is None:
            passages = self.retrieve(query or question, cfg.n_passages)
        passages = list(passages)
        stats.time_retrieval = time.perf_counter() - t0

        t0 = time.perf_counter()
        memory = self.build_memory(passages) if passages else None
        stats.time_keys = time.perf_counter() - t0
        stats.n_passages = len(passages)
        stats.n_keys = len(memory) if memory is not None else 0

        prompt_ids = self.prompt_ids(prompt, passages[: cfg.ra_passages])
        max_new = self._check_length(len(prompt_ids), max_new_tokens)
        stats.prompt_tokens = len(prompt_ids)
        gen = None
        if cfg.temperature > 0:
            gen = torch.Generator()
            gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
        run = _Run(cfg, memory, passages, max_new, stop_list, stats, gen)
        yield from self._decode(run, prompt_ids)
        run.done = True  # flush text held back for stop strings or partial characters
        yield from self._deltas(run, bool(run.sources) and run.sources[-1] is not None)
        stats.time_total = time.perf_counter() - t_start
        stats.mean_lambda = run.lam_sum / run.lam_n if run.lam_n else 1.0
        yield StreamChunk(text="", result=self._result(run))

    # ----------------------------------------------------------------- the decoding loop
    def _decode(self, run: _Run, prompt_ids: list[int]) -> Iterator[StreamChunk]:
        cfg, memory, lm = run.config, run.memory, self.lm
        eos = lm.eos_token_ids
        cache = lm.new_cache()
        logits, keys = self._forward(run, prompt_ids, cache)  # prefill
        cur: tuple[torch.Tensor, torch.Tensor] | None = (logits[-1:], keys[-1:])
        pending: int | None = None
        stream_row: int | None = None  # continue copying here after a full acceptance
        while not run.done and len(run.out_ids) < run.max_new_tokens:
            if cur is None:  # feed the pending token: the cache then holds every commit
                cur = self._forward(run, [pending], cache)  # type: ignore[list-item]
            dist = self._distribution(run, *cur)
            budget = run.max_new_tokens - len(run.out_ids)
            rows: list[int] = []
            continuation = stream_row is not None
            if continuation and memory is not None:
                rows = span_draft(memory, stream_row, min(cfg.max_span, budget), eos)
            stream_row = None
            if not rows:
                continuation = False
                w = choose_token(dist.p[0], cfg.temperature, cfg.top_p, run.generator)
                start = None
                lam = float(dist.lam[0])
                if memory is not None and cfg.span_copying and use_span(lam, cfg.span_threshold):
                    start = span_start(dist.hits, memory, w)
                if start is None or w in eos:  # token mode
                    yield from self._commit(run, [w], [self._token_source(run, dist, w)])
                    run.done = run.done or w in eos
                    pending, cur = w, None
                    continue
                rows = span_draft(memory, start, min(cfg.max_span, budget), eos)  # type: ignore[arg-type]
            # ------------------------------------------------ verify the draft
            assert memory is not None
            draft = memory.values[torch.as_tensor(rows, device=memory.device)]  # (L,)
            run.stats.verify_steps += 1
            run.stats.drafted_tokens += len(rows)
            if continuation and self._accept(run, dist.p, draft[:1]) == 0:
                c = choose_token(dist.p[0], cfg.temperature, cfg.top_p, run.generator)
                yield from self._commit(run, [c], [None])
                run.done = run.done or c in eos
                pending, cur = c, None
                continue
            before = lm.cache_length(cache)
            logits, keys = self._forward(run, draft.tolist(), cache)  # ONE pass: (L, V), (L, d)
            vdist = self._distribution(run, logits[:-1], keys[:-1]) if len(rows) > 1 else None
            # row i of p_rows scores draft token i: the current p_M, then the draft's outputs
            m = 1 + (self._accept(run, vdist.p, draft[1:]) if vdist is not None else 0)
            run.stats.accepted_tokens += m
            srcs = [memory.source(r) for r in rows[:m]]
            if not cfg.strict_acceptance:  # strict mode keeps p_M history-free (lossless)
                memory.mask(rows[:m])
            yield from self._commit(run, draft[:m].tolist(), srcs)
            if m == len(rows):
                cur = (logits[-1:], keys[-1:])  # the cache holds the whole draft
                nxt = rows[-1] + 1
                if nxt < len(memory) and memory.source(nxt)[0] == memory.source(rows[-1])[0]:
                    stream_row = nxt
                continue
            lm.crop_cache(cache, before + m)  # keep exactly the accepted tokens
            cur = None
            if run.done or len(run.out_ids) >= run.max_new_tokens:
                break
            c = choose_token(vdist.p[m - 1], cfg.temperature, cfg.top_p, run.generator)  # type: ignore[union-attr]
            yield from self._commit(run, [c], [None])
            run.done = run.done or c in eos
            pending = c

    def _forward(
        self, run: _Run, ids: list[int], cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        out = self.lm.forward(ids, cache)
        run.stats.time_lm += time.perf_counter() - t0
        run.stats.forward_passes += 1
        return out

    def _distribution(self, run: _Run, logits: torch.Tensor, keys: torch.Tensor) -> StepDistribution:
        cfg = run.config
        t0 = time.perf_counter()
        dist = nest_distribution(
            logits,
            keys,
            run.memory,
            n_neighbors=cfg.n_neighbors,
            alpha=cfg.rrc_offset,
            tau=cfg.rrc_scale,
            lm_temperature=cfg.lm_temperature,
            mu=cfg.knn_temperature,
            fixed_lm_weight=cfg.fixed_lm_weight,
        )
        run.stats.time_knn += time.perf_counter() - t0
        run.lam_sum += float(dist.lam[0])
        run.lam_n += 1
        return dist

    def _accept(self, run: _Run, p: torch.Tensor, draft: torch.Tensor) -> int:
        cfg = run.config
        if cfg.strict_acceptance:
            return strict_accept_count(p, draft)
        if cfg.temperature > 0:
            return sampled_accept_count(p, draft, cfg.relaxation, run.generator)
        return relaxed_accept_count(p, draft, cfg.relaxation)

    def _token_source(self, run: _Run, dist: StepDistribution, w: int) -> Source:
        """Token mode cites the nearest neighbour when it carries the emitted token (§8)."""
        memory = run.memory
        if memory is None or dist.hits.empty or not run.config.cite_token_mode:
            return None
        row = int(dist.hits.rows[0, 0])
        return memory.source(row) if memory.value(row) == w else None

    def _commit(self, run: _Run, ids: list[int], sources: list[Source]) -> Iterator[StreamChunk]:
        """Append tokens (cut at EOS and stop strings) and yield the new text."""
        eos = self.lm.eos_token_ids
        for tok, src in zip(ids, sources):
            if run.done:
                break
            if tok in eos:
                run.done = True
                run.stats.finish_reason = "stop"
                break
            run.out_ids.append(tok)
            run.sources.append(src)
            run.token_ends.append(len(self.lm.detokenize(run.out_ids)))
        run.text = self.lm.detokenize(run.out_ids)
        self._apply_stop_strings(run)
        if len(run.out_ids) >= run.max_new_tokens and not run.stats.finish_reason:
            run.stats.finish_reason = "length"
        yield from self._deltas(run, bool(ids) and sources[0] is not None, ids)

    def _apply_stop_strings(self, run: _Run) -> None:
        if not run.stop:
            return
        hits = [i for i in (run.text.find(s) for s in run.stop) if i >= 0]
        if not hits:
            return
        cut = min(hits)
        keep = sum(1 for e in run.token_ends if e <= cut)
        del run.out_ids[keep:], run.sources[keep:], run.token_ends[keep:]
        run.text = run.text[:cut]
        run.done = True
        run.stats.finish_reason = "stop"

    def _deltas(self, run: _Run, copied: bool, ids: Sequence[int] = ()) -> Iterator[StreamChunk]:
        text = run.text
        safe = len(text)
        if not run.done:
            if text.endswith("\ufffd"):
                return  # hold back an incomplete multi-byte character
            safe -= _stop_prefix_overlap(text, run.stop)  # it may become a stop string
        if safe <= run.emitted:
            return
        delta = text[run.emitted : safe]
        citation = None
        if copied:
            cites = self._citations(run)
            citation = cites[-1] if cites and cites[-1].end > run.emitted else None
        run.emitted = safe
        yield StreamChunk(text=delta, citation=citation, token_ids=tuple(ids))

    def _citations(self, run: _Run) -> list:
        offsets = run.memory.offsets if run.memory is not None else []
        ends = [min(e, len(run.text)) for e in run.token_ends]
        return build_citations(run.sources, ends, run.passages, offsets)

    def _result(self, run: _Run) -> NestResult:
        stats = run.stats
        stats.new_tokens = len(run.out_ids)
        stats.copied_tokens = stats.accepted_tokens
        stats.attributed_tokens = sum(s is not None for s in run.sources)
        if not stats.finish_reason:
            stats.finish_reason = "length"
        pid = [p.id for p in run.passages]
        return NestResult(
            text=run.text,
            token_ids=list(run.out_ids),
            citations=self._citations(run),
            stats=stats,
            passages=list(run.passages),
            token_sources=[(pid[s[0]], s[1]) if s is not None else None for s in run.sources],
        )

    # ----------------------------------------------------------------- prompts
    def prompt_ids(self, prompt: Prompt, ra: Sequence[Passage] = ()) -> list[int]:
        """The token ids the engine decodes from: a string prompt as raw text, chat messages
        through the chat template, with the ``ra`` passages in the prompt (RA-NEST) if any.
        Scoring code (perplexity) uses it to condition on exactly the generation prompt."""
        context = "\n\n".join(p.text for p in ra)
        if isinstance(prompt, str):
            text = RA_TEXT_TEMPLATE.format(context=context, prompt=prompt) if ra else prompt
            return self.lm.tokenize(text)
        messages = [dict(m) for m in prompt]
        if ra:
            last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
            messages[last]["content"] = RA_CHAT_TEMPLATE.format(
                context=context, question=messages[last]["content"]
            )
        return self.lm.chat_prompt(messages)

    def _check_length(self, n_prompt: int, max_new_tokens: int) -> int:
        ctx = self.lm.max_context
        if n_prompt >= ctx:
            raise ValueError(
                f"the prompt is {n_prompt} tokens but the model's context is {ctx} tokens: "
                "shorten the prompt (or lower ra_passages)"
            )
        if n_prompt + max_new_tokens > ctx:
            LOG.warning(
                "max_new_tokens=%d does not fit the context (%d prompt tokens of %d): "
                "generating at most %d tokens",
                max_new_tokens, n_prompt, ctx, ctx - n_prompt,
            )
            return ctx - n_prompt
        return max_new_tokens


def _stop_prefix_overlap(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _query_of(prompt: Prompt) -> str:
    """The retrieval query: the prompt, or the last user message of a chat."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    if not messages:
        return ""
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return str(messages[-1].get("content", ""))
