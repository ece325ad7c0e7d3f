"""The evaluation harness shared by reward models and zero-shot judges.

`run_judge` asks a judge about every pair in normal and (optionally) swapped order, for R runs, and stores
every verdict in the original pair order. `evaluate_judgements` turns those verdicts into the report:
recognition (two- and three-class WAF / ACC), swap consistency and JudgeLM's position-bias figures, multi-run
consistency, the length and random baselines and the length-control diagnostics (with the judge's and the humans'
longer-description rates on the same pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from emoreward.data import PreferencePair
from emoreward.evaluation import metrics
from emoreward.evaluation.judge import Judge
from emoreward.evaluation.verdicts import Judgement


@dataclass
class JudgementSet:
    """All judgements of one judge on one list of pairs.

    Attributes:
        pairs: the pairs, original order.
        normal: `runs` lists of judgements in normal order (one per pair).
        swapped: the same for the swapped order, verdicts mapped back to the original order (empty if not run).
    """

    judge_name: str
    pairs: list[PreferencePair]
    normal: list[list[Judgement]] = field(default_factory=list)
    swapped: list[list[Judgement]] = field(default_factory=list)

    def verdicts(self, order: str = "normal", run: int = 0) -> list[str]:
        runs = self.normal if order == "normal" else self.swapped
        return [j.verdict.value for j in runs[run]]


def run_judge(judge: Judge, pairs: Sequence[PreferencePair], *, swap: bool = True, runs: int = 1) -> JudgementSet:
    """Judge every pair in normal and swapped order, `runs` times each.

    Swapped pairs are passed with descriptions exchanged; their verdicts are mapped back to the original order.

    Raises:
        ValueError: if the judge returns a different number of judgements than pairs, or `runs` < 1.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    pairs = list(pairs)
    result = JudgementSet(judge.name, pairs)
    swapped_pairs = [p.swapped() for p in pairs]
    for run in range(runs):
        normal = judge.judge(pairs, run=run)
        _check(judge, normal, pairs)
        result.normal.append(normal)
        if swap:
            back = []
            for j in judge.judge(swapped_pairs, run=run):
                j.verdict = j.verdict.swapped()
                j.order = "swapped"
                j.reward_1, j.reward_2 = j.reward_2, j.reward_1
                j.p_first, j.p_second = j.p_second, j.p_first
                back.append(j)
            _check(judge, back, pairs)
            result.swapped.append(back)
    return result


def _check(judge: Judge, judgements: list[Judgement], pairs: list[PreferencePair]) -> None:
    if len(judgements) != len(pairs):
        raise ValueError(f"judge {judge.name!r} returned {len(judgements)} judgements for {len(pairs)} pairs")


def _mean_over_runs(per_run: list[dict]) -> dict:
    """Each figure's mean over runs (a count, such as ``n_pairs``, is the same in every run)."""
    return {key: float(np.mean([run[key] for run in per_run])) for key in per_run[0]}


def evaluate_judgements(result: JudgementSet, *, tie_policy: metrics.TiePolicy = "wrong", seed: int = 0) -> dict:
    """The metrics of one judge on labelled pairs (run 0 for recognition; all runs for consistency).

    Returns a JSON-safe dict: `judge` (two-class / three-class recognition, swap and multi-run consistency,
    length control, reward-length correlation when rewards exist), `length_baseline`, `random_baseline`,
    `n_pairs`, `label_counts`.

    Raises:
        ValueError: if a pair has no label.
    """
    pairs = result.pairs
    unlabeled = [p.row for p in pairs if p.label is None]
    if unlabeled:
        raise ValueError(f"{len(unlabeled)} pairs have no label (rows {unlabeled[:5]}...); evaluation needs labels")
    y_true = [p.label for p in pairs]
    pred = result.verdicts("normal", 0)
    has_two_class = any(y != "tie" for y in y_true)  # a file of ties only has no two-class metrics
    judge: dict = {"three_class": metrics.recognition(y_true, pred, "three-class", tie_policy)}
    if has_two_class:
        judge["two_class"] = metrics.recognition(y_true, pred, "two-class", tie_policy)
    judge["length_control"] = metrics.length_control(pairs, pred)
    if result.swapped:
        per_run = [
            metrics.swap_consistency(result.verdicts("normal", r), result.verdicts("swapped", r))
            for r in range(len(result.swapped))
        ]
        judge["swap_consistency"] = float(np.mean(per_run))
        judge["swap_consistency_std"] = float(np.std(per_run))
    judge["position_bias"] = _mean_over_runs(
        [
            metrics.position_bias(
                result.verdicts("normal", r), result.verdicts("swapped", r) if result.swapped else None
            )
            for r in range(len(result.swapped) if result.swapped else 1)
        ]
    )
    if len(result.normal) > 1:
        judge["multi_run_consistency"] = metrics.multi_run_consistency(
            [result.verdicts("normal", r) for r in range(len(result.normal))]
        )
    first = result.normal[0]
    if all(j.reward_1 is not None for j in first):
        rewards = [j.reward_1 for j in first] + [j.reward_2 for j in first]
        lengths = [metrics.description_length(p.description_1) for p in pairs] + [
            metrics.description_length(p.description_2) for p in pairs
        ]
        judge["reward_length_spearman"] = metrics.reward_length_correlation(rewards, lengths)
        signal = [j.reward_1 - j.reward_2 for j in first]
    else:
        signal = [{"1": 1.0, "2": -1.0}.get(v, 0.0) for v in pred]
    judge["length_controlled"] = metrics.length_controlled_preference(pairs, signal)
    length_pred = metrics.length_verdicts(pairs)
    return {
        "judge_name": result.judge_name,
        "tie_policy": tie_policy,
        "n_pairs": len(pairs),
        "label_counts": {k: sum(y == k for y in y_true) for k in ("1", "2", "tie")},
        "judge": judge,
        "length_baseline": {
            **(
                {"two_class": metrics.recognition(y_true, length_pred, "two-class", tie_policy)}
                if has_two_class
                else {}
            ),
            "three_class": metrics.recognition(y_true, length_pred, "three-class", tie_policy),
            "length_control": metrics.length_control(pairs, length_pred),
        },
        "random_baseline": {
            **({"two_class": metrics.random_baseline(y_true, "two-class", seed=seed)} if has_two_class else {}),
            "three_class": metrics.random_baseline(y_true, "three-class", seed=seed),
        },
    }
