"""A computing dictionary for "What is X?" questions: FOLDOC, from Debian's ``dict-foldoc``.

The Free On-line Dictionary of Computing (Denis Howe; GNU FDL 1.1 or later) ships in Debian as a
dictd database. A dictionary entry defines its headword in its first sentence, often without
repeating it ("permutation: An ordering of a certain number of elements of a given set."), and
its later sentences give second senses, usage notes and examples ("For instance, the
permutations of (1,2,3) are ..."): the shape that "What is X?" must answer with the first.

Get it (no install, no root; nothing is downloaded at run time)::

    apt-get download dict-foldoc            # dict-foldoc_20230119-1_all.deb (Debian 12/13)
    python -m benchmarks.answers --foldoc dict-foldoc_20230119-1_all.deb ...

``load_foldoc(path)`` reads the ``.deb``, the unpacked folder or ``foldoc.index`` +
``foldoc.dict.dz`` (dictzip is gzip) and returns ``Entry``s with their text cleaned: the body
dedented, lines of a paragraph joined, the ``<domain>`` tags, sense numbers (``1.``) and
cross-reference braces (``{like this (url)}``) removed, the date paragraph dropped.
``choose(entries, n_gold, n_distractors, seed)`` picks the entries asked about (module
constants below say which qualify) and others that only fill the store; the gold answer is the
entry's first sentence (``Entry.definition``).
"""

from __future__ import annotations

import gzip
import io
import random
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from benchmarks.harness.answer_metrics import sentences

#: dictd's base64 alphabet for offsets and lengths in ``.index`` files.
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: A gold entry's headword: 1-3 lower-case words (no acronyms, symbols or proper names).
HEADWORD = re.compile(r"[a-z][a-z-]{3,}( [a-z][a-z-]+){0,2}")
#: A gold entry's definition sentence has this many words ...
DEFINITION_WORDS = (6, 40)
#: ... and its body at least this many sentences (so there are side sentences) and at most
#: this many words (one or two passages).
MIN_SENTENCES, MAX_WORDS = 3, 260
_NOT_DEFINITION = re.compile(r"^(see |abbreviation|acronym|an abbreviation|an acronym|"
                             r"a misspelling|\(|\")", re.IGNORECASE)
#: What opens a paragraph before its text: tags, sense numbers, a pronunciation (/breyl/), a
#: note in parentheses or brackets ("(Often capitalised)", "[Usenet]").
_OPENING = re.compile(r"^(\s*(<[^>]{1,80}>|\d{1,2}\.(?=\s)|/[^/\s][^/]{0,40}/(?=[\s,])|or\s(?=/)|,|"
                      r"\([^()]{1,80}\)|\[[^\[\]]{1,60}\]))+\s*")
_LINK = re.compile(r"\{([^{}]*?)(?:\s*\([^(){}]*\))?\}")
_DATE = re.compile(r"^\(\d{4}-\d{2}-\d{2}\)$")


@dataclass(frozen=True)
class Entry:
    """One dictionary entry: its ``headword``, cleaned ``paragraphs`` and ``definition`` (the
    first sentence)."""

    headword: str
    paragraphs: tuple[str, ...]

    @property
    def text(self) -> str:
        """The document as stored: the headword, a blank line, the paragraphs."""
        return self.headword + "\n\n" + "\n\n".join(self.paragraphs)

    @property
    def sentences(self) -> list[str]:
        return [s for p in self.paragraphs for s in sentences(p)]

    @property
    def definition(self) -> str:
        return self.sentences[0] if self.paragraphs else ""

    @property
    def doc_id(self) -> str:
        return "foldoc/" + self.headword.replace(" ", "_")


def b64_number(s: str) -> int:
    """A dictd index number (offset or length) from its base64 digits."""
    n = 0
    for ch in s:
        n = n * 64 + _B64.index(ch)
    return n


def clean(body: str) -> tuple[str, ...]:
    """An entry's body (the lines after the headword) as cleaned paragraphs (module
    docstring)."""
    paras = []
    for raw in re.split(r"\n\s*\n", body):
        p = " ".join(line.strip() for line in raw.splitlines() if line.strip())
        p = _LINK.sub(lambda m: m.group(1), p).strip()
        p = _OPENING.sub("", p).strip()
        if p and not _DATE.match(p):
            paras.append(p)
    return tuple(paras)


