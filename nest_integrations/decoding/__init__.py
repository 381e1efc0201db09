"""The decoding path: prompt ids in, verified tokens and their sources out.

- ``engine``: ``NestEngine``: retrieve passages, plan the answer (``policy/``), run the loop,
  return a ``NestResult`` (or stream ``StreamChunk``s);
- ``prompts``: the chat template, the retrieval-augmented templates, what a string prompt means;
- ``loop``: the ONE verify-and-commit loop (``DecodeLoop``), shared by every decoding method in
  ``drafters/``; ``target``: its target passes, as the LM's declared ``Capabilities`` allow,
  and the target distribution; ``drafts``: the drafter's side; ``verifiers``: its acceptance
  rules (relaxed Eq. 7, exact greedy, speculative sampling); ``lookahead``: NEST's look-ahead
  guesses; ``commits``: what leaves the loop (immutable ``Commit``s, its output as data, the
  ``StoppingCriteria`` it is given);
- ``text_stream``: incremental output text, token ends, stop strings and guards (the loop's
  stopping criterion); the loop's commits turned into streamed chunks and citations
  (``TextStream``).

Engines are built by ``nest_integrations.assembly`` (``from_defaults``, ``build_engine``);
``from nest_integrations import NestEngine`` is the public name.
"""
