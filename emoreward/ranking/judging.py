"""Generative judging of a description table: every (sample, model pair) through the harness in both orders
(`judge_records`, `JudgeRun`), pair queries for BPA (`JudgePairs`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import Verdict
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.scoring import table_pairs


if TYPE_CHECKING:
    from emoreward.evaluation.judge import Judge


OrderCombine = Literal["each", "consensus"]
ORDER_COMBINE: tuple[str, ...] = ("each", "consensus")


@dataclass
class JudgeRun:
    """Records from a generative judge, with what it cost: ``n_calls`` judge calls made, ``n_reused`` verdicts
    answered without one (the judge's call cache, or a greedy run repeating an identical one). ``verdicts`` holds
    every verdict asked, INVALID included, by ``(sample, model_1, model_2)`` and slot (``"normal/0"``,
    ``"swapped/0"``, ..., or ``"consensus/0"``): what a committee member votes (`emoreward.ranking.committee`)."""

    records: list[PairwiseRecord]
    n_calls: int
    n_invalid: int
    n_pairs: int
    n_reused: int = 0
    verdicts: dict[tuple[str, str, str], dict[str, Verdict]] = field(default_factory=dict)

    def cost(self, judge: str) -> dict[str, Any]:
        """What the run cost, as a report's ``cost``."""
        calls = {"n_judge_calls": self.n_calls, "n_reused": self.n_reused, "n_invalid": self.n_invalid}
        return {"judge": judge, **calls, "n_pairs": self.n_pairs, "n_records": len(self.records)}


def judge_records(
    judge: Judge,
    table: DescriptionTable,
    model_pairs: Sequence[tuple[str, str]] | None = None,
    swap: bool = True,
    runs: int = 1,
    combine: OrderCombine = "each",
) -> JudgeRun:
    """Run a generative judge on every (sample, model pair) through the harness, both orders, and make records.

    ``combine="each"``: every valid verdict is a record; ``"consensus"``: one record per pair and run, the shared
    verdict of the two orders, a tie when they disagree, none when either is INVALID (dropped and counted, never
    turned into a class).

    Raises:
        ValueError: on an unknown ``combine`` or ``combine="consensus"`` without ``swap``.
    """
    from emoreward.evaluation.harness import run_judge

    if combine not in ORDER_COMBINE:
        raise ValueError(f"combine must be one of {ORDER_COMBINE}, got {combine!r}")
    if combine == "consensus" and not swap:
        raise ValueError("combine='consensus' needs the swapped order (swap=True)")
    pairs = table_pairs(table, model_pairs)
    if not pairs:
        return JudgeRun([], 0, 0, 0)
    before = call_counts(judge)
    result = run_judge(judge, pairs, swap=swap, runs=runs)
    records: list[PairwiseRecord] = []
    keyed: dict[tuple[str, str, str], dict[str, Verdict]] = {}
    n_invalid = 0
    for r in range(runs):
        orders = [result.normal[r]] + ([result.swapped[r]] if swap else [])
        n_invalid += sum(j.verdict == Verdict.INVALID for js in orders for j in js)
        for k, pair in enumerate(pairs):
            verdicts = [js[k].verdict for js in orders]
            slots = keyed.setdefault((pair.sample_id, pair.model_1, pair.model_2), {})
            if combine == "each":
                slots.update((f"{o}/{r}", v) for o, v in zip(("normal", "swapped"), verdicts))
                chosen = [v for v in verdicts if v != Verdict.INVALID]
            elif Verdict.INVALID in verdicts:
                slots[f"consensus/{r}"] = Verdict.INVALID
                chosen = []
            else:
                chosen = [verdicts[0] if verdicts[0] == verdicts[1] else Verdict.TIE]
                slots[f"consensus/{r}"] = chosen[0]
            records.extend(PairwiseRecord(pair.model_1, pair.model_2, v, judge.name, pair.sample_id) for v in chosen)
    asked = len(pairs) * runs * (2 if swap else 1)
    made, reused = calls_since(judge, before, asked)
    return JudgeRun(records, made, n_invalid, len(pairs), reused, keyed)


def call_counts(judge: Judge) -> tuple[int, int] | None:
    """A judge's calls so far, ``(made, answered without a call)``, from its own statistics (a zero-shot judge's
    `zero_shot.strategies.CallStats`); ``None`` for a judge without them. With `calls_since`, the one count of the
    calls a piece of work made (ranking, BPA queries, committee calibration)."""
    stats = getattr(judge, "stats", None)
    return None if stats is None else (stats.made, stats.cached + stats.reused)


def calls_since(judge: Judge, before: tuple[int, int] | None, asked: int) -> tuple[int, int]:
    """``(calls made, verdicts reused)`` since `call_counts` gave ``before``; a judge without call statistics
    made one call per verdict ``asked``."""
    if before is None:
        return asked, 0
    made, reused = call_counts(judge)
    return made - before[0], reused - before[1]


class JudgePairs:
    """Answer BPA pair queries with a generative judge (:func:`judge_records` on one sample; ``swap``, ``runs``,
    ``combine`` as there), counting ``n_queries``, ``n_calls``, ``n_reused`` and ``n_invalid``."""

    def __init__(
        self, judge: Judge, table: DescriptionTable, swap: bool = True, runs: int = 1, combine: OrderCombine = "each"
    ):
        self.judge, self.table, self.swap, self.runs, self.combine = judge, table, swap, runs, combine
        self.name = judge.name
        self.n_queries = self.n_calls = self.n_invalid = self.n_reused = 0

    def __call__(self, sample: str, model_a: str, model_b: str) -> list[PairwiseRecord]:
        return self._run(sample, model_a, model_b).records

    def verdicts(self, sample: str, model_a: str, model_b: str) -> dict[str, Verdict]:
        """The query's verdicts by slot, INVALID included (`JudgeRun.verdicts`): a committee member's vote."""
        return self._run(sample, model_a, model_b).verdicts.get((sample, model_a, model_b), {})

    def _run(self, sample: str, model_a: str, model_b: str) -> JudgeRun:
        one = DescriptionTable(
            [model_a, model_b],
            [sample],
            {(sample, m): self.table.descriptions[sample, m] for m in (model_a, model_b)},
            {sample: self.table.media[sample]} if sample in self.table.media else {},
            self.table.source,
        )
        got = judge_records(self.judge, one, [(model_a, model_b)], self.swap, self.runs, self.combine)
        self.n_queries += 1
        self.n_calls += got.n_calls
        self.n_reused += got.n_reused
        self.n_invalid += got.n_invalid
        return got

    def cost(self) -> dict[str, Any]:
        return {
            "judge": self.name,
            "n_queries": self.n_queries,
            "n_calls": self.n_calls,
            "n_reused": self.n_reused,
            "n_invalid": self.n_invalid,
        }
