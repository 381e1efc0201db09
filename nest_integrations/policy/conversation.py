"""Conversations: the standalone question that retrieval, title match and evidence read.

A chat sends the whole conversation; the model's prompt keeps all of it (chat template), but
retrieval, the title index and the evidence scorer read one question. Read alone, a follow-up
("And in The Bahamas?", "What is its capital?", "How does it work?") names no attribute or no
subject, so it retrieves and cites the wrong thing. ``AnswerPolicy.conversation`` says how the
question is made standalone (``CONVERSATION_MODES``):

- ``"last"``: the last user message as it is (what a single question needs);
- ``"carry"`` (``carry_over``): a rule from how English continues a question, with no model:

  - **pronoun coreference**: a third-person pronoun or locative "there" ("its", "it", "they",
    "there"; not an expletive "it is true that", not an existential "is there") refers to the
    previous question's subject, which takes its place: "What is its capital?" -> "What is
    Cambodia's capital?";
  - **ellipsis of the predicate**: a fragment without a verb whose only content is a new named
    subject ("And in Y?", "What about Y?", "Y?") asks the previous question again of it: the
    previous subject is replaced by the new one in the previous (standalone) question;
  - **ellipsis of the subject**: a fragment without a named subject ("And the population?") or
    a question whose last noun phrase is a bare definite ("What is the currency?": bridging
    anaphora, a definite with an implicit argument) asks it of the previous subject ("... of
    Cambodia");
  - anything else (a question with its own subject and predicate, an indefinite "What is a
    generator?") is a new question and left alone.

  A question's subject is, in this order: a title of the collection found in it (the title
  index, ``retrieval.titles``: the previous turn's title-matched documents), preferring a
  proper noun over a title that is a common noun ("life expectancy"); a run of capitalised
  words inside the sentence; a quoted phrase; the complement of a definitional question
  ("What is X?", "How does X work?", "Tell me about X").
- ``"rewrite"``: the engine's own LM rewrites the last message into a standalone question from
  the conversation (``condense_messages``: the condense step of LangChain's
  ``create_history_aware_retriever`` and LlamaIndex's ``CondensePlusContextChatEngine``),
  greedy and short; an empty rewrite falls back to the last message.

Only user messages are read: the previous subject is the one the user asked about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from nest_integrations.core.sentences import STOP_WORDS
from nest_integrations.retrieval.titles import TitleIndex, normalize

#: What ``AnswerPolicy.conversation`` accepts (see the module docstring).
CONVERSATION_MODES = ("carry", "rewrite", "last")
#: User turns the carry-over reads (the last one and those before it).
CARRY_TURNS = 4

_WORD = re.compile(r"[^\W_]+(?:['\u2019\u02bc][^\W_]+)*", re.UNICODE)
#: Auxiliaries and copulas: a fragment has none (an ellipsis leaves no verb).
_VERBS = frozenset("""is are was were be been being am do does did has have had can could will
would shall should may might must 's 're""".split())
#: The verbs of a request ("Tell me about X."): no content for evidence (``STOP_WORDS``), but
#: a verb here: a sentence with one is no fragment to complete from the previous turn.
_REQUEST_VERBS = frozenset("tell explain describe give show say said".split())
#: Words that carry no content in a question or a fragment: connectives, wh-words,
#: discourse particles (beside ``core.sentences.STOP_WORDS``, less the request verbs).
_FUNCTION = (STOP_WORDS - _REQUEST_VERBS) | frozenset("""about also too please then now ok okay well so same
instead case as how what which who whom whose when where why much many again
question""".split())
_CONNECTIVES = ("and what about", "and how about", "what about", "how about", "and", "or",
                "but", "also", "same for", "then")
#: Lower-case words inside a name ("Bosnia and Herzegovina", "Trinidad and Tobago").
_JOINERS = frozenset("of and de la del".split())
_PREPOSITIONS = frozenset("""in of for at on from to into by with about near around across over
under through within inside outside beyond between among""".split())
#: Pronouns that refer back, by what takes their place: subject/object, possessive, locative.
_PRONOUNS = {"it": "", "they": "", "them": "", "he": "", "she": "", "him": "", "this": "",
             "that": "", "its": "'s", "their": "'s", "his": "'s", "her": "'s", "there": "in"}
#: After pronominal "this"/"that" comes a verb or the end, not a noun ("this function").
_PRONOMINAL_NEXT = _VERBS | frozenset("mean means work works do cost costs".split())
_EXPLETIVE = re.compile(r"\b(?:it\s+(?:is|was|'s|seems|appears)|is\s+it|was\s+it)\s+"
                        r"(?:\w+\s+){0,2}?(?:that|to|whether|if)\b", re.IGNORECASE)
_EXISTENTIAL = re.compile(r"\b(?:(?:is|are|was|were)\s+there|there\s+(?:is|are|was|were|'s))\b",
                          re.IGNORECASE)
_DEFINITIONAL = [
    re.compile(r"^(?:what|who)\s+(?:is|are|was|were|'s)\s+(?P<x>.+?)$", re.IGNORECASE),
    re.compile(r"^what\s+(?:does|do)\s+(?P<x>.+?)\s+(?:mean|do|stand for)\b", re.IGNORECASE),
    re.compile(r"^how\s+(?:does|do|did|can|is|are)\s+(?P<x>.+?)\s+(?:work|function|operate|"
               r"run)\b", re.IGNORECASE),
    re.compile(r"^(?:tell me about|explain|describe|define)\s+(?P<x>.+?)$", re.IGNORECASE),
]
_POSSESSIVE = re.compile(r"['\u2019\u02bc]s$", re.IGNORECASE)
#: Where a clause ends or a subordinate one starts.
_CLAUSE = re.compile(r"[,;:]|\b(?:when|while|before|after|because|since|if|although|though|"
                     r"until|unless|whether|who|which|that)\b", re.IGNORECASE)
_ARTICLE = re.compile(r"^(?:a|an|the)\s+", re.IGNORECASE)
_QUOTED = re.compile(r"[\"\u201c\u201d]([^\"\u201c\u201d]{1,80})[\"\u201c\u201d]")


@dataclass(frozen=True)
class Resolved:
    """One user turn made standalone: its ``text``, the ``standalone`` question, its
    ``subject`` (as written, or None) and how it was read (``kind``: ``"new"``, ``"pronoun"``,
    ``"ellipsis"``, ``"bridging"``)."""

    text: str
    standalone: str
    subject: str | None
    kind: str = "new"


def user_messages(messages: Sequence[Any]) -> list[str]:
    """The contents of the user messages, in order."""
    return [str(m.get("content", "")) for m in messages if m.get("role") == "user"]


def carry_over(messages: Sequence[Any], titles: TitleIndex | None = None) -> str:
    """The last user message made standalone by the carry-over rule (module docstring)."""
    turns = user_messages(messages)[-CARRY_TURNS:]
    return resolve_turns(turns, titles)[-1].standalone if turns else ""


def resolve_turns(turns: Sequence[str], titles: TitleIndex | None = None) -> list[Resolved]:
    """Each user turn made standalone, reading each against the one before it."""
    out: list[Resolved] = []
    for text in turns:
        out.append(resolve(text, out[-1] if out else None, titles))
    return out


def resolve(text: str, previous: Resolved | None, titles: TitleIndex | None = None) -> Resolved:
    """``text`` made standalone against the ``previous`` turn (module docstring)."""
    text = str(text).strip()
    if previous is None or not previous.subject:
        return Resolved(text, text, subject_of(text, titles))
    antecedent = previous.subject
    named = named_in(text, titles)
    # a pronoun may refer to a name of its own sentence in an earlier clause ("When Ada was
    # young, where did she live?"), never in its own (binding: a pronoun is free in its clause,
    # so "the GDP ... there" is not GDP); those pronouns are left alone
    ends = [m.end() for n in named for m in _mentions(text, n)]
    pronouns = [p for p in anaphors(text) if not any(
        e <= p.start() and _CLAUSE.search(text, e, p.start()) for e in ends)]
    if pronouns:
        return Resolved(text, substitute(text, pronouns, antecedent), antecedent, "pronoun")
    rest = [w for w in _words(_without(text, named)) if w.casefold() not in _FUNCTION]
    verbless = not any(w.casefold() in _VERBS for w in _words(text))
    if named and not rest and verbless:  # "And in Y?": the previous question, of Y
        return Resolved(text, replace_subject(previous.standalone, antecedent, named[0]),
                        named[0], "ellipsis")
    if not named and rest and (verbless or _connective(text)):
        phrase = _strip_connective(text)
        if _ARTICLE.match(phrase) and phrase.split()[0].casefold() != "the":
            # "And a toaster?": an indefinite is a new referent in the previous one's place
            new = _ARTICLE.sub("", phrase)
            return Resolved(text, replace_subject(previous.standalone, antecedent, new), new,
                            "ellipsis")
        # "And the population?": a definite is an attribute of the previous subject
        return Resolved(text, f"What is {phrase} of {antecedent}?", antecedent, "ellipsis")
    if not named and bridging(text):  # "What is the currency?"
        return Resolved(text, f"{text.rstrip(' ?.!')} of {antecedent}?", antecedent, "bridging")
    return Resolved(text, text, subject_of(text, titles))


# ----------------------------------------------------------------------------- reading a turn


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def anaphors(text: str) -> list[re.Match[str]]:
    """The pronouns of ``text`` that refer back (``_PRONOUNS``): not an expletive "it" ("is
    it true that"), an existential "there" ("is there") or a determiner "this"/"that"."""
    expletive = [m.span() for m in _EXPLETIVE.finditer(text)]
    existential = [m.span() for m in _EXISTENTIAL.finditer(text)]
    words = list(_WORD.finditer(text))
    out = []
    for i, m in enumerate(words):
        w = m.group().casefold()
        if w not in _PRONOUNS:
            continue
        if w == "it" and _within(m.start(), expletive) or \
                w == "there" and _within(m.start(), existential):
            continue
        nxt = words[i + 1].group().casefold() if i + 1 < len(words) else None
        if w in ("this", "that") and nxt is not None and nxt not in _PRONOMINAL_NEXT:
            continue
        if w == "that" and i > 0 and words[i - 1].group().casefold() not in _PREPOSITIONS \
                and nxt is not None and words[i - 1].group().casefold() not in _VERBS:
            continue  # a complementiser or relative "that" ("the claim that ...")
        out.append(m)
    return out


def _within(at: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(a <= at < b for a, b in spans)


def substitute(text: str, pronouns: Sequence[re.Match[str]], subject: str) -> str:
    """``text`` with each pronoun replaced by ``subject`` (possessives as "X's", a locative
    "there" as "in X" unless a preposition precedes it)."""
    out, at = [], 0
    for m in pronouns:
        w = m.group().casefold()
        kind = _PRONOUNS[w]
        before = text[: m.start()].split()
        if w == "her":  # possessive before a noun, else an object
            after = text[m.end():].split()
            kind = "'s" if after and after[0].strip("?.!,").casefold() not in _FUNCTION else ""
        if kind == "'s":
            new = f"{subject}'s"
        elif kind == "in" and not (before and before[-1].casefold() in _PREPOSITIONS):
            new = f"in {subject}"
        else:
            new = subject
        out += [text[at : m.start()], new]
        at = m.end()
    return "".join(out + [text[at:]])


def named_in(text: str, titles: TitleIndex | None = None) -> list[str]:
    """The named subjects of ``text`` as written: titles of the collection (proper nouns first),
    runs of capitalised words inside the sentence, quoted phrases."""
    found = [s for s, _ in _title_spans(text, titles)]
    for run in _capitalised_runs(text) + _QUOTED.findall(text):
        if not any(normalize(run) in normalize(f) or normalize(f) in normalize(run)
                   for f in found):
            found.append(run)
    return found


def subject_of(text: str, titles: TitleIndex | None = None) -> str | None:
    """What ``text`` asks about (module docstring), as written, or None."""
    named = named_in(text, titles)
    x = definitional_subject(text, named)
    return x or (named[0] if named else None)


def definitional_subject(text: str, named: Sequence[str] | None = None) -> str | None:
    """The subject of ``text`` where it asks only what the subject is or how it works ("What
    is X?", "How does X work?", "Tell me about X": ``_DEFINITIONAL``), as written; None for
    any other question ("What is the Z of X?" and "X's Z" ask for an attribute of X).
    ``named``: the question's named subjects (``named_in``), where the caller has them: the
    complement must hold the first."""
    named = named_in(text) if named is None else named
    for pattern in _DEFINITIONAL:
        m = pattern.match(text.strip().rstrip("?.! \t"))  # the patterns end at the words
        x = _ARTICLE.sub("", m.group("x").strip()) if m else ""
        # a plain noun phrase: "the Z of X" and "X's Z" ask for an attribute of X (a
        # hyphenated compound is one word: "call-by-need" holds no preposition)
        simple = not any(w.casefold() in _PREPOSITIONS or _POSSESSIVE.search(w)
                         for w in _words(" ".join(t for t in x.split() if "-" not in t)))
        if x and simple and any(w.casefold() not in _FUNCTION for w in _words(x)) and (
                not named or normalize(named[0]) in normalize(x)):
            return x  # "What is a Zorvane pump?": the whole noun phrase, not its proper noun
    return None


def _title_spans(text: str, titles: TitleIndex | None) -> list[tuple[str, bool]]:
    """Titles found in ``text``, as written there, each with whether it is written as a proper
    noun (capitalised inside the sentence); proper nouns first, then longest."""
    if titles is None or not len(titles):
        return []
    spans = _normal_word_spans(text)
    out = []
    for m in titles.match(text):
        if spans is None or m.end > len(spans):
            out.append((m.title, False, False))
            continue
        a, b = spans[m.start][0], spans[m.end - 1][1]
        surface = text[a:b]
        proper = any(w[:1].isupper() for w in _words(surface)) and a > _first_word_end(text)
        before = _words(text[:a])
        argument = bool(before) and before[-1].casefold() in _PREPOSITIONS
        out.append((surface, proper or _bare(text, surface), argument))
    # a proper noun first, then the object of a preposition ("the Z of X": X is the subject)
    out.sort(key=lambda t: (not t[1], not t[2], -len(t[0].split())))
    return [(s, p) for s, p, _ in out]


def _normal_word_spans(text: str) -> list[tuple[int, int]] | None:
    """The character span of each word of ``normalize(text)``, or None where they do not line
    up one to one."""
    spans, words = [], []
    for m in re.finditer(r"[^\W_]+", text):
        s = m.start()
        if m.group().casefold() == "s" and s >= 2 and text[s - 1] in "'\u2019\u02bc" \
                and text[s - 2].isalnum():
            continue  # a possessive "'s": normalize drops it
        n = normalize(m.group()).split()
        if len(n) != 1:
            return None
        spans.append(m.span())
        words.extend(n)
    return spans if words == normalize(text).split() else None


def _first_word_end(text: str) -> int:
    m = _WORD.search(text)
    return m.end() if m else 0


def _bare(text: str, phrase: str) -> bool:
    """Whether ``text`` is nothing but ``phrase`` with function words around it ("Y?")."""
    rest = _without(text, [phrase])
    return not any(w.casefold() not in _FUNCTION for w in _words(rest))


def _capitalised_runs(text: str) -> list[str]:
    """Runs of capitalised words inside the sentence (the first word is capitalised anyway,
    unless the whole text is the run: "The Bahamas?"); a capitalised function word only
    inside or at the start of a run ("The Bahamas", "Bosnia and Herzegovina")."""
    words = list(_WORD.finditer(text))
    runs: list[list[re.Match[str]]] = []
    cur: list[re.Match[str]] = []
    for i, m in enumerate(words):
        w = m.group()
        cap = w[:1].isupper() and w != "I"
        joiner = w.casefold() in _JOINERS and cur
        if (cap or joiner) and (i > 0 or _bare_caps(words) or _topic(text, words)):
            cur.append(m)
            continue
        if cur:
            runs.append(cur)
        cur = []
    if cur:
        runs.append(cur)
    out = []
    for run in runs:
        while run and run[-1].group().casefold() in _FUNCTION:
            run = run[:-1]
        while run and run[0].group().casefold() in _FUNCTION and not (
                len(run) > 1 and run[0].group().casefold() == "the"):
            run = run[1:]
        if run and any(m.group().casefold() not in _FUNCTION for m in run):
            out.append(_POSSESSIVE.sub("", text[run[0].start() : run[-1].end()]))
    return out


def _topic(text: str, words: Sequence[re.Match[str]]) -> bool:
    """Whether the text opens with a capitalised topic set off by a colon, a comma or a
    possessive ("Cambodia: what is ...?", "Malawi's capital?")."""
    i = 0
    while i < len(words) and (words[i].group()[:1].isupper() or i and
                              words[i].group().casefold() in _JOINERS):
        i += 1
    if not i or words[0].group().casefold() in _FUNCTION:
        return False
    after = text[words[i - 1].end():].lstrip()
    return after[:1] in (":", ",") or words[i - 1].group()[-2:].casefold() in ("'s", "’s")


def _bare_caps(words: Sequence[re.Match[str]]) -> bool:
    """Whether the text is one run of capitalised words with function words around it
    ("The Bahamas?", "And Malawi?"; not "Tell me about Germany")."""
    ws = [m.group() for m in words]
    while ws and ws[0].casefold() in _FUNCTION:
        ws = ws[1:]
    while ws and ws[-1].casefold() in _FUNCTION:
        ws = ws[:-1]
    return bool(ws) and all(w[:1].isupper() or w.casefold() in _JOINERS for w in ws)


def _mentions(text: str, phrase: str) -> list[re.Match[str]]:
    return list(re.finditer(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", text, re.IGNORECASE))


def _without(text: str, phrases: Sequence[str]) -> str:
    for p in phrases:
        text = re.sub(re.escape(p), " ", text, flags=re.IGNORECASE)
    return text


def _connective(text: str) -> bool:
    low = " ".join(_words(text)).casefold()
    return any(low == c or low.startswith(c + " ") for c in _CONNECTIVES)


def _strip_connective(text: str) -> str:
    words = _words(text)
    low = " ".join(words).casefold()
    for c in _CONNECTIVES:
        if low.startswith(c + " "):
            words = words[len(c.split()):]
            break
    return " ".join(words)


def bridging(text: str) -> bool:
    """Whether ``text`` ends in a bare definite noun phrase: "the" and content words up to the
    end, no complement after them ("What is the currency?", not "the capital of X")."""
    words = [w.casefold() for w in _words(text)]
    if "the" not in words:
        return False
    tail = words[len(words) - words[::-1].index("the"):]
    return bool(tail) and all(w not in _FUNCTION for w in tail)


def replace_subject(question: str, old: str, new: str) -> str:
    """``question`` with its subject ``old`` replaced by ``new`` (case-insensitively); where
    ``old`` is not written there, ``new`` is added at the end."""
    pattern = re.compile(r"(?<!\w)" + re.escape(old) + r"(?!\w)", re.IGNORECASE)
    if pattern.search(question):
        return pattern.sub(lambda _: new, question, count=1)
    return f"{question.rstrip(' ?.!')} ({new})?"


# ----------------------------------------------------------------------------- LM rewrite

CONDENSE_PROMPT = (
    "Rewrite the last question of this conversation so that it can be understood without "
    "the conversation: name what it refers to. Do not answer it. Write only the question.\n\n"
    "{history}\n\nLast question: {question}\nStandalone question:"
)
#: Tokens a rewrite may take.
REWRITE_TOKENS = 40


def condense_messages(messages: Sequence[Any], turns: int = CARRY_TURNS) -> list[dict[str, str]]:
    """One user message asking the LM to rewrite the last question as a standalone one, with
    the conversation's last ``turns`` user turns and the answers between them."""
    chat = [m for m in messages if m.get("role") in ("user", "assistant")]
    last = max((i for i, m in enumerate(chat) if m.get("role") == "user"), default=None)
    if last is None:
        return []
    users = [i for i, m in enumerate(chat[:last]) if m.get("role") == "user"][-(turns - 1):]
    history = chat[users[0] : last] if users else []
    lines = [f"{'User' if m['role'] == 'user' else 'Assistant'}: {str(m.get('content', ''))}"
             for m in history]
    text = CONDENSE_PROMPT.format(history="\n".join(lines),
                                  question=str(chat[last].get("content", "")))
    return [{"role": "user", "content": text}]


def rewrite(messages: Sequence[Any], complete: Callable[[list[dict[str, str]]], str]) -> str:
    """The LM's standalone rewrite of the last user message (``complete`` decodes a message
    list greedily), or the last message where the rewrite is empty."""
    users = user_messages(messages)
    if not users:
        return ""
    if len(users) < 2:
        return users[-1]
    out = complete(condense_messages(messages))
    line = next((s.strip() for s in str(out).splitlines() if s.strip()), "")
    line = re.sub(r"^(?:standalone question|question)\s*:\s*", "", line, flags=re.IGNORECASE)
    return line.strip().strip('"') or users[-1]


def check_conversation(mode: Any, name: str = "AnswerPolicy.conversation") -> str:
    """``mode`` if it is one of ``CONVERSATION_MODES``, else a ValueError naming them."""
    if not isinstance(mode, str) or mode not in CONVERSATION_MODES:
        raise ValueError(f"{name}={mode!r} is invalid: choose one of "
                         f"{list(CONVERSATION_MODES)}")
    return mode


__all__ = ["CARRY_TURNS", "CONDENSE_PROMPT", "CONVERSATION_MODES", "REWRITE_TOKENS", "Resolved",
           "anaphors", "bridging", "carry_over", "check_conversation", "condense_messages",
           "definitional_subject", "named_in", "replace_subject", "resolve", "resolve_turns",
           "rewrite", "subject_of", "substitute", "user_messages"]
