"""Lossless decoding benchmark: HF greedy, HF prompt lookup, our prompt lookup, REST-style
exact-suffix drafts, and DReSD out-of-domain and in-domain, on the same prompts, interleaved.

Prompts: "Tell me about {title}." for the Wikipedia leads of the shipped sample corpus, shuffled
with a fixed seed; the first ``--n-train`` build the in-domain datastore (the model's own greedy
responses, 128 tokens each: ``nest dresd build --from-prompts``), the next ``--n-eval`` (disjoint)
are evaluated. The out-of-domain datastore is the sample corpus (``nest ingest --sample`` then
``nest dresd build --collection nest``; built here when missing).

Usage::

    python -m benchmarks.dresd          # ~15 min
    python -m benchmarks.dresd --n-eval 4 --max-new-tokens 32 --no-sweep  # smoke run

Writes ``benchmarks/results/lossless.md`` and ``lossless.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from benchmarks import harness
from benchmarks.harness.prompts import in_domain_datastore, tell_me_about
from nest_integrations.config import NestConfig
from nest_integrations.core.tokens import cut_at_eos
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.dresd import (
    DresdDatastore,
    PassageSource,
    build_datastore,
    default_datastore_path,
)
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.lm.hf import HFLanguageModel

LOG = logging.getLogger(__name__)


def ood_datastore(lm: Any) -> Path:
    path = default_datastore_path("nest")
    try:
        DresdDatastore.open(path, lm)
        return path
    except FileNotFoundError:
        pass
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.paths import default_persist_dir, keys_dir
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(default_persist_dir(), "nest")
    passages = sorted(store.iter_passages(), key=lambda p: p.id)
    if not passages:
        raise SystemExit("run `nest ingest --sample` first (the out-of-domain datastore)")
    ks = DiskKeyStore.open(keys_dir(default_persist_dir()), lm)
    build_datastore(lm, PassageSource(passages, lm, key_store=ks, name="collection:nest"), path,
                    progress=True)  # fmt: skip
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.dresd", __doc__)
    ap.add_argument("--n-train", type=int, default=200)
    ap.add_argument("--n-train-small", type=int, default=60,
                    help="a smaller in-domain datastore for the size curve (0: none)")
    ap.add_argument("--n-eval", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-sweep", action="store_true", help="skip the draft-shape sweep")
    ap.add_argument("--stem", default="lossless", help="output file stem (default lossless)")
    args, args.run = harness.start(ap, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    lm = HFLanguageModel.from_default()
    train, evals = tell_me_about(args.n_train, args.n_eval)
    ood = ood_datastore(lm)
    ind = in_domain_datastore(lm, train, 128, "bench-lossless")
    small = (in_domain_datastore(lm, train[: args.n_train_small], 128, "bench-lossless")
             if args.n_train_small else None)
    stores = {"ood": DresdDatastore.open(ood, lm), "id": DresdDatastore.open(ind, lm)}
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(temperature=0.0))
    eos = lm.eos_token_ids
    n = args.max_new_tokens

    def hf(pld: bool) -> Callable[[list[int]], dict]:
        def run(ids: list[int]) -> dict:
            x = torch.tensor([ids])
            kw = {"prompt_lookup_num_tokens": 10} if pld else {}
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                        max_new_tokens=n, eos_token_id=sorted(eos),
                                        pad_token_id=sorted(eos)[0], **kw)  # fmt: skip
            dt = time.perf_counter() - t0
            return {"ids": cut_at_eos(out[0, len(ids) :].tolist(), eos), "seconds": dt}

        return run

    def ours(decoding: str, **opts: Any) -> Callable[[list[int]], dict]:
        def run(ids: list[int]) -> dict:
            t0 = time.perf_counter()
            res = engine.generate(msgs[tuple(ids)], max_new_tokens=n, decoding=decoding,
                                  drafter_options=opts)  # fmt: skip
            dt = time.perf_counter() - t0
            st = res.stats
            return {"ids": list(res.token_ids), "seconds": dt, "verify": st.verify_steps,
                    "drafted": st.drafted_tokens, "accepted": st.accepted_tokens,
                    "forwards": st.forward_passes,
                    "search": st.time_draft, "tree_steps": st.tree_steps,
                    "verbatim": sum(c.n_tokens for c in res.citations)}  # fmt: skip

        return run

    ds_id, ds_ood = str(ind), str(ood)
    methods: dict[str, tuple[Callable[[list[int]], dict], str]] = {
        "HF greedy": (hf(False), ""),
        "HF prompt lookup (10)": (hf(True), ""),
        "our greedy loop": (ours("greedy"), ""),
        "our prompt-lookup": (ours("prompt-lookup"), ""),
        "REST-style, ID array (chain 1x8)": (ours("rest", datastore=ds_id), "id"),
        "REST-style, ID array (tree 4x8)": (ours("rest", datastore=ds_id, shape="tree"), "id"),
        "DReSD OOD (default)": (ours("dresd", datastore=ds_ood), "ood"),
        "DReSD ID (default: chain 1x8, cos >= 0.8)": (ours("dresd", datastore=ds_id), "id"),
        "DReSD ID (tree 4x8, cos >= 0.8)": (ours("dresd", datastore=ds_id, shape="tree"), "id"),
        "DReSD ID (chain 1x8, no threshold)": (
            ours("dresd", datastore=ds_id, min_score=-1.0), "id"),
    }
    if small is not None:
        stores["id-small"] = DresdDatastore.open(small, lm)
        methods[f"DReSD ID-{args.n_train_small} (default)"] = (
            ours("dresd", datastore=str(small)), "id-small")
    if not args.no_sweep:
        methods["DReSD ID (tree 10x10, no threshold: paper shape)"] = (
            ours("dresd", datastore=ds_id, shape="tree", num_drafts=10, draft_len=10,
                 max_nodes=100, min_score=-1.0), "id")  # fmt: skip
        methods["DReSD ID (chain 1x4, cos >= 0.8)"] = (
            ours("dresd", datastore=ds_id, draft_len=4), "id")
    msgs: dict[tuple[int, ...], list[dict]] = {}
    prompt_ids = []
    for p in evals:
        m = [{"role": "user", "content": p["prompt"]}]
        ids = engine.prompt_ids(m)
        msgs[tuple(ids)] = m
        prompt_ids.append(ids)
    # warm-up (not timed): one short run per method
    for name, (run, _) in methods.items():
        run(prompt_ids[0])
    rows: dict[str, list[dict]] = {name: [] for name in methods}
    for i, ids in enumerate(prompt_ids):  # interleaved: every method on prompt i, then i+1
        for name, (run, _) in methods.items():
            rows[name].append(run(ids))
        LOG.info("prompt %d/%d done", i + 1, len(prompt_ids))
    ref = rows["HF greedy"]
    ref_tps = sum(len(r["ids"]) for r in ref) / sum(r["seconds"] for r in ref)
    table = []
    for name, (_, store) in methods.items():
        rs = rows[name]
        toks = sum(len(r["ids"]) for r in rs)
        secs = sum(r["seconds"] for r in rs)
        same = sum(r["ids"] == q["ids"] for r, q in zip(rs, ref))
        row = {"method": name, "tokens": toks, "seconds": round(secs, 2),
               "tokens_per_s": toks / secs, "vs_hf_greedy": (toks / secs) / ref_tps,
               "identical_to_hf_greedy": f"{same}/{len(rs)}"}  # fmt: skip
        if "verify" in rs[0]:
            v = sum(r["verify"] for r in rs)
            d = sum(r["drafted"] for r in rs)
            a = sum(r["accepted"] for r in rs)
            row.update(
                verify_steps=v, forwards=sum(r["forwards"] for r in rs),
                accepted_per_step=a / v if v else 0.0, acceptance_rate=a / d if d else 0.0,
                drafted_per_step=d / v if v else 0.0,
                search_share=sum(r["search"] for r in rs) / secs,
                verbatim_tokens=sum(r["verbatim"] for r in rs),
            )  # fmt: skip
        if store:
            row["datastore_bytes_per_token"] = stores[store].stats()["bytes_per_token"]
        table.append(row)
    write_report(args, table, stores, train, evals, index_table(stores))
    return 0


def index_table(stores: dict) -> list[dict]:
    """Per datastore: exact vs IVF vs HNSW search time per query and recall@50 vs exact."""
    import numpy as np

    from nest_integrations.dresd.index import build_index, recall_at

    out = []
    rng = np.random.default_rng(0)
    for name, ds in stores.items():
        keys = np.asarray(ds.keys, dtype=np.float32)
        q = keys[rng.choice(len(keys), size=min(200, len(keys)), replace=False)]
        q = q + 0.1 * rng.standard_normal(q.shape).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        for kind in ("flat", "ivf", "hnsw"):
            t0 = time.perf_counter()
            index, params = build_index(keys, kind)
            build = time.perf_counter() - t0
            t0 = time.perf_counter()
            for row in q:
                index.search(row[None], 50)
            per_query = (time.perf_counter() - t0) / len(q)
            out.append({"datastore": name, "n": len(keys), **params, "build_s": round(build, 2),
                        "query_ms": round(per_query * 1e3, 3),
                        "recall@50": round(recall_at(index, keys, q, 50), 4)})  # fmt: skip
    return out


def write_report(
    args: Any, table: list[dict], stores: dict, train: list, evals: list, indexes: list[dict]
) -> None:
    meta = {
        "model": "SmolLM2-135M-Instruct (fp32, CPU)",
        "torch_threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "eval_prompts": [p["prompt"] for p in evals],
        "train_split": f"first {len(train)} shuffled sample titles (seed 0)",
        "eval_split": f"last {len(evals)} titles (disjoint)",
        "datastores": {k: v.stats() for k, v in stores.items()},
    }
    f = lambda x, p=2: "—" if x is None else (f"{x:.{p}f}" if isinstance(x, float) else str(x))  # noqa: E731
    lines = [
        "# Lossless decoding: DReSD vs peers (`python -m benchmarks.dresd`)",
        "",
        f"{meta['model']}; {args.threads} torch thread(s); {len(evals)} held-out prompts x {args.max_new_tokens} new tokens, greedy; "
        "methods interleaved per prompt after one warm-up run each.",
        "",
        f"- Prompts: \"Tell me about {{title}}.\" over the sample corpus's Wikipedia titles. "
        f"In-domain (ID) datastore = the model's own 128-token greedy responses to the "
        f"{meta['train_split']}; evaluation = the {meta['eval_split']}.",
        f"- ID datastore: {stores['id'].stats()['n_tokens']:,} tokens"
        + (f" (ID-small: {stores['id-small'].stats()['n_tokens']:,})" if "id-small" in stores
           else "") + "; OOD datastore (sample "
        f"corpus, `nest dresd build --collection nest`): {stores['ood'].stats()['n_tokens']:,} "
        "tokens. REST-style uses the same token arrays.",
        "- accepted/step excludes the verifier's own token; acceptance rate = accepted / drafted "
        "tokens (for trees, drafted = all tree nodes); search share = drafter time (PCA + FAISS "
        "+ filter, or suffix search) / wall time.",
        "",
        "| method | tok/s | vs HF greedy | same as HF greedy | accepted/step | acceptance | "
        "drafted/step | forwards | search share | verbatim tokens | datastore B/token |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['vs_hf_greedy']:.2f}x | "
            f"{r['identical_to_hf_greedy']} | {f(r.get('accepted_per_step'))} | "
            f"{f(r.get('acceptance_rate'))} | {f(r.get('drafted_per_step'), 1)} | "
            f"{f(r.get('forwards'))} | {f(r.get('search_share'), 3)} | "
            f"{f(r.get('verbatim_tokens'))} | {f(r.get('datastore_bytes_per_token'), 0)} |"
        )
    lines += ["", "FAISS index kinds on these datastores (single-query search, k = 50; recall vs "
              "exact `IndexFlatIP`; queries = stored keys + noise, re-normalised):", "",
              "| datastore | n | kind | params | build s | ms/query | recall@50 |",
              "|---|---|---|---|---|---|---|"]
    for r in indexes:
        params = {k: v for k, v in r.items()
                  if k not in ("datastore", "n", "kind", "build_s", "query_ms", "recall@50")}
        lines.append(f"| {r['datastore']} | {r['n']:,} | {r['kind']} | {params or ''} | "
                     f"{r['build_s']} | {r['query_ms']} | {r['recall@50']} |")
    harness.write_result(args.out, args.stem, {"meta": meta, "rows": table, "indexes": indexes},
                         "\n".join(lines) + "\n", args.run)


if __name__ == "__main__":
    raise SystemExit(main())
