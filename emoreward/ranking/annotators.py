"""Annotators of a ranking (`ANNOTATORS`, a registry): who judges a (sample, model pair) and what it costs.

An annotator answers every pair of a table in its own batched way (`rank_all`: the all-pairs method), one query
at a time (`pairs`: BPA, the hierarchical method and any new method), as a committee member (`member`) and on
labelled calibration pairs (`agreement`). A new annotator is one module with a class and a `register_annotator` call; its
worked example is tests/ranking/test_ranking_api.py. See docs/ranking.md ("Ranking in Python").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emoreward.data.tables import DescriptionTable


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.evaluation.judge import Judge
    from emoreward.ranking.committee import MemberRun
    from emoreward.ranking.report import RankingReport
    from emoreward.ranking.score_cache import ScoreCache


ANNOTATORS: dict[str, type] = {}
"""Annotator kind -> class (``kind``, ``from_options(judge, options)``, ``check``, ``rank_all``, ``pairs``,
``member``, ``agreement``, ``finish``); `annotator_for` and `emoreward rank` read it."""


def register_annotator(cls: type) -> type:
    """Register an annotator class under its ``kind`` (usable as a decorator); ValueError on a kind taken."""
    if cls.kind in ANNOTATORS and ANNOTATORS[cls.kind] is not cls:
        raise ValueError(f"annotator kind {cls.kind!r} is already registered ({ANNOTATORS[cls.kind].__name__})")
    ANNOTATORS[cls.kind] = cls
    return cls


def annotator_for(kind: str, judge: Any, options: Mapping[str, Any]) -> Any:
    """The annotator of ``kind`` over ``judge`` (a loaded reward model or judge), taking from ``options`` the
    ones its kind reads (`from_options`). ValueError on an unknown kind, listing the registered ones."""
    if kind not in ANNOTATORS:
        raise ValueError(f"unknown annotator kind {kind!r}; registered: {sorted(ANNOTATORS)}")
    return ANNOTATORS[kind].from_options(judge, options)


class Annotator:
    """The base of an annotator: what a kind need not write. ``pairs(table)`` (a `PairAnswer` with ``cost()``) is
    the one primitive a subclass must give; `rank_all` defaults to asking it every pair (all-pairs method,
    `emoreward.ranking.methods.rank_queries`), `member` to its verdicts per pair."""

    kind = "custom"

    @classmethod
    def from_options(cls, judge: Any, options: Mapping[str, Any]) -> Annotator:
        return cls(judge)

    def check(self, table: DescriptionTable) -> None:
        """Refuse, before any work, a table this annotator cannot judge (default: any table is fine)."""

    def pairs(self, table: DescriptionTable) -> Any:
        raise NotImplementedError(f"{type(self).__name__} answers no pair queries")

    def rank_all(self, table: DescriptionTable, fit: Mapping[str, Any]) -> RankingReport:
        """Every (sample, model pair) asked once through `pairs`, ranked by the fits of one judge."""
        from emoreward.ranking.methods import rank_queries

        return rank_queries(table, self.pairs(table), list(every_query(table)), fit)

    def member(self, table: DescriptionTable) -> MemberRun:
        """Its verdict on every pair as a committee member's vote (the first record a query gives, in every slot)."""
        from emoreward.ranking.committee import MemberRun

        answer = self.pairs(table)
        answers = {q: answer(*q) for q in every_query(table)}
        return MemberRun({q: {None: records[0].outcome} for q, records in answers.items() if records}, answer.cost())

    def agreement(self, pairs: Sequence[PreferencePair]) -> tuple[int, int]:
        raise ValueError(f"a {self.kind} annotator cannot be calibrated on labelled pairs")

    def finish(self, report: Any, answer: Any) -> None:
        """Add what this annotator knows to a report made from its `pairs` answers (default: nothing)."""


def every_query(table: DescriptionTable) -> Iterator[tuple[str, str, str]]:
    """Every ``(sample, model_a, model_b)`` both models described, the models in table order."""
    from emoreward.ranking.active import shared_samples

    for (a, b), samples in shared_samples(table).items():
        yield from ((s, a, b) for s in samples)


