"""A committee of judges ranking as one annotator (E3mo-Score, E3mo-Bench supp. D.5).

Each member judges the table exactly as it would alone (a reward model through the score cache, a generative judge
through the harness); the committee's verdict per (model pair, sample, order) is the reliability-weighted vote of the
members' verdicts (`emoreward.ranking.bpa.committee.weighted_vote`), with each member's weight from its agreement
with human labels on calibration pairs (`weights_from_agreement`). The committee's verdicts go through the same fits
as one judge's, or into BPA as the annotator (`CommitteePairs`). See docs/ranking.md ("Committee of judges").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.committee import weighted_vote, weights_from_agreement
from emoreward.ranking.bpa.config import CommitteeConfig
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.report import RankingReport, ranking_warnings


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.evaluation.judge import Judge
    from emoreward.models.base import RewardModel
    from emoreward.ranking.score_cache import ScoreCache

PairKey = tuple[str, str, str]
"""``(sample, model_a, model_b)``, the models in table order."""
MemberVerdicts = Mapping[PairKey, Mapping[Any, Verdict]]
"""A member's verdicts: pair -> slot (``"normal/0"``, ``"swapped/0"``, ...; ``None`` for a member that answers once
whatever the order, a reward model) -> verdict, INVALID included (an INVALID verdict abstains)."""


@dataclass
class MemberRun:
    """One member's verdicts on the table (`MemberVerdicts`), what they cost (the keys of a single judge's) and, for a
    member that can count them (a reward model), the descriptions it cut to its length limit per model
    (``n_truncated``, as `truncation_counts`; None: cannot count) with that limit (``max_length``, tokens)."""

    verdicts: dict[PairKey, dict[Any, Verdict]]
    cost: dict[str, Any]
    n_truncated: dict[str, int] | None = None
    max_length: int | None = None


@dataclass
class CommitteeVotes:
    """The committee's verdicts: one record per (pair, slot) where some member with a positive weight voted.

    Attributes:
        records (`list[PairwiseRecord]`): annotator ``name``.
        counts (`dict`): ``n_verdicts``, ``first`` / ``second`` / ``tie``, ``n_no_verdict`` (no member with a
            positive weight gave a valid verdict), ``n_unanimous`` (every member voted, all alike), and per member
            ``n_votes`` and ``n_agree`` (votes equal to the committee's verdict).
    """

    records: list[PairwiseRecord]
    counts: dict[str, Any] = field(default_factory=dict)


def member_agreement(
    judge: Judge, pairs: Sequence[PreferencePair], *, swap: bool = True, runs: int = 1
) -> tuple[int, int]:
    """A member's agreement with the human labels on calibration pairs, through the one harness (`run_judge`):
    ``(verdicts equal to the label, verdicts asked)``, an INVALID verdict asked and not equal. ValueError on a pair
    without a label."""
    from emoreward.evaluation.harness import run_judge

    unlabelled = [p.sample_id for p in pairs if p.label is None]
    if unlabelled:
        raise ValueError(f"calibration pairs without a label: {unlabelled[:5]}")
    result = run_judge(judge, pairs, swap=swap, runs=runs)
    truth = [Verdict.from_label(p.label) for p in result.pairs]
    correct = total = 0
    for judgements in [*result.normal, *result.swapped]:
        correct += sum(j.verdict == t for j, t in zip(judgements, truth))
        total += len(judgements)
    return correct, total


def committee_weights(
    n_correct: Mapping[str, int], n_total: Mapping[str, int], weighting: str = "log_odds"
) -> dict[str, float]:
    """Member weights from calibration agreement: `weights_from_agreement` with ``CommitteeConfig(weighting)``
    (log-odds of the Laplace-smoothed accuracy by default, 0 at or below chance; E3mo-Score, supp. D.5)."""
    return weights_from_agreement(n_correct, n_total, CommitteeConfig(weighting=weighting))


def committee_votes(
    members: Mapping[str, MemberVerdicts], weights: Mapping[str, float], name: str = "committee"
) -> CommitteeVotes:
    """The weighted vote (`weighted_vote`) of the members' verdicts, per pair and slot.

    Members are read in name order; a pair's slots are its members' (a reward model's one verdict votes in every
    slot); a member abstains on an INVALID verdict or a pair it did not judge.

    Args:
        members (`Mapping[str, MemberVerdicts]`): member name -> its verdicts.
        weights (`Mapping[str, float]`): member name -> non-negative weight.
        name (`str`): annotator of the committee's records.

    Raises:
        ValueError: a member without a weight, a negative weight, or every weight zero.
    """
    order = sorted(members)
    missing = [m for m in order if m not in weights]
    if missing:
        raise ValueError(f"committee members without a weight: {missing}")
    if any(weights[m] < 0 for m in order):
        raise ValueError(f"committee weights must be >= 0, got {dict(weights)}")
    if not any(weights[m] > 0 for m in order):
        raise ValueError("every committee member has weight 0: no member votes")
    keys: dict[PairKey, None] = {}
    for m in order:
        keys.update(dict.fromkeys(members[m]))
    records: list[PairwiseRecord] = []
    counts: dict[str, Any] = {"n_verdicts": 0, "first": 0, "second": 0, "tie": 0, "n_no_verdict": 0, "n_unanimous": 0}
    per_member = {m: {"n_votes": 0, "n_agree": 0} for m in order}
    for key in keys:
        slots: dict[Any, None] = {}
        for m in order:
            slots.update((s, None) for s in members[m].get(key, {}) if s is not None)
        for slot in slots or [None]:
            votes = {}
            for m in order:
                answers = members[m].get(key)
                vote = None if answers is None else answers.get(slot, answers.get(None))
                if vote is not None and vote != Verdict.INVALID:
                    votes[m] = vote
            if sum(weights[m] for m in votes) <= 0:
                counts["n_no_verdict"] += 1
                continue
            verdict = weighted_vote(votes, weights)
            records.append(PairwiseRecord(key[1], key[2], verdict, name, key[0]))
            counts["n_verdicts"] += 1
            counts[verdict.name.lower()] += 1
            counts["n_unanimous"] += len(votes) == len(order) and len(set(votes.values())) == 1
            for m, vote in votes.items():
                per_member[m]["n_votes"] += 1
                per_member[m]["n_agree"] += vote == verdict
    counts["members"] = per_member
    return CommitteeVotes(records, counts)


def reward_model_member(
    model: RewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    tie_threshold: float | None = None,
    batch_size: int = 32,
) -> MemberRun:
    """A reward model's verdicts on the table, as `rank_with_reward_model` makes them (M x N scorings through the
    score cache, the verdict of each score difference), one per pair (slot ``None``)."""
    from emoreward.models.precision import precision_record
    from emoreward.ranking.rank import scoring_cost
    from emoreward.ranking.scoring import records_from_scores, score_table, truncation_counts

    threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
    scores = score_table(model, table, cache, batch_size=batch_size)
    records = records_from_scores(scores, threshold)
    cost = {**scoring_cost(scores, records), "tie_threshold": threshold, "precision": precision_record(model)}
    verdicts = {(r.sample, r.item_a, r.item_b): {None: r.outcome} for r in records}
    limit = getattr(getattr(model, "settings", None), "max_length", None)
    return MemberRun(verdicts, cost, truncation_counts(scores), limit)


def judge_member(
    judge: Judge, table: DescriptionTable, swap: bool = True, runs: int = 1, combine: str = "each"
) -> MemberRun:
    """A generative judge's verdicts on the table, as `rank_with_judge` asks them (`judge_records`: every pair,
    both orders, ``runs`` runs), by slot."""
    from emoreward.ranking.judging import judge_records

    got = judge_records(judge, table, None, swap=swap, runs=runs, combine=combine)  # type: ignore[arg-type]
    return MemberRun({k: dict(v) for k, v in got.verdicts.items()}, got.cost(judge.name))


def rank_with_committee(
    members: Mapping[str, MemberRun],
    weights: Mapping[str, float],
    table: DescriptionTable,
    committee: Mapping[str, Any] | None = None,
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with `committee_votes` of the members (``members``: name -> `MemberRun`) through the
    fits of one judge (`fit_ranking`, ``**fit_kwargs`` as for `rank_with_judge`).

    Returns:
        `RankingReport` with ``meta["committee"]`` (``committee`` plus the vote counts as ``verdicts``) and
        ``cost["judge"] == "committee"``; a member with weight 0 is named in the warnings.
    """
    from emoreward.ranking.rank import fit_ranking, with_features

    start = time.perf_counter()
    votes = committee_votes({m: run.verdicts for m, run in members.items()}, weights)
    fits = fit_ranking(votes.records, table.models, **with_features(table, fit_kwargs))
    counts = {k: v for k, v in votes.counts.items() if k != "members"}
    cost = {
        "judge": "committee",
        "n_members": len(members),
        **counts,
        "members": {m: members[m].cost for m in sorted(members)},
        "fit_seconds": time.perf_counter() - start,
    }
    info = dict(committee or {})
    info["verdicts"] = votes.counts
    for m, run in members.items():  # what each member cut, where it can count (a reward model)
        cost["members"][m] = {**cost["members"][m], "n_truncated": run.n_truncated, "max_length": run.max_length}
    counted = [run for run in members.values() if run.n_truncated is not None]
    limits = {run.max_length for run in counted}
    meta = {
        "tie_model": fits.ties.estimate.model,
        "n_samples": table.n_samples,
        "n_models": table.n_models,
        "committee": info,
        "max_length": limits.pop() if len(limits) == 1 else None,  # the members' one limit, where they share it
    }
    # per model, the most descriptions a member cut (None: no member can count): the warning of a single judge's
    n_truncated = {m: max(run.n_truncated.get(m, 0) for run in counted) for m in table.models} if counted else None
    report = fits.report(table.models, table.lengths(), cost, meta, n_truncated=n_truncated)
    report.warnings = ranking_warnings(report) + committee_warnings(weights, info)
    return report


