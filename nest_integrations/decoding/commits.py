"""What leaves the decode loop (``loop.py``): its commits, its output, and the stopping
criterion it is given.

The loop yields an immutable ``Commit`` per commit and returns ``Decoded``: data, the only
channel out while it runs. ``Committed`` is the loop's own output (ids, sources, copied flags)
and its own copy of the generation's passages, which drafters extend through their drafts
(``Draft.new_passages``); the commits report what was added. Stop strings and the output guards
are a ``StoppingCriteria`` (as HF's), implemented on the text side (``text_stream.TextStream``).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any, Generator, Protocol, Sequence, TypeVar

from nest_integrations.drafters.base import PassageUpdate, Source
from nest_integrations.types import NestStats, Passage

R = TypeVar("R")


@dataclass(frozen=True)
class StatsDelta:
    """The loop's counters over a stretch of decoding: a commit's since the one before
    (``Commit.stats``), or a whole run's (``Decoded.stats``). Summed over a run's commits they
    are the run's totals."""

    forward_passes: int = 0
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_forwards: int = 0  # a draft model's passes (KNN-SSD), not the target's
    candidates: int = 0  # corpus continuations drafted (DReSD, REST)
    seconds_lm: float = 0.0  # the target's passes
    seconds_draft: float = 0.0  # the drafter's proposals
    seconds_knn: float = 0.0  # the target distribution's kNN mixture

    @classmethod
    def of(cls, stats: NestStats) -> "StatsDelta":
        """The counters of ``stats`` as they stand (a mark to subtract from)."""
        d, t = stats.drafting, stats.timing
        return cls(stats.forward_passes, d.verify_steps, d.drafted_tokens, d.accepted_tokens,
                   d.forwards, d.candidates, t.lm, t.draft, t.knn)

    def __sub__(self, other: "StatsDelta") -> "StatsDelta":
        return StatsDelta(*(a - b for a, b in zip(astuple(self), astuple(other))))

    def __add__(self, other: "StatsDelta") -> "StatsDelta":
        return StatsDelta(*(a + b for a, b in zip(astuple(self), astuple(other))))


@dataclass(frozen=True)
class Commit:
    """One commit of the decode loop: the only thing that leaves it while it runs.

    Attributes:
        ids: the committed token ids (cut at EOS and the budget; the stopping criterion may
            then keep fewer of them, or of earlier ones: ``kept``).
        sources: per id, ``(passage, position)`` or None for the LM's own.
        copied: the ids were accepted from a draft (a plain step's are not).
        kept: how many output tokens the loop holds after this commit.
        done: the text has ended (no more ids come; what was held back may be shown).
        final: the last commit of a run: the stopping criterion has finished the text.
        new_passages: passages registered since the last commit, as
            ``drafters.base.PassageUpdate``s (index, passage, token char offsets): an index
            past the passages held so far adds one, a lower one gives that passage its offsets.
        stats: what the loop counted since the commit before (the passes and drafts that
            produced this one; the first commit's include the prefill).
    """

    ids: tuple[int, ...]
    sources: tuple[Source, ...]
    copied: bool = False
    kept: int = 0
    done: bool = False
    final: bool = False
    new_passages: tuple[PassageUpdate, ...] = ()
    stats: StatsDelta = StatsDelta()


class StoppingCriteria(Protocol):
    """What decides, after each commit, whether the output goes on (as HF's
    ``StoppingCriteria``): stop strings and the output guards, on the text side
    (``text_stream.TextStream``). The loop keeps the first ``kept`` tokens it reports."""

    @property
    def stopped(self) -> bool:
        """The text has stopped (a stop string or an output guard cut it)."""

    @property
    def reason(self) -> str:
        """Why it stopped: ``"repeat"`` (an output guard), ``"stop"``, or ``""``."""

    def update(self, ids: Sequence[int], sources: Sequence[Source], copied: bool) -> int:
        """Take one commit's tokens; returns how many output tokens are kept in all."""

    def finish(self) -> int:
        """The text has ended (a guard may still cut its end); returns the tokens kept."""


@dataclass(frozen=True)
class Decoded:
    """What a finished loop returns: its output ids, their sources and copied flags, NEST's
    mean lambda over the rows it mixed (1.0 when it mixed none), and whether the model
    rejected the evidence quote (then nothing was committed), and the run's counters (the sum
    of its commits' ``stats``)."""

    ids: tuple[int, ...]
    sources: tuple[Source, ...]
    copied: tuple[bool, ...]
    mean_lambda: float
    quote_rejected: bool = False
    stats: StatsDelta = StatsDelta()


