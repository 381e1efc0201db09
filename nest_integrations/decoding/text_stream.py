"""Output text beside the decoding loop: incremental detokenisation, stop strings, deltas.

``OutputText`` holds the committed token ids, where each token's text ends, and the text. It
decodes incrementally (each commit decodes only the tokens since a stable anchor, with one token
of left context), so a generation costs O(n) decoding, not O(n^2). Streamed deltas hold back an
incomplete multi-byte character and any tail that may still become a stop string.

Token ends: ``ends[i]`` is how much of ``text`` the tokens ``ids[:i + 1]`` determine, i.e. the
length of the common prefix of ``detokenize(ids[:i + 1])`` and ``text``. So a character split
over several tokens (byte-level BPE, SentencePiece byte fallback) belongs to the token that
completes it, as in ``HFLanguageModel.tokenize_with_offsets``; ends never decrease; and
``text[:ends[i]]`` is always a prefix that the first i + 1 tokens decode to. Ends of the tokens
after the last complete character are recomputed on each commit until the text is settled.

The anchor only follows a token whose own decode is whole text (``_whole``): after a skipped
special token a WordPiece decode would start its next token without a space or keep its "##".
Checked against whole decodes on random ids with special tokens mixed in (WordPiece, byte-level
BPE, SentencePiece): what still differs, once in 1,500 SentencePiece sequences, is a character
whose byte tokens a special token splits.

``TextStream`` is the consumer side of the decode loop: it owns the generation's ``OutputText``
(nothing else writes to it), is the loop's stopping criterion (``commits.StoppingCriteria``: the
loop tells it each commit's tokens and keeps what it keeps), and ``TextStream.follow`` turns each
``commits.Commit`` into the ``StreamChunk``s of the text it made safe to show, with the citation of
the copy that text belongs to. It learns new passages from the commits alone. Data flows one
way: nothing calls back into the loop, and a consumer that stops iterating closes it.
``TextStream.replay`` rebuilds the same stream from recorded commits, with no loop at all.
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, Sequence, TypeVar

from nest_integrations.core.citations import (
    adjacent_groups,
    build_citations,
    answer_document,
    clause_rule,
    continues_run,
    document_of,
    merge_adjacent,
    run_pieces,
    snap_to_words,
    word_edge,
)
from nest_integrations.core.guards import (
    GuardScan,
    citation_words,
    open_guarded_start,
    open_junk_start,
    open_loop_start,
    open_repeat_start,
)
from nest_integrations.types import Citation, Passage, StreamChunk

if TYPE_CHECKING:
    from nest_integrations.attribution import SentenceStream
    from nest_integrations.core.evidence import EvidenceSpan
    from nest_integrations.decoding.commits import Commit

R = TypeVar("R")

_ANCHOR_EVERY = 8  # tokens between anchor moves (a decode covers at most about this many)
#: Text a stream may go on with that could put a citation's end inside a word or a number.
_PROBES = ("a", "0")


class TokenEnds(list):
    """``OutputText.ends``: a list of ints that also carries the output ``text`` it indexes, so
    ``core.citations`` can make citations exact against it."""

    text: str = ""


class OutputText:
    """Committed tokens, their per-token sources, and the text they decode to.

    Invariants: ``text == detokenize(ids)`` (until a stop string cuts it; with ``answer``,
    ``detokenize(ids).lstrip()``: a chat answer never opens with the space of a word-initial
    token, as a copy from mid-passage does), ``ends`` as in the module docstring (``ends.text
    is text``). After a stop string, ``text`` is cut at the end
    of the last whole token before it, so the text holds nothing that is absent from ``ids``.

    With ``repeat_guard`` (``core.guards``), a sentence or line that repeats an earlier one is
    cut the same way (``repeated`` and ``stopped`` are then set), and ``delta`` holds back an
    unfinished sentence while it may still become a repeat.
    """

    def __init__(
        self,
        detokenize: Callable[[Sequence[int]], str],
        stop: Sequence[str] = (),
        repeat_guard: bool = False,
        answer: bool = False,
    ):
        #: an answer to a chat question never opens with whitespace (the space of the
        #: word-initial token a copy from mid-passage starts with); a completion keeps it
        self._raw, self._answer = detokenize, answer
        self._detok = (lambda ids: detokenize(ids).lstrip()) if answer else detokenize
        self.stop = [s for s in stop if s]
        self.repeat_guard = repeat_guard
        self._scan = GuardScan()  # the guards' reading of the text, incremental (core.guards)
        self.repeated = False
        self._loop_checked = 0  # phrases ending at or before this word hold no loop
        self.ids: list[int] = []
        self.sources: list = []
        self.copied: list[bool] = []
        self.ends = TokenEnds()
        self._text = ""
        self.emitted = 0  # chars already streamed
        self.stopped = False
        self._a = 0  # anchor: text[:_a_chars] == detokenize(ids[:_a])
        self._a_chars = 0
        self._searched = 0  # no stop string starts before this char
        self._settled = 0  # ends[:_settled] are final (the text after them was complete)

    @property
    def text(self) -> str:
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text = value
        self.ends.text = value

    def __len__(self) -> int:
        return len(self.ids)

    def _text_upto(self, j: int) -> str:
        """``detokenize(ids[:j])`` for ``j >= anchor``, decoding only from the anchor."""
        a = self._a
        if a == 0:
            return self._detok(self.ids[:j])
        left = self._raw(self.ids[a - 1 : a])
        tail = self._raw(self.ids[a - 1 : j])
        if tail.startswith(left):
            head, rest = self.text[: self._a_chars], tail[len(left) :]
            return head + rest if head or not self._answer else rest.lstrip()
        return self._detok(self.ids[:j])  # the left context did not decode on its own

    def append(self, ids: Sequence[int], sources: Sequence, copied: bool) -> None:
        """Commit tokens (the caller has cut them at EOS and the budget)."""
        for tok, src in zip(ids, sources):
            self.ids.append(tok)
            self.sources.append(src)
            self.copied.append(copied and src is not None)
            self.ends.append(0)
        text = self.text = self._text_upto(len(self.ids))
        prev = self.ends[self._settled - 1] if self._settled else 0
        n = len(self.ids)
        for k in range(self._settled, n):  # the unsettled tail and the new tokens
            upto = text if k + 1 == n else self._text_upto(k + 1)  # the last: text itself
            prev = self.ends[k] = max(prev, _common_prefix(upto, text, self._a_chars))
        if not text.endswith("\ufffd"):
            self._settled = len(self.ids)
            # the anchor's left context must decode to text of its own: a token that decodes
            # to nothing (a skipped special token) would leave the next one first in its
            # decode, and a decoder treats a first token otherwise (WordPiece: no space, no
            # "##" merge), so such a token does not take the anchor
            if len(self.ids) - self._a >= _ANCHOR_EVERY and _whole(self._raw(self.ids[-1:])):
                self._a, self._a_chars = len(self.ids), len(text)
        self._apply_stop_strings()
        if self.repeat_guard and not self.stopped:
            text, scan = self.text, self._scan
            scan.update(text)
            loop = scan.loop_start(first_end=self._loop_checked + 1)
            self._loop_checked = scan.complete_words()
            self._cut_repeat(_first(scan.repeat_start(text), loop, scan.junk_start()))

    def finish(self) -> bool:
        """The text has ended: with ``repeat_guard``, cut a last sentence that repeats an
        earlier one (or a loop; then True), or an unfinished one held back as a possible
        repeat (False: the text ended for another reason)."""
        if not self.repeat_guard or self.stopped:
            return False
        text, scan = self.text, self._scan
        scan.update(text)
        cut = _first(scan.repeat_start(text, final=True),
                     scan.loop_start(final=True, first_end=self._loop_checked + 1),
                     scan.junk_start())
        if cut is None:  # an unfinished sentence held back as a possible repeat: drop it, but
            held = scan.open_repeat_start(text)  # the text ended for its own reason (the budget)
            if held is not None and not self._copied_from(held):
                self._cut(held)
            return False
        return self._cut_repeat(cut)

    def _cut_repeat(self, cut: int | None) -> bool:
        """Cut a repeat or loop starting at char ``cut`` (not where the source repeats itself:
        ``_copied_from``); whether it cut."""
        if cut is None or self._copied_from(cut):
            return False
        self._cut(cut)
        self.repeated = True
        return True

    def _copied_from(self, cut: int) -> bool:
        """Whether all the text from char ``cut`` on is copied from the corpus: a line or a
        loop the source itself repeats (a code block said twice) is no degenerate output, so
        the repeat guard does not cut it."""
        k = bisect.bisect_right(self.ends, cut)  # the first token that ends after ``cut``
        return k < len(self.ids) and all(self.copied[k:])

    def _apply_stop_strings(self) -> None:
        if not self.stop:
            return
        longest = max(len(s) for s in self.stop)
        lo = max(0, self._searched - longest + 1)
        hits = [i for i in (self.text.find(s, lo) for s in self.stop) if i >= 0]
        self._searched = len(self.text)
        if not hits:
            return
        self._cut(min(hits))

    def _cut(self, cut: int) -> None:
        """Keep the whole tokens that end at or before char ``cut``; the text has stopped."""
        keep = sum(1 for e in self.ends if e <= cut)
        del self.ids[keep:], self.sources[keep:], self.copied[keep:], self.ends[keep:]
        self.text = self.text[: self.ends[-1]] if keep else ""
        self._a, self._a_chars = 0, 0
        self._settled = len(self.ids)
        self.stopped = True

    def delta(self, final: bool) -> str:
        """The text not yet streamed that is safe to stream now (all of it when ``final``)."""
        safe = len(self.text)
        if not final:
            if self.text.endswith("\ufffd"):
                return ""  # hold back an incomplete multi-byte character
            overlap = stop_prefix_overlap(self.text, self.stop)  # it may become a stop string
            if self.repeat_guard:  # text that a guard may still cut (core.guards)
                text, scan = self.text, self._scan
                if self.stopped:  # after a cut the scan read a longer text: the functions
                    held = _first(open_repeat_start(text), open_loop_start(text),
                                  open_junk_start(text), open_guarded_start(text))
                else:
                    scan.update(text)  # nothing to read when append read this text
                    held = _first(scan.open_repeat_start(text), scan.open_loop_start(),
                                  scan.open_junk_start(), open_guarded_start(text))
                if held is not None:
                    overlap = max(overlap, len(self.text) - held)
            if overlap:  # a stop cuts whole tokens: hold back the token the overlap starts in
                safe -= overlap
                i = bisect.bisect_right(self.ends, safe)
                safe = self.ends[i - 1] if i else 0
        if safe <= self.emitted:
            return ""
        out = self.text[self.emitted : safe]
        self.emitted = safe
        return out


def _first(*cuts: int | None) -> int | None:
    """The earliest of some char positions (None when all are None)."""
    found = [c for c in cuts if c is not None]
    return min(found) if found else None


def _whole(piece: str) -> bool:
    """Whether a token's own decode is text an anchor can follow: not empty (a skipped special
    token) and no part of a character (a byte token)."""
    return bool(piece) and "\ufffd" not in piece


def _common_prefix(a: str, b: str, lo: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, given that they agree on ``[:lo]``."""
    lo = min(lo, len(a), len(b))
    if b.startswith(a[lo:], lo):
        return len(a)
    n = min(len(a), len(b))
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


