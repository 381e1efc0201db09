"""Every edge cites (issue 53): one corpus-grounded question per corpus, asked through
``nest ask`` (its JSON and its printed sources), LangChain's ``ChatNest`` (content-block
annotations), LlamaIndex's ``NestLLM.complete`` (citation payloads) and ``NestQueryEngine``
(source nodes), and ``nest serve`` (``url_citation`` annotations).

Each edge is built the way a user builds it, with the defaults (the ``grounded`` preset): the
CLI from its arguments, the adapters from ``persist_dir``, the server from ``nest serve``'s own
arguments (``cli.serve``), all on the embedded model (fp32, the tests' ``default_lm``). Two
stores: the shipped sample corpus (``nest ingest --sample``), asked the README's question, and a
held-out dictionary of computing terms written here (a JSONL in the common ``{"id", "title",
"text"}`` layout, ingested by ``nest ingest``), asked for one term's entry, the prompt issue 53
reported uncited at the framework edges.

Every edge must return at least one copy or verbatim citation on the gold document, every
citation exact (``answer[start:end] == cited text == passage[passage_start:passage_end] ==
source[source_start:source_end]``; a support citation's text is the passage sentence and its
answer offsets span the sentence it supports), and each edge the same answer and citations as
``nest ask`` (the server's streamed annotations, merged, the same list as its response's).
Slow: the real model, and the session's sample store (about 1 min here once it is made).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pytest

from nest_integrations import assembly, cli
from tests._stores import copy_sample_store

pytestmark = pytest.mark.slow

MAX_TOKENS = 48

#: A held-out dictionary of computing terms (written for this test; no corpus holds it).
DICTIONARY = [
    ("checksum", "checksum (noun). In computing, a small value calculated from a block of data "
     "and stored or sent with it. When the data is read back, the value is calculated again; "
     "if the two values differ, the data was damaged on the way."),
    ("deadlock", "deadlock (noun). In computing, a state in which two or more processes each "
     "hold a resource that another of them needs, so that none of them can continue. A "
     "deadlock lasts until one of the processes is stopped or gives up what it holds."),
    ("mutex", "mutex (noun). Short for mutual exclusion: a lock that lets only one thread at a "
     "time run a section of code that uses a shared resource. A thread that finds the mutex "
     "taken waits until its owner releases it."),
    ("compiler", "compiler (noun). A program that translates source code written in a "
     "high-level programming language into machine code, or another lower-level form, before "
     "the program runs. Compare interpreter."),
    ("interpreter", "interpreter (noun). A program that runs source code directly, statement "
     "by statement, without first translating the whole program into machine code. Compare "
     "compiler."),
    ("cache", "cache (noun). In computing, a small, fast store that keeps copies of recently "
     "or often used data, so that later requests for the same data are answered faster than "
     "the original source could answer them."),
    ("bytecode", "bytecode (noun). Instructions for a virtual machine rather than for a real "
     "processor, produced by compiling source code; an interpreter or a just-in-time compiler "
     "then runs them."),
    ("semaphore", "semaphore (noun). In computing, a counter that limits how many threads may "
     "use a resource at once: a thread decrements it to enter and increments it to leave, and "
     "waits while it is zero."),
]


@dataclass
class Corpus:
    """A store, its question and gold document, and what the checks read."""

    name: str
    persist_dir: str
    question: str
    gold: str  # the doc id of the document that answers the question
    sources: dict[str, str]  # doc id -> the source document's text as ingested
    passages: dict[str, Any]  # passage id -> Passage (every passage of the store)


@dataclass(frozen=True)
class Cite:
    """One citation as an edge reports it, in NEST's own terms."""

    kind: str
    start: int
    end: int
    text: str
    passage_id: str
    passage_start: int
    passage_end: int
    doc_id: str
    source_start: int | None
    source_end: int | None

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.kind, self.start, self.end, self.passage_id, self.passage_start,
                self.passage_end)


# ------------------------------------------------------------------------------- the corpora


