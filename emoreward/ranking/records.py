"""Pairwise comparison records shared by every ranking method (Bradley-Terry, ties, BPA).

A record says that, on one sample, a judge (human annotator, zero-shot MLLM judge or reward model) compared
the outputs of two items (description-generating models, or descriptions) and preferred ``item_a``,
``item_b`` or neither (tie).

One encoding of pairwise outcomes: a record's outcome is a `Verdict` of `emoreward.data.verdicts` read in
the record's own order, ``Verdict.FIRST`` when ``item_a`` won, ``Verdict.SECOND`` when ``item_b`` won and
``Verdict.TIE``; ``Verdict.INVALID`` is never a record (a caller drops and counts it). Other spellings (the
letters ``"a"`` / ``"b"`` of annotation files, ``"1"`` / ``"2"``) are converted in exactly one place,
:func:`as_outcome`.
"""

from __future__ import annotations

from dataclasses import dataclass

from emoreward.data.verdicts import Verdict


Outcome = Verdict
OUTCOMES: tuple[Verdict, ...] = (Verdict.FIRST, Verdict.SECOND, Verdict.TIE)
"""The three outcomes of a record, in the index order the fits use (0 = item_a won, 1 = item_b won, 2 = tie)."""
OUTCOME_CODE: dict[Verdict, int] = {outcome: code for code, outcome in enumerate(OUTCOMES)}
"""Outcome -> its index in `OUTCOMES` (FIRST 0, SECOND 1, TIE 2)."""

# Spellings accepted on input, each mapped to one Verdict. "a"/"b" are the item letters of the BPA annotation files
# (item_a / item_b); "1"/"2"/"tie" are the Verdict values themselves.
_SPELLINGS: dict[str, Verdict] = {
    "1": Verdict.FIRST,
    "a": Verdict.FIRST,
    "2": Verdict.SECOND,
    "b": Verdict.SECOND,
    "tie": Verdict.TIE,
}
OUTCOME_SPELLINGS: tuple[str, ...] = tuple(_SPELLINGS)


def as_outcome(value: Verdict | str) -> Verdict:
    """The one conversion of a pairwise outcome to its `Verdict` (in the order ``item_a``, ``item_b``).

    Args:
        value (`Verdict` or `str`): a `Verdict` (FIRST, SECOND or TIE) or one of the spellings ``"1"``, ``"a"``
            (``item_a`` won), ``"2"``, ``"b"`` (``item_b`` won), ``"tie"``; strings are matched case-insensitively
            after stripping blanks.

    Returns:
        `Verdict`: ``FIRST``, ``SECOND`` or ``TIE``.

    Raises:
        ValueError: for ``Verdict.INVALID`` (an invalid answer is dropped and counted by the caller, never turned
            into an outcome) or any other value; the message lists the accepted spellings.
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
        item_a (`str`): first compared item (e.g. a model name).
        item_b (`str`): second compared item; must differ from ``item_a``.
        outcome (`Verdict`): ``Verdict.FIRST`` if ``item_a`` was preferred, ``Verdict.SECOND`` if ``item_b`` was,
            ``Verdict.TIE`` otherwise. Any spelling :func:`as_outcome` accepts may be passed; the record stores
            the `Verdict`.
        annotator (`str`): who judged (annotator id or judge name); ``"judge"`` when there is only one.
        sample (`str` or `None`): the sample (video) the two outputs describe; used for bootstrap over samples.

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
