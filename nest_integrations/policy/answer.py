"""``AnswerPolicy`` and ``plan_answer``: one request planned before decoding.

A preset names a policy (here, ``POLICIES``) and a ``NestConfig`` (``config.PRESETS``) under the
same name. The policy decides:

- **stage 1**: with ``title_match``, the documents the question names, found by the title index
  (``retrieval.titles``: the store's titles looked for in the question's text, whatever its
  phrasing), go first: those retrieved keep their retrieval order, and a named document that
  retrieval missed is looked up by title and put after them; the list keeps its length.
- **the prompt**: ``title_context``: ``"off"`` = the top passages as retrieval ranked them
  (in-context RAG's prompt); ``"first"`` = the named documents' passages, then the other top
  passages; ``"only"`` = the named documents' passages alone when there are any.
- **evidence first** (``evidence``): for a chat question, the prompt passages' sentence that
  best answers it (``policy.evidence``); when its score reaches ``evidence_min`` the question
  is decoded with ``evidence_decoding`` (NEST) over that evidence: the answer opens with the
  sentence, copied and cited, and spans come from the rest of its passage only
  (``drafters.nest``). Below it, no sentence holds enough of the question. Where no passage
  is about the question's subject (``policy.evidence.on_subject``: "What is the Roman
  Empire?" over a corpus without it), there is no evidence and the plan cites no passage
  (``AnswerPlan.absent``): the model reads the retrieved passages in its prompt (a FAQ may
  still answer "What is the return policy?" without a title that names it) and answers by
  plain greedy decoding, uncited (its sentences flagged unsupported): nothing of a document
  not about the subject is copied or cited as the answer.
- **the method**: ``decoding`` when the call names none (and no evidence answers),
  ``completion_decoding`` for a prompt completed as raw text (a string the caller asks to
  continue, not a chat message: the call's form, not its wording). ``grounded`` decodes a chat
  question without evidence losslessly against its RA prompt (``rag-copy``: in-context RAG's
  answer, token for token) and continues raw text with NEST's relaxed span copying, where
  copying the corpus is the task; the ``copy`` preset copies for questions too.
- **the relevance gate**: with ``completion_relevance``, raw text is continued with the
  completion method only where stage 1 is about it: the top passage's relevance to the prompt
  (``retrieval.relevance``: the prompt's cosine to the passage over that of the passage's own
  opening of the same length) must reach the threshold; below it, stage 1 is about something
  else (a text the corpus does not hold retrieves its nearest other article) and the prompt is
  decoded with the chat method (``grounded``: ``rag-copy``, in-context RAG's answer), so no
  span of another document is copied and cited as its continuation.
- **the guards** (``config.Guards``): none under ``paper``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from nest_integrations.config import GROUNDED_MIN_CITATION_WORDS, PRESETS, Guards
from nest_integrations.core.evidence import EvidenceSpan
from nest_integrations.drafters import Method, get_method
from nest_integrations.policy.conversation import check_conversation
from nest_integrations.policy.evidence import (
    EVIDENCE_SCORERS,
    asked_beyond,
    choose,
    opens_document,
)
from nest_integrations.retrieval.titles import (
    LOOKUP_LIMIT,
    TitleMatch,
    first_passages,
    index_of,
    lookup_of,
    title_of,
)
from nest_integrations.types import Passage

#: What ``title_context`` accepts.
TITLE_CONTEXTS = ("off", "first", "only")
#: The method of a call, engine and policy that all name none: the paper's NEST.
FALLBACK_DECODING = "nest"


@dataclass(frozen=True, kw_only=True)
class AnswerPolicy:
    """What to retrieve, prompt, decode with and guard (see the module docstring).

    Attributes:
        title_match: stage 1 puts the documents the question names first (title index).
        title_context: ``"off"``, ``"first"`` or ``"only"``: the named documents' passages in
            the RA prompt (see the module docstring).
        decoding: the method (``drafters.METHODS``) when the call and the engine name none.
        completion_decoding: the same for a prompt completed as raw text (None: ``decoding``).
        completion_relevance: the relevance (``retrieval.relevance``) stage 1's top passage
            must reach for ``completion_decoding`` to continue raw text; below it, or with no
            passage, raw text is decoded with ``decoding``. None: no gate.
        guards: the output guards (``config.Guards``).
        evidence: evidence first, then copy (``policy.evidence``): the scorer that chooses the
            prompt passages' sentence that answers a chat question (one of
            ``EVIDENCE_SCORERS``), or None (off).
        evidence_min: the chosen sentence's score needed to answer from it; below it (no
            sentence holds enough of the question) the question is decoded with ``decoding``.
        evidence_decoding: the method that copies the evidence (its memory is the evidence
            window; ``drafters.nest``).
        conversation: how a chat's last message becomes the question that retrieval, title
            match and evidence read (``policy.conversation``): ``"carry"``, ``"rewrite"`` or
            ``"last"``.
    """

    title_match: bool = False
    title_context: str = "off"
    decoding: str | None = None
    completion_decoding: str | None = None
    completion_relevance: float | None = None
    guards: Guards = field(default_factory=Guards)
    evidence: str | None = None
    evidence_min: float = 0.0
    evidence_decoding: str = "nest"
    conversation: str = "carry"

    def __post_init__(self) -> None:
        check_conversation(self.conversation)
        if not isinstance(self.title_match, bool):
            raise ValueError(f"AnswerPolicy.title_match={self.title_match!r} is invalid: "
                             "allowed True or False")
        if self.title_context not in TITLE_CONTEXTS:
            raise ValueError(f"AnswerPolicy.title_context={self.title_context!r} is invalid: "
                             f"allowed one of {TITLE_CONTEXTS}")
        for name in (self.decoding, self.completion_decoding):
            if name is not None:
                get_method(name)  # an unknown method fails here, listing the known ones
        r = self.completion_relevance
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))
                              or not 0.0 <= r <= 2.0):
            raise ValueError(f"AnswerPolicy.completion_relevance={r!r} is invalid: allowed None "
                             "or a number in [0, 2] (1.0: as close as the passage's own opening)")
        if self.evidence is not None and self.evidence not in EVIDENCE_SCORERS:
            raise ValueError(f"AnswerPolicy.evidence={self.evidence!r} is invalid: allowed None "
                             f"or one of {EVIDENCE_SCORERS}")
        m = self.evidence_min
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0:
            raise ValueError(f"AnswerPolicy.evidence_min={m!r} is invalid: allowed a number "
                             "in [0, 1]")
        if get_method(self.evidence_decoding).make_drafter is None:
            raise ValueError(f"AnswerPolicy.evidence_decoding={self.evidence_decoding!r} is "
                             "invalid: a method that copies (one with a drafter)")
        if not isinstance(self.guards, Guards):
            raise ValueError("AnswerPolicy.guards must be a config.Guards")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "AnswerPolicy":
        """The policy of a named preset, with field overrides (``guards`` too)."""
        if name not in POLICIES:
            raise ValueError(f"unknown preset {name!r}: choose one of {sorted(POLICIES)}")
        return POLICIES[name].replace(**overrides)

    def replace(self, **changes: Any) -> "AnswerPolicy":
        """A copy with some fields changed; a ``guards`` dict updates the guards' fields."""
        if isinstance(changes.get("guards"), dict):
            changes["guards"] = dataclasses.replace(self.guards, **changes["guards"])
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown AnswerPolicy field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def method(self, *names: str | None, completion: bool = False) -> Method:
        """The first method named in ``names`` (call, engine), else the policy's for a chat
        prompt or (``completion``) a raw-text one, else NEST."""
        own = (self.completion_decoding or self.decoding) if completion else self.decoding
        name = next((n for n in names if n), None) or own or FALLBACK_DECODING
        return get_method(name)


