"""Prompts: what the engine decodes from (chat template, RA context) and what it retrieves with.

What a prompt means:

- A list of ``{"role", "content"}`` messages gets the model's chat template with the generation
  prompt.
- A string is completed as raw text, after the tokenizer's BOS when the tokenizer adds one by
  default (Llama, Mistral: as ``tokenizer(text)`` would; SmolLM2/GPT-2 add none). Passage keys
  are encoded after ``[BOS, "\\n"]``, so prompt and passages start alike.
- ``string_prompts`` (``STRING_PROMPT_MODES``) says what to do with a string for a model that
  has a chat template:

  - ``"completion"``: always complete the string as raw text;
  - ``"chat"``: always send the string as one user message;
  - ``"auto"`` (the default): complete it as raw text, but when that completion would be empty
    (the model's first token ends the text, as an instruct model does after a bare question
    such as "What is X?") send it as one user message instead. The engine decides this after
    the first forward pass (``chat_retry``), so a string that continues naturally is completed
    and a question gets an answer.

- With RA (``ra_passages > 0``) the top passages go into the prompt through the templates below.

What a prompt asks (``standalone_query``): retrieval, the title index and the evidence read one
question. A string prompt is that question; for chat messages it is the last user message made
standalone from the conversation by the policy's ``conversation`` mode (``policy.conversation``:
``"carry"``, ``"rewrite"`` with the engine's own LM, or ``"last"``), while the prompt the model
decodes from keeps the whole conversation.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from nest_integrations.lm.base import capabilities_of
from nest_integrations.policy import AnswerPolicy
from nest_integrations.policy.conversation import (
    CARRY_TURNS,
    REWRITE_TOKENS,
    carry_over,
    check_conversation,
    rewrite,
    user_messages,
)
from nest_integrations.retrieval.titles import conversation_titles
from nest_integrations.types import Passage

Prompt = str | Sequence[dict[str, str]]

#: Values of ``string_prompts`` (see the module docstring).
STRING_PROMPT_MODES = ("auto", "completion", "chat")

RA_CHAT_TEMPLATE = (
    "Answer the question with the background context as reference.\n"
    "Background:\n{context}\n\nQuestion: {question}"
)
RA_TEXT_TEMPLATE = "Background:\n{context}\n\n{prompt}"


def prompt_ids(
    lm: Any, prompt: Prompt, ra: Sequence[Passage] = (), *, as_chat: bool = False
) -> list[int]:
    """Token ids to decode from: a string prompt as raw text (after the default BOS, if any),
    chat messages through the chat template, with the ``ra`` passages in the prompt (RA-NEST)
    if any. ``as_chat`` sends a string prompt as one user message."""
    if isinstance(prompt, str) and as_chat:
        prompt = [{"role": "user", "content": prompt}]
    context = "\n\n".join(p.text for p in ra)
    if isinstance(prompt, str):
        text = RA_TEXT_TEMPLATE.format(context=context, prompt=prompt) if ra else prompt
        return bos_prefix(lm) + list(lm.tokenize(text))
    messages = [dict(m) for m in prompt]
    if ra:
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = RA_CHAT_TEMPLATE.format(
            context=context, question=messages[last]["content"]
        )
    return lm.chat_prompt(messages)


def bos_prefix(lm: Any) -> list[int]:
    """``[BOS]`` when the model's tokenizer adds a BOS token by default, else ``[]``
    (``Capabilities.string_prefix``)."""
    return list(capabilities_of(lm).string_prefix)


def has_chat_template(lm: Any) -> bool:
    """Whether the model's ``chat_prompt`` applies a chat template
    (``Capabilities.chat_template``)."""
    return capabilities_of(lm).chat_template


def check_string_prompts(mode: str) -> str:
    """``mode`` if it is a valid ``string_prompts`` value, else a ValueError naming them."""
    if mode not in STRING_PROMPT_MODES:
        raise ValueError(
            f"string_prompts={mode!r} is invalid: choose one of {list(STRING_PROMPT_MODES)}"
        )
    return mode


def string_as_chat(lm: Any, prompt: Prompt, mode: str) -> bool:
    """Whether a string prompt is sent as a user message from the start (mode ``"chat"``)."""
    return isinstance(prompt, str) and mode == "chat" and has_chat_template(lm)


def chat_retry(lm: Any, prompt: Prompt, mode: str, ended_at_once: bool) -> bool:
    """Mode ``"auto"``: a string prompt whose raw-text completion ended at once (its first token
    was an end token; not a stop string, not a length limit) is generated again as one user
    message, when the model has a chat template. Nothing was streamed, so the retry is
    invisible to a stream consumer."""
    return isinstance(prompt, str) and mode == "auto" and ended_at_once and has_chat_template(lm)


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


#: The ``NestEngine.generate`` arguments of a ``"rewrite"``: greedy, short, no passages, no
#: conversation of its own (``policy.conversation.condense_messages`` is one user message).
REWRITE_CALL: dict[str, Any] = dict(max_new_tokens=REWRITE_TOKENS, passages=[], decoding="greedy",
                                    policy=AnswerPolicy(conversation="last"), stop=["\n"])


def standalone_query(
    prompt: Prompt, conversation: str = "last", *, retriever: Any = None,
    complete: Callable[[list[dict[str, str]]], str] | None = None,
) -> str:
    """The question retrieval, title match and evidence read: a string prompt as it is; for
    chat messages, the last user message made standalone by ``conversation``
    (``policy.conversation``): ``"carry"`` with the titles ``retriever`` knows, ``"rewrite"``
    by ``complete`` (greedy decoding of a message list; without it, ``"carry"``), ``"last"``
    as it is. A single user message is always read as it is."""
    check_conversation(conversation, "conversation")
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    users = user_messages(messages)
    if conversation == "last" or len(users) < 2:
        return query_of(messages)
    if conversation == "rewrite" and complete is not None:
        return rewrite(messages, complete)
    return carry_over(messages, conversation_titles(retriever, users[-CARRY_TURNS:]))


