"""The evaluation harness shared by reward models and zero-shot judges: `run_judge` asks a judge about every pair
in normal and swapped order for R runs; `evaluate_judgements` turns the verdicts into the report; `evaluate_model`
is the whole evaluation of a reward model on labelled pairs. See docs/evaluation.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from emoreward.data import PreferencePair
from emoreward.data.annotators import agreement
from emoreward.data.pairs import sample_groups
from emoreward.data.text import identity_text
from emoreward.data.verdicts import Judgement
from emoreward.evaluation import metrics
from emoreward.evaluation.controlled import ControlledSet, controlled_section
from emoreward.evaluation.cost import CostLedger
from emoreward.evaluation.judge import Judge, RewardModelJudge


if TYPE_CHECKING:  # importing the models pulls in transformers; the zero-shot harness does not need it
    from emoreward.data.negatives import Negative
    from emoreward.models.base import RewardModel


@dataclass
class JudgementSet:
    """All judgements of one judge on one list of `pairs` (original order): `normal` and `swapped` (mapped back to the
    original order; empty if not run), one list per run."""

    judge_name: str
    pairs: list[PreferencePair]
    normal: list[list[Judgement]] = field(default_factory=list)
    swapped: list[list[Judgement]] = field(default_factory=list)

    def verdicts(self, order: str = "normal", run: int = 0) -> list[str]:
        runs = self.normal if order == "normal" else self.swapped
        return [j.verdict.value for j in runs[run]]


def run_judge(judge: Judge, pairs: Sequence[PreferencePair], *, swap: bool = True, runs: int = 1) -> JudgementSet:
    """Judge every pair in normal and swapped order (descriptions exchanged, verdicts mapped back), `runs` times each.

    Raises:
        ValueError: if the judge returns a different number of judgements than pairs, or `runs` < 1."""
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


def controlled_errors(judge: Judge, negatives: Sequence[Negative], *, source: str, runs: int = 1,
                      swap: bool = True, in_sample: Sequence[bool] | None = None,
                      new_edit: Sequence[bool] | None = None) -> dict:  # fmt: skip
    """Judge every negative as the pair (original, negative) in normal and swapped order (`run_judge`) and
    build the section (`controlled.controlled_section`, with the negatives' `in_sample` and `new_edit` flags and, for a
    reward model (`RewardModelJudge`), the margins r(original) - r(negative)); a judge of either kind (a reward model,
    a zero-shot or trained generative judge).

    Raises:
        ValueError: the judge returns the wrong number of judgements."""
    rewards = isinstance(judge, RewardModelJudge)  # a reward model: its order with no tie threshold too
    if not negatives:
        return controlled_section([], [[]], [[]] if swap else [], source, [] if in_sample is not None else None,
                                  [] if rewards else None, [] if new_edit is not None else None)  # fmt: skip
    pairs = [n.pair(i + 1) for i, n in enumerate(negatives)]
    result = run_judge(judge, pairs, swap=swap, runs=runs)
    # r(original) - r(negative) (`controlled.margin_verdict`); NaN where its media could not be read (no rewards)
    margins = [math.nan if j.reward_1 is None or j.reward_2 is None else j.reward_1 - j.reward_2
               for j in result.normal[0]] if rewards else None  # fmt: skip
    return controlled_section(negatives, _verdicts(result.normal), _verdicts(result.swapped), source, in_sample,
                              margins, new_edit)  # fmt: skip


def _verdicts(runs: list[list[Judgement]]) -> list[list[str]]:
    return [[j.verdict.value for j in run] for run in runs]


def _check(judge: Judge, judgements: list[Judgement], pairs: list[PreferencePair]) -> None:
    if len(judgements) != len(pairs):
        raise ValueError(f"judge {judge.name!r} returned {len(judgements)} judgements for {len(pairs)} pairs")


def _mean_over_runs(per_run: list[dict]) -> dict:
    """Each figure's mean over runs (a count, such as ``n_pairs``, is the same in every run)."""
    return {key: float(np.mean([run[key] for run in per_run])) for key in per_run[0]}