def parse(index: str, data: bytes) -> list[Entry]:
    """Every entry of a dictd database (``.index`` text, uncompressed ``.dict`` bytes), in
    index order, the database's own ``00-database-*`` records left out."""
    out, seen = [], set()
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0] in seen:
            continue
        seen.add(parts[0])
        off, length = b64_number(parts[1]), b64_number(parts[2])
        rec = data[off:off + length].decode("utf-8", "replace")
        head, _, body = rec.partition("\n")
        out.append(Entry(head.strip() or parts[0], clean(body)))
    return out


def load_foldoc(path: str | Path) -> list[Entry]:
    """FOLDOC's entries from ``path``: the ``dict-foldoc`` ``.deb``, a folder holding
    ``foldoc.index`` and ``foldoc.dict.dz`` (at any depth), or the ``.index`` file itself."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: run `apt-get download dict-foldoc` "
                                "and pass the .deb (or its unpacked folder) as --foldoc")
    if path.suffix == ".deb":
        index, data = _from_deb(path)
    else:
        if path.is_dir():
            found = sorted(path.rglob("foldoc.index"))
            if not found:
                raise FileNotFoundError(f"no foldoc.index under {path}")
            path = found[0]
        index = path.read_text(encoding="utf-8", errors="replace")
        data = gzip.decompress(path.with_name("foldoc.dict.dz").read_bytes())
    return parse(index, data)


def _from_deb(deb: Path) -> tuple[str, bytes]:
    """The index and dictionary of a ``.deb`` (an ar archive holding ``data.tar.*``)."""
    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a Debian package (no ar header)")
    pos, members = 8, {}
    while pos + 60 <= len(blob):
        name = blob[pos:pos + 16].decode().strip().rstrip("/")
        size = int(blob[pos + 48:pos + 58].decode().strip())
        members[name] = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    tar_name = next((n for n in members if n.startswith("data.tar")), None)
    if tar_name is None:
        raise ValueError(f"{deb} holds no data.tar member")
    with tarfile.open(fileobj=io.BytesIO(members[tar_name])) as tar:
        files = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        if "foldoc.index" not in files:
            raise ValueError(f"{deb} holds no foldoc.index: is it dict-foldoc?")
        index = tar.extractfile(files["foldoc.index"]).read().decode("utf-8", "replace")
        data = gzip.decompress(tar.extractfile(files["foldoc.dict.dz"]).read())
    return index, data


def qualifies(e: Entry) -> bool:
    """Whether ``e`` can be asked about (the module constants)."""
    if not HEADWORD.fullmatch(e.headword) or not e.paragraphs:
        return False
    d = e.definition
    words = len(d.split())
    return (DEFINITION_WORDS[0] <= words <= DEFINITION_WORDS[1] and not _NOT_DEFINITION.match(d)
            and d[-1:] in ".!?" and "{" not in e.text and "}" not in e.text
            and len(e.sentences) >= MIN_SENTENCES and len(e.text.split()) <= MAX_WORDS)


def choose(entries: Iterable[Entry], n_gold: int = 160, n_distractors: int = 240,
           seed: int = 0) -> tuple[list[Entry], list[Entry]]:
    """``(gold, distractors)``: ``n_gold`` qualifying entries to ask about and
    ``n_distractors`` other qualifying entries that only fill the store, drawn by ``seed``
    from the entries sorted by headword (so the order of ``entries`` does not matter)."""
    pool = sorted((e for e in entries if qualifies(e)), key=lambda e: e.headword)
    if len(pool) < n_gold + n_distractors:
        raise ValueError(f"only {len(pool)} qualifying entries for {n_gold} gold and "
                         f"{n_distractors} distractors: ask for fewer")
    random.Random(f"glossary:{seed}").shuffle(pool)
    return pool[:n_gold], pool[n_gold:n_gold + n_distractors]


__all__ = ["Entry", "b64_number", "choose", "clean", "load_foldoc", "parse", "qualifies"]
