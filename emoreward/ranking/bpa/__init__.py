"""Bayesian Pairwise Alignment (BPA) from E3mo-Bench: anchor-calibrated scores from sparse pairwise judgements.

Pieces, in data-flow order:

- `PairwiseRecord` lists from the evaluation harness (or a simulated crowd);
- `initial_scores`: percentile initialisation from preliminary estimates (supp. D.3);
- `BPAScheduler` / `run_active_ranking`: TrueSkill provisional updates and the 50/30/20 exploration / anchor /
  bridge policy (supp. D.2), periodic global refits, stopping on mean uncertainty;
- `fit_bpa`: MAP of the Rao-Kupper + Crowd-BT model with fixed anchors and an adaptive prior, plus the
  empirical-Fisher uncertainty;
- `CommitteeJudge`: reliability-weighted voting of several judges (E3mo-Score, supp. D.5).
"""

from emoreward.ranking.bpa.committee import (
    CommitteeJudge,
    estimate_judge_weights,
    known_outcome,
    weighted_vote,
    weights_from_agreement,
)
from emoreward.ranking.bpa.config import PAPER_SCHEDULING, BPAConfig, CommitteeConfig, SchedulerConfig
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