class Committed:
    """The loop's committed output: ids, their sources, whether each was copied, and its own
    copy of the generation's passages and offsets (with what was registered since the last
    commit, which the next ``commit`` reports)."""

    def __init__(self, passages: Sequence[Passage], offsets: Sequence[Any],
                 stats: NestStats) -> None:  # fmt: skip
        self._stats = stats  # read only: each commit reports what it counted since the last
        self._start = self._mark = StatsDelta.of(stats)
        self.ids: list[int] = []
        self.sources: list[Source] = []
        self.copied: list[bool] = []
        self.passages, self.offsets = list(passages), list(offsets)
        self._new: list[PassageUpdate] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(
        self, ids: Sequence[int], sources: Sequence[Source], copied: bool, eos: frozenset[int],
        max_tokens: int, stopping: StoppingCriteria | None,
    ) -> tuple[Commit, str]:
        """Commit tokens, cut at EOS, at ``max_tokens`` and where ``stopping`` cuts the text (a
        token is copied when accepted from a draft with a source): the commit, and why the
        output ended (``"stop"`` at EOS, the criterion's reason, ``"length"``) or ``""``."""
        reason, n = "", 0
        for n, tok in enumerate(ids):
            if tok in eos:
                reason = "stop"
                break
            if len(self.ids) + n >= max_tokens:
                break
        else:
            n = len(ids)
        keep_ids, keep_src = ids[:n], sources[:n]
        if keep_ids:
            self.ids += keep_ids
            self.sources += keep_src
            self.copied += [copied and src is not None for src in keep_src]
            if stopping is not None:
                self.keep(stopping.update(keep_ids, keep_src, copied))
        if stopping is not None and stopping.stopped:
            reason = stopping.reason
        if len(self.ids) >= max_tokens and not reason:
            reason = "length"
        return self.commit(bool(reason), keep_ids, keep_src, copied), reason

    def keep(self, n: int) -> None:
        """Keep the first ``n`` tokens (what the stopping criterion kept)."""
        del self.ids[n:], self.sources[n:], self.copied[n:]

    def finish(self, stopping: StoppingCriteria) -> bool:
        """The output has ended: keep what ``stopping.finish`` keeps; whether its guards cut a
        repeat at the end (it had not stopped before)."""
        was_stopped = stopping.stopped
        self.keep(stopping.finish())
        return not was_stopped and stopping.reason == "repeat"

    def register(self, updates: Sequence[PassageUpdate]) -> tuple[tuple, tuple]:
        """Add a draft's passages (``Draft.new_passages``): a new one at the next index; one
        held without offsets gets them. A wrong index is a drafter bug: a ValueError. Returns
        the passages and offsets now held, as tuples (the drafters' read view)."""
        for i, passage, offsets in updates:
            n = len(self.passages)
            if i == n:
                self.passages.append(passage)
                self.offsets.append(offsets)
            elif i < n and self.passages[i].id == passage.id:
                if self.offsets[i] is not None:
                    continue
                self.offsets[i] = offsets
            else:
                raise ValueError(f"a draft registers passage {passage.id!r} at index {i}, but the "
                                 f"generation holds {n} passages: take the index from "
                                 "DecodeState.passage_index")
            self._new.append((i, passage, offsets))
        return tuple(self.passages), tuple(self.offsets)

    def commit(self, done: bool, ids: Sequence[int] = (), sources: Sequence[Source] = (),
               copied: bool = False, final: bool = False) -> Commit:
        """The commit of ``ids`` (already appended), with the passages registered since the
        last one."""
        news, self._new = tuple(self._new), []
        mark, before = StatsDelta.of(self._stats), self._mark
        self._mark = mark
        return Commit(tuple(ids), tuple(sources), copied, len(self.ids), done, final, news,
                      mark - before)

    def decoded(self, mean_lambda: float, quote_rejected: bool) -> Decoded:
        return Decoded(tuple(self.ids), tuple(self.sources), tuple(self.copied), mean_lambda,
                       quote_rejected, self._mark - self._start)


def run_to_end(commits: Generator[Any, None, R]) -> R:
    """Exhaust a generator (a loop's commits, unread) and return what it returns."""
    while True:
        try:
            next(commits)
        except StopIteration as end:
            return end.value
