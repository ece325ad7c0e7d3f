"""Ranking description-generating models from pairwise verdicts: Bradley-Terry (EMER-Ranker eq. 1-4; EmoPrefer
appendix F with ties), bootstrap intervals, hierarchical comparison, and BPA (E3mo-Bench, `emoreward.ranking.bpa`)."""

from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import (
    BTResult,
    fit_binarized_bradley_terry,
    fit_bradley_terry,
    fit_bradley_terry_ties,
)
from emoreward.ranking.counts import PairwiseCounts, check_connected
from emoreward.ranking.hierarchical import rank_hierarchical
from emoreward.ranking.records import PairwiseRecord


__all__ = [
    "BTResult",
    "PairwiseCounts",
    "PairwiseRecord",
    "bootstrap_ci",
    "check_connected",
    "fit_binarized_bradley_terry",
    "fit_bradley_terry",
    "fit_bradley_terry_ties",
    "rank_hierarchical",
]