def evaluate_judgements(
    result: JudgementSet, *, tie_policy: metrics.TiePolicy = "wrong", seed: int = 0, media_by_id: bool = False
) -> dict:
    """The metrics of one judge on labelled pairs (run 0 for recognition; all runs for consistency).

    Returns a JSON-safe dict: `judge` (two-class / three-class recognition, swap and multi-run consistency,
    length control, reward-length correlation when rewards exist), `length_baseline`, `random_baseline`,
    `n_pairs`, `label_counts`, `weighting` (`sample_weighting`: every figure weighs each pair once; the judge's and
    the length baseline's `two_class_per_sample` / `three_class_per_sample` weigh each sample once) and `annotators`
    (`emoreward.data.annotators.Agreement`). ``media_by_id``: the pairs were read with clips by sample id
    (`load_pairs`), which decides their samples (`sample_groups`).

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
    groups = sample_groups(pairs, media_by_id=media_by_id)
    judge: dict = {"three_class": metrics.recognition(y_true, pred, "three-class", tie_policy)}
    if has_two_class:
        judge["two_class"] = metrics.recognition(y_true, pred, "two-class", tie_policy)
    judge.update(_per_sample(y_true, pred, tie_policy, groups))
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
        "weighting": sample_weighting(groups),
        "annotators": agreement(pairs).to_dict(),
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
            **_per_sample(y_true, length_pred, tie_policy, groups),
        },
        "random_baseline": {
            **({"two_class": metrics.random_baseline(y_true, "two-class", seed=seed)} if has_two_class else {}),
            "three_class": metrics.random_baseline(y_true, "three-class", seed=seed),
        },
    }


def sample_weighting(groups: Sequence[int]) -> dict:
    """How the figures of one evaluation weigh samples with many pairs: `unit` `"pair"` (every figure weighs each
    pair once; the `*_per_sample` figures each sample once), `n_pairs`, `n_samples` and `max_pairs_per_sample`, from
    `sample_groups` of the evaluated pairs."""
    sizes = np.bincount(np.asarray(groups, dtype=int)) if len(groups) else np.zeros(0, dtype=int)
    return {
        "unit": "pair",
        "n_pairs": len(groups),
        "n_samples": int(len(sizes)),
        "max_pairs_per_sample": int(sizes.max()) if len(sizes) else 0,
    }


def _per_sample(y_true: list, pred: list, tie_policy: str, groups: list[int]) -> dict:
    """WAF, accuracy and pairs scored with each sample weighted once (`metrics.recognition` with `groups`)."""
    out = {}
    for setting in ("two-class", "three-class"):
        if setting == "two-class" and all(y == "tie" for y in y_true):
            continue
        figures = metrics.recognition(y_true, pred, setting, tie_policy, groups=groups)
        out[f"{setting.replace('-', '_')}_per_sample"] = {key: figures[key] for key in ("waf", "acc", "n")}
    return out


def identical_descriptions(pairs: Sequence[PreferencePair]) -> list[str]:
    """Sample ids of the pairs whose two descriptions are one text (`emoreward.data.text.identity_text`): a reward
    model always judges them ties."""
    return [p.sample_id for p in pairs if identity_text(p.description_1) == identity_text(p.description_2)]


def evaluate_model(
    model: RewardModel,
    pairs: list[PreferencePair],
    *,
    tie_policy: str = "wrong",
    batch_size: int | None = None,
    media_errors: str = "raise",
    tie_threshold: float | None = None,
    controlled: ControlledSet | tuple[Sequence[Negative], str] | None = None,
    media_by_id: bool = False,
) -> dict:
    """Judge labelled pairs with any reward model (a `RewardModelJudge` with these settings) and compute every
    metric (`evaluate_reward_judge`, with its `controlled` negatives; ``media_by_id``: the pairs were read with clips
    by sample id).

    Raises:
        MediaError: bad media with `media_errors="raise"`."""
    judge = RewardModelJudge(model, tie_threshold=tie_threshold, batch_size=batch_size, media_errors=media_errors)
    return evaluate_reward_judge(judge, pairs, tie_policy=tie_policy, controlled=controlled, media_by_id=media_by_id)


def evaluate_reward_judge(
    judge: RewardModelJudge,
    pairs: list[PreferencePair],
    *,
    tie_policy: str = "wrong",
    controlled: ControlledSet | tuple[Sequence[Negative], str] | None = None,
    media_by_id: bool = False,
) -> dict:
    """The evaluation of a reward model as a judge (the shared harness, normal and swapped order, one run) with
    every metric of `evaluate_judgements`; the dict also holds the tie threshold, the scoring cost and precision
    (`scoring_seconds`, `scoring_dtype`), the per-pair rewards in the normal order (`pair_rewards`), the truncation
    count, the pairs with identical descriptions, for skipped media, `media_errors`, and with `controlled`
    (a `ControlledSet` or `(negatives, where they come from)`) the controlled-error section (`controlled_errors`,
    `emoreward.evaluation.controlled`; its `n_descriptions_scored` counts what scoring the negatives added); `cost`:
    the command's whole scoring work, total and by part (`emoreward.evaluation.cost.CostLedger.record`).

    Raises:
        MediaError: bad media with the judge's `media_errors="raise"`.
    """
    from emoreward.models.precision import precision_record

    model = judge.model
    start = time.perf_counter()
    result = run_judge(judge, pairs, swap=True)
    seconds = time.perf_counter() - start
    evaluation = evaluate_judgements(result, tie_policy=tie_policy, media_by_id=media_by_id)
    first = result.normal[0]
    evaluation.update(
        tie_threshold=judge.tie_threshold,
        n_descriptions_scored=judge.n_scored,
        n_truncated_at_scoring=judge.n_truncated,
        scoring_seconds=seconds,
        scoring_dtype=precision_record(model)["dtype"],
        precision=precision_record(model),
        # per-pair rewards in the normal order: the reward histogram, and checks that a saved model scores the same
        pair_rewards={
            "sample_id": [p.sample_id for p in pairs],
            "reward_1": [j.reward_1 for j in first],
            "reward_2": [j.reward_2 for j in first],
        },
    )
    identical = identical_descriptions(pairs)
    evaluation["n_identical_descriptions"] = len(identical)  # always judged ties: a zero reward difference
    if identical:
        evaluation["identical_description_ids"] = identical
    if judge.errors:
        evaluation["media_errors"] = dict(judge.errors)
    cost = CostLedger("descriptions")  # the command's work: the pairs, then the controlled negatives
    cost.add("pairs", scored=judge.n_scored, seconds=seconds)
    mark = time.perf_counter()
    if controlled is not None:
        scored = judge.n_scored
        negatives, source, in_sample, new_edit = ControlledSet(*controlled)
        evaluation["controlled_errors"] = controlled_errors(judge, negatives, source=source, in_sample=in_sample,
                                                            new_edit=new_edit)  # fmt: skip
        evaluation["controlled_errors"]["n_descriptions_scored"] = judge.n_scored - scored
        cost.add("controlled_negatives", scored=judge.n_scored - scored, seconds=time.perf_counter() - mark)
    evaluation["cost"] = cost.record()  # the cost line and the JSON from these values (`cost.cost_line`)
    return evaluation