#: ``grounded``'s relevance gate for raw text (docs/decisions.md, "Raw text the corpus is not
#: about"): the threshold with the fewest errors on the dev families (completion questions and
#: lead openings of the sample corpus's Wikipedia side against Wikipedia leads it does not
#: hold), ``python -m benchmarks.completion_gate``.
GROUNDED_COMPLETION_RELEVANCE = 0.735
#: ``grounded``'s evidence scorer and threshold (docs/decisions.md, "Evidence first, then
#: copy"): of the three scorers, the one whose scores separate the dev split's answerable
#: questions (entities and open-ended prompts) from unanswerable ones (entity questions asked of
#: the sample corpus), and the threshold between them, ``python -m benchmarks.evidence``.
GROUNDED_EVIDENCE = "combined"
GROUNDED_EVIDENCE_MIN = 0.33
#: ``grounded``'s bar for the model's say in the evidence quote (``Guards.quote_check``): off.
#: On the dev split (``python -m benchmarks.evidence_rank``) -1.0 kept every right pick (from
#: -0.86) and rejected 10% of wrong candidates, but on the held-out families of
#: ``benchmarks.answers`` it rejected 7 of 10 definition quotes (FOLDOC's terse entries score
#: low as an answer) and answered them with RAG: a check that costs right quotes is off until
#: a bar is chosen on a dev split that holds those families (docs/decisions.md).
GROUNDED_QUOTE_CHECK: float | None = None
_GROUNDED_GUARDS = Guards(stop_on_repeat=True, min_citation_words=GROUNDED_MIN_CITATION_WORDS,
                          lock_document=True, confidence_guard=0.3, eos_guard=0.5,
                          quote_check=GROUNDED_QUOTE_CHECK)
