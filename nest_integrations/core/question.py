"""Question form (issue 22): does a prompt ask for a fact, or for a description?

``asks_for_fact`` is the signal of ``NestConfig.fact_decoding``: a question that asks for a
fact (who, when, where, which, how many, "what is the <attribute> of <X>?") is answered
losslessly with respect to the RA prompt's LM, so its answer is in-context RAG's, token for token,
and NEST's relaxed copying is kept for descriptive questions ("What is X?", "How does X work?",
"Write the entry for X") and for completions (a prompt that is not a question), where copying
whole spans is what wins (ROUGE-L ahead of RAG on open-ended answers). Pure: no framework.

The rule reads the last line of the prompt (a question after pasted context): a line that ends
with "?" and opens with a fact word, or a "Name the ..." request. It is decided by the opening
words, so it is predictable: a user can always force either mode with ``decoding=``
or ``fact_decoding=None``.
"""

from __future__ import annotations

import re

_WH_FACT = re.compile(
    r"^(who|whom|whose|when|where|which"
    r"|how\s+(many|much|long|old|far|big|tall|large|high|often|fast)"
    r"|(in|on|at|from|by|since)\s+(what|which)"
    r"|what\s+(year|date|day|month|time|number|percentage|percent|country|city|state|town"
    r"|language|name|color|colour|amount|price|age|size|value))\b",
    re.IGNORECASE,
)
# "what is the founding year of X", "what was the maiden flight date of X?" (a lower-case
# "the": "What is The Garden of Earthly Delights?" names a title)
_ATTRIBUTE_OF = re.compile(
    r"^what\s+(is|was|are|were|'s)\s+(?-i:the)\s+(\w[\w'-]*\s+){0,4}?\w[\w'-]*\s+of\s+\S",
    re.IGNORECASE,
)
_WHO_IS = re.compile(r"^who\s+(is|was|are|were)\s+", re.IGNORECASE)
# "name the ..." asks for a fact too
_NAME = re.compile(r"^(name|list)\s+the\b", re.IGNORECASE)


def question_line(prompt: str) -> str:
    """The last non-empty line of ``prompt``, stripped."""
    lines = [line.strip() for line in prompt.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def asks_for_fact(prompt: str) -> bool:
    """Whether the prompt's last line asks for a fact (see the module docstring).

    >>> asks_for_fact("What is the founding year of Korvanta Systems?")
    True
    >>> asks_for_fact("What is Futurism?"), asks_for_fact("How does the assert statement work?")
    (False, False)
    >>> asks_for_fact("La traviata\\n\\nIt was first performed on 6 March")
    False
    """
    q = question_line(prompt)
    if not q:
        return False
    if _WHO_IS.match(q) and not _ATTRIBUTE_OF.match("what " + q.split(None, 1)[1]):
        return False  # "Who was Charles Dickens?" asks for a description
    if _NAME.match(q):
        return True
    if not q.endswith("?"):  # a completion or an instruction
        return False
    return bool(_WH_FACT.match(q) or _ATTRIBUTE_OF.match(q))


__all__ = ["asks_for_fact", "question_line"]
