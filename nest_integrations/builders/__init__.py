"""Offline builders that decode with the model to make a method's data: they sit above
``decoding/`` (they run the one loop), while the data they write is read at run time by the
packages below ``drafters/`` (``dresd/``, ``knn_ssd/``).

- ``dresd_responses``: DReSD's response cache, the model's own greedy answers to a prompts file
  (``nest dresd build --from-prompts``);
- ``knn_ssd_selfspec``: self-speculative generation with a fixed skip set, and its counters;
- ``knn_ssd_search``: the skip-set search and the K-means anchors (``nest knn-ssd search |
  anchors``).
"""
