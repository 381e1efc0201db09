"""The engine oracles' passages: a Wikipedia-style lead the model continues, an unrelated
one it must not copy, and ``make_passage`` (a ``Passage`` of a text). Used by
``tests/decoding/test_engine.py`` and ``tests/decoding/test_lookahead.py``."""

from __future__ import annotations

import hashlib

from nest_integrations.types import Passage


PASSAGE_TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western "
    "Asia, and was ruled by emperors. From the accession of Caesar Augustus as the first Roman "
    "emperor to the military anarchy of the 3rd century, it was a Principate with Italia as "
    "the metropole of its provinces and the city of Rome as its sole capital."
)
UNRELATED_TEXT = (
    "Photosynthesis is a process used by plants and other organisms to convert light energy "
    "into chemical energy that, through cellular respiration, can later be released to fuel "
    "the organism's activities."
)


def make_passage(text: str, doc: str = "doc") -> Passage:
    pid = hashlib.sha1(text.encode()).hexdigest()[:16]
    return Passage(pid, text, doc_id=doc, char_start=0, char_end=len(text), metadata={"title": doc})
