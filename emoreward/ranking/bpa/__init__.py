"""Bayesian Pairwise Alignment (BPA, E3mo-Bench): anchor-calibrated scores from sparse pairwise judgements, with the
judge in the loop. Model and MAP refit (`fit_bpa`), scheduling and the loop (`BPAScheduler`, `run_active_ranking`),
initialisation (`initial_scores`), committee voting (`CommitteeJudge`). See docs/ranking.md ("Active ranking (BPA)").
"""

from emoreward.ranking.bpa.committee import (
    CommitteeJudge,
    estimate_judge_weights,
    known_outcome,
    weighted_vote,
    weights_from_agreement,
)
from emoreward.ranking.bpa.config import PAPER_SCHEDULING, RULE_POLICIES, BPAConfig, CommitteeConfig, SchedulerConfig
from emoreward.ranking.bpa.initialization import initial_scores
from emoreward.ranking.bpa.model import (
    BPAFit,
    BPAObjective,
    encode_records,
    fit_bpa,
    rao_kupper_probabilities,
    smooth_uncertainty,
)
from emoreward.ranking.bpa.scheduler import ActiveRankingResult, BPAScheduler, run_active_ranking
from emoreward.ranking.bpa.simulation import SimulatedCrowd, make_items


__all__ = [
    "ActiveRankingResult",
    "BPAConfig",
    "BPAFit",
    "BPAObjective",
    "BPAScheduler",
    "CommitteeConfig",
    "CommitteeJudge",
    "PAPER_SCHEDULING",
    "RULE_POLICIES",
    "SchedulerConfig",
    "SimulatedCrowd",
    "encode_records",
    "estimate_judge_weights",
    "fit_bpa",
    "initial_scores",
    "known_outcome",
    "make_items",
    "rao_kupper_probabilities",
    "run_active_ranking",
    "smooth_uncertainty",
    "weighted_vote",
    "weights_from_agreement",
]