#: The policy part of each preset (``config.PRESETS`` holds the algorithm part).
POLICIES: dict[str, AnswerPolicy] = {
    **{name: AnswerPolicy() for name in PRESETS},
    "grounded": AnswerPolicy(title_match=True, title_context="only", decoding="rag-copy",
                             completion_decoding="nest",
                             completion_relevance=GROUNDED_COMPLETION_RELEVANCE,
                             guards=_GROUNDED_GUARDS, evidence=GROUNDED_EVIDENCE,
                             evidence_min=GROUNDED_EVIDENCE_MIN),
    "copy": AnswerPolicy(title_match=True, title_context="first", decoding="nest",
                         guards=_GROUNDED_GUARDS),
}


@dataclass
class AnswerPlan:
    """One request's plan: the method (for a chat prompt; ``completion_method`` for raw text),
    stage 1's passages (reordered), the RA prompt's passages, the guards, and the titles the
    question named."""

    method: Method
    passages: list[Passage]
    prompt_passages: list[Passage]
    guards: Guards
    matches: list[TitleMatch] = field(default_factory=list)
    completion_method: Method | None = None
    relevance: float | None = None  # the relevance gate's measure, when it ran
    evidence: EvidenceSpan | None = None  # the chosen evidence, when a chat answer copies it
    #: the method without the evidence: what answers when the model rejects the quote
    #: (``Guards.quote_check``); None when no evidence was chosen
    fallback: Method | None = None
    #: the question's subject where evidence first found no passage about it
    #: (``policy.evidence.Choice.absent``): the plan then cites no passage (``passages`` is
    #: empty; the prompt still holds the retrieved ones) and decodes greedily
    absent: str | None = None

    def without_evidence(self) -> "AnswerPlan":
        """This plan with no evidence: the method it had before the evidence was chosen."""
        if self.evidence is None or self.fallback is None:
            return self
        return dataclasses.replace(self, method=self.fallback, evidence=None, fallback=None)

    def method_for(self, as_chat: bool) -> Method:
        """The method of the prompt as read: chat messages, or raw text to continue."""
        return self.method if as_chat or self.completion_method is None else self.completion_method


def plan_answer(
    policy: AnswerPolicy,
    question: str,
    passages: Sequence[Passage],
    retriever: Any = None,
    *,
    n_ra: int = 0,
    decoding: Sequence[str | None] = (),
    raw_text: bool = False,
) -> AnswerPlan:
    """Plan one request (module docstring): ``passages`` are stage 1's, ``n_ra`` the passages
    the RA prompt holds, ``decoding`` the methods the call and the engine name (None = none),
    ``raw_text`` whether the prompt is read as raw text to continue (the relevance gate runs
    only then)."""
    method = policy.method(*decoding)
    completion = policy.method(*decoding, completion=True)
    relevance = None
    if (raw_text and policy.completion_relevance is not None and not any(decoding)
            and completion.name != method.name):
        relevance = gate_relevance(question, passages, retriever)
        if relevance < policy.completion_relevance:
            completion = method
    retrieved = ranked = list(passages)
    matches: list[TitleMatch] = []
    if policy.title_match and retrieved:
        index, found = index_of(retriever, retrieved, question)
        matches = index.match(question)
        lookup = lookup_of(retriever)
        if found:  # the lookup already ran: its passages serve named_first's
            lookup = lambda titles, limit: [p for p in found if title_of(p) in titles][:limit]  # noqa: E731
        if matches:
            ranked = named_first(retrieved, matches, index.titles, lookup)
            if not asked_beyond(question, " ".join(m.title for m in matches)):
                ranked = with_openings(ranked, matches, index.titles, lookup)
    n_ra = n_ra or method.ra_passages
    prompt = prompt_passages(retrieved if policy.title_context == "off" else ranked, n_ra,
                             policy.title_context)
    evidence = fallback = absent = None
    if policy.evidence is not None and not raw_text and not any(decoding) and prompt:
        choice = choose(question, prompt, policy.evidence, retriever)
        found, absent = choice.evidence, choice.absent
        if found is not None and found.score >= policy.evidence_min:
            evidence, fallback, method = found, method, get_method(policy.evidence_decoding)
        if absent is not None:  # no passage is about the subject: none to copy or cite
            ranked, method = [], get_method("greedy")  # the prompt keeps them to read
    return AnswerPlan(method, ranked, prompt, policy.guards, matches, completion, relevance,
                      evidence, fallback, absent)