def _sample_sources() -> dict[str, str]:
    from nest_integrations.ingest import sample_corpus_path

    root = sample_corpus_path()
    out = {f"pydoc/{p.name}": p.read_text(encoding="utf-8")
           for p in (root / "pydoc").glob("*.txt")}
    for line in (root / "wikipedia.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            out[rec["id"]] = rec["text"]
    return out


def _store_passages(persist_dir: str) -> dict[str, Any]:
    store = assembly.open_store(None, persist_dir)
    return {p.id: p for p in store.iter_passages()}


@pytest.fixture(scope="module", params=["sample", "dictionary"])
def corpus(request, tmp_path_factory, default_lm) -> Iterable[Corpus]:
    """A store filled by ``nest ingest``, with every model the edges load being ``default_lm``
    (``assembly.shared_model``, as tests/cli/test_ask.py does): one model in memory, fp32."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(assembly, "shared_model", lambda *a, **k: default_lm)
        tmp = tmp_path_factory.mktemp(f"edges-{request.param}")
        if request.param == "sample":
            root = copy_sample_store(request.getfixturevalue("sample_store"), tmp / "store")
            question, gold, sources = (
                "How does the assert statement work in Python?", "pydoc/assert.txt",
                _sample_sources(),
            )
        else:
            docs = tmp / "docs"
            docs.mkdir()
            (docs / "terms.jsonl").write_text("".join(
                json.dumps({"id": term, "title": term, "text": text}) + "\n"
                for term, text in DICTIONARY
            ))
            root = tmp / "store"
            assert cli.main(["ingest", str(docs), "--persist-dir", str(root)]) == 0
            # its answer has a support citation and a copy that start at the same character,
            # and a copy whose passage offsets are not its answer offsets
            question = "Write the dictionary entry for the computing term 'bytecode'."
            gold, sources = "bytecode", dict(DICTIONARY)
        passages = _store_passages(str(root))
        assert {p.doc_id for p in passages.values()} <= set(sources), "doc ids as ingested"
        yield Corpus(request.param, str(root), question, gold, sources, passages)


# ------------------------------------------------------------------------------- the checks


def check(corpus: Corpus, answer: str, cites: list[Cite]) -> None:
    """Exact on every side; at least one copy or verbatim citation on the gold document."""
    for c in cites:
        assert c.kind in ("copy", "verbatim", "support"), c
        p = corpus.passages[c.passage_id]
        assert p.doc_id == c.doc_id, c
        assert p.text[c.passage_start : c.passage_end] == c.text != "", c
        if c.kind == "support":  # the passage sentence; its answer offsets span the answer's
            assert 0 <= c.start < c.end <= len(answer), c
        else:
            assert answer[c.start : c.end] == c.text, (answer, c)
        assert c.source_start is not None and c.source_end is not None, c
        assert corpus.sources[c.doc_id][c.source_start : c.source_end] == c.text, c
        assert c.source_start - (p.char_start or 0) == c.passage_start, c
    shown = [c for c in cites if c.kind in ("copy", "verbatim")]
    assert shown, (answer, cites)
    assert corpus.gold in {c.doc_id for c in shown}, (answer, [c.doc_id for c in shown])


def from_result_dict(d: dict[str, Any]) -> Cite:
    """``NestResult.to_dict()``'s citations (``nest ask --json``)."""
    return Cite(d["kind"], d["start"], d["end"], d["text"], d["passage_id"], d["passage_start"],
                d["passage_end"], d["doc_id"], d["source_start"], d["source_end"])


def from_payload(start: int, end: int, text: str, extras: dict[str, Any]) -> Cite:
    """The adapters' payload (``integrations._common.citation_payload``): answer offsets and
    text, the source side in ``extras`` under ``*_char`` names (LangChain's annotations drop
    the None ones)."""
    return Cite(extras["kind"], start, end, text, extras["passage_id"],
                extras["passage_start_char"], extras["passage_end_char"], extras["doc_id"],
                extras.get("source_start_char"), extras.get("source_end_char"))


@pytest.fixture(scope="module")
def asked(corpus: Corpus) -> dict[str, Any]:
    """``nest ask --json``: the answer every other edge must give."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["ask", corpus.question, "--persist-dir", corpus.persist_dir,
                         "--max-new-tokens", str(MAX_TOKENS), "--json"])
    assert code == 0
    return json.loads(out.getvalue())


def same_as_cli(asked: dict[str, Any], answer: str, cites: list[Cite]) -> None:
    assert answer == asked["text"]
    assert sorted(c.key for c in cites) == sorted(
        from_result_dict(d).key for d in asked["citations"])


# ------------------------------------------------------------------------------- the edges


def test_cli_ask_json(corpus: Corpus, asked: dict[str, Any]) -> None:
    cites = [from_result_dict(d) for d in asked["citations"]]
    check(corpus, asked["text"], cites)
    by_id = {p["id"]: p for p in asked["passages"]}
    for c in cites:  # the passages it reports are the store's
        assert by_id[c.passage_id]["text"] == corpus.passages[c.passage_id].text


#: A span line of ``nest ask``'s printed sources (``cli.formatting.source_lines``).
SPAN_LINE = re.compile(r'^    (?:page \d+, )?chars (\d+)-(\d+) of the (source|passage), '
                       r'(?:verbatim match, )?\d+ tokens: "(.*)"$')
HEAD_LINE = re.compile(r"^\[(\d+)\] .*\(doc (.+?), passage (.+?)\)(?: |$)")


def test_cli_ask_prints_its_sources(corpus: Corpus, asked: dict[str, Any], capsys) -> None:
    """The printed answer has markers, and every printed span is the slice of its source
    document that its printed offsets name."""
    capsys.readouterr()
    assert cli.main(["ask", corpus.question, "--persist-dir", corpus.persist_dir,
                     "--max-new-tokens", str(MAX_TOKENS)]) == 0
    out = capsys.readouterr().out
    assert "Sources:" in out and "Sources: none" not in out, out
    assert "[1]" in out.split("Sources:")[0], out
    doc, spans, chars = None, [], []
    for line in out.split("Sources:")[1].splitlines():
        if m := HEAD_LINE.match(line):
            doc, pid = m.group(2), m.group(3)
        elif m := SPAN_LINE.match(line):
            a, b, where, shown = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
            text = corpus.sources[doc] if where == "source" else corpus.passages[pid].text
            cited = " ".join(text[a:b].split())  # printed with whitespace collapsed
            assert cited == shown or (shown.endswith("...") and cited.startswith(shown[:-3])), (
                line, cited)
            spans.append(doc)
            chars.append((doc, b - a))
    assert corpus.gold in spans, out
    if corpus.name == "sample":  # the README's main command: the topic quoted, on its file
        answer = re.sub(r"\[\d+\]", "", out.split("Sources:")[0]).strip()
        on_file = sum(n for d, n in chars if d == "pydoc/assert.txt")
        assert on_file >= 0.8 * len(answer), out  # (was: 2+ spans; now one span covers it)
        assert answer.startswith("Assert statements are a convenient way"), out


def test_chatnest_annotations(corpus: Corpus, asked: dict[str, Any]) -> None:
    from nest_integrations.langchain import ChatNest

    chat = ChatNest(persist_dir=corpus.persist_dir, max_tokens=MAX_TOKENS)
    msg = chat.invoke(corpus.question)
    (block,) = [b for b in msg.content_blocks if b["type"] == "text"]
    notes = list(block.get("annotations") or [])
    for n in notes:
        assert n["type"] == "citation"
    cites = [from_payload(n["start_index"], n["end_index"], n["cited_text"], n["extras"])
             for n in notes]
    check(corpus, msg.text, cites)
    same_as_cli(asked, msg.text, cites)
    assert msg.additional_kwargs["citations"] == msg.response_metadata["citations"]
    assert len(msg.additional_kwargs["citations"]) == len(notes)


@pytest.fixture(scope="module")
def llm(corpus: Corpus) -> Any:
    from nest_integrations.llama_index import NestLLM

    return NestLLM(persist_dir=corpus.persist_dir, max_new_tokens=MAX_TOKENS)


def test_nestllm_complete_citations(corpus: Corpus, asked: dict[str, Any], llm: Any) -> None:
    resp = llm.complete(corpus.question)
    payloads = resp.additional_kwargs["citations"]
    cites = [from_payload(p["start_index"], p["end_index"], p["cited_text"], p["extras"])
             for p in payloads]
    check(corpus, resp.text, cites)
    same_as_cli(asked, resp.text, cites)


def test_query_engine_source_nodes(corpus: Corpus, asked: dict[str, Any], llm: Any) -> None:
    """``source_nodes`` are the cited spans: node text = the cited text, the node's char
    offsets index its source document."""
    from nest_integrations.llama_index import NestQueryEngine

    response = NestQueryEngine.from_args(llm=llm).query(corpus.question)
    cites = []
    for n in response.source_nodes:
        node, m = n.node, n.node.metadata
        assert node.ref_doc_id == m["doc_id"]
        cites.append(Cite(m["kind"], m["response_start_char"], m["response_end_char"],
                          node.text, m["passage_id"], m["passage_start_char"],
                          m["passage_end_char"], m["doc_id"], node.start_char_idx,
                          node.end_char_idx))
    check(corpus, response.response, cites)
    same_as_cli(asked, response.response, cites)


def test_server_url_citations(corpus: Corpus, asked: dict[str, Any]) -> None:
    """``nest serve``'s app (built by ``cli.serve`` from its own arguments) answers the chat
    completion with ``url_citation`` annotations, streamed and not, and serves each cited
    passage."""
    from starlette.testclient import TestClient

    from nest_integrations.cli import serve
    from nest_integrations.server import create_app
    from nest_integrations.server.protocol import merge_annotations

    args = cli.build_parser().parse_args(["serve", "--persist-dir", corpus.persist_dir])
    app = create_app(serve.build_engine(args), serve.settings_from_args(args))
    body = {"model": args.served_model_name, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": corpus.question}]}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        anns = msg["annotations"]
        cites = []
        for a in anns:
            assert a["type"] == "url_citation"
            u = a["url_citation"]
            assert u["url"] and u["title"]
            cites.append(Cite(u["kind"], u["start_index"], u["end_index"], u["cited_text"],
                              u["passage_id"], u["passage_start"], u["passage_end"],
                              u["doc_id"], u["source_start"], u["source_end"]))
            p = client.get(f"/v1/passages/{u['passage_id']}")  # the page's next request
            assert p.status_code == 200
            assert p.json()["text"] == corpus.passages[u["passage_id"]].text
        check(corpus, msg["content"], cites)
        same_as_cli(asked, msg["content"], cites)
        # streamed: the deltas add up to the same text, the merged annotations to the same list
        text, streamed = "", []
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[len("data: "):])["choices"]:
                    text += choice["delta"].get("content") or ""
                    streamed += choice["delta"].get("annotations") or []
        assert text == msg["content"]
        assert merge_annotations(streamed) == anns
