"""The compared systems (same model, corpus, prompts and retrieved passages) and how one
example is generated and scored with each.

| key     | name     | prompt                  | p_M                              | spans      |
|---------|----------|-------------------------|----------------------------------|------------|
| base    | Base LM  | the prompt              | p_LM (empty memory)              | no         |
| ra      | +RA      | top-3 passages + prompt | p_LM (lambda fixed at 1)         | no         |
| knn-lm  | +kNN-LM  | the prompt              | 0.7 p_LM + 0.3 p_kNN (two-stage) | no         |
| nest    | +NEST    | the prompt              | RRC mixture                      | yes        |
| ra-nest | +RA-NEST | top-3 passages + prompt | RRC mixture                      | gamma 5e-1 |

Every system decodes greedily through ``NestEngine`` so stopping (EOS, stop strings), timing
and the prompt templates are identical. The base and RA systems never cite (``cite_token_mode``
off); kNN-LM cites token-mode tokens that equal the nearest neighbour's value (the paper's
rule), NEST also cites copied spans.

Perplexity of a reference is teacher-forced with ONE forward pass over prompt + reference:
``lm.forward(ids, lm.new_cache())`` gives logits and query vectors at every position, and the
reference tokens are scored under the system's distribution (p_LM, or p_M over the unmasked
memory of the retrieved passages, mixed in log space).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from nest_integrations.config import NestConfig
from nest_integrations.evaluation import metrics
from nest_integrations.evaluation.tasks import Example
from nest_integrations.types import Passage

#: RA / RA-NEST: passages put in the prompt (the paper's RA baseline uses the top 3).
RA_PASSAGES = 3
#: The two-stage kNN-LM baseline's fixed weight on p_LM (paper: 0.7 on Wikipedia).
KNN_LM_WEIGHT = 0.7
#: RA-NEST's relaxation gamma on Wikipedia tasks (paper).
RA_NEST_GAMMA = 5e-1

SYSTEM_KEYS = ("base", "ra", "knn-lm", "nest", "ra-nest")
#: Systems that need more than the settings: ``nest-cal`` is NEST with ``nest calibrate``'s
#: fitted mu, alpha, tau (``make_systems(..., calibration=overrides)``).
EXTRA_SYSTEM_KEYS = ("nest-cal",)
ALL_SYSTEM_KEYS = SYSTEM_KEYS + EXTRA_SYSTEM_KEYS


@dataclass(frozen=True)
class System:
    """One compared system.

    Attributes:
        key: short id (``SYSTEM_KEYS``).
        name: row label (the paper's Table 1 style).
        config: the ``NestConfig`` its generations use.
        memory: whether its distribution uses the token memory (p_M rather than p_LM).
        ra: whether the top passages go into the prompt.
    """

    key: str
    name: str
    config: NestConfig
    memory: bool
    ra: bool

    def passages_for(self, passages: Sequence[Passage]) -> list[Passage]:
        """What the engine gets: all retrieved passages for memory systems, the top ones for
        RA, none for the base LM."""
        if self.memory:
            return list(passages)
        if self.ra:
            return list(passages[: self.config.ra_passages])
        return []


def make_systems(
    config: NestConfig,
    keys: Sequence[str] = SYSTEM_KEYS,
    ra_nest_gamma: float = RA_NEST_GAMMA,
    calibration: dict[str, Any] | None = None,
) -> list[System]:
    """The systems named by ``keys``, all derived from ``config`` (the NEST setting);
    ``nest-cal`` needs ``calibration`` (NestConfig overrides from ``nest calibrate``)."""
    unknown = [k for k in keys if k not in ALL_SYSTEM_KEYS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}: choose from {ALL_SYSTEM_KEYS}")
    if "nest-cal" in keys and not calibration:
        raise ValueError("system 'nest-cal' needs the calibration overrides")
    plain = dict(span_copying=False, fixed_lm_weight=1.0, cite_token_mode=False)
    table = {
        "base": System("base", "Base LM", config.replace(ra_passages=0, **plain), False, False),
        "ra": System("ra", "+RA", config.replace(ra_passages=RA_PASSAGES, **plain), False, True),
        "knn-lm": System(
            "knn-lm",
            "+kNN-LM",
            config.replace(ra_passages=0, span_copying=False, fixed_lm_weight=KNN_LM_WEIGHT),
            True,
            False,
        ),
        "nest": System("nest", "+NEST", config.replace(ra_passages=0), True, False),
        "ra-nest": System(
            "ra-nest",
            "+RA-NEST",
            config.replace(ra_passages=RA_PASSAGES, relaxation=ra_nest_gamma),
            True,
            True,
        ),
    }
    if calibration:
        table["nest-cal"] = System(
            "nest-cal", "+NEST (calibrated)", config.replace(ra_passages=0, **calibration),
            True, False,
        )
    return [table[k] for k in keys]


# ----------------------------------------------------------------------------- prompts


def prompt_ids(
    engine: Any, example: Example, system: System, passages: Sequence[Passage]
) -> list[int]:
    """The prompt token ids ``engine.generate`` uses for this system (same template code)."""
    ra = passages[: system.config.ra_passages] if system.ra else []
    return engine.prompt_ids(example.engine_prompt(), list(ra))


# ----------------------------------------------------------------------------- perplexity


@torch.inference_mode()
def reference_logprobs(
    engine: Any,
    example: Example,
    system: System,
    passages: Sequence[Passage],
    ref_ids: Sequence[int],
) -> torch.Tensor:
    """log p(reference token) under the system's distribution, teacher-forced: ``(R,)`` fp64.

    One forward pass over prompt + reference; the row before each reference token gives its
    logits and query vector. Memory systems mix p_LM with p_kNN over the unmasked memory of
    ``passages`` (lambda from RRC or fixed), in log space.
    """
    from nest_integrations.core.mixture import knn_distribution, log_mixture, rrc_lambda

    lm, cfg = engine.lm, system.config
    p_ids = prompt_ids(engine, example, system, passages)
    logits, queries = lm.forward(list(p_ids) + list(ref_ids), lm.new_cache())
    rows = slice(len(p_ids) - 1, len(p_ids) - 1 + len(ref_ids))
    logits, queries = logits[rows], queries[rows]  # (R, V), (R, d)
    target = torch.as_tensor(list(ref_ids), device=logits.device)  # (R,)
    log_lm = torch.log_softmax(logits.double() / cfg.lm_temperature, dim=-1)
    log_lm = log_lm.gather(1, target[:, None])[:, 0]  # (R,)
    if not system.memory or not passages:
        return log_lm
    memory = engine.build_memory(passages)
    if memory.n_available == 0:
        return log_lm
    hits = memory.search(queries, cfg.n_neighbors)
    mu = cfg.knn_temperature or 1.0 / math.sqrt(queries.shape[-1])
    p_knn = knn_distribution(hits, memory.values, logits.shape[-1], mu)
    p_knn = p_knn.gather(1, target[:, None])[:, 0].double()  # (R,)
    if cfg.fixed_lm_weight is not None:
        lam = torch.full_like(log_lm, float(cfg.fixed_lm_weight))
    else:
        lam = rrc_lambda(hits, cfg.rrc_offset, cfg.rrc_scale).double()
    return log_mixture(log_lm, p_knn, lam)


# ----------------------------------------------------------------------------- one example


def run_example(
    engine: Any,
    example: Example,
    system: System,
    passages: Sequence[Passage],
    *,
    max_new_tokens: int,
    scorer: Any = None,
    score_perplexity: bool = True,
) -> dict[str, Any]:
    """Generate ``example`` with ``system`` and score it: one flat record (JSON-ready)."""
    lm = engine.lm
    given = system.passages_for(passages)
    t0 = time.perf_counter()
    result = engine.generate(
        example.engine_prompt(),
        max_new_tokens=max_new_tokens,
        stop=list(example.stop) or None,
        config=system.config,
        passages=given,
    )
    wall = time.perf_counter() - t0
    # E3: the engine already stops at EOS and stop strings; cut again so scoring never sees
    # text past them whatever produced it.
    text = metrics.cut_at_stop(result.text, example.stop)
    st = result.stats
    sources = result.token_sources
    runs = metrics.span_lengths(sources)
    correct, total = metrics.citation_hits(
        [c.doc_id for c in result.citations], example.gold_doc_id
    )
    rec: dict[str, Any] = {
        "example": example.id,
        "system": system.key,
        "text": text,
        "new_tokens": st.new_tokens,
        "finish_reason": st.finish_reason,
        "attributed_tokens": sum(s is not None for s in sources),
        "cited_runs": len(runs),
        "cited_run_tokens": sum(runs),
        "citations_correct": correct,
        "citations_total": total,
        "cited_docs": sorted({c.doc_id for c in result.citations}),
        "forward_passes": st.forward_passes,
        "verify_steps": st.verify_steps,
        "drafted_tokens": st.drafted_tokens,
        "accepted_tokens": st.accepted_tokens,
        "time_total": st.time_total,
        "time_lm": st.time_lm,
        "time_knn": st.time_knn,
        "time_keys": st.time_keys,
        "wall": wall,
        "mean_lambda": st.mean_lambda,
        "prompt_tokens": st.prompt_tokens,
        "n_keys": st.n_keys,
    }
    if example.reference is not None:
        r = metrics.rouge(text, example.reference, scorer)
        rec.update({f"{k}_f": v["f"] for k, v in r.items()})
        if score_perplexity:
            ref_ids = lm.tokenize(example.reference)
            lp = reference_logprobs(engine, example, system, passages, ref_ids)
            rec["nll_sum"] = float(-lp.sum())
            rec["ref_tokens"] = len(ref_ids)
    if example.answers:
        rec["alr"] = metrics.answer_recall(text, example.answers)
        rec["answer_token_recall"] = metrics.answer_token_recall(text, example.answers)
    if example.grounded:
        rec.update(grounded_record(lm, result, text, example))
    return rec


def grounded_record(lm: Any, result: Any, text: str, example: Example) -> dict[str, Any]:
    """The grounded-QA metrics of one output (see ``evaluation.grounded``)."""
    from nest_integrations.evaluation import grounded

    answer = example.answers[0] if example.answers else None
    gold = example.gold_doc_id
    cites = list(result.citations)
    ends = grounded.token_char_ends(lm, result.token_ids)
    return {
        "correct": float(
            any(grounded.answer_correct(text, a, example.distractors) for a in example.answers)
        ),
        "wrong_entity": float(grounded.wrong_entity(text, example.distractors)),
        "cited_chars": sum(len(c.text) for c in cites),
        "gold_cited_chars": sum(len(c.text) for c in cites if c.doc_id == gold),
        "off_topic_tokens": grounded.off_topic_tokens(result.token_sources, result.passages, gold),
        "run_on_tokens": grounded.run_on_tokens(result.text, ends, answer, example.distractors),
    }


__all__ = [
    "ALL_SYSTEM_KEYS",
    "EXTRA_SYSTEM_KEYS",
    "grounded_record",
    "KNN_LM_WEIGHT",
    "RA_NEST_GAMMA",
    "RA_PASSAGES",
    "SYSTEM_KEYS",
    "System",
    "make_systems",
    "prompt_ids",
    "reference_logprobs",
    "run_example",
]
