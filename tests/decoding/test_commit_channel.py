"""The commit is the only channel out of the decode loop (issue 61).

The loop yields immutable ``commits.Commit``s and returns its output as data; the text stream owns
its ``OutputText`` and is the loop's stopping criterion; passages a drafter registers come back
in its draft and reach the stream and the result through the commits. Shown here by replaying
the commits an engine's loop yielded through a fresh ``TextStream`` with no loop at all: the
replay gives the engine's text, ids, chunks and citations. An AST check keeps the loop free of
``text_stream`` and every other module from writing a loop attribute.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import nest_integrations.decoding.loop as loop_module
from nest_integrations.decoding.commits import Commit, StatsDelta
from nest_integrations.config import Guards, NestConfig
from nest_integrations.decoding.text_stream import TextStream
from nest_integrations.drafters import METHODS, Draft, Method
from nest_integrations.policy import AnswerPolicy
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import NestStats, Passage
from tests.decoding.test_quote_check import PASSAGE, QUESTION, SENTENCE
from tests.engines import make_engine
from tests.passages import PASSAGE_TEXT, UNRELATED_TEXT, make_passage

PACKAGE = Path(loop_module.__file__).resolve().parents[1]


class _Recorder:
    """Records each loop run's commits and each text stream's constructor arguments."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[list[Commit]] = []
        self.decoded: list[Any] = []  # each run's return value (``Decoded``)
        self.streams: list[tuple[tuple, dict]] = []
        run, init = loop_module.DecodeLoop.run, TextStream.__init__
        me = self

        def recorded_run(loop: Any) -> Any:
            commits: list[Commit] = []
            me.runs.append(commits)
            gen = run(loop)
            try:
                while True:
                    commit = next(gen)
                    commits.append(commit)
                    yield commit
            except StopIteration as end:
                me.decoded.append(end.value)
                return end.value

        def recorded_init(stream: Any, *args: Any, **kwargs: Any) -> None:
            me.streams.append((args, dict(kwargs)))
            init(stream, *args, **kwargs)

        monkeypatch.setattr(loop_module.DecodeLoop, "run", recorded_run)
        monkeypatch.setattr(TextStream, "__init__", recorded_init)

    def replay(self) -> tuple[TextStream, list]:
        """A fresh stream, built as the engine built its last one, fed the last run's commits."""
        args, kwargs = self.streams[-1]
        stream = TextStream(*args, **kwargs)
        return stream, list(stream.replay(self.runs[-1]))


def _spans(citations: list) -> list[tuple]:
    return [(c.passage_id, c.kind, c.start, c.end, c.text) for c in citations]


def _check_replay(rec: _Recorder, live_chunks: list, res: Any) -> TextStream:
    """The replay equals the engine's result and its streamed chunks."""
    stream, chunks = rec.replay()
    assert stream.out.text == res.text and stream.out.ids == res.token_ids
    assert _spans(stream.citations()) == _spans(res.citations)
    assert [p.id for p in stream.passages] == [p.id for p in res.passages]
    live = [(c.text, c.citation) for c in live_chunks if c.result is None and c.text]
    assert [(c.text, c.citation) for c in chunks] == live
    for commit in rec.runs[-1]:  # commits are immutable data
        assert isinstance(commit.ids, tuple) and isinstance(commit.sources, tuple)
        with pytest.raises(dataclasses.FrozenInstanceError):
            commit.ids = ()  # type: ignore[misc]
    return stream


def _generate(engine: Any, monkeypatch: pytest.MonkeyPatch, prompt: Any, **kw: Any):
    rec = _Recorder(monkeypatch)
    chunks = list(engine.stream(prompt, **kw))
    res = chunks[-1].result
    assert res is not None
    return rec, chunks, res


def test_nest_copies_and_citations_come_from_the_commits_alone(tiny_lm, monkeypatch):
    """NEST copying on a tiny model: the replayed commits give the same text, ids, chunks
    and (non-empty) citations as the engine, with no loop object."""
    passages = [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]
    cfg = NestConfig(span_threshold=1.0, min_citation_tokens=1, relaxation=0.9)
    rec, chunks, res = _generate(make_engine(tiny_lm, config=cfg), monkeypatch,
                                 PASSAGE_TEXT[:40], max_new_tokens=40, passages=passages)
    assert res.stats.copied_tokens > 0 and res.citations
    _check_replay(rec, chunks, res)


