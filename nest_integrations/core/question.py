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


# "What is the founding year of X?" -> X
_OF_ENTITY = re.compile(
    r"^what\s+(?:is|was|are|were|'s)\s+(?-i:the)\s+(?:\w[\w'-]*\s+){0,4}?\w[\w'-]*\s+of\s+"
    r"(?P<e>.+?)\s*\?$",
    re.IGNORECASE,
)
# "What is X?", "Who was X?", "What are X?"
_IS_ENTITY = re.compile(r"^(?:what|who)\s+(?:is|was|are|were)\s+(?P<e>.+?)\s*\?$", re.IGNORECASE)
# "Write the (Python reference) entry for X.", "Tell me about X", "Describe X", "Explain X"
_ASK_ENTITY = re.compile(
    r"^(?:write\s+(?:the|an?)\s+(?:[\w'-]+\s+){0,4}?(?:entry|article|page|summary)\s+"
    r"(?:for|on|about)|tell\s+me\s+about|describe|explain|summari[sz]e)\s+(?P<e>.+?)\s*[.?!]?$",
    re.IGNORECASE,
)
_QUOTED = re.compile(
    r'["\u201c`](?P<e>[^"\u201d`]{1,80})["\u201d`]'
    r"|(?:(?<=\s)|^)['\u2018](?P<s>[^'\u2019]{1,80})['\u2019](?=[\s.,;:?!]|$)"
)
_ARTICLE = re.compile(r"^(?:a|an|(?-i:the))\s+", re.IGNORECASE)
_MAX_ENTITY_WORDS = 12


def question_entities(prompt: str) -> list[str]:
    """``question_entity`` and, for "... of X?", each shorter name after a later " of ",
    longest first: "What is the number of employees of Biquaza Labs?" gives
    ``["employees of Biquaza Labs", "Biquaza Labs"]`` (the title match takes the first that is
    a title).

    >>> question_entities("What is the number of employees of Biquaza Labs?")
    ['employees of Biquaza Labs', 'Biquaza Labs']
    """
    first = question_entity(prompt)
    if first is None:
        return []
    out = [first]
    if _OF_ENTITY.match(question_line(prompt)):
        rest = first
        while True:
            head, sep, tail = rest.partition(" of ")
            if not sep:
                break
            rest = _ARTICLE.sub("", tail.strip())
            if rest:
                out.append(rest)
    return list(dict.fromkeys(out))


def question_entity(prompt: str) -> str | None:
    """The entity a question is about, or None: what ``NestConfig.title_match`` looks for
    among the retrieved documents' titles.

    Read from the last line: a quoted name (``Write the entry for "for".``), the X of
    "What is the <attribute> of X?", "What is X?" / "Who was X?", or "Write the ... entry for
    X" / "Tell me about X" / "Describe X" / "Explain X". A leading "a", "an" or lower-case
    "the" is dropped; a candidate of more than 12 words is no name (None).

    >>> question_entity("What is the founding year of Korvanta Systems?")
    'Korvanta Systems'
    >>> question_entity('Write the Python reference entry for "for".')
    'for'
    >>> question_entity("What is a dishwasher?"), question_entity("How does it work?")
    ('dishwasher', None)
    """
    q = question_line(prompt)
    if not q:
        return None
    m = (_OF_ENTITY.match(q) or _IS_ENTITY.match(q) or _ASK_ENTITY.match(q))
    candidate = m.group("e") if m else None
    quoted = _QUOTED.search(candidate if candidate is not None else q)
    if quoted and (m is not None or q.endswith("?")):
        candidate = quoted.group("e") or quoted.group("s")
    if candidate is None:
        return None
    candidate = _ARTICLE.sub("", candidate.strip().strip("\"'`\u201c\u201d\u2018\u2019")).strip()
    if not candidate or len(candidate.split()) > _MAX_ENTITY_WORDS:
        return None
    return candidate


__all__ = ["asks_for_fact", "question_entities", "question_entity", "question_line"]
