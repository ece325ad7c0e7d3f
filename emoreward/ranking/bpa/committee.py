"""Reliability-weighted committee voting of several judges (E3mo-Score, supp. D.5): weights from agreement with known
answers on calibration pairs (rules: `CommitteeConfig.weighting`), the weighted vote as one BPA annotator's verdict.
See docs/ranking.md ("Committee of judges").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.config import CommitteeConfig
from emoreward.ranking.records import OUTCOMES, PairwiseRecord, as_outcome


def known_outcome(score_a: float, score_b: float, tie_threshold: float) -> Verdict:
    """The correct `Verdict` for a pair with known (reference) scores: ``TIE`` within ``tie_threshold``, else
    ``FIRST`` when ``score_a`` is higher, ``SECOND`` otherwise."""
    if abs(score_a - score_b) <= tie_threshold:
        return Verdict.TIE
    return Verdict.FIRST if score_a > score_b else Verdict.SECOND


def weights_from_agreement(
    n_correct: Mapping[str, int], n_total: Mapping[str, int], config: CommitteeConfig | None = None
) -> dict[str, float]:
    """Non-negative committee weight per judge from its calibration agreement (``n_correct`` of ``n_total``
    answers), by ``config.weighting``: ``log_odds`` (default) ``w = max(0, log(acc (C - 1) / (1 - acc)))``, the
    optimal weighted majority (Nitzan & Paroush 1982) for ``C = 3`` answers, ``acc`` Laplace-smoothed; ``accuracy``
    ``w = acc``; ``equal`` ``w = 1`` (the paper's ablation, supp. tab. 6). E3mo-Score, supp. D.5.

    Raises:
        ValueError: if a judge lacks a total, or ``n_correct > n_total``, or counts are negative.
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

    ``judges``: name -> function of ``(item_a, item_b)`` returning an outcome (`as_outcome`); ``calibration_pairs``:
    pairs of items with ``reference_scores`` (golden anchors; E3mo-Score). Returns `weights_from_agreement`.

    Raises:
        ValueError: if ``calibration_pairs`` is empty, a pair item has no reference score, or a judge answers
            something that is not an outcome (never turned into a class).
    """
    config = config or CommitteeConfig()
    if not calibration_pairs:
        raise ValueError("estimate_judge_weights needs at least one calibration pair")
    missing = next((item for pair in calibration_pairs for item in pair if item not in reference_scores), None)
    if missing is not None:
        raise ValueError(f"calibration item {missing!r} has no reference score")
    truth = [
        known_outcome(reference_scores[a], reference_scores[b], config.tie_threshold) for a, b in calibration_pairs
    ]
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
    """Weighted plurality of the judges' answers (``votes``: judge -> outcome; ``weights``: judge -> weight >= 0):
    the `Verdict` of largest total weight, ``TIE`` when the largest totals are equal (conflicting evidence).

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
    """A committee of judges (name -> judge function, with ``weights``, e.g. from `estimate_judge_weights`) acting as
    one BPA annotator (E3mo-Score): called on ``(item_a, item_b)``, the `weighted_vote` of every member as a
    `PairwiseRecord` by ``name``.

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

    def __call__(self, item_a: str, item_b: str) -> PairwiseRecord:
        """Weighted committee verdict on one pair, as a `PairwiseRecord` (member votes kept in ``votes``)."""
        votes = {name: _answer(name, judge(item_a, item_b)) for name, judge in self.judges.items()}
        self.votes.append(votes)
        return PairwiseRecord(item_a, item_b, weighted_vote(votes, self.weights), self.name)