def test_a_stop_string_cut_is_the_streams_and_the_loop_keeps_it(tiny_lm, monkeypatch):
    """A stop string is the stream's criterion: the loop's ids are cut with the text (the
    commits say how many it kept), and a replay with other stop strings is refused."""
    engine = make_engine(tiny_lm)
    full = engine.generate("Hello", max_new_tokens=12)
    stop = full.text[2:4]
    rec, chunks, res = _generate(engine, monkeypatch, "Hello", max_new_tokens=12, stop=[stop])
    assert stop not in res.text and res.stats.finish_reason == "stop"
    commits = rec.runs[-1]
    assert sum(len(c.ids) for c in commits) > commits[-1].kept == len(res.token_ids)
    _check_replay(rec, chunks, res)
    args, kwargs = rec.streams[-1]
    with pytest.raises(ValueError, match="keeps .* tokens but this stream kept"):
        list(TextStream(*args, **{**kwargs, "stop": ()}).replay(commits))


def test_the_evidence_quote_reaches_the_stream_as_commits(tiny_lm, monkeypatch):
    """The evidence quote (a draft of the loop) and its citation, replayed from commits."""
    policy = AnswerPolicy(decoding="rag-copy", evidence="overlap", evidence_min=0.0,
                          guards=Guards())
    engine = make_engine(tiny_lm, InMemoryRetriever([PASSAGE]), policy=policy)
    rec, chunks, res = _generate(engine, monkeypatch, QUESTION, max_new_tokens=32)
    assert res.stats.evidence == "quoted"
    assert [c.text for c in res.citations if c.kind == "copy"] == [SENTENCE]
    _check_replay(rec, chunks, res)


@pytest.mark.parametrize("check", [None, -50.0])
def test_an_opening_quote_runs_in_the_prompts_pass_and_unchecked_is_shown_first(
        tiny_lm, monkeypatch, check):
    """Evidence first: the opening quote is decided before any pass, so it runs with the prompt
    in one pass; where nothing checks it (``quote_check`` None, the default) it is the first
    commit, before that pass (time to first token: no LM pass). Checked, it follows the pass
    that scored it. Either way the answer is the same, token for token."""
    policy = AnswerPolicy(decoding="rag-copy", evidence="overlap", evidence_min=0.0,
                          guards=Guards(quote_check=check))
    engine = make_engine(tiny_lm, InMemoryRetriever([PASSAGE]), policy=policy)
    rec, chunks, res = _generate(engine, monkeypatch, QUESTION, max_new_tokens=32)
    assert res.stats.evidence == "quoted" and res.text.strip() == SENTENCE
    first = rec.runs[-1][0]
    assert res.token_ids[: len(first.ids)] == list(first.ids) and first.copied
    assert first.stats.forward_passes == (0 if check is None else 1)
    assert res.stats.forward_passes == 1  # the prompt and the whole quote: one pass
    _check_replay(rec, chunks, res)


class _Registering:
    """A draft-first drafter that copies the model's own greedy continuation from a passage it
    registers itself (not in the generation's passages): its drafts carry the passage."""

    PASSAGE_ID = "registered-by-the-drafter"

    def __init__(self, ctx: Any) -> None:
        lm, ids = ctx.lm, list(ctx.prompt_ids)
        self.ctx_passages = ctx.passages
        cont: list[int] = []
        for _ in range(14):
            logits, _ = lm.forward(ids + cont, lm.new_cache(), last=1)
            cont.append(int(logits[-1].argmax()))
        ends = [len(lm.detokenize(cont[: j + 1])) for j in range(len(cont))]
        self.tokens = cont
        self.passage = Passage(self.PASSAGE_ID, lm.detokenize(cont), "drafter-doc")
        self.offsets = [(a, b) for a, b in zip([0] + ends[:-1], ends)]
        self.index: int | None = None

    def propose(self, state: Any) -> Draft | None:
        import numpy as np

        new: list = []
        if self.index is None:
            self.index = state.passage_index(self.passage, np.asarray(self.offsets), new)
        k = len(state.out_ids)
        toks = self.tokens[k : k + min(3, state.budget)]
        if not toks or set(toks) & state.eos:
            return Draft([], new_passages=tuple(new)) if new else None
        return Draft(toks, [(self.index, k + i) for i in range(len(toks))],
                     new_passages=tuple(new))

    def update(self, state: Any, draft: Draft, n_accepted: int) -> None:
        return None


