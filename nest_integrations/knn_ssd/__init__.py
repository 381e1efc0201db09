"""KNN-SSD (arXiv 2505.16162): lossless self-speculative decoding whose layer-skip set is
chosen per prompt by the nearest domain anchor. This package is what the drafter reads at run
time, plus the domain prompt sets:

- ``profile``: per-model JSON profiles (skip sets, anchors) with the model fingerprint;
- ``router``: 1-NN cosine routing with a documented fallback;
- ``domains``: the four built-in domain prompt sets (train / eval splits).

The drafter is ``drafters/knn_ssd.py`` (``decoding="knn-ssd"``); the layer-skip forward is
``lm/layer_skip.py``; the offline search of skip sets and anchors, which decodes, is
``builders/knn_ssd_search.py`` and ``builders/knn_ssd_selfspec.py``; ``nest knn-ssd`` is
``cli/knn_ssd.py``.
"""
