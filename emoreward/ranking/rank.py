"""Rank the models that write emotion descriptions, with a judge (EMER-Ranker, section 2 and 4.4).

The sweep: a judge compares the descriptions M models wrote of N samples, every pair of every sample; the verdicts
become win / loss / tie counts W, ranked by Bradley-Terry on the binarized W (EMER-Ranker eq. 1-4) and with ties
(Davidson 1970 by default, EmoPrefer appendix F as the paper's column), with bootstrap intervals over samples. A
reward model scores every description once (cached); a generative judge runs every pair in both orders. The
hierarchical scheme (section 5) is an option; ``--method bpa`` is `emoreward.ranking.active`. See docs/ranking.md.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from emoreward.data.tables import DescriptionTable
from emoreward.ranking.bootstrap import BootstrapCI, bootstrap_ci
from emoreward.ranking.bradley_terry import (
    finite_float,
    fit_binarized_bradley_terry,
    fit_bradley_terry_ties,
)
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.edges import reward_edges
from emoreward.ranking.effects import fit_reward_effects
from emoreward.ranking.fit import FitSpec
from emoreward.ranking.judging import OrderCombine, judge_records
from emoreward.ranking.length_control import ControlledFit, description_features, fit_length_controlled
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.report import RankingReport, ranking_warnings
from emoreward.ranking.score_cache import ScoreCache
from emoreward.ranking.scoring import ScoreMatrix, records_from_scores, score_table, truncation_counts
from emoreward.ranking.tie_models import get_model


if TYPE_CHECKING:
    from emoreward.evaluation.judge import Judge
    from emoreward.models.base import RewardModel


PAPER_TIE_MODEL = "emoprefer"
"""The paper's column (EmoPrefer appendix F), fitted beside the ranking tie model (`FitSpec.model`) when it differs."""


@dataclass
class RankingFits:
    """The fits of one ranking (:func:`fit_ranking`): ``counts`` (W), ``binarized`` (EMER-Ranker eq. 1-4), ``ties``
    (the ranking tie model), ``paper`` (EmoPrefer appendix F, when ``ties`` is another) and ``controlled`` (the
    length-controlled fit, when covariates were given)."""

    counts: PairwiseCounts
    binarized: BootstrapCI
    ties: BootstrapCI
    paper: BootstrapCI | None = None
    controlled: ControlledFit | None = None

    def report(
        self,
        models: Sequence[str],
        lengths: Mapping[str, Any],
        cost: dict[str, Any],
        meta: dict[str, Any],
        *,
        mean_reward: dict[str, float | None] | None = None,
        hierarchical: Any = None,
        **extra: Any,
    ) -> RankingReport:
        """The `RankingReport` of these fits (its ``warnings`` are left to the caller)."""
        return RankingReport(
            list(models),
            self.counts,
            self.binarized,
            self.ties,
            dict(lengths),
            cost,
            mean_reward,
            hierarchical,
            meta,
            paper=self.paper,
            controlled=self.controlled,
            **extra,
        )


