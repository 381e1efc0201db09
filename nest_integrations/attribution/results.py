"""What ``attribute`` returns: one verdict per answer unit, and the whole ``Attribution``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nest_integrations.types import Citation, Passage, UnsupportedSentence

VERDICTS = ("verbatim", "support", "unsupported")


@dataclass
class SentenceAttribution:
    """The verdict on one answer unit (a sentence, or a clause of a long one).

    Attributes:
        text, start, end: the unit, ``answer[start:end] == text``.
        verdict: ``"verbatim"``, ``"support"`` or ``"unsupported"``.
        score: the best support score (1.0 for a verbatim unit; None when nothing was scored).
        passage_id: the passage of the support citation, or of the best candidate.
        coverage: share of the unit's non-space characters covered by verbatim citations.
    """

    text: str
    start: int
    end: int
    verdict: str
    score: float | None = None
    passage_id: str | None = None
    coverage: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Attribution:
    """What ``attribute`` returns.

    Attributes:
        text: the attributed text, as given.
        citations: verbatim and support citations, in text order.
        unsupported: the units no passage supports.
        sentences: one verdict per unit, in text order.
        passages: the passages the text was checked against.
        tokenizer: the tokens of verbatim runs: ``"words"`` or the LM's name.
        scorer: the support scorer used; ``threshold``: its threshold.
        time: seconds spent.
    """

    text: str
    citations: list[Citation] = field(default_factory=list)
    unsupported: list[UnsupportedSentence] = field(default_factory=list)
    sentences: list[SentenceAttribution] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    tokenizer: str = "words"
    scorer: str = "embedding"
    threshold: float = 0.0
    time: float = 0.0

    @property
    def supported_ratio(self) -> float:
        """Share of units with a verbatim or support verdict (1.0 for no units)."""
        if not self.sentences:
            return 1.0
        return sum(s.verdict != "unsupported" for s in self.sentences) / len(self.sentences)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "citations": [c.to_dict() for c in self.citations],
            "unsupported": [u.to_dict() for u in self.unsupported],
            "sentences": [s.to_dict() for s in self.sentences],
            "passages": [dataclasses.asdict(p) for p in self.passages],
            "tokenizer": self.tokenizer,
            "scorer": self.scorer,
            "threshold": self.threshold,
            "supported_ratio": self.supported_ratio,
            "time": self.time,
        }
