"""Cost of one verify forward over T new tokens after a 120-token cache (chain vs token tree),
SmolLM2-135M on CPU, 1 torch thread: what bounds DReSD's speed-up on this machine.

Usage: python benchmarks/verify_cost.py
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from nest_integrations.lm.hf import HFLanguageModel  # noqa: E402

torch.set_num_threads(1)
lm = HFLanguageModel.from_default()
prompt = list(range(1000, 1120))
print("| new tokens T | chain forward ms | tree forward ms (4 branches) |")
print("|---|---|---|")
for t in (1, 2, 5, 9, 17, 33):
    rows = []
    for tree in (False, True):
        times = []
        for _ in range(5):
            cache = lm.new_cache()
            lm.forward(prompt, cache)
            ids = list(range(2000, 2000 + t))
            t0 = time.perf_counter()
            if tree and t > 4:
                per = (t - 1) // 4
                parents = [-1] + [0 if j % per == 0 else j for j in range(t - 1)]
                lm.forward_tree(ids, parents, cache)
            else:
                lm.forward(ids, cache)
            times.append((time.perf_counter() - t0) * 1e3)
        rows.append(statistics.median(times))
    print(f"| {t} | {rows[0]:.0f} | {rows[1]:.0f} |")