def stop_prefix_overlap(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class TextStream:
    """The stream of one decoding: its commits in, ``StreamChunk``s and citations out; and the
    loop's stopping criterion (``update``, ``finish``, ``stopped``, ``reason``).

    Args:
        detokenize, stop, repeat_guard: this stream's ``OutputText`` (stop strings, and
            ``Guards.stop_on_repeat``: the output guards).
        passages, offsets: the generation's passages and their token char offsets (copied:
            passages the commits register are added to the copies).
        kind: the citations' kind (``"copy"`` for NEST's memory, else ``"verbatim"``).
        min_tokens, min_words: a citation is shown from this many tokens and words
            (``NestConfig.min_citation_tokens``, ``Guards.min_citation_words``).
        live: a ``SentenceStream`` (``NestConfig.attribute``): the support citations of the
            sentences each delta completes (``SentenceStream.feed``, given this stream's
            citations so far).
        evidence: the answer's evidence (``DrafterContext.evidence``): its document is the
            answer's for the clause rule (``core.citations``); without it, the most cited one.

    Streamed and final citations agree: both are the runs' pieces through the clause rule and
    ``merge_adjacent``. A delta reports a citation only once nothing can change its verdict or
    its start: while the text goes on, a piece on another document than the evidence's (on any
    document, without evidence: the most cited one can still change) waits until it is known to
    cover a whole clause, and the pieces it would merge with wait with it. What waits comes with
    the final result (``output.CitationStream`` reports it there).
    """

    def __init__(
        self, detokenize: Callable[[Sequence[int]], str], passages: Sequence[Passage],
        offsets: Sequence[Any], *, kind: str, min_tokens: int, min_words: int,
        stop: Sequence[str] = (), repeat_guard: bool = False, live: SentenceStream | None = None,
        evidence: EvidenceSpan | None = None, answer: bool = False,
    ) -> None:
        self.out = OutputText(detokenize, stop, repeat_guard=repeat_guard, answer=answer)
        self.passages, self.offsets, self.kind = list(passages), list(offsets), kind
        self.min_tokens, self.min_words, self.live = min_tokens, min_words, live
        ev = next((p for p in passages if evidence and p.id == evidence.passage_id), None)
        self.evidence_doc = (ev.doc_id if ev.doc_id is not None else ev.id) if ev else None
        self._runs: dict[tuple, list[Citation]] = {}  # run_pieces' cache
        self._sent: dict[tuple, tuple[int, str]] = {}  # each reported citation's last form
        #: ``time.perf_counter()`` at the first commit that held a token (None before it): the
        #: engine's time to first token (``NestStats.time_to_first_token``)
        self.first_token_at: float | None = None

    # ------------------------------------------------ the loop's stopping criterion
    @property
    def stopped(self) -> bool:
        """A stop string or an output guard has cut the text."""
        return self.out.stopped

    @property
    def reason(self) -> str:
        """``"repeat"`` when an output guard cut the text, ``"stop"`` for a stop string (or an
        unfinished sentence held back at the end), else ``""``."""
        return "repeat" if self.out.repeated else "stop" if self.out.stopped else ""

    def update(self, ids: Sequence[int], sources: Sequence[Any], copied: bool) -> int:
        """Append one commit's tokens to the text: how many output tokens it keeps."""
        self.out.append(ids, sources, copied)
        return len(self.out)

    def finish(self) -> int:
        """The text has ended: the guards may cut its end (``OutputText.finish``); how many
        output tokens it keeps."""
        self.out.finish()
        return len(self.out)

    def replay(self, commits: Iterable[Commit]) -> Iterator[StreamChunk]:
        """The chunks of recorded commits, with no loop: each commit's tokens are taken as the
        loop would hand them over (``update``; ``finish`` at the final one), checked against
        what the loop kept, and then streamed (``chunks``)."""
        for commit in commits:
            if commit.final:
                self.finish()
            elif commit.ids:
                self.update(commit.ids, commit.sources, commit.copied)
            if len(self.out) != commit.kept:
                raise ValueError(f"the commit keeps {commit.kept} tokens but this stream kept "
                                 f"{len(self.out)}: replay with the generation's stop strings "
                                 "and guards")
            yield from self.chunks(commit)

    # ------------------------------------------------ chunks and citations
    def shows(self, citation: Citation) -> bool:
        """Whether a citation is reported: at least ``min_tokens`` tokens and ``min_words``
        words; shorter copies stay plain text."""
        return (citation.n_tokens >= self.min_tokens
                and citation_words(citation.text) >= self.min_words)

    def follow(self, commits: Generator[Commit, None, R]) -> Generator[StreamChunk, None, R]:
        """The chunks of each commit; returns what ``commits`` returns (closed with this)."""
        try:
            while True:
                try:
                    commit = next(commits)
                except StopIteration as end:
                    return end.value
                if commit.ids and self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                yield from self.chunks(commit)
        finally:
            commits.close()

    def chunks(self, commit: Commit) -> Iterator[StreamChunk]:
        """The text that is safe to show after ``commit``, with the citation of the last cited
        run that the delta touches (also when the delta ends in uncited text: a run that grew
        while its text was held back is reported with its full extent) once its verdict is
        known (see the class docstring), and, with ``live``, the support citations of the
        sentences this delta completes."""
        self._learn(commit.new_passages)
        out, live = self.out, self.live
        start = out.emitted
        delta = out.delta(final=commit.done)
        if not delta:
            return
        found = (live.feed(out.text[: out.emitted], cited=self.citations)
                 if live is not None else None)
        support = tuple(found.citations) if found else ()
        unsupported = tuple(found.unsupported) if found else ()
        yield StreamChunk(text=delta, citation=self._delta_citation(start, commit.done),
                          token_ids=commit.ids, support=support, unsupported=unsupported)

    def _learn(self, updates: Sequence[tuple[int, Passage, Any]]) -> None:
        """Take the passages a commit registers (``commits.Commit.new_passages``)."""
        for i, passage, offsets in updates:
            if i == len(self.passages):
                self.passages.append(passage)
                self.offsets.append(offsets)
            else:
                self.offsets[i] = offsets

    def _delta_citation(self, start: int, done: bool) -> Citation | None:
        """The citation a delta that starts at char ``start`` reports: the last citation of the
        text so far whose verdict (the clause rule) and start nothing can change any more (see
        the class docstring) that the delta touches (a whitespace delta keeps its run open) or
        that was not reported in this form yet (the delta settled it)."""
        out = self.out
        j = min(bisect.bisect_left(out.ends, out.emitted), len(out.ids) - 1)
        while j >= 0 and out.sources[j] is None:  # the last cited token up to the delta's end
            j -= 1
        if j < 0:
            return None
        text, src, pieces = out.text, out.sources, self._pieces(j + 1)
        if done:  # the text is whole: the final verdicts
            verdicts = clause_rule(pieces, text,
                                   answer_document(self._pieces(len(src)), self.evidence_doc))
        else:
            verdicts = clause_rule(pieces, text, self.evidence_doc, open_end=True)
            if pieces and self._end_may_move(pieces[-1], j):
                verdicts[-1] = document_of(pieces[-1]) == self.evidence_doc or None
        held = [(c, v) for c, v in zip(pieces, verdicts) if v is not False]
        groups = adjacent_groups([c for c, _ in held], self.passages, text)
        for group in reversed(groups):
            if not all(held[k][1] for k in group):
                continue  # its verdict, or that of a piece it merges with, is not known yet
            (cite,) = merge_adjacent([held[k][0] for k in group], self.passages, text)
            if not self.shows(cite) or not (done or self._survives(cite, text)):
                continue
            key, form = (cite.passage_id, cite.start, cite.kind), (cite.end, cite.text)
            if cite.end >= start or self._sent.get(key) != form:
                self._sent[key] = form
                return cite
        return None

    def _end_may_move(self, piece: Citation, j: int) -> bool:
        """Whether the text to come can still move the end of ``piece``, the last piece of the
        output's first ``j + 1`` tokens: the next character could put it inside a word or a
        number (it then moves back, ``snap_to_words``), or its run goes on (or may: token
        ``j`` is the last one)."""
        out, src = self.out, self.out.sources
        if any(not word_edge(out.text + probe, piece.end) for probe in _PROBES):
            return True
        if j + 1 < len(src) and not continues_run(src[j], src[j + 1]):
            return False
        i = j
        while i > 0 and continues_run(src[i - 1], src[i]):
            i -= 1
        return piece.end > (out.ends[i - 1] if i else 0)  # the piece is that run's

    def _survives(self, cite: Citation, text: str) -> bool:
        """Whether ``cite`` is still shown if the text to come puts its end inside a word or a
        number (its end then moves back): only then is it streamed, so that a streamed
        citation is never missing from the final ones."""
        passage = next(p for p in self.passages if p.id == cite.passage_id)
        for probe in _PROBES:
            longer = text + probe
            if word_edge(longer, cite.end):
                continue
            left = snap_to_words(longer, passage.text, cite.start, cite.end,
                                 cite.passage_start, cite.passage_end)
            if left is None or citation_words(longer[left[0] : left[1]]) < self.min_words:
                return False
        return True

    def citations(self) -> list[Citation]:
        """The citations of the whole output that are shown: the runs' pieces through the
        clause rule (``core.citations``), merged, of at least ``min_tokens`` and ``min_words``."""
        out = self.out
        cites = build_citations(out.sources, out.ends, self.passages, self.offsets,
                                kind=self.kind, text=out.text, clauses=True,
                                evidence_doc=self.evidence_doc, cache=self._runs)
        return [c for c in cites if self.shows(c)]

    def _pieces(self, upto: int) -> list[Citation]:
        """``core.citations.run_pieces`` of the first ``upto`` output tokens."""
        out = self.out
        return run_pieces(out.sources[:upto], out.ends, self.passages, self.offsets,
                          kind=self.kind, text=out.text, cache=self._runs)

