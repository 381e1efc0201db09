"""Key codecs on the sample corpus: bytes per token, top-r recall against fp16, lambda,
accepted tokens per verify step and p_M perplexity, in-corpus and held-out (issue 15 part 2).

A subset of the shipped sample corpus (whole documents, about ``--tokens`` tokens) is encoded
once with the embedded model in fp32; every codec's store is filled from those same keys
(trained on the first ``codecs.WANT_TRAIN_ROWS`` of them). The texts, the held-out split and
the retrieval are those of ``nest calibrate`` (``calibrate.split_corpus``; BM25 over the
subset, held-out documents removed from every retrieval), so "held-out" means the text's own
document is not in the memory.

- bytes/token: the whole namespace on disk (codes + token ids + offsets + sqlite index +
  codec tables) divided by stored tokens;
- recall@r: mean |top-r(codec) ∩ top-r(fp16)| / r over every scored position (r = the
  config's ``n_neighbors``), the same retrieved passages for both;
- mean λ and p_M perplexity: teacher-forced over the scored continuation with the default
  config (mu = 1/sqrt(d), alpha, tau as ``NestConfig()``), as in ``nest calibrate``;
- accepted/verify and mean λ (generation): ``NestEngine.generate`` from each text's prefix,
  ``--new-tokens`` greedy tokens, its ``stats``.

Run (about 10-15 min on 2 busy cores)::

    python -m benchmarks.key_codecs

Writes ``benchmarks/results/key_codecs.md`` (and ``.json``).
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from benchmarks import harness
from nest_integrations.calibrate import split_corpus
from nest_integrations.calibrate.fitting import ALPHAS, MU_MULTIPLES, TAUS
from nest_integrations.calibrate.scoring import ScoredText as _Scored
from nest_integrations.calibrate.scoring import ScorePool as _Pool
from nest_integrations.config import NestConfig
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.index import codecs
from nest_integrations.index.keys import encode_keys
from nest_integrations.index.store import DiskKeyStore

CODECS = [("fp16", {}), ("int8", {}), ("pq", {}), ("pq", {"m": 144})]


def _label(name: str, opts: dict) -> str:
    return name + ("" if not opts else "-" + ",".join(f"{k}{v}" for k, v in opts.items()))


def _corpus(lm, max_tokens: int, seed: int):
    from nest_integrations.ingest import load_documents, sample_corpus_inputs, split_documents
    from nest_integrations.ingest.splitter import token_counter_for

    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, token_counter_for(lm))
    by_doc: dict[str, list] = {}
    for p in passages:
        by_doc.setdefault(p.doc_id, []).append(p)
    ids = sorted(by_doc)
    random.Random(seed).shuffle(ids)
    out, n = [], 0
    for d in ids:
        if n >= max_tokens:
            break
        out += by_doc[d]
        n += sum(int(p.metadata.get("n_tokens", 0)) for p in by_doc[d])
    return out, len(passages)


def _ns_bytes(store: DiskKeyStore) -> int:
    return sum(f.stat().st_size for f in store.namespace_dir.iterdir() if f.is_file())


@torch.inference_mode()
def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.key_codecs", __doc__)
    for flag, default, what in (("--tokens", 30000, "corpus subset size in tokens"),
                                ("--texts", 12, "texts in-corpus and held-out each"),
                                ("--gen-texts", 6, "of those, generated from"),
                                ("--new-tokens", 32, "tokens generated per text")):
        ap.add_argument(flag, type=int, default=default, help=what)
    args, run = harness.start(ap, argv)
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    from nest_integrations.decoding.engine import NestEngine
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    lm = HFLanguageModel.from_default()
    cfg = NestConfig()
    r = cfg.n_neighbors
    passages, n_all = _corpus(lm, args.tokens, seed=0)
    print(f"corpus: {len(passages)} of {n_all} passages", flush=True)

    t0 = time.perf_counter()
    keys = []
    for i in range(0, len(passages), 16):
        keys += encode_keys(lm, passages[i : i + 16], np.dtype(np.float32))
    n_tok = sum(len(k.token_ids) for k in keys)
    t_enc = time.perf_counter() - t0
    print(f"encoded {n_tok} tokens in {t_enc:.0f} s", flush=True)
    sample = np.concatenate([k.keys for k in keys])[: codecs.WANT_TRAIN_ROWS["pq"]]

    tmp = Path(tempfile.mkdtemp(prefix="bench-codecs-"))
    stores: dict[str, DiskKeyStore] = {}
    sizes: dict[str, dict] = {}
    for name, opts in CODECS:
        label = _label(name, opts)
        t0 = time.perf_counter()
        codec = codecs.make_codec(name, lm.key_dim, **opts)
        s = DiskKeyStore.open(tmp / label, lm, codec=codec)
        s.train_codec(sample)
        for i in range(0, len(passages), 64):
            s.put_keys(passages[i : i + 64], keys[i : i + 64])
        s.close()
        s = DiskKeyStore.open(tmp / label, lm)
        stores[label] = s
        b = _ns_bytes(s)
        tables = s.namespace_dir / "codec.npz"
        tb = tables.stat().st_size if tables.exists() else 0
        sizes[label] = {"code_bytes": s.codec.code_size, "bytes_on_disk": b,
                        "bytes_per_token": b / n_tok, "table_bytes": tb,
                        "bytes_per_token_without_tables": (b - tb) / n_tok, "seconds_to_fill": time.perf_counter() - t0}
        print(f"{label}: {b / n_tok:.1f} bytes/token", flush=True)

    # -- teacher-forced scoring (as nest calibrate) --------------------------------------------
    in_texts, out_texts, held = split_corpus(passages, lm, n_texts=args.texts, seed=0)
    retriever = InMemoryRetriever(passages)
    n_held = sum(1 for p in passages if p.doc_id in held)

    def retrieve(q: str) -> list:
        got = retriever.retrieve(q, cfg.n_passages + n_held)
        return [p for p in got if p.doc_id not in held][: cfg.n_passages]

    mu = cfg.knn_temperature or 1.0 / math.sqrt(lm.key_dim)
    scored: dict[str, list[_Scored]] = {k: [] for k in stores}
    recall: dict[str, dict[str, list[float]]] = {k: {"in": [], "out": []} for k in stores}
    for t in in_texts + out_texts:
        ps = retrieve(t.prefix)
        p_ids, r_ids = list(lm.tokenize(t.prefix)), list(lm.tokenize(t.rest))
        logits, queries = lm.forward(p_ids + r_ids, lm.new_cache())
        rows = slice(len(p_ids) - 1, len(p_ids) - 1 + len(r_ids))
        logits, queries = logits[rows], queries[rows]
        target = torch.as_tensor(r_ids)
        log_p = torch.log_softmax(logits.double() / cfg.lm_temperature, dim=-1)
        p_lm = log_p.exp()
        log_lm = log_p.gather(1, target[:, None])[:, 0]
        ref_rows = None
        for label, s in stores.items():
            mem = TokenMemory(s.get_keys(ps), device=lm.device)
            hits = mem.search(queries, r)
            vals = mem.values[hits.rows]
            scored[label].append(_Scored(
                t.in_corpus, log_lm, hits.dist.float(), vals == target[:, None], vals,
                p_lm.gather(1, vals), log_lm.exp(), p_lm.max(-1).values))  # fmt: skip
            rows_np = hits.rows.cpu().numpy()
            if ref_rows is None:
                ref_rows = rows_np
            k = rows_np.shape[1]
            rec = [len(set(a) & set(b)) / k for a, b in zip(rows_np, ref_rows)]
            recall[label]["in" if t.in_corpus else "out"] += rec
    print("scored", flush=True)

    res: dict[str, dict] = {}
    for label in stores:
        row = dict(sizes[label])
        row.update(_calibrated(scored[label], lm.key_dim))
        for part, flag in (("in", True), ("out", False)):
            pool = _Pool([x for x in scored[label] if x.in_corpus == flag])
            lam = pool.lam(cfg.rrc_offset, cfg.rrc_scale)
            row[f"ppl_{part}"] = math.exp(pool.nll(pool.p_knn_true(mu), cfg.rrc_offset,
                                                   cfg.rrc_scale))
            row[f"ppl_base_{part}"] = math.exp(pool.base_nll())
            row[f"lambda_tf_{part}"] = float(lam.mean())
            row[f"recall_{part}"] = float(np.mean(recall[label][part]))
            row[f"n_tokens_{part}"] = pool.n
            hits = torch.cat([x.match.any(-1) for x in pool.scored])
            row[f"knn_hit_{part}"] = float(hits.double().mean())  # true token in top-r values
            row[f"p_knn_true_{part}"] = float(pool.p_knn_true(mu).mean())
        res[label] = row

    # -- generation -----------------------------------------------------------------------------
    gen_texts = in_texts[: args.gen_texts] + out_texts[: args.gen_texts]
    for label, s in stores.items():
        engine = NestEngine(lm, None, s, cfg)
        for part, flag in (("in", True), ("out", False)):
            acc = ver = 0
            lams, tokens = [], []
            t0 = time.perf_counter()
            for t in (x for x in gen_texts if x.in_corpus == flag):
                out = engine.generate(t.prefix, max_new_tokens=args.new_tokens,
                                      passages=retrieve(t.prefix))
                acc += out.stats.accepted_tokens
                ver += out.stats.verify_steps
                lams.append(out.stats.mean_lambda)
                tokens.append(out.token_ids)
                for c in out.citations:  # exact citations whatever the codec
                    p = next(p for p in out.passages if p.id == c.passage_id)
                    assert c.text == p.text[c.passage_start : c.passage_end] \
                        == out.text[c.start : c.end]
            res[label][f"accepted_per_verify_{part}"] = acc / ver if ver else 0.0
            res[label][f"lambda_gen_{part}"] = float(np.mean(lams))
            res[label][f"gen_seconds_{part}"] = time.perf_counter() - t0
            res[label][f"_tokens_{part}"] = tokens
        print(f"generated with {label}", flush=True)
    for label in stores:
        for part in ("in", "out"):
            ref, got = res["fp16"][f"_tokens_{part}"], res[label][f"_tokens_{part}"]
            same = sum(a == b for a, b in zip(ref, got))
            res[label][f"same_output_{part}"] = f"{same}/{len(ref)}"
    for label in stores:
        for part in ("in", "out"):
            res[label].pop(f"_tokens_{part}")
        stores[label].close()
    shutil.rmtree(tmp, ignore_errors=True)

    meta = {
        "corpus": f"sample corpus subset: {len(passages)} of {n_all} passages, {n_tok} tokens",
        "model": lm.fingerprint, "key_dim": lm.key_dim, "n_neighbors": r,
        "n_passages": cfg.n_passages, "texts": {"in": len(in_texts), "out": len(out_texts)},
        "gen_texts_each": args.gen_texts, "new_tokens": args.new_tokens,
        "encode_seconds": t_enc, "total_seconds": time.perf_counter() - t_all,
        "torch_threads": 1,
    }
    harness.write_result(args.out, "key_codecs", {"meta": meta, "results": res},
                         _markdown(res, meta), run)
    return 0


def _calibrated(scored: list[_Scored], key_dim: int) -> dict:
    """p_M perplexity at each codec's own best (mu, alpha, tau): ``nest calibrate``'s
    objective (min in-corpus PPL subject to held-out PPL <= the base LM's)."""
    pin = _Pool([x for x in scored if x.in_corpus])
    pout = _Pool([x for x in scored if not x.in_corpus])
    base_out = pout.base_nll()
    grid = []
    for m in MU_MULTIPLES:
        mu = m / math.sqrt(key_dim)
        k_in, k_out = pin.p_knn_true(mu), pout.p_knn_true(mu)
        for a in ALPHAS:
            for tau in TAUS:
                grid.append((mu, a, tau, pin.nll(k_in, a, tau), pout.nll(k_out, a, tau)))
    feasible = [g for g in grid if g[4] <= base_out + 1e-9]
    if feasible:
        floor = min(g[3] for g in feasible) + math.log(1.01)
        best = min((g for g in feasible if g[3] <= floor), key=lambda g: (g[4], g[3]))
    else:
        best = min(grid, key=lambda g: (g[4], g[3]))
    return {"ppl_cal_in": math.exp(best[3]), "ppl_cal_out": math.exp(best[4]),
            "cal_point": {"mu": best[0], "alpha": best[1], "tau": best[2]},
            "cal_feasible": bool(feasible)}


def _markdown(res: dict, meta: dict) -> str:
    fp = res["fp16"]
    lines = [
        "# Key codecs: size and quality",
        "",
        meta["corpus"] + f"; model {meta['model']} (d={meta['key_dim']}); "
        f"r = n_neighbors = {meta['n_neighbors']}, b = {meta['n_passages']} BM25 passages per "
        f"text; {meta['texts']['in']} in-corpus and {meta['texts']['out']} held-out texts "
        "scored teacher-forced (split of `nest calibrate`), "
        f"{meta['gen_texts_each']} of each generated from ({meta['new_tokens']} new tokens, "
        f"default `NestConfig()`), 1 torch thread.",
        "",
        "| codec | bytes/key (codes) | bytes/token on disk | vs fp16 | without tables (at scale) | recall@r in / out "
        "| λ teacher-forced in / out | λ generation in / out | accepted/verify in / out "
        "| p_M PPL default in / out | p_M PPL calibrated in / out | true token in top-r in / out "
        "| same tokens as fp16 in / out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, x in res.items():
        lines.append(
            f"| {label} | {x['code_bytes']} | {x['bytes_per_token']:.1f} "
            f"| {x['bytes_per_token'] / fp['bytes_per_token']:.3f} "
            f"| {x['bytes_per_token_without_tables']:.1f} "
            f"({x['bytes_per_token_without_tables'] / fp['bytes_per_token']:.3f}) "
            f"| {x['recall_in']:.3f} / {x['recall_out']:.3f} "
            f"| {x['lambda_tf_in']:.4f} / {x['lambda_tf_out']:.4f} "
            f"| {x['lambda_gen_in']:.4f} / {x['lambda_gen_out']:.4f} "
            f"| {x['accepted_per_verify_in']:.3f} / {x['accepted_per_verify_out']:.3f} "
            f"| {x['ppl_in']:.3f} / {x['ppl_out']:.3f} "
            f"| {x['ppl_cal_in']:.3f} / {x['ppl_cal_out']:.3f} "
            f"| {x['knn_hit_in']:.3f} / {x['knn_hit_out']:.3f} "
            f"| {x['same_output_in']} / {x['same_output_out']} |"
        )
    lines += [
        "",
        f"Base LM p_M-free perplexity on the same tokens: in {fp['ppl_base_in']:.3f}, held-out "
        f"{fp['ppl_base_out']:.3f} ({fp['n_tokens_in']} / {fp['n_tokens_out']} scored tokens).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
