"""The title index: which documents a question names, read from the store's own titles.

Dense retrieval ranks by meaning, so a document that *mentions* the question's subject (a
disambiguation note, a neighbouring entry, a profile sharing its frames) can outrank the document
*titled* with it, or push it out of the top passages. A question template cannot find the
subject for every phrasing ("the life expectancy at birth in X", "X: what is ...?", "X's ..."),
so the index does it the other way round: every title of the collection, normalised, is looked
for in the question's text.

- ``normalize``: case-folded, diacritics removed (NFKD), possessive "'s" dropped, punctuation to
  spaces: "Baháʼu'lláh's life" and "bahau llah life" compare equal word for word.
- ``TitleIndex.match(question)``: every title found as a run of whole words, longest first
  (a run inside a longer match is not matched again), each with its document ids. A title
  with a parenthetical qualifier ("Python (programming language)", "Anabasis (Xenophon)")
  also answers to its base ("python"), but only where no document is titled with the base
  exactly (so "Korvanta Systems (disambiguation)" never stands in for "Korvanta Systems").
  A title made only of function words ("for", "with", "in"; English, French and Spanish, the
  corpus languages) matches only where the question quotes it ('for', "with", `in`).
- Built per collection at ingest and kept with the store (``<persist dir>/titles/``, see
  ``ChromaPassageStore.title_index``); for other retrievers, from the retrieved passages'
  ``metadata["title"]`` (``TitleIndex.from_passages``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from nest_integrations.core.sentences import STOP_WORDS
from nest_integrations.types import Passage

FORMAT = "nest-title-index"
VERSION = 1
#: Titles longer than this many words are not looked for in questions.
MAX_TITLE_WORDS = 12
#: Passages a title lookup reads per call (the first passage of each titled document is kept).
LOOKUP_LIMIT = 32

_POSSESSIVE = re.compile(r"(?<=\w)['\u2019\u02bc]s\b", re.IGNORECASE)
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
_QUALIFIER = re.compile(r"^(?P<base>.+?)\s*\((?P<q>[^()]+)\)\s*$")
_QUOTED = re.compile(r"[\"\u201c\u201d`\u00ab\u00bb]([^\"\u201c\u201d`\u00ab\u00bb]{1,80})"
                     r"[\"\u201c\u201d`\u00ab\u00bb]"
                     r"|(?:(?<=\W)|^)['\u2018]([^'\u2019]{1,80})['\u2019](?=\W|$)")


def normalize(text: str) -> str:
    """``text`` as titles and questions are compared (see the module docstring)."""
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = _POSSESSIVE.sub("", text)
    return " ".join(_NON_WORD.sub(" ", text.casefold()).split())


def qualifier_base(title: str) -> str | None:
    """"Python (programming language)" -> "Python"; None for a title with no qualifier."""
    m = _QUALIFIER.match(str(title).strip())
    return m.group("base").strip() or None if m else None


@dataclass(frozen=True)
class TitleMatch:
    """A title found in a question: its normalised words, the documents it names, the word
    span in the normalised question, and whether it matched by a qualified title's base."""

    title: str
    doc_ids: tuple[str, ...]
    start: int
    end: int
    qualified: bool = False


