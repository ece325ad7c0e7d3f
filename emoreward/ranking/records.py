"""Pairwise comparison records shared by every ranking method (Bradley-Terry, ties, BPA).

A record: on one sample, a judge compared two items and preferred ``item_a`` (``Verdict.FIRST``), ``item_b``
(``SECOND``) or neither (``TIE``); ``INVALID`` is never a record. Other spellings are converted in one place,
:func:`as_outcome`. See docs/ranking.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from emoreward.data.verdicts import Verdict


Outcome = Verdict
OUTCOMES: tuple[Verdict, ...] = (Verdict.FIRST, Verdict.SECOND, Verdict.TIE)
"""The three outcomes of a record, in the index order the fits use (0 = item_a won, 1 = item_b won, 2 = tie)."""
OUTCOME_CODE: dict[Verdict, int] = {outcome: code for code, outcome in enumerate(OUTCOMES)}
"""Outcome -> its index in `OUTCOMES` (FIRST 0, SECOND 1, TIE 2)."""

# Spellings accepted on input: "a"/"b" the item letters of annotation files, "1"/"2"/"tie" the Verdict values.
_SPELLINGS: dict[str, Verdict] = {
    "1": Verdict.FIRST,
    "a": Verdict.FIRST,
    "2": Verdict.SECOND,
    "b": Verdict.SECOND,
    "tie": Verdict.TIE,
}
OUTCOME_SPELLINGS: tuple[str, ...] = tuple(_SPELLINGS)


def as_outcome(value: Verdict | str) -> Verdict:
    """The one conversion of a pairwise outcome (a `Verdict`, or ``"1"``/``"a"``, ``"2"``/``"b"``, ``"tie"``, any
    case and blanks) to ``FIRST``, ``SECOND`` or ``TIE`` in the order ``item_a``, ``item_b``.

    Raises:
        ValueError: for ``Verdict.INVALID`` (dropped and counted by the caller) or any other value; the message
            lists the accepted spellings.
    """
    if isinstance(value, Verdict):
        if value is Verdict.INVALID:
            raise ValueError("an INVALID verdict is not a pairwise outcome: drop it and count it")
        return value
    if isinstance(value, str):
        got = _SPELLINGS.get(value.strip().lower())
        if got is not None:
            return got
    raise ValueError(f"pairwise outcome must be a Verdict or one of {list(OUTCOME_SPELLINGS)}, got {value!r}")


@dataclass(frozen=True)
class PairwiseRecord:
    """One pairwise judgement.

    Attributes:
        item_a, item_b (`str`): the compared items (e.g. model names), different.
        outcome (`Verdict`): FIRST, SECOND or TIE (any spelling :func:`as_outcome` accepts may be passed).
        annotator (`str`): who judged (annotator id or judge name); ``"judge"`` when there is only one.
        sample (`str` or `None`): the sample (video) the two outputs describe: the bootstrap unit.

    Raises:
        ValueError: if ``outcome`` is not an outcome (see :func:`as_outcome`) or the two items are equal.
    """

    item_a: str
    item_b: str
    outcome: Verdict
    annotator: str = "judge"
    sample: str | None = None

    def __post_init__(self) -> None:
        if self.outcome.__class__ is not Verdict or self.outcome is Verdict.INVALID:
            object.__setattr__(self, "outcome", as_outcome(self.outcome))
        if self.item_a == self.item_b:
            raise ValueError(f"PairwiseRecord compares {self.item_a!r} with itself (sample={self.sample!r})")

    def swapped(self) -> PairwiseRecord:
        """The same judgement with the two items exchanged (FIRST <-> SECOND; ties stay ties)."""
        return PairwiseRecord(self.item_b, self.item_a, self.outcome.swapped(), self.annotator, self.sample)
