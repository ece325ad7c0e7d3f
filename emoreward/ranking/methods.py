"""Ranking methods (`METHODS`, a registry): which (sample, model pair) queries to ask an annotator, and the fit.

All pairs (EMER-Ranker, section 2), hierarchical (section 5) and BPA (E3mo-Bench). A method is an object with a
``name`` and ``run(table, annotator, fit) -> report``; a new one is one module with a `register_method` call (worked
example: tests/ranking/test_ranking_api.py). `emoreward.ranking.api.rank` runs one. See docs/ranking.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from emoreward.data.tables import DescriptionTable


METHODS: dict[str, type] = {}
"""Method name -> class; `method_for` and `emoreward rank` read it."""


def register_method(cls: type) -> type:
    """Register a method class under its ``name`` (usable as a decorator); ValueError on a name taken."""
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"ranking method {cls.name!r} is already registered ({METHODS[cls.name].__name__})")
    METHODS[cls.name] = cls
    return cls


def method_for(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The registered method ``name`` built from ``options`` (``from_options``: each method takes the option names
    in its ``OPTIONS``); ValueError on an unknown name, listing them, or an option the method does not take."""
    if name not in METHODS:
        raise ValueError(f"unknown ranking method {name!r}; registered: {sorted(METHODS)}")
    return METHODS[name].from_options(dict(options or {}))


class Method:
    """The base of a method: ``name``, ``OPTIONS`` (the option names ``from_options`` takes; default none),
    ``uses_fit`` (whether ``run`` reads ``fit``; `emoreward.ranking.api.rank` refuses a ``fit`` for a method that
    fits its own model, as `emoreward rank` refuses the fit options) and ``run(table, annotator, fit)``."""

    name = "custom"
    OPTIONS: tuple[str, ...] = ()
    uses_fit = True

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Method:
        cls.check_options(options)
        return cls()

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """ValueError naming every option the method does not take (a misspelt name is never dropped silently)."""
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            takes = f"it takes {sorted(cls.OPTIONS)}" if cls.OPTIONS else "it takes none"
            raise ValueError(f"ranking method {cls.name!r}: unknown option(s) {unknown}; {takes}")

    def run(self, table: DescriptionTable, annotator: Any, fit: Mapping[str, Any]) -> Any:
        raise NotImplementedError


def rank_queries(
    table: DescriptionTable, answer: Any, queries: Sequence[tuple[str, str, str]], fit: Mapping[str, Any]
) -> Any:
    """Ask ``answer`` (a `PairAnswer`, e.g. ``annotator.pairs(table)``) each ``(sample, model_a, model_b)`` of
    ``queries`` once and rank the table's models by the fits of one judge (`fit_ranking`, ``fit`` as its keyword
    arguments). The cost is the annotator's own (`queries_report`).

    Returns:
        `RankingReport`. Raises ValueError as `fit_ranking` (no records, a disconnected graph).
    """
    records = [r for q in queries for r in answer(*q)]
    return queries_report(table, answer, queries, records, fit)


def queries_report(
    table: DescriptionTable,
    answer: Any,
    queries: Sequence[tuple[str, str, str]],
    records: Sequence[Any],
    fit: Mapping[str, Any],
    models: Sequence[str] | None = None,
    hierarchical: Any = None,
) -> Any:
    """The `RankingReport` of the ``records`` that ``answer`` gave to ``queries``: the fits of one judge over
    ``models`` (default the table's; the records between them), ``hierarchical`` attached. The cost is the
    annotator's own ledger (``answer.cost()``): ``n_judge_calls`` the calls it made (``n_calls``; a reward model's
    ``n_scored``, the texts it scored; else one per query), ``n_pairs`` the queries asked, ``n_records`` the
    verdicts they gave.

    Raises:
        ValueError: as `fit_ranking` (no records, a disconnected graph).
    """
    from emoreward.ranking.rank import fit_ranking, with_features
    from emoreward.ranking.report import ranking_warnings

    models = list(table.models if models is None else models)
    among = set(models)
    fits = fit_ranking([r for r in records if {r.item_a, r.item_b} <= among], models, **with_features(table, fit))
    own = answer.cost() if hasattr(answer, "cost") else {}
    cost = {
        "judge": own.get("judge", getattr(answer, "name", "custom")),
        "n_judge_calls": own.get("n_calls", own.get("n_scored", len(queries))),
        "n_reused": own.get("n_reused", 0),
        "n_invalid": own.get("n_invalid", 0),
        "n_pairs": len(queries),
        "n_records": len(records),
        "annotator": own,
    }
    if "n_members" in own:  # a committee: its verdict counts and its members' ledgers, as the report prints them
        cost = {**own, **{k: cost[k] for k in ("n_pairs", "n_records", "annotator")}}
    meta = {"tie_model": fits.ties.estimate.model, "n_samples": table.n_samples, "n_models": table.n_models}
    lengths = {m: v for m, v in table.lengths().items() if m in among}
    report = fits.report(models, lengths, cost, meta, hierarchical=hierarchical)
    report.warnings = ranking_warnings(report)
    return report


