"""The corpus of docs/own_corpus.md's tests: 17 short paragraphs about five made-up products,
in the three JSONL layouts ``nest ingest`` reads, and the checks each edge's answer must pass.

Written for these tests, not tuned to the answer rules. ``check`` takes an edge's answer and its
citations (renamed to one shape) and asserts: the gold value is in the answer; every copied or
verbatim citation is the exact answer slice; every cited text is in the corpus, in the document
the citation names; and one citation, on the gold document, holds the gold value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

#: Own layout (``id``, ``text``, ``metadata``): the Zephyr X2 scooter, the Nimbus 3 tent, the
#: Quill tablet.
OWN = {
    "zx2-price": "The Zephyr X2 is an electric scooter sold by Halvard Mobility. It costs 2,390 "
    "dollars in the standard colour and 2,540 dollars in matte black.",
    "zx2-battery": "The battery of the Zephyr X2 holds 620 watt-hours. A full charge takes about "
    "five hours and gives a range of 58 kilometres on flat roads.",
    "zx2-weight": "The Zephyr X2 weighs 21 kilograms and folds in three seconds. Its frame is "
    "made of aluminium and carries riders of up to 120 kilograms.",
    "zx2-warranty": "Halvard Mobility gives the Zephyr X2 a two-year warranty on the frame and a "
    "one-year warranty on the battery.",
    "nimbus-weight": "The Nimbus 3 is a three-person tent made by Cairn Outdoor. It weighs 2.4 "
    "kilograms with its poles and pegs.",
    "nimbus-pitch": "The Nimbus 3 can be pitched by one person in about six minutes. Its "
    "flysheet has a hydrostatic head of 3000 millimetres.",
    "nimbus-space": "The Nimbus 3 has two doors and two porches, and its inner tent measures 210 "
    "by 180 centimetres.",
    "quill-screen": "The Quill tablet is an e-ink writing tablet from Marrow Labs with a "
    "10.3-inch screen.",
    "quill-battery": "The battery of the Quill tablet lasts about three weeks of daily "
    "note-taking. It stores up to 50,000 pages.",
    "quill-pen": "The Quill tablet comes with a pressure-sensitive pen that needs no charging. "
    "It costs 429 dollars.",
}
OWN_TITLES = {"zx2": "Zephyr X2", "nimbus": "Nimbus 3", "quill": "Quill tablet"}
#: BEIR layout (``_id``, ``title``, ``text``): the Orbit kettle.
BEIR = {
    "ok-1": "The Orbit Kettle is a glass electric kettle from Brennick Home. It holds 1.7 litres "
    "and boils a full load in about four minutes.",
    "ok-2": "The Orbit Kettle has five temperature settings, from 70 to 100 degrees Celsius, and "
    "keeps water warm for 30 minutes.",
    "ok-3": "The Orbit Kettle costs 89 dollars. Its base is made of stainless steel, and the "
    "glass jug is dishwasher safe.",
}
#: Hugging Face layout (``id``, ``url``, ``title``, ``text``): the Lumen desk lamp.
HF = {
    "11": "The Lumen desk lamp uses a 9-watt LED panel whose colour temperature can be set "
    "between 2700 and 6500 kelvin.",
    "12": "The Lumen desk lamp has a built-in battery that lasts 40 hours at half brightness. It "
    "charges over USB-C in three hours.",
    "13": "The Lumen desk lamp was designed by the studio Ferra Works in Lisbon and went on sale "
    "in 2021.",
    "14": "The Lumen desk lamp costs 149 dollars.",
}
TEXTS = {**OWN, **BEIR, **HF}
FILES = ("products.jsonl", "beir/corpus.jsonl", "hf_dump.jsonl")


def write_corpus(root: Path) -> None:
    """The three files of docs/own_corpus.md under ``root``."""
    own = [{"id": k, "text": t, "metadata": {"title": OWN_TITLES[k.split("-")[0]],
                                             "url": f"https://example.com/{k}"}}
           for k, t in OWN.items()]
    beir = [{"_id": k, "title": "Orbit Kettle", "text": t} for k, t in BEIR.items()]
    hf = [{"id": k, "url": f"https://example.com/lumen/{k}", "title": "Lumen desk lamp",
           "text": t} for k, t in HF.items()]
    (root / "beir").mkdir(exist_ok=True)
    for name, rows in zip(FILES, (own, beir, hf)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def check(answer: str, citations: Iterable[dict[str, Any]], gold: str, doc: str) -> None:
    """``citations``: dicts with ``start``, ``end``, ``text``, ``doc_id``, ``kind``."""
    cites = list(citations)
    assert gold in answer, (gold, answer)
    assert cites, f"no citation on {answer!r}"
    for c in cites:
        if c["kind"] != "support":  # a support citation spans the answer sentence it backs
            assert answer[c["start"] : c["end"]] == c["text"], c
        assert c["text"] in TEXTS[c["doc_id"]], c
    assert any(c["doc_id"] == doc and gold in c["text"] for c in cites), (gold, doc, cites)


def payload_citations(payloads: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """LangChain / LlamaIndex citation payloads (``citation_payload``) in ``check``'s shape."""
    return [{"start": p["start_index"], "end": p["end_index"], "text": p["cited_text"],
             "doc_id": p["extras"]["doc_id"], "kind": p["extras"]["kind"]} for p in payloads]
