"""Evaluation tasks: examples built from Wikipedia leads, or read from a JSONL file.

Tasks (every filter is recorded in the task's ``filters`` and in the benchmark output, E7):

- ``completion-in``: text completion, in-corpus. A lead in the datastore (train split) is cut
  after ``prefix_tokens`` tokens; the prompt is that prefix (raw text, no chat template), the
  reference is the next ``reference_tokens`` tokens of the lead. The retrieval query is the
  prefix (paper: the prefix). Gold document: the lead itself.
- ``completion-out``: the same on leads kept out of the datastore (the title-hash test split;
  held-out, no gold document).
- ``qa``: "What is {title}?" as a chat message, for non-People leads in the datastore with a
  description; gold answers are the description and the description without parenthesised
  parts; gold document: the lead.
- ``jsonl``: one ``{"prompt", "reference"?, "answers"?, "gold_doc_id"?, "id"?, "format"?,
  "query"?, "stop"?, "max_new_tokens"?}`` object per line (``format``: ``"chat"`` or ``"text"``).

Examples are picked deterministically: candidates sorted by sha1 of the title.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from nest_integrations.evaluation.corpora import WikiLead, sha1_key
from nest_integrations.jsonl import jsonl_values


#: How reports and plots title each task.
TASK_TITLES = {
    "completion-in": "Completion, in-corpus",
    "completion-out": "Completion, held-out",
    "qa": 'QA "What is X?"',
    "entity-qa": "Grounded entity QA",
}


@dataclass(frozen=True)
class Example:
    """One evaluation input.

    Attributes:
        id: unique within its task.
        prompt: the user message (``chat``) or the raw text to complete.
        chat: apply the model's chat template to ``prompt`` as one user message.
        reference: gold continuation/answer text (ROUGE and perplexity), if any.
        answers: gold answers for answer-level recall, if any.
        gold_doc_id: the document a correct citation points to, if known.
        query: stage-1 retrieval query (default: ``prompt``).
        max_new_tokens: generation budget (default: the task's).
        stop: stop strings (the output is cut before the earliest one).
        distractors: grounded QA: the other entities' values for the asked attribute (an
            answer naming one is wrong; see ``grounded.answer_correct``).
        grounded: score with the grounded-QA metrics (correct, gold-cited share, off-topic
            copied tokens, run-on tokens).
    """

    id: str
    prompt: str
    chat: bool = False
    reference: str | None = None
    answers: tuple[str, ...] = ()
    gold_doc_id: str | None = None
    query: str | None = None
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    distractors: tuple[str, ...] = ()
    grounded: bool = False

    def engine_prompt(self) -> Any:
        """What ``NestEngine.generate`` takes: a string, or one chat user message."""
        return [{"role": "user", "content": self.prompt}] if self.chat else self.prompt

    @property
    def retrieval_query(self) -> str:
        return self.query or self.prompt


@dataclass
class Task:
    """A named list of examples with its generation budget and the filters that built it."""

    name: str
    examples: list[Example]
    max_new_tokens: int
    description: str = ""
    filters: list[str] = field(default_factory=list)

    def budget(self, ex: Example) -> int:
        return ex.max_new_tokens or self.max_new_tokens

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n_examples": len(self.examples),
            "max_new_tokens": self.max_new_tokens,
            "description": self.description,
            "filters": list(self.filters),
        }


# ----------------------------------------------------------------------------- completion


def cut_lead(
    lm: Any, text: str, prefix_tokens: int, reference_tokens: int
) -> tuple[str, str] | None:
    """Split ``text`` after ``prefix_tokens`` LM tokens: ``(prefix, reference)``, the reference
    being at most ``reference_tokens`` tokens. Cuts fall on token boundaries (the reference
    keeps its leading space). None when the text is too short for a reference of at least
    ``reference_tokens // 4`` tokens (and at least 8)."""
    ids, off = lm.tokenize_with_offsets(text)
    min_ref = max(8, reference_tokens // 4)
    if len(ids) < prefix_tokens + min_ref:
        return None
    cut = int(off[prefix_tokens, 0])
    end_tok = min(len(ids), prefix_tokens + reference_tokens)
    end = int(off[end_tok - 1, 1]) if end_tok < len(ids) else len(text)
    prefix, reference = text[:cut], text[cut:end]
    # The prompt must not end in whitespace (the next token carries its own leading space).
    stripped = prefix.rstrip()
    reference = prefix[len(stripped) :] + reference
    if not stripped or not reference.strip():
        return None
    return stripped, reference


def completion_task(
    lm: Any,
    leads: Sequence[WikiLead],
    *,
    in_corpus: bool,
    n: int,
    prefix_tokens: int,
    reference_tokens: int,
    pool: str = "",
) -> Task:
    """Text completion on ``leads``: ``in_corpus`` says whether they are in the datastore
    (then a citation of the lead itself is the correct one). ``pool`` describes where the
    leads come from (for the report's filter list)."""
    name = "completion-in" if in_corpus else "completion-out"
    ordered = sorted(leads, key=lambda lead: sha1_key(lead.title))
    examples = []
    for lead in ordered:
        if len(examples) >= n:
            break
        cut = cut_lead(lm, lead.extract, prefix_tokens, reference_tokens)
        if cut is None:
            continue
        prefix, reference = cut
        examples.append(
            Example(
                id=lead.title,
                prompt=prefix,
                reference=reference,
                gold_doc_id=lead.title if in_corpus else None,
            )
        )
    where = "in the datastore" if in_corpus else "held out of the datastore"
    return Task(
        name=name,
        examples=examples,
        max_new_tokens=reference_tokens,
        description=(
            f"Wikipedia lead completion, article {where}: {prefix_tokens}-token prefix -> "
            f"next <= {reference_tokens} tokens"
        ),
        filters=[
            f"{pool or 'given'} leads in sha1(title) order",
            f"leads with at least {prefix_tokens} + {max(8, reference_tokens // 4)} tokens",
        ],
    )


# ----------------------------------------------------------------------------- QA

_PARENS = re.compile(r"\s*\([^)]*\)")


def gold_answers(description: str) -> tuple[str, ...]:
    """The description, plus the description without parenthesised parts when that differs
    (e.g. "Finnish architect (1898-1976)" -> also "Finnish architect")."""
    answers = [description.strip()]
    bare = _PARENS.sub("", description).strip()
    if bare and bare not in answers:
        answers.append(bare)
    return tuple(a for a in answers if a)


def qa_task(leads: Sequence[WikiLead], *, n: int, max_new_tokens: int, pool: str = "") -> Task:
    """ "What is X?" over ``leads`` (in the datastore) that have a description and are not
    People (biographies ask "Who was X?")."""
    ordered = sorted(
        (lead for lead in leads if lead.description.strip() and lead.topic != "People"),
        key=lambda lead: sha1_key(lead.title),
    )
    examples = [
        Example(
            id=lead.title,
            prompt=f"What is {lead.title}?",
            chat=True,
            answers=gold_answers(lead.description),
            gold_doc_id=lead.title,
        )
        for lead in ordered[:n]
    ]
    return Task(
        name="qa",
        examples=examples,
        max_new_tokens=max_new_tokens,
        description='"What is X?" (chat) scored against the lead\'s one-line description',
        filters=[
            f"{pool or 'given'} leads (in the datastore) with a description, topic != People, "
            "in sha1(title) order",
            "gold answers: the description, and the description without parentheses",
        ],
    )


def entity_qa_task(questions: Sequence[Any], *, max_new_tokens: int, seed: int = 0) -> Task:
    """Grounded QA over the generated fictional-entity corpus (``entities.generate_corpus``):
    "What is the <attribute> of <entity>?" as a chat message; gold answer = the value, gold
    document = the entity's, distractors = the other entities' values for the attribute."""
    examples = [
        Example(
            id=q.id,
            prompt=q.question,
            chat=True,
            answers=(q.answer,),
            gold_doc_id=q.gold_doc_id,
            distractors=tuple(q.distractors),
            grounded=True,
        )
        for q in questions
    ]
    return Task(
        name="entity-qa",
        examples=examples,
        max_new_tokens=max_new_tokens,
        description="grounded QA over generated fictional entities sharing sentence frames",
        filters=[f"entities.generate_corpus(seed={seed}).sample_questions(n, seed={seed})"],
    )


# ----------------------------------------------------------------------------- JSONL


def load_jsonl_task(
    path: str | os.PathLike[str],
    *,
    max_new_tokens: int,
    default_format: str = "chat",
    name: str = "jsonl",
) -> Task:
    """A task from a JSONL file (see the module docstring). Every line must parse; a line
    without a ``prompt`` is an error (no example is silently skipped, E2)."""
    if default_format not in ("chat", "text"):
        raise ValueError(f"default_format={default_format!r} is invalid: use 'chat' or 'text'")
    examples = []
    with open(path, encoding="utf-8") as f:
        for i, obj in jsonl_values(path, f):
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("prompt"), str)
                or not obj["prompt"].strip()
            ):
                raise ValueError(f'{path}:{i}: each line needs a non-empty "prompt" string')
            answers = obj.get("answers") or ()
            if isinstance(answers, str):
                answers = (answers,)
            fmt = obj.get("format", default_format)
            if fmt not in ("chat", "text"):
                raise ValueError(f'{path}:{i}: "format" must be "chat" or "text", got {fmt!r}')
            examples.append(
                Example(
                    id=str(obj.get("id", i)),
                    prompt=obj["prompt"],
                    chat=fmt == "chat",
                    reference=obj.get("reference"),
                    answers=tuple(str(a) for a in answers),
                    gold_doc_id=obj.get("gold_doc_id"),
                    query=obj.get("query"),
                    max_new_tokens=obj.get("max_new_tokens"),
                    stop=tuple(obj.get("stop") or ()),
                )
            )
    if not examples:
        raise ValueError(f"{path}: no examples")
    return Task(
        name=name,
        examples=examples,
        max_new_tokens=max_new_tokens,
        description=f"JSONL task {os.path.basename(str(path))}",
        filters=["every line of the file"],
    )


__all__ = [
    "Example",
    "Task",
    "completion_task",
    "cut_lead",
    "entity_qa_task",
    "gold_answers",
    "load_jsonl_task",
    "qa_task",
]
