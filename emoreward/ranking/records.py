"""Pairwise comparison records shared by every ranking method (Bradley-Terry, ties, BPA).

A record says that, on one sample, a judge (human annotator, zero-shot MLLM judge or reward model) compared
the outputs of two items (description-generating models, or descriptions) and preferred ``item_a``,
``item_b`` or neither (tie).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


Outcome = Literal["a", "b", "tie"]
OUTCOMES: tuple[str, ...] = ("a", "b", "tie")


@dataclass(frozen=True)
class PairwiseRecord:
    """One pairwise judgement.

    Attributes:
        item_a (`str`): first compared item (e.g. a model name).
        item_b (`str`): second compared item; must differ from ``item_a``.
        outcome (`Outcome`): ``"a"`` if ``item_a`` was preferred, ``"b"`` if ``item_b`` was, ``"tie"`` otherwise.
        annotator (`str`): who judged (annotator id or judge name); ``"judge"`` when there is only one.
        sample (`str` or `None`): the sample (video) the two outputs describe; used for bootstrap over samples.

    Raises:
        ValueError: if ``outcome`` is not one of ``"a"``, ``"b"``, ``"tie"`` or the two items are equal.
    """

    item_a: str
    item_b: str
    outcome: Outcome
    annotator: str = "judge"
    sample: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"PairwiseRecord.outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.item_a == self.item_b:
            raise ValueError(f"PairwiseRecord compares {self.item_a!r} with itself (sample={self.sample!r})")

    def swapped(self) -> PairwiseRecord:
        """The same judgement with the two items exchanged (``a`` <-> ``b``; ties stay ties)."""
        flip = {"a": "b", "b": "a", "tie": "tie"}
        return PairwiseRecord(self.item_b, self.item_a, flip[self.outcome], self.annotator, self.sample)  # type: ignore[arg-type]
