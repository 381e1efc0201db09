"""KNN-SSD (arXiv 2505.16162): lossless self-speculative decoding whose layer-skip set is
chosen per prompt by the nearest domain anchor. Spec: shared/docs/dresd-knnssd-spec.md §3.

Modules:

- ``nest_integrations.lm.layer_skip``: the layer-skip draft forward (``SkipSet``,
  ``forward_skip``, ``HFLanguageModel.forward_skip``) and the domain vector;
- ``selfspec``: greedy self-speculative decoding with a fixed skip set through the one loop
  (``loop.decode_ids``) and its counters (``SpecStats``), for the search;
- ``domains``: the four built-in domain prompt sets (train / eval splits);
- ``profile``: per-model JSON profiles (skip sets, anchors) with the model fingerprint;
- ``search``: optuna TPE search of a domain's skip set, K-means anchors;
- ``router``: 1-NN cosine routing with a documented fallback;
- ``nest knn-ssd prompts | search | anchors | show`` is ``nest_integrations/cli/knn_ssd.py``.

The decoding method itself, with the draft loop ``draft_chain``, is
``nest_integrations.drafters.knn_ssd`` (``decoding="knn-ssd"``).
"""
