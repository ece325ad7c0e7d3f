"""Win / loss / tie count matrices over compared items, and the comparison-graph connectivity check.

``wins[i, j]``: how often ``i`` was preferred to ``j``; ``ties[i, j] == ties[j, i]``: how often they tied
(EMER-Ranker section 4.4, figure 11(a); EmoPrefer appendix F eq. 3). :meth:`PairwiseCounts.binarized` gives
EMER-Ranker's matrix W (section 2, eq. 1). See docs/ranking.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from emoreward.ranking.records import OUTCOME_CODE, PairwiseRecord


EqualCounts = Literal["half", "drop"]
EQUAL_COUNTS: tuple[str, ...] = ("half", "drop")
OnDisconnected = Literal["error", "warn"]
ON_DISCONNECTED: tuple[str, ...] = ("error", "warn")


@dataclass(frozen=True)
class PairwiseCounts:
    """Pairwise win and tie counts over a fixed list of items.

    Attributes:
        items (`list[str]`): the M compared items; row/column ``i`` of every matrix is ``items[i]``.
        wins (`np.ndarray` of shape `(M, M)`, float): ``wins[i, j]`` = number of comparisons ``i`` won against
            ``j`` (weighted: a binarized matrix holds 0, 0.5 or 1). The diagonal is 0.
        ties (`np.ndarray` of shape `(M, M)`, float, symmetric): ``ties[i, j]`` = number of ties between ``i`` and
            ``j``, stored in both ``[i, j]`` and ``[j, i]``; counted once per comparison.

    Raises:
        ValueError: if shapes disagree with ``items``, items repeat, counts are negative or not finite, ``ties``
            is not symmetric or a diagonal entry is non-zero.
    """

    items: list[str]
    wins: np.ndarray
    ties: np.ndarray

    def __post_init__(self) -> None:
        m = len(self.items)
        if len(set(self.items)) != m:
            raise ValueError(f"PairwiseCounts.items must be unique, got {self.items}")
        wins = np.asarray(self.wins, dtype=float)
        ties = np.asarray(self.ties, dtype=float)
        for name, mat in (("wins", wins), ("ties", ties)):
            if mat.shape != (m, m):
                raise ValueError(f"PairwiseCounts.{name} must have shape ({m}, {m}), got {mat.shape}")
            if not np.all(np.isfinite(mat)) or np.any(mat < 0):
                raise ValueError(f"PairwiseCounts.{name} must hold finite non-negative counts")
            if np.any(np.diag(mat) != 0):
                raise ValueError(f"PairwiseCounts.{name} must have a zero diagonal (no self-comparisons)")
        if not np.array_equal(ties, ties.T):
            raise ValueError("PairwiseCounts.ties must be symmetric (ties[i, j] == ties[j, i])")
        object.__setattr__(self, "items", list(self.items))
        object.__setattr__(self, "wins", wins)
        object.__setattr__(self, "ties", ties)

    @classmethod
    def from_records(cls, records: Iterable[PairwiseRecord], items: Sequence[str] | None = None) -> PairwiseCounts:
        """Count wins and ties of ``records`` (one comparison each) over ``items`` (default: the sorted names in
        the records; may include items never compared). Raises ValueError as :func:`encode_records`."""
        encoded = encode_records(records, items)
        return cls.from_encoded(encoded)

    @classmethod
    def from_encoded(cls, encoded: EncodedRecords) -> PairwiseCounts:
        """Counts from records already encoded by :func:`encode_records` (one ``bincount`` per matrix)."""
        m = len(encoded.items)
        is_tie = encoded.outcome == 2
        wins = np.bincount(encoded.winner_loser_cells()[~is_tie], minlength=m * m).reshape(m, m).astype(float)
        ties = np.bincount(encoded.a[is_tie] * m + encoded.b[is_tie], minlength=m * m).reshape(m, m).astype(float)
        return cls(encoded.items, wins, ties + ties.T)

    @property
    def n_items(self) -> int:
        """Number of items M."""
        return len(self.items)

    @property
    def n_comparisons(self) -> float:
        """Total number of comparisons: all wins plus every tie counted once (a float for weighted counts)."""
        return float(self.wins.sum() + np.triu(self.ties, 1).sum())

    @property
    def totals(self) -> np.ndarray:
        """Comparisons per pair, `np.ndarray` of shape `(M, M)`, symmetric: ``wins + wins.T + ties``."""
        return self.wins + self.wins.T + self.ties

    def binarized(self, equal: EqualCounts = "half") -> PairwiseCounts:
        """EMER-Ranker's binarized preference matrix W (EMER-Ranker, section 2, eq. 1).

        ``W[i, j] = 1``, ``W[j, i] = 0`` for every compared pair with ``wins[i, j] > wins[j, i]`` (ties count for
        neither side): one comparison per compared pair (eq. 3-4); pairs never compared stay empty. Equal win
        counts, on which the paper is silent: ``equal="half"`` gives each side 0.5 (the chess draw, the pair stays
        in the graph), ``"drop"`` leaves the pair out.

        Returns:
            `PairwiseCounts` with ``wins`` in {0, 0.5, 1} and ``ties`` all zero.

        Raises:
            ValueError: if ``equal`` is not one of ``"half"``, ``"drop"``.
        """
        if equal not in EQUAL_COUNTS:
            raise ValueError(f"equal must be one of {EQUAL_COUNTS}, got {equal!r}")
        compared = self.totals > 0
        w = np.zeros_like(self.wins)
        w[compared & (self.wins > self.wins.T)] = 1.0
        if equal == "half":
            w[compared & (self.wins == self.wins.T)] = 0.5
        np.fill_diagonal(w, 0.0)
        return PairwiseCounts(self.items, w, np.zeros_like(self.ties))

    def subset(self, items: Sequence[str]) -> PairwiseCounts:
        """The counts restricted to ``items`` (in that order). Raises ValueError on an unknown item."""
        missing = [name for name in items if name not in self.items]
        if missing:
            raise ValueError(f"unknown items {missing}; available: {self.items}")
        idx = [self.items.index(name) for name in items]
        return PairwiseCounts(list(items), self.wins[np.ix_(idx, idx)], self.ties[np.ix_(idx, idx)])


@dataclass(frozen=True)
class EncodedRecords:
    """Pairwise records as integer arrays over a fixed item list (see :func:`encode_records`).

    Attributes:
        items (`list[str]`): the item order; ``a``, ``b`` index into it.
        a, b (`np.ndarray` of shape `(N,)`, int64): indices of ``item_a`` and ``item_b`` of every record.
        outcome (`np.ndarray` of shape `(N,)`, int8): 0 = ``item_a`` won (``Verdict.FIRST``), 1 = ``item_b`` won
            (``Verdict.SECOND``), 2 = tie.
    """

    items: list[str]
    a: np.ndarray
    b: np.ndarray
    outcome: np.ndarray

    def winner_loser_cells(self) -> np.ndarray:
        """Flat index ``winner * M + loser`` of every record (``a * M + b`` for a tie)."""
        m = len(self.items)
        b_won = self.outcome == 1
        return np.where(b_won, self.b, self.a) * m + np.where(b_won, self.a, self.b)


def encode_records(records: Iterable[PairwiseRecord], items: Sequence[str] | None = None) -> EncodedRecords:
    """Encode records as index arrays: one C-level pass (``map``/``numpy.fromiter``) per field, no Python loop.

    Args:
        records (`Iterable[PairwiseRecord]`): the judgements.
        items (`Sequence[str]`, *optional*): fixed item order (may include items never compared). Default:
            the sorted set of items named by the records.

    Returns:
        `EncodedRecords` in record order.

    Raises:
        ValueError: if a record names an item missing from ``items``, items repeat, or there are no items.
    """
    records = records if isinstance(records, list) else list(records)
    names_a = [r.item_a for r in records]
    names_b = [r.item_b for r in records]
    if items is None:
        items = sorted(set(names_a) | set(names_b))
    items = list(items)
    if not items:
        raise ValueError("PairwiseCounts.from_records got no records and no items")
    index = {name: k for k, name in enumerate(items)}
    if len(index) != len(items):
        raise ValueError(f"PairwiseCounts.from_records: items must be unique, got {items}")
    n = len(records)
    try:
        a = np.fromiter(map(index.__getitem__, names_a), dtype=np.int64, count=n)
        b = np.fromiter(map(index.__getitem__, names_b), dtype=np.int64, count=n)
        outcome = np.fromiter(map(OUTCOME_CODE.__getitem__, [r.outcome for r in records]), dtype=np.int8, count=n)
    except KeyError:
        for r in records:  # error path only: name the first offending record
            for key, table in ((r.item_a, index), (r.item_b, index), (r.outcome, OUTCOME_CODE)):
                if key not in table:
                    raise ValueError(
                        f"record compares {r.item_a!r} and {r.item_b!r} but {key!r} is not in items {list(index)}"
                    ) from None
        raise
    return EncodedRecords(items, a, b, outcome)


def connected_item_groups(counts: PairwiseCounts) -> list[list[str]]:
    """Connected components of the comparison graph (`list[list[str]]`, largest first, each in ``counts.items``
    order): items compared at least once, whatever the outcome, are joined."""
    n_comp, labels = connected_components(_adjacency(counts.totals > 0), directed=False)
    groups = [[counts.items[k] for k in np.flatnonzero(labels == c)] for c in range(n_comp)]
    return sorted(groups, key=len, reverse=True)


def _adjacency(compared: np.ndarray) -> csr_matrix:
    """CSR matrix of a dense boolean adjacency, built from its index arrays (cheaper than ``csr_matrix(dense)``)."""
    m = compared.shape[0]
    cols = np.nonzero(compared)[1].astype(np.int32)
    indptr = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(compared.sum(axis=1), out=indptr[1:])
    return csr_matrix((np.ones(cols.size), cols, indptr), shape=(m, m))


def check_connected(counts: PairwiseCounts, on_disconnected: OnDisconnected = "error") -> list[list[str]]:
    """Check that every item is linked to every other through a chain of comparisons: across components only the
    prior decides (Hunter 2004, assumption 1; Ford 1957).

    Returns:
        `list[list[str]]`: the components (:func:`connected_item_groups`); one when connected.

    Raises:
        ValueError: if the graph is disconnected and ``on_disconnected="error"`` (the message names the
            components), or ``on_disconnected`` is not a known choice.
    """
    if on_disconnected not in ON_DISCONNECTED:
        raise ValueError(f"on_disconnected must be one of {ON_DISCONNECTED}, got {on_disconnected!r}")
    groups = connected_item_groups(counts)
    if len(groups) > 1:
        message = (
            f"comparison graph is disconnected: {len(groups)} components {groups}; "
            "scores are not comparable across components"
        )
        if on_disconnected == "error":
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=2)
    return groups