class TitleIndex:
    """Normalised titles -> document ids, for one collection (see the module docstring)."""

    def __init__(self, titles: Mapping[str, str], count: int | None = None) -> None:
        #: document id -> its title as stored
        self.titles: dict[str, str] = {str(d): str(t) for d, t in titles.items() if str(t).strip()}
        #: how many passages the collection held when the index was built (freshness check)
        self.count = count
        self._exact: dict[str, list[str]] = {}
        self._qualified: dict[str, list[str]] = {}
        for doc_id, title in self.titles.items():
            key = normalize(title)
            if key:
                self._exact.setdefault(key, []).append(doc_id)
            base = qualifier_base(title)
            if base and normalize(base):
                self._qualified.setdefault(normalize(base), []).append(doc_id)
        lengths = [len(k.split()) for k in (*self._exact, *self._qualified)]
        self._longest = min(max(lengths, default=0), MAX_TITLE_WORDS)

    def __len__(self) -> int:
        return len(self.titles)

    @classmethod
    def from_passages(cls, passages: Iterable[Passage]) -> "TitleIndex":
        """An index of the documents of ``passages`` (their ``metadata["title"]``)."""
        titles: dict[str, str] = {}
        for p in passages:
            title = str((p.metadata or {}).get("title") or "")
            if title:
                titles.setdefault(p.doc_id or p.id, title)
        return cls(titles)

    def match(self, text: str) -> list[TitleMatch]:
        """Every title found in ``text`` as a run of whole words, longest first (then in
        order of appearance); a run inside a longer match is not matched again."""
        words = normalize(text).split()
        quoted = {normalize(a or b) for a, b in _QUOTED.findall(str(text))}
        taken = [False] * len(words)
        found: list[TitleMatch] = []
        for n in range(min(self._longest, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                if any(taken[i : i + n]):
                    continue
                phrase = " ".join(words[i : i + n])
                docs, qualified = self._exact.get(phrase), False
                if docs is None:
                    docs, qualified = self._qualified.get(phrase), True
                if docs is None:
                    continue
                if all(w in STOP_WORDS for w in words[i : i + n]) and phrase not in quoted:
                    continue
                found.append(TitleMatch(phrase, tuple(docs), i, i + n, qualified))
                taken[i : i + n] = [True] * n
        return found

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "count": self.count, "titles": self.titles}

    @classmethod
    def from_json(cls, data: Any) -> "TitleIndex | None":
        """The index, or None for data in another format or version."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or \
                data.get("version") != VERSION or not isinstance(data.get("titles"), dict):
            return None
        return cls(data["titles"], data.get("count"))

    def save(self, path: str | Path) -> None:
        from nest_integrations.paths import ensure_dir

        path = Path(path)
        ensure_dir(path.parent)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> "TitleIndex | None":
        try:
            return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None


def title_of(p: Passage) -> str:
    return str((p.metadata or {}).get("title") or "")


def first_passages(passages: Sequence[Passage]) -> list[Passage]:
    """The first passage (lowest ``chunk_index``, else char_start) of each document, in the
    order the documents first appear."""
    best: dict[str, Passage] = {}

    def pos(p: Passage) -> tuple[int, int]:
        ci = (p.metadata or {}).get("chunk_index")
        ci = ci if isinstance(ci, int) and not isinstance(ci, bool) else 0
        return ci, p.char_start or 0

    for p in passages:
        key = p.doc_id or p.id
        if key not in best or pos(p) < pos(best[key]):
            best[key] = p
    return list(best.values())


#: Longest run of question words tried as a title where no index exists (``index_of``).
CANDIDATE_WORDS = 6
_EDGE = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)


def candidate_titles(text: str, max_words: int = CANDIDATE_WORDS) -> list[str]:
    """Runs of up to ``max_words`` words of ``text`` as a title might be stored: the words as
    written (edge punctuation and possessives off), and in lower, title and sentence case."""
    words = [w for w in (_EDGE.sub("", _POSSESSIVE.sub("", t)) for t in str(text).split()) if w]
    out: list[str] = []
    for n in range(min(max_words, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            run = words[i : i + n]
            if all(normalize(w) in STOP_WORDS for w in run):
                continue
            phrase = " ".join(run)
            out += [phrase, phrase.lower(), phrase.title(), phrase[:1].upper() + phrase[1:]]
    return list(dict.fromkeys(out))


def index_of(retriever: Any, retrieved: Sequence[Passage], question: str = ""
             ) -> tuple[TitleIndex, list[Passage]]:  # fmt: skip
    """The title index to match ``question`` against, and the passages a lookup found.

    The retriever's collection-wide index (``title_index()``: the Chroma store, the in-memory
    and hybrid retrievers). Else the titles of the retrieved passages, plus those of the
    stored passages titled with a run of the question's words (``candidate_titles``), found
    with one ``passages_titled`` call where the retriever has it (a framework vector store with
    metadata filters)."""
    index = collection_index(retriever)
    if index is not None:
        return index, []
    lookup = lookup_of(retriever)
    found = list(lookup(candidate_titles(question), LOOKUP_LIMIT)) if lookup and question else []
    return TitleIndex.from_passages(list(retrieved) + found), found


def collection_index(retriever: Any) -> TitleIndex | None:
    """The retriever's collection-wide title index (``title_index()``, an optional capability:
    the Chroma store, the in-memory and hybrid retrievers), else None."""
    fn = getattr(retriever, "title_index", None)
    return fn() if callable(fn) else None


def conversation_titles(retriever: Any, turns: Sequence[str]) -> TitleIndex | None:
    """The title index the carry-over reads the ``turns`` with: the retriever's collection-wide
    index, else the titles a lookup by the turns' words finds (``titles.index_of``); None
    without either."""
    index = collection_index(retriever)
    if index is not None:
        return index if len(index) else None
    if lookup_of(retriever) is None:
        return None
    titles: dict[str, str] = {}
    for text in turns:
        titles.update(index_of(retriever, [], text)[0].titles)
    return TitleIndex(titles) if titles else None


def lookup_of(retriever: Any) -> Any:
    """The retriever's ``passages_titled(titles, limit)`` (an optional capability), else None."""
    fn = getattr(retriever, "passages_titled", None)
    return fn if callable(fn) else None


__all__ = ["CANDIDATE_WORDS", "LOOKUP_LIMIT", "MAX_TITLE_WORDS", "STOP_WORDS", "TitleIndex",
           "TitleMatch", "candidate_titles", "first_passages", "index_of", "lookup_of",
           "normalize", "qualifier_base", "title_of"]
