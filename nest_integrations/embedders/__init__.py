"""Embedders, in one place: the embedder port (``port``: ``Embedder``, ``embed``), the packaged
MiniLM passage embedder and its registered Chroma function (``minilm``), and the plain-torch
BERT it runs on (``bert``). Nothing is imported here: each module loads what it needs."""
