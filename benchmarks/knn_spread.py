"""How many neighbours carry p_kNN's weight at a given kNN temperature (issue 21).

Encodes the first 1,500 characters of 8 pydoc entries of the shipped sample corpus with the
embedded model. Every 10th token key of the first entry is a query; the keys of the other 7
are the memory. Prints the median squared distance at a few neighbour ranks, and, for each μ,
the median weight of the nearest neighbour and the median effective number of neighbours
(1 / Σ w², over the 1,024 nearest) of Eq. 2's softmax. Writes ``results/knn_spread.md`` (and ``.json``).

    python -m benchmarks.knn_spread [--dtype fp32] [--mu 0.0417,0.1,0.25,1.0]
"""

from __future__ import annotations

import math
from typing import Sequence

from benchmarks import harness

REPO = harness.REPO


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser("benchmarks.knn_spread", __doc__)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--mu", default=None, help="comma-separated μ values (default: 1/sqrt(d), "
                    "0.1, 0.25, 1.0)")
    args, run = harness.start(ap, argv)

    import torch

    from nest_integrations.core.mixture import knn_weights
    from nest_integrations.lm.hf import HFLanguageModel

    torch.set_num_threads(1)
    lm = HFLanguageModel.from_default(dtype=args.dtype)
    files = sorted((REPO / "nest_integrations" / "data" / "sample" / "pydoc").glob("*.txt"))[:8]
    texts = [f.read_text(encoding="utf-8")[:1500] for f in files]
    keys = [torch.as_tensor(k).float() for k in lm.encode_passages([lm.tokenize(t) for t in texts])]
    memory, queries = torch.cat(keys[1:]), keys[0][::10]
    dist = (torch.cdist(queries, memory) ** 2).sort(dim=1).values[:, :1024]
    d = memory.shape[1]
    mus = ([float(m) for m in args.mu.split(",")] if args.mu
           else [1.0 / math.sqrt(d), 0.1, 0.25, 1.0])
    lines = [
        "# How many neighbours carry p_kNN's weight (`python -m benchmarks.knn_spread`)", "",
        f"Model `{lm.fingerprint}` ({args.dtype}), key dimension {d}; {queries.shape[0]} queries "
        f"(every 10th key of `{files[0].name}`) against {memory.shape[0]} keys of "
        f"{len(files) - 1} other pydoc entries; squared L2 distances as in Eq. 2. Median "
        f"squared key norm {float((memory ** 2).sum(-1).median()):.1f}.", "",
        "| neighbour rank | median squared distance |", "|---|---|",
    ]
    for r in (1, 2, 5, 17, 65, 257, dist.shape[1]):
        if r <= dist.shape[1]:
            lines.append(f"| {r} | {float(dist[:, r - 1].median()):.1f} |")
    spread = {}
    lines += ["", "| μ | nearest neighbour's weight (median) | effective neighbours, 1/Σw² "
              f"(median, of {dist.shape[1]}) |", "|---|---|---|"]
    for mu in mus:
        w = knn_weights(dist, mu)
        spread[mu] = float((1.0 / (w ** 2).sum(dim=1)).median())
        lines.append(f"| {mu:.4g} | {float(w[:, 0].median()):.3f} | "
                     f"{float((1.0 / (w ** 2).sum(dim=1)).median()):.0f} |")
    harness.write_result(args.out, "knn_spread", {"key_dim": d, "effective_neighbours": spread},
                         "\n".join(lines) + "\n", run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
