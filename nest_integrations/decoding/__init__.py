"""The decoding path: prompt ids in, verified tokens and their sources out.

- ``engine``: ``NestEngine``: retrieve passages, fill their token keys, build the prompt ids, run
  the loop, return a ``NestResult`` (or stream ``StreamChunk``s);
- ``prompts``: the chat template, the retrieval-augmented templates, what a string prompt means;
- ``loop``: the ONE verify-and-commit loop (``DecodeLoop``) and its verifiers (relaxed Eq. 7,
  exact greedy, speculative sampling), shared by every decoding method in ``drafters/``;
- ``text_stream``: incremental output text, token ends, stop strings, streamed deltas.

Engines are built by ``nest_integrations.assembly`` (``from_defaults``, ``build_engine``);
``from nest_integrations import NestEngine`` is the public name.
"""
