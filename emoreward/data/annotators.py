"""Repeated labels of one pair (one row per annotator): the one aggregation rule (`majority_label`) and the
agreement between annotators (`agreement`: share of labels agreeing with the pair's label, Krippendorff's alpha).
See docs/data.md, "Several pairs per sample, several annotators per pair".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


AGGREGATION = "majority; no single most-voted label -> tie"
"""How a pair's label is made from its annotators' labels (`majority_label`); part of a training run's identity."""


def majority_label(labels: Sequence[str]) -> str:
    """The label of a pair from its annotators' labels (`"1"`, `"2"`, `"tie"`, in the pair's order): the label with
    the most votes; when two or more labels share the most votes, `"tie"` (the annotators did not settle which
    description is better). One label is itself.

    Raises:
        ValueError: no labels."""
    if not labels:
        raise ValueError("no labels to aggregate")
    counts = Counter(labels).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return "tie"
    return counts[0][0]


FLIP = {"1": "2", "2": "1"}  # a pair's labels seen from its other order


def krippendorff_alpha(units: Sequence[Sequence[str]]) -> float | None:
    """Krippendorff's alpha for nominal labels (Krippendorff, *Content Analysis*, 2004, ch. 11.3; coincidence
    matrix): `units` holds each pair's labels (any number per pair; a pair with fewer than 2 is not pairable and is
    left out). Returns alpha in [-1, 1], or None when undefined (fewer than 2 pairable labels, or one category)."""
    coincidence: Counter = Counter()
    for labels in units:
        m = len(labels)
        if m < 2:
            continue
        counts = Counter(labels)
        for c, n_c in counts.items():
            for k, n_k in counts.items():
                coincidence[c, k] += (n_c * (n_c - 1) if c == k else n_c * n_k) / (m - 1)
    n = sum(coincidence.values())
    totals: Counter = Counter()
    for (c, _), value in coincidence.items():
        totals[c] += value
    expected = n * (n - 1) - sum(v * (v - 1) for v in totals.values())
    if n < 2 or expected <= 1e-12:
        return None
    observed = sum(v for (c, k), v in coincidence.items() if c == k)
    return float(((n - 1) * observed - sum(v * (v - 1) for v in totals.values())) / expected)


@dataclass(frozen=True)
class Agreement:
    """Agreement between the annotators of a set of pairs (`agreement`).

    Attributes:
        n_pairs (`int`): pairs; n_repeated (`int`): pairs with two or more labels.
        n_labels (`int`): labels in all (one per pair without an `annotator` column).
        n_annotators (`int`): distinct annotator names (0 without an `annotator` column).
        majority_share (`float` or `None`): percent of the labels of repeated pairs equal to their pair's label
            (`majority_label`); None when no pair is repeated.
        alpha (`float` or `None`): Krippendorff's alpha (nominal) over the repeated pairs; None when undefined.
        rule (`str`): the aggregation rule (`AGGREGATION`).
    """

    n_pairs: int
    n_repeated: int
    n_labels: int
    n_annotators: int
    majority_share: float | None
    alpha: float | None
    rule: str = AGGREGATION

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for a loading summary or a report; empty when no pair has more than one label."""
        if not self.n_repeated:
            return ""
        alpha = "undefined" if self.alpha is None else f"{self.alpha:.3f}"
        return (
            f"{self.n_labels} labels from {self.n_annotators} annotators, {self.n_repeated} of {self.n_pairs} pairs "
            f"labelled more than once ({self.rule}): {self.majority_share:.1f}% of their labels agree with the "
            f"pair's label, Krippendorff's alpha {alpha}"
        )


def agreement(pairs: Sequence[Any]) -> Agreement:
    """The annotators' agreement on `pairs` (`PreferencePair`s: their `label` and `annotations`; a pair without
    annotations counts as one label)."""
    units = [[label for _, label in p.annotations] for p in pairs if len(p.annotations) > 1]
    agreeing = sum(label == p.label for p in pairs if len(p.annotations) > 1 for _, label in p.annotations)
    n_repeated_labels = sum(len(u) for u in units)
    return Agreement(
        n_pairs=len(pairs),
        n_repeated=len(units),
        n_labels=sum(max(1, len(p.annotations)) for p in pairs),
        n_annotators=len({name for p in pairs for name, _ in p.annotations}),
        majority_share=100.0 * agreeing / n_repeated_labels if units else None,
        # "1" / "2" name a side in the pair's (arbitrary) content order: each unit in both orders, so the expected
        # disagreement, and alpha, do not depend on which description sorts first
        alpha=krippendorff_alpha([*units, *[[FLIP.get(label, label) for label in u] for u in units]]),
    )


__all__ = ["AGGREGATION", "Agreement", "agreement", "krippendorff_alpha", "majority_label"]