def gate_relevance(prompt: str, passages: Sequence[Passage], retriever: Any = None) -> float:
    """The relevance gate's measure: stage 1's top passage's relevance to ``prompt``
    (``retrieval.relevance``, under the retriever's embedder); 0.0 without passages."""
    from nest_integrations.retrieval.relevance import retriever_relevance

    return retriever_relevance(retriever, prompt, passages[0]) if passages else 0.0


def named_first(
    passages: Sequence[Passage],
    matches: Sequence[TitleMatch],
    titles: dict[str, str],
    lookup: Any = None,
) -> list[Passage]:
    """``passages`` with those of the named documents first (in retrieval order), then the
    first passage of each named document retrieval missed (looked up by title, in match
    order), then the rest; as long as ``passages``. Named passages carry
    ``metadata["title_match"] = True``."""
    named = list(dict.fromkeys(d for m in matches for d in m.doc_ids))
    wanted = set(named)
    hit = [p for p in passages if (p.doc_id or p.id) in wanted]
    missing = [d for d in named if d not in {p.doc_id or p.id for p in hit}]
    extra: list[Passage] = []
    if missing and lookup is not None:
        found = first_passages(lookup([titles[d] for d in missing if d in titles], LOOKUP_LIMIT))
        by_doc = {p.doc_id or p.id: p for p in found}
        extra = [by_doc[d] for d in missing if d in by_doc]
    front = [_mark(p) for p in hit + extra]
    ids = {p.id for p in front}
    return (front + [p for p in passages if p.id not in ids])[: len(passages)]


def with_openings(
    passages: Sequence[Passage],
    matches: Sequence[TitleMatch],
    titles: dict[str, str],
    lookup: Any = None,
) -> list[Passage]:
    """``passages`` with each named document's opening passage (its first: where its lead is)
    before that document's other passages, looked up by title where retrieval missed it; as
    long as ``passages``. For a question that asks nothing beyond what the document is called
    ("How does the try statement work?"): its answer is the document's lead."""
    out = list(passages)
    for doc in dict.fromkeys(d for m in matches for d in m.doc_ids):
        mine = [i for i, p in enumerate(out) if (p.doc_id or p.id) == doc]
        if not mine or opens_document(out[mine[0]]):
            continue
        have = [i for i in mine if opens_document(out[i])]
        if have:  # retrieved, ranked lower: it moves up
            out.insert(mine[0], out.pop(have[0]))
        elif lookup is not None and doc in titles:
            first = [p for p in first_passages(lookup([titles[doc]], LOOKUP_LIMIT))
                     if (p.doc_id or p.id) == doc and opens_document(p)]
            if first:
                out.insert(mine[0], _mark(first[0]))
                out.pop()
    return out


def prompt_passages(passages: Sequence[Passage], n: int, title_context: str = "off") -> list[Passage]:
    """The ``n`` passages of the RA prompt: the first ``n``, or by ``title_context``."""
    if n <= 0:
        return []
    if title_context == "only":
        named = [p for p in passages if (p.metadata or {}).get("title_match")]
        if named:
            return named[:n]
    return list(passages[:n])


def _mark(p: Passage) -> Passage:
    return dataclasses.replace(p, metadata={**(p.metadata or {}), "title_match": True})


__all__ = ["FALLBACK_DECODING", "GROUNDED_COMPLETION_RELEVANCE", "GROUNDED_EVIDENCE",
           "GROUNDED_EVIDENCE_MIN", "GROUNDED_QUOTE_CHECK", "POLICIES", "TITLE_CONTEXTS",
           "AnswerPlan", "AnswerPolicy", "gate_relevance", "named_first", "plan_answer",
           "prompt_passages", "with_openings"]
