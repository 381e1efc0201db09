"""Which sentence answers: the features of every candidate evidence sentence, and the rules
that pick one, measured on a split (issue 60, "The sentence that answers").

No decoding. For each prompt, stage 1 and the ``grounded`` policy's plan give the RA prompt's
passages; every sentence of those passages is a candidate (``policy.evidence.candidates``), with:

- ``overlap``, ``cosine``, ``combined``: the evidence scorers of ``policy.evidence``;
- ``lead``: the sentence opens its document (the first sentence of the document's first
  passage that is not a heading);
- ``lm``: the target LM's mean log-probability of the sentence's tokens as the answer, after
  the RA chat prompt (what the loop's quote pass computes for free: ``decoding.loop``);
- ``lm_first``: the log-probability of its first token there.

A candidate is right for a closed question when it holds the gold value and is on the gold
document (``evaluation.grounded.answer_correct``), for an open-ended prompt when it is on the
gold document and opens with its lead (``benchmarks.harness.answer_metrics.opens_with_lead``
against the first sentence of the prompt's gold text: a label that does not depend on the
package's own ``lead`` flag). ``--rules`` prints how often each pick rule (``RULES``) picks a right
candidate, per set and family; the records go to ``--out`` as JSON Lines for other rules.

    python -m benchmarks.evidence_rank --split dev --sets entities,open --n-closed 24 \\
        --n-open 16 --out /tmp/rank_dev.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import robust
from nest_integrations import assembly
from benchmarks.harness.answer_metrics import first_sentence, opens_with_lead
from nest_integrations.core.evidence import overlap_scores
from nest_integrations.evaluation.grounded import answer_correct
from nest_integrations.policy.evidence import candidates as evidence_candidates

LOG = logging.getLogger("evidence_rank")


def lm_scores(lm: Any, prompt_ids: list[int], texts: list[str]) -> list[tuple[float, float]]:
    """Per text: the mean and the first token's log-probability of its tokens after
    ``prompt_ids`` (one prefill, then one chain pass per text, cropped back)."""
    cache = lm.new_cache()
    logits, _ = lm.forward(prompt_ids, cache, last=1)
    first = torch.log_softmax(logits[-1].float(), dim=-1)
    n = lm.cache_length(cache)
    out = []
    for text in texts:
        ids = list(lm.tokenize(text))[:48]
        if not ids:
            out.append((-99.0, -99.0))
            continue
        rows, _ = lm.forward(ids[:-1], cache) if len(ids) > 1 else (None, None)
        lp = [float(first[ids[0]])]
        if rows is not None:
            logp = torch.log_softmax(rows.float(), dim=-1)
            lp += [float(logp[i, t]) for i, t in enumerate(ids[1:])]
        lm.crop_cache(cache, n)
        out.append((sum(lp) / len(lp), lp[0]))
    return out


def records(items: list[robust.Item], roots: dict[str, Path], with_lm: bool = True
            ) -> list[dict[str, Any]]:
    engines: dict[str, Any] = {}
    out = []
    for k, item in enumerate(items):
        if item.collection not in engines:
            engines[item.collection] = assembly.build_engine(
                robust.system_spec("default", item.collection, roots["torch"]))
        engine = engines[item.collection]
        passages = engine.retrieve(item.prompt)
        plan = engine.plan(item.prompt, passages)
        cands = evidence_candidates(item.prompt, plan.prompt_passages, "combined",
                                    engine.retriever)
        if not cands:
            continue
        messages = [{"role": "user", "content": item.prompt}]
        ids = engine.prompt_ids(messages, plan.prompt_passages)
        texts = [c.text for c in cands]
        lms = lm_scores(engine.lm, ids, texts) if with_lm else [(0.0, 0.0)] * len(texts)
        gold_first = first_sentence(item.gold_text) if item.kind == "open" else ""
        raw = overlap_scores(item.prompt, texts)
        rows = []
        for c, (lm_mean, lm_first), o_raw in zip(cands, lms, raw):
            on_gold = c.doc_id == item.gold_doc_id
            right = on_gold and (opens_with_lead(c.text, gold_first) if item.kind == "open"
                                 else answer_correct(c.text, item.answer, item.distractors))
            rows.append({"text": c.text[:200], "overlap": c.overlap, "cosine": c.cosine,
                         "overlap_raw": float(o_raw),
                         "combined": c.score, "lead": c.lead, "heading": c.heading,
                         "position": c.position, "lm": lm_mean, "lm_first": lm_first,
                         "on_gold": on_gold, "right": bool(right)})
        out.append({"set": item.set, "family": item.family, "qid": item.qid,
                    "prompt": item.prompt, "kind": item.kind, "cands": rows})
        if k % 20 == 0:
            LOG.info("%d/%d", k, len(items))
    return out


def _best(cands: list[dict[str, Any]], key: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
    return max(cands, key=key)  # the first of equal maxima (candidates in text order)


#: Pick rules over one prompt's candidates (each returns the picked candidate).
RULES: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    "before (raw overlap)": lambda cs: _best(cs, lambda c: (c["overlap_raw"] + c["cosine"]) / 2),
    "combined": lambda cs: _best(cs, lambda c: c["combined"]),
    "combined-nohead": lambda cs: _best([c for c in cs if not c["heading"]] or cs,
                                        lambda c: c["combined"]),
}


def add_rules(grid: dict[str, Any]) -> None:
    """Rules of the form combined + b*lead + w*lm over the top-k by combined (no headings)."""
    for k in grid["k"]:
        for b in grid["lead"]:
            for w in grid["lm"]:
                def rule(cs: list[dict[str, Any]], k=k, b=b, w=w) -> dict[str, Any]:
                    pool = [c for c in cs if not c["heading"]] or cs
                    top = sorted(pool, key=lambda c: -c["combined"])[:k]
                    leads = [c for c in pool if c["lead"]]
                    pool = top + [c for c in leads if c not in top]
                    return _best(pool, lambda c: c["combined"] + b * c["lead"] + w * c["lm"])
                RULES[f"k{k}-lead{b}-lm{w}"] = rule


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def table(recs: list[dict[str, Any]], rules: list[str]) -> str:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault(f"{r['set']}/{r['kind']}", []).append(r)
    lines = ["| rule | " + " | ".join(f"{g} (n={len(v)})" for g, v in groups.items())
             + " | all |", "|---" * (len(groups) + 2) + "|"]
    for name in rules:
        cells, tot, n = [], 0, 0
        for g, v in groups.items():
            k = sum(RULES[name](r["cands"])["right"] for r in v)
            cells.append(f"{k}/{len(v)}")
            tot, n = tot + k, n + len(v)
        lo, hi = wilson(tot, n)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {tot}/{n} [{lo:.2f}, {hi:.2f}] |")
    return "\n".join(lines)


def prepare(split: str, sets: list[str], n_closed: int, n_open: int, seed: int,
            work: str | None) -> tuple[list[robust.Item], dict[str, Path]]:
    """The prompts of ``sets`` on ``split`` (the held-out phrasing family left out on dev) and
    the store roots, as ``benchmarks.evidence`` builds them."""
    from nest_integrations import paths

    items: list[robust.Item] = []
    ent, qs = robust.entity_items(split, n_closed if "entities" in sets else 0, seed)
    items += ent
    if "open" in sets:
        items += robust.open_items(qs, split, n_open, seed)
    if split == "dev":
        items = [i for i in items if i.family != robust.HELD_OUT]
    root = Path(work) if work else paths.nest_home() / "bench" / "robust"
    return items, {"torch": robust.build_stores(root, set(sets), qs, None, None, None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="dev", choices=("dev", "test"))
    ap.add_argument("--sets", default="entities,open")
    ap.add_argument("--n-closed", type=int, default=24)
    ap.add_argument("--n-open", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None, help="records as .jsonl(.gz)")
    ap.add_argument("--load", default=None, help="read records instead of computing them")
    ap.add_argument("--no-lm", action="store_true", help="skip the LM's scores (fast)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.load:
        opener = gzip.open if args.load.endswith(".gz") else open
        with opener(args.load, "rt", encoding="utf-8") as f:
            recs = [json.loads(line) for line in f]
    else:
        items, roots = prepare(args.split, args.sets.split(","), args.n_closed, args.n_open,
                               args.seed, args.work)
        recs = records(items, roots, with_lm=not args.no_lm)
        if args.out:
            opener = gzip.open if args.out.endswith(".gz") else open
            with opener(args.out, "wt", encoding="utf-8") as f:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
    add_rules({"k": (3, 5), "lead": (0.0, 0.05, 0.1, 0.2, 0.3), "lm": (0.0, 0.02, 0.05, 0.1)})
    print(table(recs, list(RULES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
