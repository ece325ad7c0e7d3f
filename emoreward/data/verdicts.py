"""The tie vocabulary: what any judge (reward model or zero-shot MLLM) says about a pair (`Verdict`, `Judgement`)
and the one tie rule that turns a reward difference into a verdict (`verdict_from_difference`). It lives on the
lowest floor so that models (precision checks), evaluation, ranking and zero_shot all reach it without climbing."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal


class Verdict(str, Enum):
    """A judge's answer for one pair. `INVALID` (unparseable answer, failed call) is never turned into a class
    silently; metrics say how they count it (see `metrics.recognition`)."""

    FIRST = "1"
    SECOND = "2"
    TIE = "tie"
    INVALID = "invalid"

    def swapped(self) -> Verdict:
        """The same verdict seen from the swapped pair order."""
        return {Verdict.FIRST: Verdict.SECOND, Verdict.SECOND: Verdict.FIRST}.get(self, self)

    @classmethod
    def from_label(cls, label: str | None) -> Verdict:
        """`"1"`, `"2"`, `"tie"` -> verdict; None -> INVALID."""
        return cls(label) if label is not None else cls.INVALID


Order = Literal["normal", "swapped"]


@dataclass
class Judgement:
    """One verdict in the ORIGINAL pair order (swapped runs are mapped back before they are stored).

    Attributes:
        sample_id: the pair's sample id.
        verdict: the verdict, original order.
        order: the order the judge saw the pair in.
        run: index of the repeated run (0-based).
        reward_1, reward_2: rewards of descriptions 1 and 2 (reward-model judges).
        p_first, p_second, p_tie: verdict probabilities, original order (logit-based judges).
        raw: the judge's raw output text, if any.
        steps: intermediate outputs (reference descriptions, reasoning) by step name.
    """

    sample_id: str
    verdict: Verdict
    order: Order = "normal"
    run: int = 0
    reward_1: float | None = None
    reward_2: float | None = None
    p_first: float | None = None
    p_second: float | None = None
    p_tie: float | None = None
    raw: str | None = None
    steps: dict[str, str] = field(default_factory=dict)


def verdict_from_difference(difference: float, tie_threshold: float = 0.0) -> Verdict:
    """The tie rule: TIE when |r1 - r2| < `tie_threshold` (or the rewards are equal), else FIRST if r1 > r2 and
    SECOND if r1 < r2. NaN (a reward that could not be computed) gives INVALID.

    Args:
        difference: r1 - r2, reward units.
        tie_threshold: >= 0, reward units (a model's calibrated `settings.tie_threshold`; 0 = ties only on equality).
    """
    if difference != difference:  # NaN
        return Verdict.INVALID
    if abs(difference) < tie_threshold or difference == 0:
        return Verdict.TIE
    return Verdict.FIRST if difference > 0 else Verdict.SECOND


__all__ = ["Judgement", "Order", "Verdict", "verdict_from_difference"]