def test_passages_a_drafter_registers_reach_the_result_through_commits(tiny_lm, monkeypatch):
    """A drafter's new passage comes back in its draft: the loop adds it to its own list and
    reports it in a commit before any source points at it; the stream and the result learn it
    from there; the caller's and the drafter context's lists are never written."""
    made: list[_Registering] = []

    def make(ctx: Any) -> _Registering:
        made.append(_Registering(ctx))
        return made[-1]

    monkeypatch.setitem(METHODS, "registering", Method("registering", make))
    passages = [make_passage(PASSAGE_TEXT, "rome")]
    engine = make_engine(tiny_lm, config=NestConfig(min_citation_tokens=1))
    rec, chunks, res = _generate(engine, monkeypatch, PASSAGE_TEXT[:30], max_new_tokens=12,
                                 passages=passages, decoding="registering")
    pid = _Registering.PASSAGE_ID
    assert [p.id for p in res.passages] == [passages[0].id, pid]
    assert any(s is not None and s[0] == pid for s in res.token_sources)
    assert [c.passage_id for c in res.citations] == [pid]
    learned = len(passages)  # passages the commits have reported so far
    for commit in rec.runs[-1]:
        learned = max([learned] + [i + 1 for i, _, _ in commit.new_passages])
        assert all(s is None or s[0] < learned for s in commit.sources)
    assert learned == 2
    assert len(passages) == 1 and len(made[-1].ctx_passages) == 1  # nobody wrote them
    _check_replay(rec, chunks, res)


def test_the_loops_passage_list_takes_registrations_by_index_and_refuses_a_wrong_one():
    """``Committed.register``: a new passage at the next index, offsets for one held without
    them (not over ones it has), each reported once in the next commit; a wrong index (a
    drafter that did not ask ``DecodeState.passage_index``) is a ValueError naming it."""
    from nest_integrations.decoding.commits import Committed

    a, b = Passage("a", "alpha", "d"), Passage("b", "beta", "d")
    out = Committed([a], [None], NestStats())
    assert out.register([(0, a, "offs-a"), (1, b, "offs-b")]) == ((a, b), ("offs-a", "offs-b"))
    assert out.register([(0, a, "other")]) == ((a, b), ("offs-a", "offs-b"))
    first, second = out.commit(False), out.commit(True)
    assert first.new_passages == ((0, a, "offs-a"), (1, b, "offs-b")) and not second.new_passages
    with pytest.raises(ValueError, match="registers passage 'c' at index 5.*holds 2"):
        out.register([(5, Passage("c", "gamma", "d"), None)])


def _summed(commits: list[Commit]) -> StatsDelta:
    total = StatsDelta()
    for commit in commits:
        total = total + commit.stats
    return total


@pytest.mark.parametrize("method", ["knn-ssd", "registering"])
def test_commits_carry_what_the_loop_counted_and_the_run_returns_it_as_data(
        tiny_lm, monkeypatch, method):
    """Each commit carries the counters since the one before (the first includes the prefill);
    summed over the run they are the run's returned stats and the generation's totals. A
    drafter's own counters (KNN-SSD's layer-skip passes, its route) reach the stats through
    its drafts: it holds no stats to write to."""
    from nest_integrations.lm.layer_skip import SkipSet

    n_layers = len(tiny_lm.model.model.layers)
    options = ({"skip": SkipSet.from_lists(n_layers, [1], []).to_dict(), "threshold": 0.0}
               if method == "knn-ssd" else {})
    monkeypatch.setitem(METHODS, "registering", Method("registering", _Registering))
    engine = make_engine(tiny_lm)
    prompt = "the cat sat on the mat and the cat sat on the"
    rec, _, res = _generate(engine, monkeypatch, prompt, max_new_tokens=24, decoding=method,
                            drafter_options=options)
    commits, decoded, st = rec.runs[-1], rec.decoded[-1], res.stats
    assert commits[0].stats.forward_passes >= 1  # the prefill
    assert _summed(commits) == decoded.stats
    assert decoded.stats.forward_passes == st.forward_passes > 1
    assert decoded.stats.verify_steps == st.drafting.verify_steps > 0
    assert decoded.stats.drafted_tokens == st.drafting.drafted_tokens
    assert decoded.stats.accepted_tokens == st.drafting.accepted_tokens
    assert decoded.stats.draft_forwards == st.drafting.forwards
    if method == "knn-ssd":
        assert st.drafting.forwards >= st.drafting.drafted_tokens > 0
        assert st.route.skip_set == "explicit"
    else:
        assert st.drafting.forwards == 0 and st.drafting.accepted_tokens > 0
    # a commit's counters are its own: the verify steps fall to the commits of their drafts
    assert sum(1 for c in commits if c.stats.verify_steps) <= st.drafting.verify_steps