def committee_warnings(weights: Mapping[str, float], info: Mapping[str, Any]) -> list[str]:
    """The committee's own warnings: a member with weight 0 (in the committee, never changing a verdict), and a
    member calibrated on pairs it was trained on (``info["members"][k]["n_in_sample_calibration"]``)."""
    warnings = [
        f"committee member {m} has weight 0 (calibration agreement at or below chance): its verdicts do not count"
        for m in sorted(weights)
        if weights[m] == 0
    ]
    for member in info.get("members", []):
        if member.get("n_in_sample_calibration"):
            warnings.append(
                f"committee member {member['name']} was trained on {member['n_in_sample_calibration']} of the "
                f"{info.get('n_calibration_pairs')} calibration pairs: its weight is in-sample (inflated)"
            )
    return warnings


class CommitteePairs:
    """Answer BPA pair queries with a committee: every member answers the query (``member.verdicts(sample, a, b)``,
    e.g. `RewardModelPairs` or `JudgePairs`), the committee's records are `committee_votes` of their verdicts.

    Attributes:
        n_queries (`int`); counts (`dict`): the vote counts of `CommitteeVotes`, summed over queries.
    """

    name = "committee"
    tie_threshold = None

    def __init__(self, members: Mapping[str, Any], weights: Mapping[str, float]):
        self.members, self.weights = dict(members), dict(weights)
        if not any(self.weights.get(m, 0) > 0 for m in self.members):
            raise ValueError("every committee member has weight 0: no member votes")
        self.n_queries = 0
        self.counts: dict[str, Any] = {}

    def __call__(self, sample: str, model_a: str, model_b: str) -> list[PairwiseRecord]:
        key = (sample, model_a, model_b)
        answers = {m: {key: self.members[m].verdicts(sample, model_a, model_b)} for m in sorted(self.members)}
        votes = committee_votes(answers, self.weights, self.name)
        self.n_queries += 1
        for k, v in votes.counts.items():
            if k == "members":
                per = self.counts.setdefault("members", {m: {"n_votes": 0, "n_agree": 0} for m in self.members})
                for m, c in v.items():
                    per[m]["n_votes"] += c["n_votes"]
                    per[m]["n_agree"] += c["n_agree"]
            else:
                self.counts[k] = self.counts.get(k, 0) + v
        return votes.records

    def cost(self) -> dict[str, Any]:
        counts = {k: v for k, v in self.counts.items() if k != "members"}
        return {
            "judge": "committee",
            "n_members": len(self.members),
            "n_queries": self.n_queries,
            **counts,
            "members": {m: self.members[m].cost() for m in sorted(self.members)},
        }


