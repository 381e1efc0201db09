"""`nest ask`: the answer with its sources, end to end on the real embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations import assembly, cli

ROME = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western "
    "Asia, and was ruled by emperors. From the accession of Caesar Augustus as the first Roman "
    "emperor to the military anarchy of the 3rd century, it was a Principate with Italia as "
    "the metropole of its provinces and the city of Rome as its sole capital."
)
PLANTS = (
    "Photosynthesis is a process used by plants and other organisms to convert light energy "
    "into chemical energy that, through cellular respiration, can later be released to fuel "
    "the organism's activities."
)


def test_missing_collection_is_a_clear_error(tmp_path: Path, capsys) -> None:
    """Asking a collection that does not exist names it and says how to create it."""
    code = cli.main(["ask", "hi", "--persist-dir", str(tmp_path), "--collection", "nope"])
    err = capsys.readouterr().err
    assert code == 1
    assert "'nope'" in err and "nest ingest" in err and "Traceback" not in err


@pytest.mark.slow
def test_ask_cites_the_copied_span(tmp_path: Path, default_lm, monkeypatch, capsys) -> None:
    """Ingest two documents, ask about one: the JSON result cites exact source slices, and the
    text rendering shows markers and sources."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "rome.txt").write_text(ROME)
    (docs / "plants.txt").write_text(PLANTS)
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: default_lm)
    store = str(tmp_path / "store")
    assert cli.main(["ingest", str(docs), "--persist-dir", store]) == 0
    capsys.readouterr()
    question = "Continue this text: The Roman Empire was the post-Republican state of ancient Rome."
    assert cli.main(["ask", question, "--persist-dir", store, "--max-new-tokens", "32", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    sources = {"docs/rome.txt": ROME, "docs/plants.txt": PLANTS}
    assert result["citations"], result["text"]
    for c in result["citations"]:
        if c["kind"] != "support":  # a support citation's text is the passage sentence
            assert result["text"][c["start"] : c["end"]] == c["text"]
        assert sources[c["doc_id"]][c["source_start"] : c["source_end"]] == c["text"]
    assert any(c["doc_id"] == "docs/rome.txt" and c["n_tokens"] >= 5 for c in result["citations"])
    # support citations are on by default: every sentence is cited or flagged unsupported
    from nest_integrations.attribution import unaccounted
    from nest_integrations.types import Citation, UnsupportedSentence

    cites = [Citation(**c) for c in result["citations"]]
    flagged = [UnsupportedSentence(**u) for u in result["stats"]["unsupported"]]
    assert unaccounted(result["text"], cites, flagged) == []
    assert cli.main(["ask", question, "--persist-dir", store, "--max-new-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "[1]" in out and "Sources:" in out and "docs/rome.txt" in out
    assert out.rstrip().endswith("passages searched, on torch")  # the backend that ran it
    assert ("[!] Unsupported" in out) == bool(flagged)
    assert cli.main(["ask", question, "--persist-dir", store, "--max-new-tokens", "32", "--json",
                     "--no-attribute"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["token_ids"] == result["token_ids"] and off["stats"]["unsupported"] == []
    assert off["citations"] == [c for c in result["citations"] if c["kind"] != "support"]