@register_annotator
class RewardModelAnnotator(Annotator):
    """A reward model (or a text model's folder, `SavedRewardModel`, loaded when a description misses ``cache``):
    every description scored once, a pair's verdict from the score difference (`data.verdicts`); cost in scorings.
    Options: ``cache`` (a `ScoreCache`, or its file, opened when first used; ``None``: in memory only),
    ``tie_threshold`` (default the model's), ``batch_size``."""

    kind = "reward-model"

    def __init__(
        self,
        model: Any,
        cache: ScoreCache | str | Path | None = None,
        tie_threshold: float | None = None,
        batch_size: int = 32,
    ):
        self.model, self._cache, self.tie_threshold, self.batch_size = model, cache, tie_threshold, batch_size

    @property
    def cache(self) -> ScoreCache:
        from emoreward.ranking.score_cache import ScoreCache

        if not isinstance(self._cache, ScoreCache):
            self._cache = ScoreCache(self._cache)
        return self._cache

    @classmethod
    def from_options(cls, judge: Any, options: Mapping[str, Any]) -> RewardModelAnnotator:
        keys = ("cache", "tie_threshold", "batch_size")
        return cls(judge, **{k: options[k] for k in keys if k in options})

    @property
    def score_cache(self) -> Path | None:
        """The score cache's file (``None``: in memory only)."""
        path = getattr(self._cache, "path", self._cache)
        return None if path is None else Path(path)

    def check(self, table: DescriptionTable) -> None:
        from emoreward.data.media_check import check_table_media

        check_table_media(self.model, table)

    def _options(self) -> dict[str, Any]:
        return {"tie_threshold": self.tie_threshold, "batch_size": self.batch_size}

    def rank_all(self, table, fit):
        from emoreward.ranking.rank import rank_with_reward_model

        return rank_with_reward_model(self.model, table, self.cache, **self._options(), **fit)

    def pairs(self, table):
        from emoreward.ranking.active import RewardModelPairs

        return RewardModelPairs(self.model, table, self.cache, **self._options())

    def member(self, table):
        from emoreward.ranking.committee import reward_model_member

        return reward_model_member(self.model, table, self.cache, **self._options())

    def agreement(self, pairs):
        """Agreement with the labels of ``pairs`` (`member_agreement`, both orders), the weights loaded first."""
        from emoreward.evaluation.judge import RewardModelJudge
        from emoreward.models.saved import SavedRewardModel
        from emoreward.ranking.committee import member_agreement
        from emoreward.ranking.score_cache import model_key_parts
        from emoreward.ranking.scoring import loaded_model

        if isinstance(self.model, SavedRewardModel):
            self.model = loaded_model(self.model, model_key_parts(self.model))
        judge = RewardModelJudge(self.model, tie_threshold=self.tie_threshold, batch_size=self.batch_size)
        correct, total = member_agreement(judge, pairs, swap=True, runs=1)
        self.calibration_cost = {"judge": self.kind, "n_verdicts": total, "n_scored": judge.n_scored}
        return correct, total


@register_annotator
class JudgeAnnotator(Annotator):
    """A generative judge (`Judge`, e.g. a zero-shot S1-S4 judge): each pair in both orders (``swap``), ``runs``
    runs, verdicts ``combine``-d (`judge_records`); cost in judge calls made (the judge's own `CallStats`)."""

    kind = "judge"

    def __init__(self, judge: Judge, swap: bool = True, runs: int = 1, combine: str = "each"):
        self.judge, self.swap, self.runs, self.combine = judge, swap, runs, combine

    @classmethod
    def from_options(cls, judge: Any, options: Mapping[str, Any]) -> JudgeAnnotator:
        return cls(judge, **{k: options[k] for k in ("swap", "runs", "combine") if k in options})

    def _options(self) -> dict[str, Any]:
        return {"swap": self.swap, "runs": self.runs, "combine": self.combine}

    def rank_all(self, table, fit):
        from emoreward.ranking.rank import rank_with_judge

        return rank_with_judge(self.judge, table, **self._options(), **fit)

    def pairs(self, table):
        from emoreward.ranking.judging import JudgePairs

        return JudgePairs(self.judge, table, **self._options())

    def member(self, table):
        from emoreward.ranking.committee import judge_member

        return judge_member(self.judge, table, **self._options())

    def agreement(self, pairs):
        from emoreward.ranking.committee import member_agreement
        from emoreward.ranking.judging import call_counts, calls_since

        before = call_counts(self.judge)
        correct, total = member_agreement(self.judge, pairs, swap=self.swap, runs=self.runs)
        made, reused = calls_since(self.judge, before, total)
        self.calibration_cost = {"judge": self.judge.name, "n_verdicts": total, "n_calls": made, "n_reused": reused}
        return correct, total