@register_method
class AllPairs(Method):
    """Every (sample, model pair) asked once, Bradley-Terry fits with bootstrap intervals (EMER-Ranker, section 2);
    the annotator asks them its batched way (`rank_all`: a reward model scores every description once)."""

    name = "full"

    def run(self, table: DescriptionTable, annotator: Any, fit: Mapping[str, Any]) -> Any:
        return annotator.rank_all(table, fit)


@register_method
class Hierarchical(Method):
    """EMER-Ranker section 5: within-group pairs, then the group winners' pairs, and no other: the method asks the
    annotator's `pairs` answer those queries only (every sample both models described), stage by stage
    (`rank_hierarchical`), and fits the winners on the final stage's verdicts; the report's cost is the annotator's
    ledger of exactly that work. ``groups``: lists of models (`emoreward.ranking.rank.parse_groups` reads
    ``"A,B|C,D"`` or K)."""

    name = "hierarchical"
    OPTIONS = ("groups",)

    def __init__(self, groups: Sequence[Sequence[str]]):
        if len(groups) < 2:
            raise ValueError("the hierarchical scheme needs at least two groups")
        self.groups = [list(g) for g in groups]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Hierarchical:
        cls.check_options(options)
        if not options.get("groups"):
            raise ValueError(
                "the hierarchical method needs its groups (option 'groups', e.g. parse_groups('A,B|C,D'))"
            )
        return cls(options["groups"])

    def queries(self, table: DescriptionTable, model_pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """The ``(sample, model_a, model_b)`` queries of a stage's model pairs: every sample both described, each
        pair in table order (as `every_query`)."""
        from emoreward.ranking.active import shared_samples

        shared = shared_samples(table)
        ordered = [pair if pair in shared else (pair[1], pair[0]) for pair in model_pairs]
        return [(s, a, b) for a, b in ordered for s in shared[a, b]]

    def run(self, table: DescriptionTable, annotator: Any, fit: Mapping[str, Any]) -> Any:
        from emoreward.ranking.hierarchical import rank_hierarchical

        answer = annotator.pairs(table)
        asked: list[tuple[str, str, str]] = []
        records: list[Any] = []

        def stage(model_pairs: list[tuple[str, str]]) -> list[Any]:
            queries = self.queries(table, model_pairs)
            got = [r for q in queries for r in answer(*q)]
            asked.extend(queries)
            records.extend(got)
            return got

        result = rank_hierarchical(stage, self.groups, order=table.models)  # a tie at the top: content order
        report = queries_report(table, answer, asked, records, fit, result.group_winners, result)
        annotator.finish(report, answer)
        return report


@register_method
class BPA(Method):
    """E3mo-Bench BPA (`rank_with_bpa`): only the queries the scheduler picks, each at most once, until ``budget``
    (default every query, `shared_samples`) or the mean uncertainty falls below ``config.sigma_tau``; it takes no
    ``fit`` (``uses_fit`` false: BPA fits its own model)."""

    name = "bpa"
    uses_fit = False
    DEFAULTS = {"budget": None, "sigma_tau": 0.3, "refit_every": 10, "policy": "exploration", "exploration": None}
    """The option values of a ranking by BPA when not given (`from_options`; `emoreward rank`'s defaults): the
    budget every query (`shared_samples`), a refit every 10 verdicts, exploration by the ranking-variance rule."""
    POLICIES = ("exploration", "paper", "bpa", "random")
    """The values of the ``policy`` option (`emoreward rank --policy`): a `SchedulerConfig` policy, or ``"paper"``
    (`PAPER_SCHEDULING`)."""
    OPTIONS = (*DEFAULTS, "seed", "progress")

    def __init__(
        self,
        budget: int | None = None,
        config: Any = None,
        scheduler_config: Any = None,
        seed: int = 0,
        progress: bool | None = False,
    ):
        self.budget, self.config, self.scheduler_config = budget, config, scheduler_config
        self.seed, self.progress = seed, progress

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> BPA:
        """From option values: ``budget``, ``sigma_tau``, ``refit_every``, ``policy`` (``"paper"``: the paper's
        scheduler, `PAPER_SCHEDULING`; else a `SchedulerConfig` policy), ``exploration`` (the exploration rule),
        ``seed``, ``progress``; one left out or ``None`` takes its value in ``DEFAULTS``.

        Raises:
            ValueError: an option BPA does not take (`check_options`), a ``policy`` not in `POLICIES`, or an
                ``exploration`` rule with a policy that reads none (`reads_exploration`, the rule `emoreward rank
                --exploration` is refused by)."""
        from emoreward.ranking.bpa import BPAConfig, SchedulerConfig

        cls.check_options(options)
        o = {**cls.DEFAULTS, **{k: options[k] for k in cls.DEFAULTS if options.get(k) is not None}}
        if o["policy"] not in cls.POLICIES:
            raise ValueError(f"BPA option 'policy': {o['policy']!r} is not one of {list(cls.POLICIES)}")
        schedule = cls.schedule(o["policy"])
        if o["exploration"] is not None:
            if not cls.reads_exploration(o["policy"]):
                reading = [p for p in cls.POLICIES if cls.reads_exploration(p)]
                raise ValueError(
                    f"BPA option 'exploration' is the exploration rule of the policies {reading}; policy "
                    f"{o['policy']!r} picks its pairs by no exploration rule"
                )
            schedule["exploration_rule"] = o["exploration"]
        seed = options.get("seed", 0)
        schedule = SchedulerConfig(**schedule, refit_every=o["refit_every"], seed=seed)
        return cls(o["budget"], BPAConfig(sigma_tau=o["sigma_tau"]), schedule, seed, options.get("progress"))

    @staticmethod
    def schedule(policy: str) -> dict[str, str]:
        """The `SchedulerConfig` fields the ``policy`` option sets (one of `POLICIES`)."""
        from emoreward.ranking.bpa import PAPER_SCHEDULING

        return dict(PAPER_SCHEDULING) if policy == "paper" else {"policy": policy}

    @classmethod
    def reads_exploration(cls, policy: str) -> bool:
        """Whether the ``policy`` option picks any pair by the ``exploration`` option's rule (its scheduler policy
        is one of `emoreward.ranking.bpa.RULE_POLICIES`; ``"random"`` is not): where ``exploration`` applies."""
        from emoreward.ranking.bpa import RULE_POLICIES

        return cls.schedule(policy)["policy"] in RULE_POLICIES

    def run(self, table: DescriptionTable, annotator: Any, fit: Mapping[str, Any]) -> Any:
        from emoreward.ranking.active import rank_with_bpa, shared_samples

        budget = self.budget
        if budget is None:
            budget = sum(map(len, shared_samples(table).values()))
        answer = annotator.pairs(table)
        report = rank_with_bpa(
            answer, table, budget, self.config, self.scheduler_config, self.seed, progress=self.progress
        )
        annotator.finish(report, answer)
        return report


__all__ = [
    "AllPairs",
    "BPA",
    "Hierarchical",
    "METHODS",
    "Method",
    "method_for",
    "queries_report",
    "rank_queries",
    "register_method",
]