def test_drafters_read_a_view_with_no_lm_cache_or_stats(tiny_lm):
    """``DecodeState`` holds no LM, cache or stats; a self-speculative drafter's passes go
    through ``ScratchPasses``, which gives the cache back as it found it and runs nothing
    outside its block."""
    from nest_integrations.drafters.base import DecodeState, ScratchPasses
    from nest_integrations.lm.layer_skip import SkipSet
    from nest_integrations.lm.port import port_of

    names = {f.name for f in dataclasses.fields(DecodeState)}
    assert not names & {"lm", "cache", "stats"}
    for path in sorted((PACKAGE / "drafters").rglob("*.py")):
        text = path.read_text()
        assert not any(f"state.{n}" in text for n in ("lm", "cache", "stats")), path.name
    cache = tiny_lm.new_cache()
    tiny_lm.forward([1, 2, 3, 4], cache, last=1)
    scratch = ScratchPasses(tiny_lm, cache, port_of(tiny_lm).layer_skip)
    skip = SkipSet.from_lists(len(tiny_lm.model.model.layers), [1], [])
    with pytest.raises(RuntimeError, match="inside `with scratch:`"):
        scratch.forward_skip([5], skip)
    with scratch:
        scratch.forward_skip([5], skip)
        scratch.forward_skip([6], skip)
        assert tiny_lm.cache_length(cache) == 6
    assert tiny_lm.cache_length(cache) == 4


# ----------------------------------------------------------------------------- architecture

def loop_imports_text_stream(source: str) -> bool:
    """Whether a module's source imports ``decoding.text_stream`` (absolute or relative)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod.endswith("text_stream") or any(a.name == "text_stream" for a in node.names):
                return True
        elif isinstance(node, ast.Import) and any(a.name.endswith("text_stream")
                                                  for a in node.names):
            return True
    return False


def loop_attribute_writes(source: str) -> list[str]:
    """Assignments to an attribute of a ``DecodeLoop`` in a module's source: targets (and
    ``setattr`` calls) on a name bound to ``DecodeLoop(...)``, a parameter annotated
    ``DecodeLoop``, the class itself, or any name or attribute called ``loop``/``*_loop``."""
    tree = ast.parse(source)
    loops = {"DecodeLoop"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                ast.unparse(node.value.func).endswith("DecodeLoop")):
            loops |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.arg) and node.annotation is not None and (
                "DecodeLoop" in ast.unparse(node.annotation)):
            loops.add(node.arg)

    def is_loop(expr: ast.expr) -> bool:
        name = ast.unparse(expr).rpartition(".")[2]
        return name in loops or name == "loop" or name.endswith("_loop")

    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
            if is_loop(node.args[0]):
                found.append(ast.unparse(node))
            continue
        flat = []
        for t in targets:
            flat += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
        found += [ast.unparse(t) for t in flat
                  if isinstance(t, ast.Attribute) and is_loop(t.value)]
    return found


def test_the_loop_imports_no_text_stream_and_nobody_writes_a_loop_attribute():
    """``decoding/loop.py`` imports nothing from ``text_stream.py``, and no package module
    besides it assigns an attribute of a loop; each check fails on a planted bad source."""
    assert not loop_imports_text_stream((PACKAGE / "decoding" / "loop.py").read_text())
    writes = {str(p.relative_to(PACKAGE)): w for p in sorted(PACKAGE.rglob("*.py"))
              if p.name != "loop.py" or p.parent.name != "decoding"
              for w in [loop_attribute_writes(p.read_text())] if w}
    assert writes == {}
    # the checks have teeth
    assert loop_imports_text_stream("from nest_integrations.decoding.text_stream import X")
    assert loop_imports_text_stream("from . import text_stream")
    bad = ("def f(request):\n    loop, text = request.loop(True, 8)\n    loop.done = True\n"
           "def g(lm):\n    x = DecodeLoop(lm)\n    x.out = []\n    setattr(x, 'ids', [])\n"
           "def h(l: DecodeLoop):\n    l.max_new_tokens += 1\n")
    assert sorted(loop_attribute_writes(bad)) == ["l.max_new_tokens", "loop.done", "setattr(x, 'ids', [])",
                                                  "x.out"]
