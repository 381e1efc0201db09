"""Decoding methods: one drafter per method, all consumed by the one loop in ``loop.py``.

A new method is one drafter file plus one ``register(Method(...))`` line below.

- ``nest``: NEST span copying (Eqs. 5-7 of arXiv 2405.19325), relaxed verification of p_M;
- ``greedy``: no drafts: plain decoding of p_LM (the oracle every lossless method must equal);
- ``prompt-lookup``: lossless n-gram drafts from the prompt and the output (HF's prompt lookup).
"""

from __future__ import annotations

from nest_integrations.drafters.base import (
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
    from nest_integrations.drafters.nest_spans import NestSpanDrafter

    return NestSpanDrafter(ctx)


def _prompt_lookup(ctx: DrafterContext) -> Drafter:
    from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter.from_context(ctx)


register(Method("nest", _nest, uses_memory=True, needs_target=True,
                description="NEST: kNN mixture + relaxed span copying with citations"))
register(Method("greedy", None, description="plain decoding of the LM (no drafts)"))
register(Method("prompt-lookup", _prompt_lookup,
                description="lossless n-gram drafts from the prompt and output"))
from nest_integrations.drafters import dresd as _dresd, rest as _rest  # noqa: E402
register(_dresd.METHOD)
register(_rest.METHOD)
register(__import__("nest_integrations.drafters.passage_copy", fromlist=["METHOD"]).METHOD)
register(__import__("nest_integrations.drafters.knn_ssd", fromlist=["METHOD"]).METHOD)

__all__ = [
    "METHODS",
    "DecodeState",
    "Draft",
    "Drafter",
    "DrafterContext",
    "Method",
    "Source",
    "get_method",
    "register",
]
