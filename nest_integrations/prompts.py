"""Prompts: what the engine decodes from (chat template, RA context) and what it retrieves with.

- A list of ``{"role", "content"}`` messages gets the model's chat template with the generation
  prompt.
- A string is completed as raw text.
- With RA (``ra_passages > 0``) the top passages go into the prompt through the templates below.
"""

from __future__ import annotations

from typing import Any, Sequence

from nest_integrations.types import Passage

Prompt = str | Sequence[dict[str, str]]

RA_CHAT_TEMPLATE = (
    "Answer the question with the background context as reference.\n"
    "Background:\n{context}\n\nQuestion: {question}"
)
RA_TEXT_TEMPLATE = "Background:\n{context}\n\n{prompt}"


def prompt_ids(lm: Any, prompt: Prompt, ra: Sequence[Passage] = ()) -> list[int]:
    """Token ids to decode from: a string prompt as raw text, chat messages through the chat
    template, with the ``ra`` passages in the prompt (RA-NEST) if any."""
    context = "\n\n".join(p.text for p in ra)
    if isinstance(prompt, str):
        text = RA_TEXT_TEMPLATE.format(context=context, prompt=prompt) if ra else prompt
        return lm.tokenize(text)
    messages = [dict(m) for m in prompt]
    if ra:
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = RA_CHAT_TEMPLATE.format(
            context=context, question=messages[last]["content"]
        )
    return lm.chat_prompt(messages)


def query_of(prompt: Prompt) -> str:
    """The retrieval query: the prompt, or the last user message of a chat."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    if not messages:
        return ""
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return str(messages[-1].get("content", ""))
