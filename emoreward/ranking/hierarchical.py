"""EMER-Ranker's hierarchical comparison (section 5): rank within groups, then compare the group winners
(`rank_hierarchical`, `HierarchicalResult`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emoreward.ranking.bradley_terry import (
    SCORE_TOLERANCE,
    BTResult,
    FitFn,
    RecordsFn,
    fit_binarized_bradley_terry,
)
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.records import PairwiseRecord


@dataclass(frozen=True)
class HierarchicalResult:
    """Outcome of :func:`rank_hierarchical`.

    Attributes:
        groups (`list[list[str]]`): the groups as given.
        group_results (`list[BTResult]`): the within-group fit of each group (``None`` for a one-item group).
        final (`BTResult`): the fit over the group winners.
        winner (`str`): the best item overall (`_top` of the final fit).
        n_comparisons (`int`): records used in all stages together.
        warnings (`list[str]`): a stage whose top two scores are equal (its pick between them is by content order,
            not by the judgements), one sentence each; a report lists them with its other warnings.
        group_winners (`list[str]`): the winner of each group, in group order (`_top` of its fit).
    """

    groups: list[list[str]]
    group_results: list[BTResult | None]
    final: BTResult
    winner: str
    n_comparisons: int
    warnings: list[str] = field(default_factory=list)
    group_winners: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every stage."""
        return {
            "groups": [list(g) for g in self.groups],
            "group_winners": self.group_winners,
            "group_results": [None if r is None else r.to_dict() for r in self.group_results],
            "final": self.final.to_dict(),
            "winner": self.winner,
            "n_comparisons": self.n_comparisons,
            "warnings": list(self.warnings),
        }


def rank_hierarchical(
    records: Iterable[PairwiseRecord] | RecordsFn,
    groups: Sequence[Sequence[str]],
    fit_fn: FitFn = fit_binarized_bradley_terry,
    order: Sequence[str] | None = None,
) -> HierarchicalResult:
    """EMER-Ranker's hierarchical comparison (EMER-Ranker, section 5).

    Models are compared only within their group, then the group winners with each other (round-robin, ranked with
    ``fit_fn``): with two groups ``2 C(M/2, 2) N + N`` comparisons instead of ``C(M, 2) N`` (the paper's ``C(M/2,
    2) N + N`` counts one group). Only the overall best is identified; scores are not comparable across stages.

    Args:
        records (`Iterable[PairwiseRecord]` or `Callable[[list[tuple[str, str]]], Iterable[PairwiseRecord]]`):
            all judgements (only the pairs of each stage are used), or a function returning judgements for the
            requested item pairs, called once per group and once for the final.
        groups (`Sequence[Sequence[str]]`): at least two disjoint, non-empty groups of item names.
        fit_fn (`Callable[[PairwiseCounts], BTResult]`): the fit of every stage (default: binarized W).
        order (`Sequence[str]`, optional): every item, in the order that breaks a tie at the top of a stage (a
            description table's `models`, in the order of their content, so renaming the models changes no pick);
            default: the items' names.

    Returns:
        `HierarchicalResult` with per-group fits, the final fit over the group winners and the overall winner.

    Raises:
        ValueError: if fewer than two groups are given, a group is empty, an item is in two groups, a function
            returns a record for a pair it was not asked for, or a stage has no comparisons (raised by the fit).
    """
    groups = [list(g) for g in groups]
    if len(groups) < 2:
        raise ValueError(f"rank_hierarchical needs at least two groups, got {len(groups)}")
    if any(len(g) == 0 for g in groups):
        raise ValueError("rank_hierarchical: every group must contain at least one item")
    flat = [name for g in groups for name in g]
    if len(set(flat)) != len(flat):
        raise ValueError(f"rank_hierarchical: groups must be disjoint, got {groups}")
    pool = None if callable(records) else list(records)
    n_used = 0
    rank = {item: k for k, item in enumerate(order if order is not None else sorted(flat))}

    def stage(stage_items: list[str]) -> BTResult:
        nonlocal n_used
        wanted = list(itertools.combinations(stage_items, 2))
        allowed = set(wanted) | {(b, a) for a, b in wanted}
        if pool is None:
            got = list(records(wanted))  # type: ignore[operator]
            bad = [(r.item_a, r.item_b) for r in got if (r.item_a, r.item_b) not in allowed]
            if bad:
                raise ValueError(f"records function returned pairs it was not asked for: {bad[:5]}")
        else:
            got = [r for r in pool if (r.item_a, r.item_b) in allowed]
        n_used += len(got)
        return fit_fn(PairwiseCounts.from_records(got, stage_items))

    group_results: list[BTResult | None] = []
    winners, notes = [], []
    for g in groups:
        res = stage(g) if len(g) > 1 else None
        group_results.append(res)
        winners.append(g[0] if res is None else _top(res, f"group {g}", notes, rank))
    final = stage(winners)
    winner = _top(final, "final stage", notes, rank)
    return HierarchicalResult(groups, group_results, final, winner, n_used, notes, winners)


def _top(result: BTResult, where: str, notes: list[str], rank: dict[str, int]) -> str:
    """Best item; between items whose scores are equal at the top, the first in `rank` (the content order), with a
    sentence in ``notes`` (the judgements do not decide between them)."""
    best = float(np.max(result.scores))
    tied = [m for m, v in zip(result.items, result.scores) if best - v < SCORE_TOLERANCE]
    if len(tied) == 1:
        return tied[0]
    tied.sort(key=lambda m: (rank.get(m, len(rank)), m))
    notes.append(
        f"hierarchical scheme, {where}: {', '.join(map(repr, tied))} have equal scores at the top; {tied[0]!r} was "
        "picked by the order of the models' content (the judgements do not decide between them)."
    )
    return tied[0]