def calibration_pairs(path: str, media_root: str | None = None) -> list[PreferencePair]:
    """The labelled pairs a committee is calibrated on (``--committee-calibration``), every one with a human label,
    read as every command reads pairs (`load_pairs`): with ``media_root`` clips are read by sample id, so the id is
    part of a pair's context (``media_by_id``).

    Raises:
        FileNotFoundError / ValueError: naming the option: no such file, a bad row (its file, row and field), no pairs,
            or pairs without a label.
    """
    from emoreward.data import load_pairs

    try:
        pairs = load_pairs(path, require_labels=False, media_by_id=bool(media_root))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--committee-calibration {path}: {err}") from None
    except (ValueError, OSError) as err:  # a DataError names its file, row and field
        raise ValueError(f"--committee-calibration: {err}") from None
    unlabelled = [p.sample_id for p in pairs if p.label is None]
    if not pairs or unlabelled:
        raise ValueError(
            f"--committee-calibration {path}: {len(unlabelled)} of {len(pairs)} pairs have no label (calibration "
            f"needs the human preference of every pair: 1, 2 or tie){': ' + ', '.join(unlabelled[:5]) if unlabelled else ''}"
        )
    return pairs


__all__ = [
    "CommitteePairs",
    "CommitteeVotes",
    "MemberRun",
    "calibration_pairs",
    "committee_votes",
    "committee_weights",
    "judge_member",
    "member_agreement",
    "rank_with_committee",
    "reward_model_member",
    "committee_warnings",
]
