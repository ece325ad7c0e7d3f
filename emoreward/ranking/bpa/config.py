"""Typed configurations of BPA (E3mo-Bench, "Algorithm Overview" and supp. D): `BPAConfig` (global MAP refit and
uncertainty), `SchedulerConfig` (pair scheduling and initialisation), `CommitteeConfig` (committee voting).

The paper's hyperparameter tables (supp. tab. 2-3) were lost in extraction; the defaults are ours, for the [1, 9]
score scale. See docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args


Optimizer = Literal["L-BFGS-B", "TNC"]
Policy = Literal["bpa", "exploration", "random", "trueskill"]
RULE_POLICIES: tuple[str, ...] = ("bpa", "exploration")
"""The policies whose exploration pairs follow `SchedulerConfig.exploration_rule` (``"trueskill"`` explores by match
quality always, ``"random"`` not at all): the scheduler's and every caller's answer to whether the rule is read."""
ExplorationRule = Literal["match_quality", "ranking_variance"]
InitMethod = Literal["percentile", "rank", "midpoint"]
Weighting = Literal["log_odds", "accuracy", "equal"]


def check_literal(owner: str, name: str, value: object, literal: object) -> None:
    """Raise ``ValueError`` naming ``owner.name`` and listing the choices if ``value`` is not in ``literal``."""
    choices = get_args(literal)
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


_BOUNDS: dict[str, Callable[[float], bool]] = {
    "be > 0": lambda v: v > 0,
    "be >= 0": lambda v: v >= 0,
    "be >= 1": lambda v: v >= 1,
    "be >= 2": lambda v: v >= 2,
    "lie in (0, 1)": lambda v: 0.0 < v < 1.0,
    "lie in [0, 1]": lambda v: 0.0 <= v <= 1.0,
}


def _check(config: object, bound: str, *names: str) -> None:
    """Raise ``ValueError`` naming ``Config.field`` for the first of ``names`` whose value does not ``bound``."""
    for name in names:
        value = getattr(config, name)
        if not _BOUNDS[bound](value):
            raise ValueError(f"{type(config).__name__}.{name} must {bound}, got {value!r}")


def check_init_bounds(
    percentiles: tuple[float, float],
    score_range: tuple[float, float],
    names: tuple[str, str] = ("percentiles", "target_range"),
) -> None:
    """Raise ``ValueError`` naming ``names`` unless ``0 <= low < high <= 100`` (percentiles) and ``low < high``."""
    if not 0.0 <= percentiles[0] < percentiles[1] <= 100.0:
        raise ValueError(f"{names[0]} must satisfy 0 <= low < high <= 100, got {percentiles}")
    if not score_range[0] < score_range[1]:
        raise ValueError(f"{names[1]} must satisfy low < high, got {score_range}")


@dataclass
class BPAConfig:
    """Configuration of the global MAP refit and the uncertainty estimate of BPA, on the [1, 9] scale of the VAD
    ratings. Source: E3mo-Bench, "Periodic Bayesian Optimization" and "Uncertainty Estimation"; supp. D.4.

    Raises:
        ValueError: naming the field, for any out-of-range value or unknown ``optimizer``.
    """

    # model
    score_min: float = field(default=1.0, metadata={"help": "Lower bound of candidate scores (paper: 1)."})
    score_max: float = field(default=9.0, metadata={"help": "Upper bound of candidate scores (paper: 9)."})
    slope: float = field(
        default=1.0,
        metadata={
            "help": "Logistic slope s per score unit: Delta_ij = s * (mu_i - mu_j) enters Lambda(Delta -/+ delta)."
        },
    )
    delta_init: float = field(default=0.5, metadata={"help": "Initial Rao-Kupper tie margin delta > 0 (logit units)."})
    delta_bounds: tuple[float, float] = field(
        default=(1e-3, 5.0), metadata={"help": "Box bounds of the tie margin delta during MAP (both > 0)."}
    )
    eta_init: float = field(
        default=0.8, metadata={"help": "Initial Crowd-BT reliability eta_k of every annotator, in (0, 1)."}
    )
    xi_bound: float = field(
        default=8.0, metadata={"help": "eta_k = sigmoid(xi_k); xi_k is box-bounded to [-xi_bound, xi_bound]."}
    )
    reliability_prior: float = field(
        default=0.05,
        metadata={"help": "Strength of the Gaussian prior 0.5*c*(xi_k - logit(eta_init))^2 keeping xi finite (>= 0)."},
    )
    lambda0: float = field(
        default=1.0, metadata={"help": "Strength lambda_0 of the adaptive quadratic prior toward mu_i^(0)."}
    )
    gamma: float = field(
        default=0.5,
        metadata={"help": "Decay gamma: lambda_i = lambda_0 * (1 + N_i)^(-gamma), N_i = comparisons of i."},
    )
    optimizer: Optimizer = field(default="L-BFGS-B", metadata={"help": "Bounded method of scipy.optimize.minimize."})
    max_iter: int = field(default=500, metadata={"help": "Maximum optimiser iterations per MAP refit."})
    tol: float = field(default=1e-8, metadata={"help": "Optimiser tolerance (ftol/gtol for L-BFGS-B)."})
    # uncertainty
    sigma_init: float = field(
        default=2.0, metadata={"help": "Initial (= maximum) uncertainty sigma^(0), score units."}
    )
    sigma_min: float = field(default=0.05, metadata={"help": "Uncertainty floor sigma^min, score units."})
    rho: float = field(
        default=0.7,
        metadata={"help": "Update rate rho in [0, 1]: sigma_new = (1 - rho) * sigma_old + rho * sigma_Fisher."},
    )
    sigma_tau: float = field(
        default=0.3, metadata={"help": "Stop when the mean candidate uncertainty falls below sigma_tau (score units)."}
    )

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not self.score_min < self.score_max:
            raise ValueError(f"{name}.score_min must be < score_max, got {self.score_min} >= {self.score_max}")
        lo, hi = self.delta_bounds
        if not 0.0 < lo < hi:
            raise ValueError(f"{name}.delta_bounds must satisfy 0 < low < high, got {self.delta_bounds!r}")
        if not lo <= self.delta_init <= hi:
            raise ValueError(f"{name}.delta_init must lie in delta_bounds {self.delta_bounds}, got {self.delta_init}")
        check_literal(name, "optimizer", self.optimizer, Optimizer)
        _check(self, "be > 0", "slope", "xi_bound", "tol", "sigma_init", "sigma_min", "sigma_tau")
        _check(self, "be >= 0", "reliability_prior", "lambda0", "gamma")
        _check(self, "be >= 1", "max_iter")
        _check(self, "lie in (0, 1)", "eta_init")
        _check(self, "lie in [0, 1]", "rho")
        if self.sigma_min > self.sigma_init:
            raise ValueError(f"{name}.sigma_min must be <= sigma_init, got {self.sigma_min} > {self.sigma_init}")


PAPER_SCHEDULING: dict[str, str] = {"policy": "bpa", "exploration_rule": "match_quality"}
"""The paper's scheduler (E3mo-Bench, "Online Pair Scheduling"): 50/30/20 exploration by TrueSkill match quality /
anchor calibration / bridge pairs (``emoreward rank --method bpa --policy paper``); not the default (docs/ranking.md)."""


@dataclass
class SchedulerConfig:
    """Configuration of online pair scheduling and initialisation in BPA. The default policy is ours (exploration by
    the ranking-variance rule, the best measured); the paper's is ``SchedulerConfig(**PAPER_SCHEDULING)``.

    Source: E3mo-Bench, "Online Pair Scheduling" (50/30/20 policy after Li et al. 2018, Hybrid-MST); supp. D.2
    (TrueSkill provisional updates, Herbrich et al. 2006) and D.3 (percentile initialisation).

    Raises:
        ValueError: naming the field, for any out-of-range value or unknown ``policy`` / ``init_method``.
    """

    # policy
    policy: Policy = field(
        default="exploration",
        metadata={
            "help": "'bpa': exploration/anchor/bridge at the shares below (paper: 50/30/20); 'exploration': "
            "exploration only, by exploration_rule; 'trueskill': exploration only by TrueSkill match quality (paper "
            "tab. 4, row 1); 'random': uniformly random pairs with at least one candidate (baseline)."
        },
    )
    exploration_rule: ExplorationRule = field(
        default="ranking_variance",
        metadata={
            "help": "How exploration picks a pair. 'match_quality' (paper, supp. D.2): focus candidate drawn "
            "proportional to u^2, partner of highest TrueSkill match quality. 'ranking_variance' (ours, see "
            "emoreward.ranking.bpa.design): the pair whose expected Fisher information most reduces the posterior "
            "variance of the score differences whose order is still in doubt (full Laplace covariance)."
        },
    )
    exploration_share: float = field(default=0.5, metadata={"help": "Share of exploration pairs (paper: 0.5)."})
    anchor_share: float = field(default=0.3, metadata={"help": "Share of anchor-calibration pairs (paper: 0.3)."})
    bridge_share: float = field(default=0.2, metadata={"help": "Share of bridge pairs (paper: 0.2)."})
    n_levels: int = field(default=4, metadata={"help": "Equal-width score levels on [1, 9] that bridge pairs join."})
    anchor_neighbours: int = field(
        default=2, metadata={"help": "Anchor calibration draws among this many anchors nearest to the candidate."}
    )
    # TrueSkill provisional state
    ts_beta: float = field(default=1.0, metadata={"help": "TrueSkill performance noise beta_TS, score units."})
    ts_tau: float = field(default=0.0, metadata={"help": "TrueSkill dynamics factor tau (0: static scores)."})
    ts_draw_probability: float = field(
        default=0.15, metadata={"help": "TrueSkill draw probability, which sets the draw margin epsilon."}
    )
    anchor_sigma: float = field(
        default=0.01, metadata={"help": "Near-zero TrueSkill uncertainty of golden anchors, score units."}
    )
    # loop
    refit_every: int = field(default=50, metadata={"help": "Global MAP refit after this many new comparisons."})
    budget: int = field(default=2000, metadata={"help": "Maximum number of comparisons to dispatch."})
    min_comparisons: int = field(
        default=0, metadata={"help": "Never stop on sigma_tau before this many comparisons have been collected."}
    )
    # initialisation (supp. D.3)
    init_method: InitMethod = field(
        default="percentile",
        metadata={
            "help": "'percentile': clip preliminary values at init_percentiles and map linearly to init_range; "
            "'rank': map mid-ranks uniformly onto init_range; 'midpoint': every candidate starts mid-scale."
        },
    )
    init_percentiles: tuple[float, float] = field(
        default=(5.0, 95.0), metadata={"help": "Lower/upper percentiles (0-100) at which preliminary values clip."}
    )
    init_range: tuple[float, float] = field(
        default=(2.0, 8.0), metadata={"help": "Score interval that the clipped percentile range maps onto."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the scheduler's random generator."})

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_literal(name, "policy", self.policy, Policy)
        check_literal(name, "exploration_rule", self.exploration_rule, ExplorationRule)
        check_literal(name, "init_method", self.init_method, InitMethod)
        _check(self, "lie in [0, 1]", "exploration_share", "anchor_share", "bridge_share")
        total = self.exploration_share + self.anchor_share + self.bridge_share
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"{name}.exploration_share + anchor_share + bridge_share must be 1, got {total}")
        _check(self, "be >= 2", "n_levels")
        _check(self, "be >= 1", "anchor_neighbours", "refit_every", "budget")
        _check(self, "be > 0", "ts_beta", "anchor_sigma")
        _check(self, "be >= 0", "ts_tau", "min_comparisons")
        _check(self, "lie in (0, 1)", "ts_draw_probability")
        check_init_bounds(self.init_percentiles, self.init_range, (f"{name}.init_percentiles", f"{name}.init_range"))


@dataclass
class CommitteeConfig:
    """Configuration of reliability-weighted committee voting (E3mo-Score, supp. D.5).

    Raises:
        ValueError: naming the field, for an unknown ``weighting`` or a negative smoothing / tie threshold.
    """

    weighting: Weighting = field(
        default="log_odds",
        metadata={
            "help": "'log_odds': w = log(acc * (C - 1) / (1 - acc)) clipped at 0 (optimal weighted majority for "
            "independent judges, C = 3 outcomes); 'accuracy': w = calibration accuracy; 'equal': w = 1."
        },
    )
    smoothing: float = field(
        default=1.0, metadata={"help": "Additive (Laplace) pseudo-count on calibration correct / incorrect counts."}
    )
    tie_threshold: float = field(
        default=0.5,
        metadata={"help": "A calibration pair of anchors is a known tie when |score_a - score_b| <= tie_threshold."},
    )

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_literal(name, "weighting", self.weighting, Weighting)
        _check(self, "be >= 0", "smoothing", "tie_threshold")
