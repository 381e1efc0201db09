"""NestEngine: one generation is retrieve -> plan -> loop -> result.

Stage 1 retrieves passages, the answer policy (``policy/``) plans the method, prompt passages
and guards, stage 2 builds the token memory (NEST-family methods), and the verify-and-commit loop
(``loop.py``) drives the method's drafter. Prompts live in ``prompts.py``, output text in
``text_stream.py``; this module wires them together and builds the result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.decoding.commits import Decoded
from nest_integrations.decoding.loop import DecodeLoop
from nest_integrations.decoding.target import session
from nest_integrations.decoding.text_stream import TextStream
from nest_integrations.decoding.prompts import (
    REWRITE_CALL,
    Prompt,
    chat_retry,
    check_string_prompts,
    prompt_ids,
    query_of,
    standalone_query,
    string_as_chat,
)
from nest_integrations.defaults import DEFAULT_MAX_NEW_TOKENS
from nest_integrations.drafters import DrafterContext, get_method
from nest_integrations.index.base import KeyStore
from nest_integrations.lm.base import LanguageModel
from nest_integrations.policy import AnswerPlan, AnswerPolicy, plan_answer
from nest_integrations.retrieval.base import PassageRetriever
from nest_integrations.types import NestResult, NestStats, Passage, StreamChunk

if TYPE_CHECKING:
    from nest_integrations.attribution import Attributor, SentenceStream

LOG = logging.getLogger(__name__)


class NestEngine:
    """Nearest Neighbor Speculative Decoding over a passage retriever and a key store.

    Setup:
        .. code-block:: bash

            nest ingest --sample          # embedded Chroma + token keys of the sample corpus

    Instantiate:
        .. code-block:: python

            import nest_integrations
            engine = nest_integrations.from_defaults(collection="nest")   # the assembly's defaults
            # or, with ready parts (nothing is defaulted but the decoding method):
            from nest_integrations import NestConfig, NestEngine
            from nest_integrations.index.in_memory_store import InMemoryKeyStore
            engine = NestEngine(lm, retriever, InMemoryKeyStore(), NestConfig.from_preset("paper"))

        ``nest_integrations.NestEngine`` is ``assembly.NestEngine``, this class with
        ``NestEngine.from_defaults(...)`` (the same as ``nest_integrations.from_defaults``).

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
        key_store: a ``KeyStore`` (required); passages without stored keys are encoded once
            and stored there. ``InMemoryKeyStore()`` keeps them for the engine's lifetime
            (what ``assembly.build_engine`` supplies when no persist dir is given).
        config: the ``NestConfig`` (required: the engine has no preset of its own; the
            assembly's default is ``defaults.DEFAULT_PRESET``).
        policy: the ``policy.AnswerPolicy`` (None: ``AnswerPolicy()``, the paper's algorithm
            with no title match and no guards; the assembly gives the preset's).
        decoding: a ``drafters.METHODS`` name, or None: the policy's (NEST without one).

    String prompts are completed as raw text (after the tokenizer's default BOS); a list of
    ``{"role", "content"}`` messages gets the model's chat template. ``string_prompts``
    (``"auto"`` | ``"completion"`` | ``"chat"``, see ``prompts.py``): with ``"auto"`` a string
    whose raw completion would be empty (an instruct model after "What is X?") is answered as
    one user message instead. NEST's relaxed acceptance changes the output distribution on purpose
    (it is not lossless); ``strict_acceptance=True`` makes it exactly greedy decoding of p_M.
    """

    def __init__(
        self,
        lm: LanguageModel,
        retriever: PassageRetriever | None,
        key_store: KeyStore,
        config: NestConfig,
        *,
        policy: AnswerPolicy | None = None,
        decoding: str | None = None,
        drafter_options: dict[str, Any] | None = None,
        string_prompts: str = "auto",
    ):
        if not isinstance(config, NestConfig):
            raise TypeError(
                f"config must be a NestConfig, not {type(config).__name__}: resolve a preset "
                "name with NestConfig.from_preset, or build with nest_integrations.from_defaults"
            )
        if key_store is None:
            raise ValueError(
                "key_store is required: pass InMemoryKeyStore() "
                "(nest_integrations.index.in_memory_store) to keep keys in memory"
            )
        self.lm = lm
        self.config = self.check_config(config)
        #: what a string prompt means for a chat model (``prompts.STRING_PROMPT_MODES``)
        self.string_prompts = check_string_prompts(string_prompts)
        if decoding is not None:
            get_method(decoding)  # fail early on an unknown method
        if policy is not None and not isinstance(policy, AnswerPolicy):
            raise TypeError(f"policy must be an AnswerPolicy, not {type(policy).__name__}: "
                            "resolve a preset name with AnswerPolicy.from_preset")
        self.policy = policy if policy is not None else AnswerPolicy()
        self.retriever = retriever
        self.key_store = key_store
        self.decoding = decoding
        self.drafter_options = dict(drafter_options or {})
        #: ``NestConfig.attribute``: one ``attribution.Attributor`` per scorer, built on use
        self._attributors: dict[str, Attributor] = {}

    def preset_config(self, name: str) -> NestConfig:
        """The config of the preset ``name`` (``config.PRESETS``) for this engine's model
        (the assembly's engine adapts it to the model's backend)."""
        return NestConfig.from_preset(name)

    def settings(
        self, config: NestConfig | str | None = None, policy: AnswerPolicy | str | None = None
    ) -> tuple[NestConfig, AnswerPolicy]:
        """A call's ``(config, policy)``: None = the engine's; a preset name (``PRESETS``)
        = that preset's config for this model (``preset_config``) and, unless ``policy`` is
        given, its policy; a policy name = that preset's policy. Other types: a TypeError."""
        if isinstance(policy, str):
            policy = AnswerPolicy.from_preset(policy)
        elif policy is not None and not isinstance(policy, AnswerPolicy):
            raise TypeError(f"policy must be an AnswerPolicy, a preset name ({_names()}) or "
                            f"None, not {type(policy).__name__}")
        if isinstance(config, str):
            name, config = config, self.preset_config(config)
            policy = policy if policy is not None else AnswerPolicy.from_preset(name)
        elif config is not None and not isinstance(config, NestConfig):
            raise TypeError(f"config must be a NestConfig, a preset name ({_names()}) or None, "
                            f"not {type(config).__name__}")
        cfg = self.check_config(config) if config is not None else self.config
        return cfg, policy if policy is not None else self.policy

    def check_config(self, config: NestConfig) -> NestConfig:
        """``config`` if this engine can decode with it, else a ``ValueError`` (its key source
        must be the model's; unset, it becomes the model's). Edges that validate early (the
        server) call this."""
        if config.key_source is None:  # unset (``NestConfig.key_source``): the model's own
            return config.replace(key_source=self.lm.key_source)
        if str(config.key_source) != str(self.lm.key_source):
            raise ValueError(
                f"NestConfig.key_source={config.key_source!r} but the language model computes "
                f"keys from {self.lm.key_source!r}: build the model with the same key_source "
                "(or pick a config with the model's)"
            )
        return config

    # ----------------------------------------------------------------- stage 1 and 2
    def retrieve(
        self, query: str, k: int | None = None, config: NestConfig | str | None = None
    ) -> list[Passage]:
        """Stage 1: the top-k passages for ``query`` (k defaults to ``n_passages``), each once
        (the policy then reorders them: ``plan``)."""
        cfg = self.settings(config)[0]
        if self.retriever is None or not query.strip():
            return []
        seen: set[str] = set()
        return [p for p in self.retriever.retrieve(query, k or cfg.n_passages)
                if not (p.id in seen or seen.add(p.id))]

    def plan(
        self, question: str, passages: Sequence[Passage], *,
        config: NestConfig | str | None = None, policy: AnswerPolicy | str | None = None,
        decoding: str | None = None,
        raw_text: bool = False,
    ) -> AnswerPlan:
        """The policy's plan for one request (``policy.plan_answer``): the method, stage 1's
        passages reordered, the RA prompt's passages, the guards (``raw_text``: the prompt is
        raw text to continue, which the relevance gate judges)."""
        cfg, pol = self.settings(config, policy)
        return plan_answer(pol, question, passages, self.retriever, n_ra=cfg.ra_passages,
                           decoding=(decoding, self.decoding), raw_text=raw_text)

    def build_memory(self, passages: Sequence[Passage]) -> TokenMemory:
        """Stage 2: the token memory of ``passages`` from the key store (encoding new ones)."""
        from nest_integrations.index.keys import ensure_keys

        keys = ensure_keys(self.key_store, self.lm, list(passages))
        return TokenMemory(keys, device=self.lm.device)

    # ----------------------------------------------------------------- public API
    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        stop: Sequence[str] | None = None,
        config: NestConfig | str | None = None,
        policy: AnswerPolicy | str | None = None,
        passages: Sequence[Passage] | None = None,
        query: str | None = None,
        decoding: str | None = None,
        drafter_options: dict[str, Any] | None = None,
    ) -> NestResult:
        """Generate for a string prompt (completion) or chat messages (``[{"role","content"}]``).

        ``passages`` skips stage-1 retrieval; ``query`` overrides the retrieval query (default:
        the prompt, or the chat's standalone question). ``config``/``policy`` override the engine's
        for this call (a ``NestConfig`` / ``AnswerPolicy``, or a preset name: ``settings``),
        ``decoding`` the method (see ``drafters.METHODS``) and ``drafter_options`` its
        drafter's options.
        """
        result = None
        for chunk in self.stream(
            prompt,
            max_new_tokens=max_new_tokens,
            stop=stop,
            config=config,
            policy=policy,
            passages=passages,
            query=query,
            decoding=decoding,
            drafter_options=drafter_options,
        ):
            result = chunk.result or result
        assert result is not None
        return result

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        stop: Sequence[str] | None = None,
        config: NestConfig | str | None = None,
        policy: AnswerPolicy | str | None = None,
        passages: Sequence[Passage] | None = None,
        query: str | None = None,
        decoding: str | None = None,
        drafter_options: dict[str, Any] | None = None,
    ) -> Iterator[StreamChunk]:
        """Like ``generate`` but yields text deltas with their citation; the last chunk has
        empty text and carries the ``NestResult``. Retrieve -> plan -> loop -> result."""
        cfg, pol = self.settings(config, policy)
        _check_budget(max_new_tokens)
        question = query_of(prompt)
        if not question.strip():
            raise ValueError("the prompt is empty: pass a non-empty string or user message")
        question = query or standalone_query(  # a chat's follow-up, made standalone
            prompt, pol.conversation, retriever=self.retriever,
            complete=lambda m: self.generate(m, **REWRITE_CALL).text)
        # an LM with its own thread pool (llama.cpp) keeps torch's few ops per step on one
        # thread while it decodes (``lm.threads.TorchThreads.on_one_thread``)
        with session(self.lm):
            t_start, stats = time.perf_counter(), NestStats()
            if passages is None:
                passages = self.retrieve(query or question, cfg.n_passages, cfg)
            as_chat = string_as_chat(self.lm, prompt, self.string_prompts)
            plan = self.plan(query or question, passages, config=cfg, policy=pol,
                             decoding=decoding, raw_text=isinstance(prompt, str) and not as_chat)
            stats.relevance = plan.relevance
            stats.timing.retrieval = time.perf_counter() - t_start
            request = _Request(self, prompt, plan, cfg, stats, [s for s in (stop or []) if s],
                               {**self.drafter_options, **(drafter_options or {})})
            loop, text = request.loop(as_chat, max_new_tokens)
            decoded = yield from text.follow(loop.run())
            _first_token(stats, text, t_start)
            if decoded.quote_rejected:  # the model said no to the evidence: answer without it
                stats.evidence, stats.finish_reason = "rejected", ""
                request.plan = plan = plan.without_evidence()
                loop, text = request.loop(as_chat, max_new_tokens)
                decoded = yield from text.follow(loop.run())
                _first_token(stats, text, t_start)
            elif stats.quote_score is not None:  # the quote was committed (and checked)
                stats.evidence = "quoted"
            ended_at_once = (not decoded.ids and stats.finish_reason == "stop"
                             and not text.stopped)
            if not as_chat and chat_retry(self.lm, prompt, self.string_prompts, ended_at_once):
                stats.finish_reason = ""  # "auto": a completion that ended at once is a question
                loop, text = request.loop(True, max_new_tokens)
                decoded = yield from text.follow(loop.run())
                _first_token(stats, text, t_start)
            result = self._result(decoded, text, stats)
            stats.timing.total = time.perf_counter() - t_start
            stats.mean_lambda = decoded.mean_lambda
            yield StreamChunk(text="", result=result)

    # ----------------------------------------------------------------- results
    def _result(self, decoded: Decoded, text: TextStream, stats: NestStats) -> NestResult:
        """The result of a loop's output (``decoded``) and the text its stream made of it (the
        text, the citations, and the passages it learned from the commits)."""
        stats.new_tokens = len(decoded.ids)
        stats.copied_tokens = sum(decoded.copied)
        stats.attributed_tokens = sum(s is not None for s in decoded.sources)
        if not stats.finish_reason:
            stats.finish_reason = "length"
        passages = text.passages
        pid = [p.id for p in passages]
        result = NestResult(
            text=text.out.text,
            token_ids=list(decoded.ids),
            citations=text.citations(),
            stats=stats,
            passages=list(passages),
            token_sources=[(pid[s[0]], s[1]) if s is not None else None for s in decoded.sources],
        )
        if text.live is not None:
            self._attribute(result, text.live)
        return result

    def sentence_stream(
        self, config: NestConfig, passages: Sequence[Passage]
    ) -> SentenceStream:
        """``NestConfig.attribute`` (on in the ``grounded`` and ``copy`` presets, the entry
        points' default): a ``SentenceStream`` over this generation's passages, with the
        engine's ``Attributor`` for the scorer (one per engine and scorer, built on first use:
        its passage-sentence embeddings stay cached across generations)."""
        from nest_integrations.attribution import AttributionConfig, Attributor, SentenceStream

        scorer = config.attribute_scorer
        attributors = self._attributors
        if scorer not in attributors:
            uses_keys = scorer in ("keys", "combined")
            attributors[scorer] = Attributor(
                AttributionConfig(scorer=scorer), lm=self.lm,
                key_store=self.key_store if uses_keys else None,
            )
        return SentenceStream(attributors[scorer], passages)

    @staticmethod
    def _attribute(result: NestResult, live: SentenceStream) -> None:
        """Add the support citations of the sentences the answer did not copy (or whose verbatim
        text none of its citations covers), and the unsupported sentences: those streamed
        (``live``, a ``SentenceStream``) and the last sentence's (copied citations keep their
        kind). Every sentence is then cited or flagged (``attribution.unaccounted``)."""
        live.feed(result.text, final=True, cited=result.citations)
        support = list(live.support)
        result.citations = sorted(result.citations + support, key=lambda c: (c.start, c.end))
        result.unsupported = list(live.unsupported)
        LOG.debug("attribution: %d support citations, %d unsupported, %.3f s", len(support),
                  len(live.unsupported), live.time)

    # ----------------------------------------------------------------- prompts
    def prompt_ids(self, prompt: Prompt, ra: Sequence[Passage] = ()) -> list[int]:
        """The token ids the engine decodes from (see ``prompts.prompt_ids``). Scoring code
        (perplexity) uses it to condition on exactly the generation prompt."""
        return prompt_ids(self.lm, prompt, ra)


def _fit_budget(lm: LanguageModel, n_prompt: int, max_new_tokens: int) -> int:
    """``max_new_tokens``, or fewer where the prompt and they would not fit the context."""
    ctx = lm.max_context
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


def _names() -> str:
    return ", ".join(repr(n) for n in PRESETS)


def _check_budget(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
        max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use an integer >= 1")


def _first_token(stats: NestStats, text: TextStream, t_start: float) -> None:
    """``stats.timing.first_token``: from ``t_start`` to the stream's first token, if any."""
    if text.first_token_at is not None and not stats.timing.first_token:
        stats.timing.first_token = text.first_token_at - t_start


@dataclass
class _Request:
    """One generation's planned parts and its decode loops: a loop per reading of the prompt
    (raw text, then chat when the completion ended at once), each with a fresh memory."""

    engine: NestEngine
    prompt: Prompt
    plan: AnswerPlan
    config: NestConfig
    stats: NestStats
    stop: list[str]
    options: dict[str, Any]
    generator: torch.Generator | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.config.temperature > 0:  # a private RNG: the global torch RNG is never touched
            self.generator = torch.Generator()
            if self.config.seed is not None:
                self.generator.manual_seed(self.config.seed)
            else:
                self.generator.seed()

    def loop(self, as_chat: bool, max_new_tokens: int) -> tuple[DecodeLoop, TextStream]:
        """A decode loop over the prompt read as chat messages or raw text, and the text
        stream that turns its commits into chunks (and is the loop's stopping criterion)."""
        engine, plan, cfg, stats = self.engine, self.plan, self.config, self.stats
        passages = list(plan.passages)  # each part below takes its own copy: none is shared
        chat = as_chat or not isinstance(self.prompt, str)
        method = plan.method_for(chat)
        stats.decoding = method.name
        t0 = time.perf_counter()
        memory = engine.build_memory(passages) if passages and method.uses_memory else None
        stats.timing.keys += time.perf_counter() - t0
        stats.n_passages, stats.n_keys = len(passages), len(memory) if memory is not None else 0
        ids = prompt_ids(engine.lm, self.prompt, plan.prompt_passages, as_chat=as_chat)
        max_new = _fit_budget(engine.lm, len(ids), max_new_tokens)
        stats.prompt_tokens = len(ids)
        live = engine.sentence_stream(cfg, passages) if cfg.attribute else None
        ctx = DrafterContext(engine.lm, cfg, ids, list(passages), memory, self.options,
                             engine.retriever, stats, plan.prompt_passages, plan.guards,
                             evidence=plan.evidence if chat else None)
        drafter = method.make_drafter(ctx) if method.make_drafter is not None else None
        offsets = list(memory.offsets) if memory is not None else [None] * len(passages)
        text = TextStream(engine.lm.detokenize, passages, offsets,
                          kind="copy" if method.uses_memory else "verbatim",
                          min_tokens=cfg.min_citation_tokens,
                          min_words=plan.guards.min_citation_words, stop=self.stop,
                          repeat_guard=plan.guards.stop_on_repeat, live=live,
                          evidence=ctx.evidence, answer=chat)
        loop = DecodeLoop(
            engine.lm, method, drafter, config=cfg, prompt_ids=ids, memory=memory,
            passages=passages, offsets=offsets, max_new_tokens=max_new, stats=stats,
            generator=self.generator, guards=plan.guards, stopping=text,
        )  # fmt: skip
        return loop, text