def fit_ranking(
    records: Sequence[PairwiseRecord],
    models: Sequence[str],
    fit: FitSpec | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    paper: bool = True,
    progress: bool | None = False,
    features: Mapping[tuple[str, str], np.ndarray] | None = None,
    batched: bool = True,
) -> RankingFits:
    """W counts, EMER-Ranker's binarized Bradley-Terry and Bradley-Terry with ties, all with bootstrap CIs.

    Args:
        records (`Sequence[PairwiseRecord]`): the verdicts.
        models (`Sequence[str]`): the M models (item order of every fit).
        fit (`FitSpec`, *optional*): the tie model object that ranks (the count-table fit and the length-controlled
            one), the prior on log-strengths and the covariates (default ``FitSpec()``: ``DEFAULT_TIE_MODEL``).
        n_boot, alpha, seed, progress, batched: as :func:`bootstrap_ci`.
        paper (`bool`): also fit EmoPrefer's appendix-F model (the paper's column) when ``fit.model`` differs.
        features (`Mapping[tuple[str, str], np.ndarray]`, *optional*): ``(sample, model) -> covariates``
            (`description_features`, names in ``fit.covariates``); with them the length-controlled fit runs too,
            under ``fit.model``.

    Returns:
        `RankingFits` (each ``BootstrapCI.estimate`` is the full-data fit).

    Raises:
        ValueError: on no records, or a disconnected comparison graph.
    """
    fit = FitSpec() if fit is None else fit
    records = list(records)
    if not records:
        raise ValueError("no pairwise records to rank (do the models share samples?)")
    models = list(models)
    counts = PairwiseCounts.from_records(records, models)
    common = {"prior_variance": fit.prior_variance}
    boot_kwargs = {"on_disconnected": "warn", **common}
    # the full-data fits must be connected: check with an error first
    fit_binarized_bradley_terry(counts, **common)
    boot = {"n_boot": n_boot, "alpha": alpha, "seed": seed, "items": models, "progress": progress, "batched": batched}
    fit_bin = partial(fit_binarized_bradley_terry, **boot_kwargs)
    binarized = bootstrap_ci(records, fit_bin, desc="bootstrap BT binarized W", **boot)

    def tie_fit(model) -> BootstrapCI:
        fit_bradley_terry_ties(counts, tie_model=model, **common)
        one = partial(fit_bradley_terry_ties, tie_model=model, **boot_kwargs)
        return bootstrap_ci(records, one, desc=f"bootstrap BT-ties ({model.name})", **boot)

    ties = tie_fit(fit.model)
    paper_model = get_model(PAPER_TIE_MODEL)
    paper_fit = tie_fit(paper_model) if paper and fit.model is not paper_model else None
    controlled = None
    if features is not None:
        with warnings.catch_warnings():  # its notes travel in `ControlledFit.warnings`, printed with the report
            warnings.filterwarnings("ignore", message="length-controlled fit:", category=UserWarning)
            controlled = fit_length_controlled(
                records, features, fit.covariates, fit.model, models, fit.prior_variance, n_boot, alpha, seed, batched
            )
    return RankingFits(counts, binarized, ties, paper_fit, controlled)


