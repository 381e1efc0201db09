"""Decoding methods: one drafter per method, all consumed by the one loop in ``decoding/loop.py``.

A new method is one drafter file plus one ``register(Method(...))`` line below.

- ``nest``: NEST span copying (Eqs. 5-7 of arXiv 2405.19325), relaxed verification of p_M;
- ``greedy``: no drafts: plain decoding of p_LM (the oracle every lossless method must equal);
- ``prompt-lookup``: lossless n-gram drafts from the prompt and the output (HF's prompt lookup);
- ``rag-copy`` (``rag_copy.py``), ``dresd``, ``rest``, ``knn-ssd``: see their modules.

Each method names its verifier (``Method.verifier``: ``RELAXED`` or ``LOSSLESS``) and each
drafter reads its ``drafter_options`` into a typed option dataclass (``corpus.parse_options``).
"""

from __future__ import annotations

from nest_integrations.drafters.base import (
    LOSSLESS,
    RELAXED,
    DecodeState,
    Draft,
    Drafter,
    DrafterContext,
    Method,
    Source,
)

#: Every decoding method by its ``decoding=`` name.
METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add (or replace) a decoding method in ``METHODS``."""
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The method called ``name``; a ValueError lists the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(
            f"unknown decoding {name!r}: choose one of {sorted(METHODS)}"
        ) from None


def _nest(ctx: DrafterContext) -> Drafter:
    from nest_integrations.drafters.nest import NestDrafter

    return NestDrafter(ctx)


def _prompt_lookup(ctx: DrafterContext) -> Drafter:
    from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter.from_context(ctx)


register(Method("nest", _nest, verifier=RELAXED, uses_memory=True, needs_target=True,
                description="NEST: kNN mixture + relaxed span copying with citations"))
register(Method("greedy", None, verifier=LOSSLESS,
                description="plain decoding of the LM (no drafts)"))
register(Method("prompt-lookup", _prompt_lookup, verifier=LOSSLESS,
                description="lossless n-gram drafts from the prompt and output"))
from nest_integrations.drafters import dresd as _dresd  # noqa: E402
from nest_integrations.drafters import knn_ssd as _knn_ssd  # noqa: E402
from nest_integrations.drafters import rag_copy as _rag_copy  # noqa: E402
from nest_integrations.drafters import rest as _rest  # noqa: E402

for _module in (_dresd, _rest, _rag_copy, _knn_ssd):
    register(_module.METHOD)

__all__ = [
    "LOSSLESS",
    "METHODS",
    "RELAXED",
    "DecodeState",
    "Draft",
    "Drafter",
    "DrafterContext",
    "Method",
    "Source",
    "get_method",
    "register",
]
