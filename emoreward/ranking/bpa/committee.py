"""Reliability-weighted committee voting of several judges (E3mo-Score, supp. D.5).

Each committee member (MLLM judge, reward model, annotator) answers every dispatched pair; the answers are
combined by weighted voting and the single committee verdict is fed to the same BPA optimisation as a human
annotator's. Weights come from each judge's agreement with known answers on a calibration set of golden-anchor
pairs (their reference scores give the correct answer, a tie within ``tie_threshold``).

The supplement's weight formula was lost in extraction. We default to the log-odds weight of the optimal
weighted majority vote for independent voters (Nitzan & Paroush 1982), generalised to ``C = 3`` answers:
``w = max(0, log(acc * (C - 1) / (1 - acc)))``, which is 0 for a judge at chance (acc = 1/3); accuracies are
Laplace-smoothed. ``"accuracy"`` and ``"equal"`` weighting are available (equal weights are the paper's
"no confidence weights" ablation, supp. tab. 6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.config import CommitteeConfig
from emoreward.ranking.records import OUTCOMES, PairwiseRecord, as_outcome


def known_outcome(score_a: float, score_b: float, tie_threshold: float) -> Verdict:
    """Correct answer for a pair with known scores: ``"tie"`` if ``|score_a - score_b| <= tie_threshold``.

    Args:
        score_a, score_b (`float`): reference scores (e.g. golden-anchor MOS on [1, 9]).
        tie_threshold (`float`): score difference treated as indistinguishable.

    Returns:
        `Verdict`: ``FIRST`` (``score_a`` higher), ``SECOND`` or ``TIE``.
    """
    if abs(score_a - score_b) <= tie_threshold:
        return Verdict.TIE
    return Verdict.FIRST if score_a > score_b else Verdict.SECOND


def weights_from_agreement(
    n_correct: Mapping[str, int], n_total: Mapping[str, int], config: CommitteeConfig | None = None
) -> dict[str, float]:
    """Committee weights from calibration agreement counts.

    Args:
        n_correct (`Mapping[str, int]`): judge -> calibration answers equal to the known answer.
        n_total (`Mapping[str, int]`): judge -> calibration pairs answered.
        config (`CommitteeConfig`, optional): weighting rule and smoothing.

    Returns:
        `dict[str, float]`: non-negative weight per judge.

    Raises:
        ValueError: if a judge lacks a total, or ``n_correct > n_total``, or counts are negative.

    Source: E3mo-Score (supp. D.5); weight rule chosen here (module docstring).
    """
    config = config or CommitteeConfig()
    n_classes = len(OUTCOMES)
    weights = {}
    for judge, correct in n_correct.items():
        if judge not in n_total:
            raise ValueError(f"judge {judge!r} has n_correct but no n_total")
        total = n_total[judge]
        if not 0 <= correct <= total:
            raise ValueError(f"judge {judge!r}: need 0 <= n_correct <= n_total, got {correct} / {total}")
        s = config.smoothing
        acc = (correct + s) / (total + 2 * s) if total + 2 * s > 0 else 1.0 / n_classes
        if config.weighting == "equal":
            weights[judge] = 1.0
        elif config.weighting == "accuracy":
            weights[judge] = acc
        elif config.weighting == "log_odds":
            acc = min(max(acc, 1e-6), 1 - 1e-6)
            weights[judge] = max(0.0, math.log(acc * (n_classes - 1) / (1 - acc)))
        else:  # unreachable: CommitteeConfig checks weighting
            raise ValueError(f"unknown weighting {config.weighting!r}")
    return weights


def estimate_judge_weights(
    judges: Mapping[str, Callable[[str, str], Verdict | str]],
    calibration_pairs: Sequence[tuple[str, str]],
    reference_scores: Mapping[str, float],
    config: CommitteeConfig | None = None,
) -> dict[str, float]:
    """Ask every judge the calibration pairs and turn its agreement with the known answers into a weight.

    Args:
        judges (`Mapping[str, Callable[[str, str], Verdict | str]]`): judge name -> function returning the outcome
            for ``(item_a, item_b)``: a `Verdict` or a spelling `as_outcome` accepts (``"a"``, ``"b"``, ``"tie"``).
        calibration_pairs (`Sequence[tuple[str, str]]`): pairs of items with reference scores (golden anchors).
        reference_scores (`Mapping[str, float]`): known scores of the calibration items.
        config (`CommitteeConfig`, optional): weighting rule, smoothing, tie threshold.

    Returns:
        `dict[str, float]`: weight per judge.

    Raises:
        ValueError: if ``calibration_pairs`` is empty, a pair item has no reference score, or a judge answers
            something that is not an outcome (an invalid answer is never turned into a class).

    Source: E3mo-Bench, "E3mo-Score" (a subset of golden anchors calibrates each model's confidence weight).
    """
    config = config or CommitteeConfig()
    if not calibration_pairs:
        raise ValueError("estimate_judge_weights needs at least one calibration pair")
    truth = []
    for a, b in calibration_pairs:
        for item in (a, b):
            if item not in reference_scores:
                raise ValueError(f"calibration item {item!r} has no reference score")
        truth.append(known_outcome(reference_scores[a], reference_scores[b], config.tie_threshold))
    correct, total = {}, {}
    for name, judge in judges.items():
        answers = [_answer(name, judge(a, b)) for a, b in calibration_pairs]
        correct[name] = sum(ans == t for ans, t in zip(answers, truth))
        total[name] = len(answers)
    return weights_from_agreement(correct, total, config)


def _answer(judge: str, vote: object) -> Verdict:
    """A judge's answer as an outcome (`as_outcome`), with the judge named when it is not one."""
    try:
        return as_outcome(vote)  # type: ignore[arg-type]
    except ValueError as err:
        raise ValueError(f"judge {judge!r} answered {vote!r}: {err}") from None


def weighted_vote(votes: Mapping[str, Verdict | str], weights: Mapping[str, float]) -> Verdict:
    """Weighted plurality of the judges' answers.

    Args:
        votes (`Mapping[str, Verdict | str]`): judge -> outcome (a `Verdict` or a spelling `as_outcome` accepts).
        weights (`Mapping[str, float]`): judge -> non-negative weight.

    Returns:
        `Verdict`: the outcome with the largest total weight. When the largest totals are equal (e.g. FIRST and
        SECOND with the same weight) the committee answers ``Verdict.TIE``: conflicting evidence of equal weight
        is read as "no meaningful difference".

    Raises:
        ValueError: for an unknown outcome, a judge without weight, a negative weight, or all weights zero.
    """
    totals = dict.fromkeys(OUTCOMES, 0.0)
    for judge, vote in votes.items():
        vote = _answer(judge, vote)
        if judge not in weights:
            raise ValueError(f"judge {judge!r} has no weight")
        if weights[judge] < 0:
            raise ValueError(f"judge {judge!r} has negative weight {weights[judge]}")
        totals[vote] += weights[judge]
    best = max(totals.values())
    if best <= 0:
        raise ValueError("weighted_vote: every voting judge has weight 0")
    winners = [o for o, t in totals.items() if math.isclose(t, best, rel_tol=1e-12, abs_tol=1e-12)]
    return winners[0] if len(winners) == 1 else Verdict.TIE


class CommitteeJudge:
    """A committee of judges acting as one BPA annotator (E3mo-Score).

    Calling it on ``(item_a, item_b)`` asks every member, takes the `weighted_vote` and returns a
    `PairwiseRecord` with ``annotator=name``, ready for `run_active_ranking` / `fit_bpa`.

    Args:
        judges (`Mapping[str, Callable[[str, str], Verdict | str]]`): member name -> judge function.
        weights (`Mapping[str, float]`): member weights (e.g. from `estimate_judge_weights`).
        name (`str`): annotator name of the committee's records.

    Raises:
        ValueError: if a member has no weight or all weights are zero.
    """

    def __init__(
        self,
        judges: Mapping[str, Callable[[str, str], Verdict | str]],
        weights: Mapping[str, float],
        name: str = "committee",
    ) -> None:
        missing = set(judges) - set(weights)
        if missing:
            raise ValueError(f"committee members without weight: {sorted(missing)}")
        if not any(weights[j] > 0 for j in judges):
            raise ValueError("committee weights are all zero")
        self.judges = dict(judges)
        self.weights = {j: float(weights[j]) for j in judges}
        self.name = name
        self.votes: list[dict[str, Verdict]] = []

    @classmethod
    def calibrated(
        cls,
        judges: Mapping[str, Callable[[str, str], Verdict | str]],
        calibration_pairs: Sequence[tuple[str, str]],
        reference_scores: Mapping[str, float],
        config: CommitteeConfig | None = None,
        name: str = "committee",
    ) -> CommitteeJudge:
        """Build a committee whose weights come from `estimate_judge_weights` on the calibration set."""
        return cls(judges, estimate_judge_weights(judges, calibration_pairs, reference_scores, config), name)

    def __call__(self, item_a: str, item_b: str) -> PairwiseRecord:
        """Weighted committee verdict on one pair, as a `PairwiseRecord` (member votes kept in ``votes``)."""
        votes = {name: _answer(name, judge(item_a, item_b)) for name, judge in self.judges.items()}
        self.votes.append(votes)
        return PairwiseRecord(item_a, item_b, weighted_vote(votes, self.weights), self.name)