def with_features(table: DescriptionTable, fit_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fit_kwargs`` with the table's description covariates (``fit.covariates``), unless ``length_control=False``
    was passed."""
    fit_kwargs = dict(fit_kwargs)
    if fit_kwargs.pop("length_control", True) and "features" not in fit_kwargs:
        fit = fit_kwargs.get("fit") or FitSpec()
        fit_kwargs.update(features=description_features(table.descriptions, fit.covariates)[1])
    return fit_kwargs


def parse_groups(spec: str, models: Sequence[str]) -> list[list[str]]:
    """Groups for the hierarchical scheme: ``"A,B|C,D"`` (explicit) or an integer K (the models, in table order,
    split into K contiguous groups of near-equal size).

    Raises:
        ValueError: on an empty group, an unknown model, fewer than two groups, or groups that do not cover every
            model once (naming the missing or repeated models).
    """
    spec = spec.strip()
    if spec.isdigit():
        k = int(spec)
        if not 2 <= k <= len(models):
            raise ValueError(f"number of groups must be in [2, {len(models)}], got {k}")
        return [list(g) for g in np.array_split(np.array(models, dtype=object), k)]
    groups = [[m.strip() for m in g.split(",") if m.strip()] for g in spec.split("|")]
    empty = [i + 1 for i, g in enumerate(groups) if not g]
    if empty:  # 'A,B|' or 'A||B': a group of no model has no ranking
        raise ValueError(f"group {empty[0]} of {len(groups)} is empty; every group names at least one model")
    flat = [m for g in groups for m in g]
    unknown = sorted(set(flat) - set(models))
    if unknown:
        raise ValueError(f"unknown models in groups: {unknown}; available: {list(models)}")
    repeated = sorted({m for m in flat if flat.count(m) > 1})
    if repeated:
        raise ValueError(f"{repeated} named more than once; groups name every ranked model exactly once")
    missing = [m for m in models if m not in flat]
    if missing:
        raise ValueError(f"groups name every ranked model exactly once: {missing} in no group")
    if len(groups) < 2:
        raise ValueError("the hierarchical scheme needs at least two groups ('A,B|C,D')")
    return groups


def rank_with_reward_model(
    model: RewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    tie_threshold: float | None = None,
    batch_size: int = 32,
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with a reward model: M x N scorings (cached), verdicts from score differences.

    The report adds the fit on the raw rewards (`RewardEffects`) and the per-model count of truncated descriptions.

    Args:
        model (`RewardModel`): the judge, text or multimodal.
        table (`DescriptionTable`): descriptions to rank.
        cache (`ScoreCache`, *optional*): where scores are kept between runs.
        tie_threshold (`float`, *optional*): |r_a - r_b| below this is a tie; default the model's calibrated one.
        batch_size (`int`): sequences per forward pass.
        **fit_kwargs: passed to :func:`fit_ranking` (the bootstrap ones also to `fit_reward_effects`).

    Returns:
        `RankingReport`.
    """
    from emoreward.models.precision import precision_record  # torch-free: a cache rerun imports no torch

    threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
    scores = score_table(model, table, cache, batch_size=batch_size)
    records = records_from_scores(scores, threshold)
    start = time.perf_counter()
    fit_kwargs = with_features(table, fit_kwargs)
    fits = fit_ranking(records, table.models, **fit_kwargs)
    effects = fit_reward_effects(
        scores,
        n_boot=fit_kwargs.get("n_boot", 1000),
        alpha=fit_kwargs.get("alpha", 0.05),
        seed=fit_kwargs.get("seed", 0),
        progress=fit_kwargs.get("progress", False),
        batched=fit_kwargs.get("batched", True),
    )
    cost = {**scoring_cost(scores, records), "fit_seconds": time.perf_counter() - start}
    present = np.isfinite(scores.scores)
    mean_reward = {
        m: finite_float(scores.scores[i][present[i]].mean()) if present[i].any() else None
        for i, m in enumerate(scores.models)
    }
    meta = {
        "tie_threshold": threshold,
        "tie_model": fits.ties.estimate.model,
        "n_samples": table.n_samples,
        "n_models": table.n_models,
        "max_length": getattr(getattr(model, "settings", None), "max_length", None),
        "precision": precision_record(model),  # the dtype every score of this ranking was computed in
    }
    report = fits.report(
        table.models,
        table.lengths(),
        cost,
        meta,
        mean_reward=mean_reward,
        reward_effects=effects,
        n_truncated=truncation_counts(scores),
    )
    report.warnings = ranking_warnings(report) + reward_edges(scores.scores, scores.models)
    return report


def scoring_cost(scores: ScoreMatrix, records: Sequence[PairwiseRecord]) -> dict[str, Any]:
    """What a reward model's verdicts on a table cost (the report's ``cost``). Truncation is no cost: it is the
    report's ``n_truncated``, per model, scored now or cached (`truncation_counts`)."""
    return {
        "judge": "reward-model",
        "n_scorings": int(np.isfinite(scores.scores).sum()),
        "n_scored": scores.n_scored,
        "n_cached": scores.n_cached,
        "scoring_seconds": scores.seconds,
        "n_pair_verdicts": len(records),
        "generative_pair_calls": len(records),
    }


def rank_with_judge(
    judge: Judge,
    table: DescriptionTable,
    swap: bool = True,
    runs: int = 1,
    combine: OrderCombine = "each",
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with a generative judge: every (sample, model pair), both orders, via the harness
    (the hierarchical scheme is the `Hierarchical` method of `emoreward.ranking.methods`).

    Returns:
        `RankingReport` (``cost`` counts judge calls; ``warnings`` from :func:`ranking_warnings`).

    Raises:
        ValueError: on a judge that returns no valid verdicts, or bad options.
    """
    got = judge_records(judge, table, None, swap=swap, runs=runs, combine=combine)
    records, models = got.records, list(table.models)
    fits = fit_ranking(records, models, **with_features(table, fit_kwargs))
    cost = {
        "judge": judge.name,
        "n_judge_calls": got.n_calls,
        "n_reused": got.n_reused,
        "n_invalid": got.n_invalid,
        "n_pairs": got.n_pairs,
        "n_records": len(records),
    }
    lengths = table.lengths()
    meta = {
        "tie_model": fits.ties.estimate.model,
        "n_samples": table.n_samples,
        "n_models": table.n_models,
        "swap": swap,
        "runs": runs,
        "combine": combine,
    }
    report = fits.report(models, lengths, cost, meta)
    report.warnings = ranking_warnings(report)
    return report