@register_annotator
class Committee(Annotator):
    """A committee of annotators (E3mo-Score): the weighted vote of the members' verdicts (`committee_votes`), each
    member judging as it would alone. ``members``: name -> annotator; ``weights``: name -> weight (default equal,
    or `calibrate`); ``info``: what the report says of the committee (`describe`).

    Raises:
        ValueError: fewer than one member, or a weight for no member.
    """

    kind = "committee"

    def __init__(self, members: Mapping[str, Any], weights: Mapping[str, float] | None = None):
        if not members:
            raise ValueError("a committee needs at least one member")
        self.members = dict(members)
        self.weights = dict.fromkeys(self.members, 1.0) if weights is None else dict(weights)
        self.agreements: dict[str, tuple[int, int]] = {}
        self.calibration_cost: dict[str, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}

    @classmethod
    def from_options(cls, judge: Any, options: Mapping[str, Any]) -> Committee:
        return cls(judge, options.get("weights"))

    def check(self, table):
        for member in self.members.values():
            member.check(table)

    def calibrate(self, pairs: Sequence[PreferencePair], weighting: str = "log_odds") -> dict[str, float]:
        """Weights from each member's agreement with the labels of ``pairs`` (`committee_weights`); ValueError when
        every weight is 0 (no member votes)."""
        from emoreward.ranking.committee import committee_weights

        self.agreements = {name: m.agreement(pairs) for name, m in self.members.items()}
        # what calibrating cost, in the command's one ledger (the report's cost.calibration)
        self.calibration_cost = {name: getattr(m, "calibration_cost", {}) for name, m in sorted(self.members.items())}
        correct = {s: c for s, (c, _) in self.agreements.items()}
        self.weights = committee_weights(correct, {s: t for s, (_, t) in self.agreements.items()}, weighting)
        if not any(w > 0 for w in self.weights.values()):
            agreement = ", ".join(f"{s} {c}/{t}" for s, (c, t) in self.agreements.items())
            raise ValueError(
                f"every member's weight is 0 ({weighting} weighting; agreement {agreement}): no member votes"
            )
        return self.weights

    def describe(
        self, weighting: str, calibration: str | None, n_pairs: int | None, extra: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The report's ``meta["committee"]``: the weighting, the calibration file and, per member (name order),
        its kind, ``extra[name]["identity"]``, score cache, agreement and weight; kept as ``info``."""
        members = []
        for name in sorted(self.members):
            member, agreed = self.members[name], self.agreements.get(name)
            members.append(
                {
                    "name": name,
                    "judge": name,
                    "kind": member.kind,
                    "identity": extra.get(name, {}).get("identity"),
                    "score_cache": None if getattr(member, "score_cache", None) is None else str(member.score_cache),
                    "n_agree": None if agreed is None else agreed[0],
                    "n_calibration": None if agreed is None else agreed[1],
                    "n_in_sample_calibration": extra.get(name, {}).get("n_in_sample_calibration"),
                    "weight": self.weights[name],
                }
            )
        zero = sorted(s for s, w in self.weights.items() if w == 0)
        keys = ("weighting", "calibration", "n_calibration_pairs", "members", "zero_weight")
        self.info = dict(zip(keys, (weighting, calibration, n_pairs, members, zero)))
        return self.info

    def rank_all(self, table, fit):
        from emoreward.ranking.committee import rank_with_committee

        runs = {name: member.member(table) for name, member in self.members.items()}
        report = rank_with_committee(runs, self.weights, table, self.info, **fit)
        self._ledger(report)
        return report

    def _ledger(self, report: Any) -> None:
        if self.calibration_cost:
            report.cost["calibration"] = self.calibration_cost

    def pairs(self, table):
        from emoreward.ranking.committee import CommitteePairs

        return CommitteePairs({name: m.pairs(table) for name, m in self.members.items()}, self.weights)

    def member(self, table):
        raise ValueError("a committee is not a member of another committee")

    def finish(self, report, answer):
        from emoreward.ranking.committee import committee_warnings

        report.meta["committee"] = {**self.info, "verdicts": answer.counts}
        report.warnings += committee_warnings(self.weights, self.info)
        self._ledger(report)


__all__ = [
    "ANNOTATORS",
    "Annotator",
    "Committee",
    "JudgeAnnotator",
    "RewardModelAnnotator",
    "annotator_for",
    "every_query",
    "register_annotator",
]
