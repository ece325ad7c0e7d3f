"""The active route of `emoreward rank --method bpa`: the judge in the BPA loop (E3mo-Bench), asking only the
(model pair, sample) queries the scheduler picks (`rank_with_bpa`), with a reward model answering pair queries from
cached scores (`RewardModelPairs`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from emoreward.data.tables import DescriptionTable
from emoreward.ranking.bootstrap import tqdm_disable
from emoreward.ranking.bpa import RULE_POLICIES, BPAConfig, BPAFit, BPAScheduler, SchedulerConfig
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.report import BPARankingReport, bpa_warnings
from emoreward.ranking.score_cache import ScoreCache, model_key_parts, score_key
from emoreward.ranking.scoring import check_tie_threshold, loaded_model, table_context


if TYPE_CHECKING:
    from emoreward.models.base import RewardModel


PairAnswer = Callable[[str, str, str], list[PairwiseRecord]]
"""``(sample, model_a, model_b) -> records``: the judge's verdicts on one sample's two descriptions (may be empty)."""


class RewardModelPairs:
    """Answer pair queries with a reward model, scoring each description at most once (cache on disk): a query
    ``(sample, a, b)`` returns one record, the verdict of ``r_a - r_b`` (the rule of :func:`records_from_scores`).

    ``model``: a `RewardModel`, or a text model's folder (`SavedRewardModel`, loaded when a description misses the
    cache); ``tie_threshold`` defaults to the model's calibrated one. Counts ``n_queries``, ``n_scored`` /
    ``n_cached`` (distinct descriptions scored now / found in the cache) and ``seconds`` of scoring.
    """

    name = "reward-model"

    def __init__(
        self,
        model: RewardModel,
        table: DescriptionTable,
        cache: ScoreCache | None = None,
        tie_threshold: float | None = None,
        batch_size: int = 32,
    ):
        self.model, self.table, self.batch_size = model, table, batch_size
        self.cache = cache if cache is not None else ScoreCache(None)
        self.tie_threshold = check_tie_threshold(
            model.settings.tie_threshold if tie_threshold is None else tie_threshold
        )
        self.n_queries = self.n_scored = self.n_cached = 0
        self.seconds = 0.0
        self._seen: set[str] = set()
        self.key_parts = model_key_parts(model)  # the model's part of every score key (it does not change here)

    def __call__(self, sample: str, model_a: str, model_b: str) -> list[PairwiseRecord]:
        from emoreward.data.verdicts import verdict_from_difference

        start = time.perf_counter()
        context = table_context(self.table, sample)
        texts = [self.table.descriptions[sample, m] for m in (model_a, model_b)]
        keys = [score_key(self.model, t, context, self.key_parts) for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if self.cache.get(k) is None}
        if todo:
            from emoreward.models.saved import SavedRewardModel

            if isinstance(self.model, SavedRewardModel):  # a description to score: now the weights are needed
                self.model = loaded_model(self.model, self.key_parts)
            info = self.model.score_info(list(todo.values()), context, batch_size=self.batch_size)
            self.cache.put(
                {k: float(v) for k, v in zip(todo, info.rewards)}, {k: bool(t) for k, t in zip(todo, info.truncated)}
            )
        new = set(keys) - self._seen
        self.n_scored += len(todo)
        self.n_cached += len(new - set(todo))
        self._seen |= new
        self.n_queries += 1
        self.seconds += time.perf_counter() - start
        verdict = verdict_from_difference(self.cache.get(keys[0]) - self.cache.get(keys[1]), self.tie_threshold)
        return [PairwiseRecord(model_a, model_b, verdict, self.name, sample)]

    def verdicts(self, sample: str, model_a: str, model_b: str) -> dict[None, Any]:
        """The query's one verdict, whatever the order (slot ``None``): a committee member's vote."""
        return {None: self(sample, model_a, model_b)[0].outcome}

    def cost(self) -> dict[str, Any]:
        from emoreward.models.precision import precision_record  # torch-free: a cache rerun imports no torch

        return {
            "judge": "reward-model",
            "n_queries": self.n_queries,
            "n_scored": self.n_scored,
            "n_cached": self.n_cached,
            "scoring_seconds": self.seconds,
            "precision": precision_record(self.model),
        }


def shared_samples(table: DescriptionTable) -> dict[tuple[str, str], list[str]]:
    """Every model pair ``(a, b)`` (table order) -> the samples both described (table order): the (model pair, sample)
    queries of a full ranking, C(M,2) x N on a complete table (the BPA default budget)."""
    return {
        (a, b): [s for s in table.samples if (s, a) in table.descriptions and (s, b) in table.descriptions]
        for a, b in itertools.combinations(table.models, 2)
    }


def rank_with_bpa(
    answer: PairAnswer,
    table: DescriptionTable,
    budget: int | None = None,
    config: BPAConfig | None = None,
    scheduler_config: SchedulerConfig | None = None,
    seed: int = 0,
    cost: Callable[[], dict[str, Any]] | None = None,
    on_refit: Callable[[int, BPAFit], bool | None] | None = None,
    progress: bool | None = False,
) -> BPARankingReport:
    """Rank the table's models with BPA, asking the judge only for the pairs the scheduler picks.

    The candidates are the M models (no anchors). A proposal ``(a, b)`` is one query on one sample, the samples
    both models described taken in a seeded random order, each (model pair, sample) asked at most once (a pair
    whose samples are all asked is closed to the scheduler), so ``n_pairs`` counts distinct queries; every valid
    verdict the judge returns is a record. The loop stops when a refit's mean uncertainty falls below
    ``config.sigma_tau``, after ``budget`` queries, or when every (model pair, sample) was asked. Source:
    E3mo-Bench, "Algorithm Overview".

    Args:
        answer (`PairAnswer`): the judge, e.g. `RewardModelPairs` or `JudgePairs`; table: the descriptions.
        budget (`int`, *optional*): maximum pair queries; default ``scheduler_config.budget`` (`BPA`, the method,
            defaults to every query of `shared_samples`).
        config, scheduler_config (`BPAConfig`, `SchedulerConfig`, *optional*): the model and the scheduling.
        seed (`int`): seed of the sample order (the scheduler has its own).
        cost (`Callable[[], dict]`, *optional*): the judge's cost counters (default ``answer.cost``).
        on_refit (`Callable[[int, BPAFit], bool | None]`, *optional*): called after every refit with the queries
            asked so far and the fit; a true return value stops the loop (``stopped_by="on_refit"``).
        progress (`bool` or `None`): a tqdm bar on stderr (``None``: only on a terminal).

    Raises:
        ValueError: if fewer than two models, ``budget < 1``, or no two models share a sample.
    """
    from tqdm.auto import tqdm

    config = config or BPAConfig()
    sconfig = scheduler_config or SchedulerConfig()
    shared = shared_samples(table)
    full_pairs = sum(len(v) for v in shared.values())
    if full_pairs == 0:  # before the budget: a default budget (every query) is 0 here, and no option was wrong
        raise ValueError("no two models described the same sample: nothing to compare")
    budget = sconfig.budget if budget is None else budget
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    models = list(table.models)
    rng = np.random.default_rng(seed)
    queues: dict[tuple[str, str], list[str]] = {}
    index = {m: k for k, m in enumerate(models)}
    open_pairs = np.zeros((len(models), len(models)), dtype=bool)  # pairs with a shared sample not yet asked
    for (a, b), samples in shared.items():
        open_pairs[index[a], index[b]] = open_pairs[index[b], index[a]] = bool(samples)
    sched = BPAScheduler(models, config=config, scheduler_config=sconfig)
    n_pairs, stopped_by = 0, "budget"
    start = time.perf_counter()
    bar = tqdm(total=min(budget, full_pairs), desc="BPA queries", disable=tqdm_disable(progress), leave=False)
    while n_pairs < budget:
        if n_pairs >= full_pairs:
            stopped_by = "exhausted"
            break
        a, b, strategy = sched.next_pair(open_pairs)  # never a pair again on a sample: distinct queries only
        key = (a, b) if (a, b) in shared else (b, a)
        if key not in queues:
            queues[key] = [shared[key][k] for k in rng.permutation(len(shared[key]))]
        sample = queues[key].pop()
        if not queues[key]:
            open_pairs[index[a], index[b]] = open_pairs[index[b], index[a]] = False
        n_pairs += 1
        bar.update(1)
        fit = None
        for record in answer(sample, a, b):
            fit = sched.add_record(record, strategy=strategy) or fit
        if fit is not None:
            bar.set_postfix(mean_sigma=f"{fit.mean_sigma:.3f}", refresh=False)
            if on_refit is not None and on_refit(n_pairs, fit):
                stopped_by = "on_refit"
                break
            if sched.converged:
                stopped_by = "sigma_tau"
                break
    bar.close()
    fit = sched.finish()
    if fit is not None:
        if on_refit is not None:
            on_refit(n_pairs, fit)
        if stopped_by == "budget" and sched.converged:
            stopped_by = "sigma_tau"
    cost_fn = cost or getattr(answer, "cost", None)
    tie_threshold = getattr(answer, "tie_threshold", None)  # a reward model's: the verdicts' ties come from it
    meta = {
        "n_models": table.n_models,
        "n_samples": table.n_samples,
        "budget": budget,
        "sigma_tau": config.sigma_tau,
        "policy": sconfig.policy,
        "exploration_rule": sconfig.exploration_rule if sconfig.policy in RULE_POLICIES else None,  # read by none
        "refit_every": sconfig.refit_every,
        "seed": seed,
        "loop_seconds": time.perf_counter() - start,
        **({"tie_threshold": tie_threshold} if tie_threshold is not None else {}),
    }
    return BPARankingReport(
        models,
        sched.fit,
        list(sched.records),
        n_pairs,
        full_pairs,
        stopped_by,
        dict(sched.strategy_counts),
        list(sched.history),
        cost_fn() if cost_fn else {"judge": "custom", "n_queries": n_pairs},
        meta,
        bpa_warnings(sched.records, tie_threshold),
    )
