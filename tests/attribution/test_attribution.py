"""Post-hoc attribution (issue 23): exact offsets for every citation kind under every tokenizer,
support and unsupported verdicts with the real MiniLM embedder, clear errors, the assembled
attributor over a real Chroma store, the output dict, and ``nest attribute``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations import output
from nest_integrations.attribution import (
    Attribution,
    AttributionConfig,
    Attributor,
    attribute,
    split_units,
    word_tokens,
)
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Citation, Passage
from tests.tokenizer_cases import EXTRA, PASSAGE_TEXT, any_lm  # noqa: F401  (fixture)

ANABASIS = (
    "Anabasis is the most famous work of the Ancient Greek professional soldier and writer "
    "Xenophon. It gives an account of the expedition of the Ten Thousand, an army of Greek "
    "mercenaries hired by Cyrus the Younger to help him seize the throne of Persia from his "
    "brother, Artaxerxes II, in 401 BC."
)
BELLY = ("Belly dance is a Middle Eastern dance that originated in Egypt. It features complex "
         "movements of the torso and hips.")


def _passages() -> list[Passage]:
    return [
        Passage("p-ana", ANABASIS, doc_id="anabasis", char_start=17, char_end=17 + len(ANABASIS),
                metadata={"title": "Anabasis (Xenophon)"}),
        Passage("p-bd", BELLY, doc_id="belly", char_start=0, char_end=len(BELLY)),
    ]


def _sources(passages: list[Passage]) -> dict[str, str]:
    """A source document per passage, holding the passage at its char_start."""
    return {p.doc_id: "x" * (p.char_start or 0) + p.text + " tail" for p in passages}


def assert_exact(a: Attribution) -> None:
    """The invariants of every kind: the answer slice, the passage slice, the source slice."""
    by_id = {p.id: p for p in a.passages}
    sources = _sources(a.passages)
    for c in a.citations:
        p = by_id[c.passage_id]
        assert p.text[c.passage_start : c.passage_end] == c.text, c
        if c.source_start is not None:
            assert sources[p.doc_id][c.source_start : c.source_end] == c.text, c
        assert c.text and not c.text[0].isspace() and not c.text[-1].isspace()
        if c.kind == "verbatim":
            assert a.text[c.start : c.end] == c.text, c
            assert c.score is None
        else:
            assert c.kind == "support" and c.score is not None and c.score >= a.threshold
            assert a.text[c.start : c.end] in {s.text for s in a.sentences}
    for s in a.sentences:
        assert a.text[s.start : s.end] == s.text
    for u in a.unsupported:
        assert a.text[u.start : u.end] == u.text


# ------------------------------------------------------------------------------ splitting


def test_split_units_exact_sentences_clauses_and_abbreviations() -> None:
    text = ("Dr. Smith arrived at 3 p.m. on Monday.  Rome, e.g. the city, is old! Is it? "
            "東京は日本の首都です。北京是中国的首都。 A long sentence follows here; it has a "
            "first clause about many things that go on and on, and a second clause that also "
            "goes on for quite a while before it finally ends.")
    units = split_units(text, max_clause_chars=80, min_clause_chars=10)
    pieces = [text[s:e] for s, e in units]
    assert pieces[:6] == ["Dr. Smith arrived at 3 p.m. on Monday.", "Rome, e.g. the city, is old!",
                          "Is it?", "東京は日本の首都です。", "北京是中国的首都。",
                          "A long sentence follows here;"]
    assert len(pieces) >= 8  # the long sentence became clauses
    assert all(p == p.strip() and p for p in pieces)
    assert split_units("") == [] and split_units("  ...  ") == []


def test_word_tokens_have_exact_offsets() -> None:
    toks, off = word_tokens("Café naïve — 東京, didn't 401 BC.")
    assert [("Café naïve — 東京, didn't 401 BC."[s:e]) for s, e in off] == toks
    assert "東" in toks and "京" in toks and "didn" in toks and "'" in toks


# ------------------------------------------------------------------------------ verbatim


def test_verbatim_runs_are_exact_and_respect_the_minimum() -> None:
    ps = _passages()
    text = ("As the sources say,  Xenophon  wrote of the expedition of the Ten Thousand, an army "
            "of Greek mercenaries. Belly dance is old.")
    a = attribute(text, ps, config=AttributionConfig(scorer="fuzzy"))
    assert_exact(a)
    verb = [c for c in a.citations if c.kind == "verbatim"]
    assert [c.text for c in verb] == [
        "of the expedition of the Ten Thousand, an army of Greek mercenaries"]
    assert verb[0].source_start == 17 + ANABASIS.index(verb[0].text)
    # "Belly dance is" is 3 words: below min_verbatim_tokens; with a minimum of 3 it is cited
    assert not any(c.passage_id == "p-bd" and c.kind == "verbatim" for c in a.citations)
    a3 = attribute(text, ps, config=AttributionConfig(scorer="fuzzy", min_verbatim_tokens=3))
    assert any(c.text == "Belly dance is" for c in a3.citations)
    assert_exact(a3)


def test_a_fully_copied_sentence_is_verbatim_without_a_scorer() -> None:
    ps = _passages()
    text = ANABASIS.split(". ")[0] + "."
    a = attribute(text, ps, config=AttributionConfig(scorer="fuzzy"))
    assert [s.verdict for s in a.sentences] == ["verbatim"]
    assert a.sentences[0].passage_id == "p-ana" and not a.unsupported


def test_every_kind_is_exact_under_every_tokenizer(any_lm) -> None:
    """Verbatim runs in LM tokens (byte BPE, SentencePiece, WordPiece) and support citations
    from the keys scorer are exact in the answer, the passage and the source."""
    family, lm = any_lm
    passage = Passage("p-rome", PASSAGE_TEXT, doc_id="rome", char_start=7,
                      char_end=7 + len(PASSAGE_TEXT))
    text = ("Historians agree that it included large territorial holdings around the "
            "Mediterranean Sea. " + EXTRA + " The metropole was Italia, they say.")
    cfg = AttributionConfig(scorer="keys", support_threshold=-1.0, min_verbatim_tokens=4)
    a = Attributor(cfg, lm=lm)(text, [passage])
    assert a.tokenizer == lm.name
    assert_exact(a)
    kinds = {c.kind for c in a.citations}
    assert kinds == {"verbatim", "support"}, a.citations
    covered = "".join(c.text for c in a.citations if c.kind == "verbatim")
    assert "Mediterranean" in covered


# ------------------------------------------------------------------------------ support (MiniLM)


@pytest.fixture(scope="module")
def attributor() -> Attributor:
    return Attributor(AttributionConfig(scorer="embedding"))  # the real packaged MiniLM


def test_paraphrase_is_supported_and_fabrications_are_flagged(attributor: Attributor) -> None:
    ps = _passages()
    text = ("The Anabasis tells of the expedition of the Ten Thousand, Greek mercenaries hired by "
            "Cyrus the Younger to seize the Persian throne. "
            "The Great Wall of China was finished by Napoleon in 1850. "
            "Xenophon wrote it while he was living in Brazil.")
    a = attributor(text, ps)
    assert_exact(a)
    verdicts = [s.verdict for s in a.sentences]
    assert verdicts == ["support", "unsupported", "unsupported"], a.sentences
    (sup,) = [c for c in a.citations if c.kind == "support"]
    assert sup.passage_id == "p-ana" and sup.text.startswith("It gives an account")
    assert [u.text for u in a.unsupported] == [s.text for s in a.sentences[1:]]
    assert a.supported_ratio == pytest.approx(1 / 3)


def test_a_wrong_value_is_not_supported(attributor: Attributor) -> None:
    ps = _passages()
    frame = ("In {}, Cyrus the Younger hired the Ten Thousand, Greek mercenaries, to seize the "
             "Persian throne from his brother.")
    right = attributor(frame.format("401 BC"), ps)
    wrong = attributor(frame.format("1066 BC"), ps)
    assert right.sentences[0].verdict == "support"
    assert wrong.sentences[0].verdict == "unsupported"


HQ = ("Biziom Labs is a company founded in Velmora. The headquarters city of Biziom Labs is "
      "Thoudrond. The chief executive of Biziom Labs is Ada Quistan.")
OPS = 'The "^" operator yields the bitwise XOR of its arguments. See also "|" and "&".'


@pytest.mark.parametrize("text, verdict", [
    ("Thoudrond is the headquarters city of Biziom Labs.", "support"),
    # the value is the first word: capitalised at the start, and still a name
    ("Brouthort is the headquarters city of Biziom Labs.", "unsupported"),
    # a lead-in phrase or a function word opening the sentence is no value
    ("Broadly speaking, the headquarters city of Biziom Labs is Thoudrond.", "support"),
    ("In short, the headquarters city of Biziom Labs is Thoudrond.", "support"),
    # all or nothing: one wrong name among several right ones is enough
    ("Ada Quistan is the chief executive of Biziom Labs in Marrowind.", "unsupported"),
    # a quoted code name must be in the supporting sentence, not just in its passage
    ('The "^" operator gives the bitwise XOR of its arguments.', "support"),
    ('The "|" operator yields the bitwise XOR of its arguments.', "unsupported"),
])
def test_the_value_check(text: str, verdict: str) -> None:
    passages = [Passage("hq", HQ, doc_id="hq"), Passage("ops", OPS, doc_id="ops")]
    a = attribute(text, passages, config=AttributionConfig(scorer="fuzzy",
                                                           support_threshold=0.5))
    assert [s.verdict for s in a.sentences] == [verdict], a.sentences
    if verdict == "unsupported":  # the check decided, not the string score
        unchecked = attribute(text, passages, config=AttributionConfig(
            scorer="fuzzy", support_threshold=0.5, check_values=False))
        assert unchecked.sentences[0].verdict in ("support", "verbatim")
    else:
        assert a.sentences[0].score >= 0.5


class _CountingEmbedder:
    """The packaged MiniLM, counting the texts it is asked to embed."""

    def __init__(self) -> None:
        from nest_integrations.embedders.minilm import shared_embedder

        self.inner, self.texts = shared_embedder(), []

    def embed(self, texts):  # noqa: ANN001, ANN201
        self.texts += list(texts)
        return self.inner.embed(texts)


@pytest.mark.parametrize("text", [
    "The headquarters city of Biziom Labs is Thoudrond.",
    "Brouthort is the headquarters city of Biziom Labs.",  # no candidate holds its values
    'The "^" operator gives the bitwise XOR. Ada Quistan runs Biziom Labs from Velmora.',
    "It is a company with a chief executive.",  # no values: every candidate is scored
])
def test_the_value_check_gates_what_is_embedded(text: str) -> None:
    """Only candidates that hold a unit's values are embedded, and the verdicts, scores and
    supporting sentences are those of scoring every candidate and then applying the check."""
    from nest_integrations.attribution.splitting import candidates
    from nest_integrations.attribution.values import value_overlap
    from nest_integrations.embedders.port import default_embedder, embed

    passages = [Passage("hq", HQ, doc_id="hq"), Passage("ops", OPS, doc_id="ops"),
                *_passages()]
    counting = _CountingEmbedder()
    a = Attributor(AttributionConfig(scorer="embedding", check_values=True), embedder=counting)
    got = a._support(text, split_units(text, 160, 25), passages)
    units = [text[s:e] for s, e in split_units(text, 160, 25)]
    cands = candidates(passages, 160, 25)
    gate = value_overlap(units, cands, passages)
    full = embed(default_embedder(), units) @ embed(default_embedder(), [c.text for c in cands]).T
    want = full * gate
    for i in range(len(units)):
        score, cand = got[i]
        b = int(want[i].argmax())
        assert cand == cands[b] and score == pytest.approx(float(want[i, b]), abs=1e-5)
    live = {c.text for j, c in enumerate(cands) if gate[:, j].any()}
    assert set(counting.texts) - set(units) == live - set(units), (counting.texts, live)
    if not live:
        assert counting.texts == []


def test_retriever_finds_the_passages_with_the_question(attributor: Attributor) -> None:
    retriever = InMemoryRetriever(_passages())
    a = attribute("He hired an army of Greek mercenaries to seize the throne.",
                  retriever=retriever, question="Who hired the Ten Thousand in Anabasis?",
                  embedder=attributor.embedder, config=AttributionConfig(k=1))
    assert [p.id for p in a.passages] == ["p-ana"]
    assert_exact(a)


def test_output_fields_of_an_attribution(attributor: Attributor) -> None:
    a = attributor("Belly dance comes from Egypt. Cats can fly to the moon.", _passages())
    d = output.attribution_fields(a)
    assert set(d) == {"text", "citations", "unsupported", "sentences"}
    assert [s["verdict"] for s in d["sentences"]] == ["support", "unsupported"]
    (cite,) = d["citations"]
    assert cite["kind"] == "support" and cite["copied"] is False and cite["score"] > 0.5
    assert cite["cited_text"] == BELLY[cite["passage_start"] : cite["passage_end"]]
    assert d["unsupported"] == [{"text": "Cats can fly to the moon.", "start": 30, "end": 55,
                                 "score": a.unsupported[0].score}]
    json.dumps(a.to_dict())  # plain JSON


def test_copy_citation_fields_have_no_score() -> None:
    c = Citation("abc", 0, 3, "p", "d", 0, 3, None, None, 1)
    assert output.citation_fields(c)["score"] is None and c.to_dict()["score"] is None


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("kwargs, error, match", [
    ({"scorer": "bleu"}, ValueError, "unknown scorer"),
    ({"min_verbatim_tokens": 0}, ValueError, "min_verbatim_tokens"),
    ({"support_threshold": 2.0}, ValueError, "support_threshold"),
    ({"tokenizer": "bpe"}, ValueError, "tokenizer"),
])
def test_bad_config_is_refused(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        AttributionConfig(**kwargs)


def test_bad_input_gets_a_clear_error() -> None:
    cfg = AttributionConfig(scorer="fuzzy")
    with pytest.raises(ValueError, match="passages= or a retriever="):
        attribute("some text", config=cfg)
    with pytest.raises(TypeError, match="text must be a str"):
        attribute(b"bytes", ["p"], config=cfg)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a passage must be"):
        attribute("text", [3], config=cfg)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not a single one"):
        attribute("text", "one passage", config=cfg)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs an lm"):
        Attributor(AttributionConfig(scorer="keys"))
    with pytest.raises(TypeError, match="AttributionConfig"):
        Attributor({"scorer": "fuzzy"})  # type: ignore[arg-type]
    empty = attribute("   ", ["p"], config=cfg)
    assert empty.sentences == [] and empty.citations == [] and empty.unsupported == []
    none = attribute("Nothing to see here today.", [], config=cfg)
    assert [s.verdict for s in none.sentences] == ["unsupported"]


# ------------------------------------------------------------------------------ assembly


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore
    from tests.fakes import FakeLM

    persist = tmp_path / "store"
    store = ChromaPassageStore.from_persist_dir(persist, "attr")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "anabasis.txt").write_text(ANABASIS + "\n", encoding="utf-8")
    (docs / "belly.txt").write_text(BELLY + "\n", encoding="utf-8")
    assert not IngestPipeline(store, FakeLM()).ingest([docs]).issues
    return persist


def test_attributor_from_defaults_uses_the_chroma_store(small_store: Path) -> None:
    from nest_integrations.assembly import attributor_from_defaults

    attr = attributor_from_defaults("attr", persist_dir=str(small_store))
    a = attr("Xenophon, a Greek soldier, wrote the Anabasis. Penguins live on Mars.",
             question="Who wrote the Anabasis?")
    assert a.passages and a.passages[0].doc_id.endswith("anabasis.txt")
    assert [s.verdict for s in a.sentences] == ["support", "unsupported"]
    src = (small_store.parent / "docs" / "anabasis.txt").read_text(encoding="utf-8")
    (c,) = [c for c in a.citations if c.kind == "support"]
    assert src[c.source_start : c.source_end] == c.text
    with pytest.raises(LookupError, match="no collection .missing.*existing: .attr."):
        attributor_from_defaults("missing", persist_dir=str(small_store))


def test_nest_attribute_cli(small_store: Path, capsys) -> None:
    from nest_integrations import cli

    where = ["--collection", "attr", "--persist-dir", str(small_store)]
    text = "Xenophon, a Greek soldier, wrote the Anabasis. Penguins live on Mars."
    assert cli.main(["attribute", text, "--question", "Who wrote the Anabasis?", *where]) == 0
    shown = capsys.readouterr().out
    assert "[~] support" in shown and "[!] unsupported" in shown
    assert "1/2 sentences supported" in shown
    answer = small_store.parent / "answer.txt"
    answer.write_text(text, encoding="utf-8")
    assert cli.main(["attribute", "--file", str(answer), "--json", *where]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [s["verdict"] for s in payload["sentences"]] == ["support", "unsupported"]
    assert payload["unsupported"][0]["text"] == "Penguins live on Mars."
    assert payload["passages"] and payload["scorer"] == "embedding"
    assert cli.main(["attribute", *where]) == 2  # nothing to attribute
    assert "nothing to attribute" in capsys.readouterr().err
    assert cli.main(["attribute", "text", "--collection", "absent", "--persist-dir",
                     str(small_store)]) == 1
    assert "no collection 'absent'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ engine


def test_engine_attribute_adds_support_and_unsupported(tiny_lm) -> None:
    """With ``NestConfig.attribute`` the result gains support citations (exact) and the
    unsupported sentences; copies keep kind "copy"; off, the result is the same as before."""
    from nest_integrations.config import NestConfig
    from tests.engines import make_engine

    ps = _passages()
    cfg = NestConfig(span_threshold=1.0, min_citation_tokens=1)
    prompt = ANABASIS[:60]
    plain = make_engine(tiny_lm, config=cfg).generate(prompt, max_new_tokens=24, passages=ps)
    engine = make_engine(tiny_lm, config=cfg.replace(attribute=True, attribute_scorer="fuzzy"))
    res = engine.generate(prompt, max_new_tokens=24, passages=ps)
    assert res.token_ids == plain.token_ids and plain.unsupported == []
    copies = [c for c in res.citations if c.kind == "copy"]
    assert copies == plain.citations and copies  # the tiny model copies with span_threshold 1
    assert res.mean_span_length == plain.mean_span_length
    from nest_integrations.attribution import SentenceAttribution

    units = split_units(res.text)
    a = Attribution(text=res.text, citations=[c for c in res.citations if c.kind != "copy"],
                    unsupported=res.unsupported, passages=res.passages,
                    sentences=[SentenceAttribution(res.text[s:e], s, e, "?") for s, e in units],
                    threshold=AttributionConfig(scorer="fuzzy").threshold)
    assert_exact(a)
    assert res.unsupported == []  # the copied answer is verbatim: nothing to flag
    assert res.to_dict()["citations"] == [c.to_dict() for c in res.citations]
    # plain greedy decoding of the random model: noise, that nothing supports
    noisy = make_engine(tiny_lm, config=NestConfig(attribute=True, attribute_scorer="fuzzy"),
                        decoding="greedy")
    res = noisy.generate("Tell me about the Anabasis.", max_new_tokens=24, passages=ps)
    units = split_units(res.text)
    assert res.unsupported and {(u.start, u.end) for u in res.unsupported} <= set(units)
    assert all(res.text[u.start : u.end] == u.text for u in res.unsupported)
    with pytest.raises(ValueError, match="attribute_scorer"):
        NestConfig(attribute_scorer="bleu")


def test_config_scorer_names_are_the_attribution_scorers() -> None:
    from nest_integrations.attribution import SCORERS
    from nest_integrations.config import ATTRIBUTE_SCORERS

    assert ATTRIBUTE_SCORERS == SCORERS


@pytest.mark.slow
def test_keys_scorer_with_the_real_model(default_lm) -> None:
    """The real SmolLM2's keys rank the paraphrase's passage sentence above a fabrication's best
    match, and the support citation is exact."""
    ps = _passages()
    att = Attributor(AttributionConfig(scorer="keys", support_threshold=-1.0), lm=default_lm)
    para = att("The Ten Thousand were Greek mercenaries that Cyrus the Younger hired.", ps)
    fab = att("The Great Wall of China was painted green by the emperor.", ps)
    assert_exact(para)
    (sup,) = [c for c in para.citations if c.kind == "support"]
    assert sup.passage_id == "p-ana" and "Ten Thousand" in sup.text
    assert para.sentences[0].score > fab.sentences[0].score


# ------------------------------------------------------------------------------ streaming


def _streaming_engine(tiny_lm, **config: object):
    """The tiny model copying the passages, attributed with the fuzzy scorer, verbatim runs
    off (40 tokens) and a low threshold, so its copied sentences get support citations."""
    from nest_integrations.config import NestConfig
    from tests.engines import make_engine

    cfg = NestConfig(span_threshold=1.0, min_citation_tokens=1, attribute=True,
                     attribute_scorer="fuzzy", **config)
    engine = make_engine(tiny_lm, config=cfg)
    attributor = Attributor(AttributionConfig(scorer="fuzzy", min_verbatim_tokens=40,
                                              support_threshold=0.5), lm=tiny_lm)
    engine._attributors["fuzzy"] = attributor  # the engine's per-scorer attributor, stricter
    return engine, attributor


STREAM_PROMPT = "Tell me about the Anabasis."


def test_stream_emits_support_citations_when_a_sentence_ends(tiny_lm) -> None:
    """Each support citation comes with the delta that starts the next sentence (not only on
    the final chunk); the final result equals ``generate``'s and the one-shot attribution of
    its text; attribution changes neither the text nor the token ids."""
    engine, attributor = _streaming_engine(tiny_lm)
    ps = _passages()
    emitted, streamed, flagged, early = "", [], [], 0
    for chunk in engine.stream(STREAM_PROMPT, max_new_tokens=64, passages=ps):
        if chunk.result is not None:
            res = chunk.result
            continue
        for c in chunk.support:
            shown = emitted + chunk.text
            assert c.kind == "support" and c.end <= len(shown)  # its sentence ends here
            assert shown[c.end :].strip()  # and the next one has begun
            early += 1
        streamed += chunk.support
        flagged += chunk.unsupported
        emitted += chunk.text
    assert early >= 2 and emitted == res.text
    support = [c for c in res.citations if c.kind == "support"]
    assert streamed == support[: len(streamed)] and flagged == res.unsupported[: len(flagged)]
    again = engine.generate(STREAM_PROMPT, max_new_tokens=64, passages=ps)
    assert (again.text, again.token_ids, again.citations, again.unsupported) == (
        res.text, res.token_ids, res.citations, res.unsupported)
    off = engine.generate(STREAM_PROMPT, max_new_tokens=64, passages=ps,
                          config=engine.config.replace(attribute=False))
    assert (off.text, off.token_ids) == (res.text, res.token_ids) and off.unsupported == []
    assert [c for c in res.citations if c.kind == "copy"] == off.citations
    whole = attributor(res.text, ps)
    assert support == [c for c in whole.citations if c.kind == "support"]
    assert res.unsupported == whole.unsupported
    by_id = {p.id: p for p in ps}
    for c in support:
        assert by_id[c.passage_id].text[c.passage_start : c.passage_end] == c.text


def test_sentence_stream_fed_in_pieces_equals_fed_at_once(tiny_lm) -> None:
    from nest_integrations.attribution import SentenceStream

    attributor = Attributor(AttributionConfig(scorer="fuzzy", min_verbatim_tokens=40,
                                              support_threshold=0.5))
    text = ("Xenophon wrote the Anabasis, e.g. for soldiers. Cyrus hired Greek mercenaries. "
            "Belly dance began in Egypt. Cats fly to the moon in 2077")
    pieces = SentenceStream(attributor, _passages())
    for n in range(1, len(text) + 1):
        pieces.feed(text[:n])
    pieces.feed(text, final=True)
    once = SentenceStream(attributor, _passages())
    once.feed(text, final=True)
    assert (pieces.support, pieces.unsupported, pieces.sentences) == (
        once.support, once.unsupported, once.sentences)
    assert "Cats fly to the moon in 2077" in [u.text for u in once.unsupported]
    assert [(u.start, u.end) for u in once.sentences] == split_units(text)
    assert {u.text for u in once.unsupported} | {text[c.start:c.end] for c in once.support} \
        == {text[s:e] for s, e in split_units(text)}
    with pytest.raises(ValueError, match="span"):
        attributor(text, _passages(), span=(5, len(text) + 1))
    # verbatim runs across sentence ends (a copied passage) leave the verdicts alone
    copied = ANABASIS + " Cats fly to the moon in 2077. " + BELLY
    verbatim = Attributor(AttributionConfig(scorer="fuzzy"))
    pieces, once = SentenceStream(verbatim, _passages()), SentenceStream(verbatim, _passages())
    for n in range(1, len(copied) + 1, 7):
        pieces.feed(copied[:n])
    pieces.feed(copied, final=True)
    once.feed(copied, final=True)
    assert (pieces.support, pieces.unsupported, pieces.sentences) == (
        once.support, once.unsupported, once.sentences)
    assert [s.verdict for s in once.sentences] == [
        "verbatim", "verbatim", "unsupported", "verbatim", "verbatim"]


VERBATIM_THEN_MADE_UP = ("Belly dance is a Middle Eastern dance that originated in Egypt. "
                         "Cats fly to the moon in 2077.")


def test_every_sentence_is_cited_or_flagged() -> None:
    """A sentence found verbatim in a passage that none of the answer's own citations covers
    gets a support citation (score 1.0, the passage sentence, exact); one the answer cites
    gets none; a made-up one is flagged; ``unaccounted`` finds what is neither."""
    from nest_integrations.attribution import SentenceStream, unaccounted

    text, ps = VERBATIM_THEN_MADE_UP, _passages()
    attributor = Attributor(AttributionConfig(scorer="fuzzy"))
    assert unaccounted(text, [], []) == split_units(text)  # the check can fail
    bare = SentenceStream(attributor, ps)
    bare.feed(text, final=True)
    (sup,) = bare.support
    first = BELLY[: BELLY.index(".") + 1]
    assert (sup.kind, sup.score, sup.text, sup.passage_id) == ("support", 1.0, first, "p-bd")
    assert text[sup.start : sup.end] == first and (sup.passage_start, sup.source_start) == (0, 0)
    assert [u.text for u in bare.unsupported] == ["Cats fly to the moon in 2077."]
    assert unaccounted(text, bare.support, bare.unsupported) == []
    # the answer's own citation covers the verbatim sentence: nothing is added for it
    copy = Citation("Belly dance", 0, 11, "p-bd", "belly", 0, 11, 0, 11, 2)
    cited = SentenceStream(attributor, ps)
    for n in range(1, len(text) + 1, 5):  # streamed: ``cited`` is asked only when needed
        cited.feed(text[:n], cited=lambda: [copy])
    cited.feed(text, final=True, cited=[copy])
    assert cited.support == [] and cited.unsupported == bare.unsupported
    assert unaccounted(text, [copy], cited.unsupported) == []
    assert unaccounted(text, [], cited.unsupported) == [(0, len(first))]


def test_support_citations_are_on_by_default_and_can_be_turned_off() -> None:
    """On in the presets every entry point defaults to (``grounded``, and ``copy``), off in a
    bare config (the paper's algorithm) and its presets; ``nest ask --no-attribute``."""
    from nest_integrations import assembly, cli
    from nest_integrations.cli.ask import ask_spec
    from nest_integrations.config import PRESETS, NestConfig

    assert assembly.DEFAULT_PRESET == "grounded"
    assert assembly.EngineSpec.for_store().config.attribute is True
    on = {name for name in PRESETS if NestConfig.from_preset(name).attribute}
    assert on == {"grounded", "copy"} and NestConfig().attribute is False
    parser = cli.build_parser()
    on_cfg = ask_spec(parser.parse_args(["ask", "q"])).config
    off = ask_spec(parser.parse_args(["ask", "q", "--no-attribute"])).config
    assert on_cfg.attribute is True and off == on_cfg.replace(attribute=False)


@pytest.mark.slow
def test_default_answers_have_every_sentence_cited_or_flagged(
    tmp_path_factory, default_lm, sample_store
) -> None:
    """The default engine (``assembly``'s, over the sample corpus) answers corpus questions with
    every sentence cited or flagged, streamed as the result has them; the edges' data carries
    the flags; off, the token ids are the same and only the answer's own citations remain."""
    from nest_integrations import assembly
    from nest_integrations.attribution import unaccounted
    from nest_integrations.cli.formatting import render
    from benchmarks.sets.sample_questions import SAMPLE_QUESTIONS
    from tests._stores import copy_sample_store
    from tests.invariants import cited_text_matches_source

    root = copy_sample_store(sample_store, tmp_path_factory.mktemp("attr") / "store")
    engine = assembly.build_engine(assembly.EngineSpec.for_store(persist_dir=str(root)),
                                   lm=default_lm)
    assert engine.config.attribute
    wanted = ("sample/assert", "sample/dickens")
    for q in [q for q in SAMPLE_QUESTIONS if q.id in wanted]:
        prompt = [{"role": "user", "content": q.question}]
        shown, streamed, flagged = "", [], []
        for chunk in engine.stream(prompt, max_new_tokens=48):
            if chunk.result is not None:
                res = chunk.result
                continue
            for c in chunk.support:  # final when it comes: its sentence is complete
                assert c.kind == "support" and c.end <= len(shown + chunk.text)
            streamed += chunk.support
            flagged += chunk.unsupported
            shown += chunk.text
        assert shown == res.text and res.text.strip()
        assert unaccounted(res.text, res.citations, res.unsupported) == [], (res.text, res)
        support = [c for c in res.citations if c.kind == "support"]
        assert streamed == support[: len(streamed)], (streamed, support)
        assert flagged == res.unsupported[: len(flagged)]
        cited_text_matches_source(res)
        flags = [u.to_dict() for u in res.unsupported]
        assert res.to_dict()["stats"]["unsupported"] == output.stats(res)["unsupported"] == flags
        assert ("[!] Unsupported" in render(res)) == bool(flags)
        off = engine.generate(prompt, max_new_tokens=48,
                              config=engine.config.replace(attribute=False))
        assert off.token_ids == res.token_ids and off.unsupported == []
        assert off.citations == [c for c in res.citations if c.kind != "support"]


def test_citation_stream_reports_support_at_once() -> None:
    p = _passages()[1]
    sup = Citation(p.id, p.doc_id, 0, 10, "Belly dance", 0, 11, 0, 11, 3, "support", 0.9)
    copy = Citation(p.id, p.doc_id, 12, 20, "Egypt", 0, 5, 0, 5, 1, "copy")
    grow, done = output.CitationStream("growing"), output.CitationStream("completed")
    assert grow.step(copy, [sup]) == [copy, sup] and grow.step(None, ()) == []
    assert done.step(copy, [sup]) == [sup] and done.step(None) == [copy]


def test_chat_nest_stream_carries_support_before_the_last_chunk(tiny_lm) -> None:
    """Through LangChain's ``ChatNest.stream``: support annotations arrive on the chunk that
    completes their sentence, and all the chunks' citations add up to ``invoke``'s."""
    from nest_integrations.integrations.langchain.chat_models import ChatNest

    engine, _ = _streaming_engine(tiny_lm)
    retriever = InMemoryRetriever(_passages())
    engine.retriever = retriever
    chat = ChatNest(engine=engine, max_tokens=64)
    chunks = list(chat.stream(STREAM_PROMPT))
    kinds = [[c["extras"]["kind"] for c in ch.additional_kwargs.get("citations", [])]
             for ch in chunks]
    assert any("support" in k for k in kinds[:-1])
    streamed = [c for ch in chunks for c in ch.additional_kwargs.get("citations", [])]
    whole = chat.invoke(STREAM_PROMPT).additional_kwargs["citations"]
    key = lambda c: (c["start_index"], c["extras"]["kind"], c["id"])  # noqa: E731
    assert sorted(streamed, key=key) == sorted(whole, key=key)
    assert any(c["extras"]["kind"] == "support" for c in whole)


def test_server_annotation_stream_merges_support_to_the_final_list(tiny_lm) -> None:
    """The server's SSE annotations (``AnnotationStream`` over the engine's chunks, as
    ``stream_events`` sends them): support ones before the end, merged == non-streamed."""
    from nest_integrations.server import protocol as P

    engine, _ = _streaming_engine(tiny_lm)
    tracker, sent, before_end = P.AnnotationStream(), [], 0
    for item in engine.stream(STREAM_PROMPT, max_new_tokens=64, passages=_passages()):
        if item.result is not None:
            sent += tracker.finish(item.result)
            final = [P.annotation(c) for c in item.result.citations]
        elif item.text:
            step = tracker.step(item.citation, item.support)
            before_end += sum(a["url_citation"]["kind"] == "support" for a in step)
            sent += step
    assert before_end >= 1
    key = lambda a: (a["url_citation"]["start_index"], a["url_citation"]["kind"])  # noqa: E731
    assert sorted(P.merge_annotations(sent), key=key) == sorted(final, key=key)
