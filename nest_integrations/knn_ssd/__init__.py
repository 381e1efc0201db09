"""KNN-SSD (arXiv 2505.16162): lossless self-speculative decoding whose layer-skip set is
chosen per prompt by the nearest domain anchor. Spec: shared/docs/dresd-knnssd-spec.md §3.

Modules:

- ``nest_integrations.lm.layer_skip``: the layer-skip draft forward (``SkipSet``,
  ``forward_skip``, ``HFLanguageModel.forward_skip``) and the domain vector;
- ``selfspec``: drafting a chain with a skip set (``draft_chain``, used by the drafter) and a
  standalone greedy self-speculative loop (search, tests);
- ``domains``: the four built-in domain prompt sets (train / eval splits);
- ``profile``: per-model JSON profiles (skip sets, anchors) with the model fingerprint;
- ``search``: optuna TPE search of a domain's skip set, K-means anchors;
- ``router``: 1-NN cosine routing with a documented fallback;
- ``cli``: ``nest knn-ssd prompts | search | anchors | show``.

The decoding method itself is ``nest_integrations.drafters.knn_ssd`` (``decoding="knn-ssd"``).
"""
