"""Typed configurations of Bayesian Pairwise Alignment (BPA, E3mo-Bench, "Algorithm Overview" and supp. D).

Three dataclasses, one per stage of BPA:

- `BPAConfig`: the periodic global MAP refit (Rao-Kupper likelihood with tie margin, Crowd-BT reliabilities,
  adaptive quadratic prior) and the empirical-Fisher uncertainty with smoothing, floor and stopping threshold.
- `SchedulerConfig`: online pair scheduling (TrueSkill provisional updates, 50/30/20 exploration / anchor
  calibration / bridge policy, refit period, budget) and percentile initialisation (supp. D.3).
- `CommitteeConfig`: reliability-weighted voting of a judge committee (E3mo-Score, supp. D.5).

Every field carries ``metadata={"help": ...}``; ``__post_init__`` raises ``ValueError`` naming the field.
The paper's hyperparameter tables (supp. tab. 2-3) were lost in extraction; the defaults here are our own,
chosen for the [1, 9] score scale (``benchmarks/benchmark_bpa.py simulation``). See docs/ranking.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args


Optimizer = Literal["L-BFGS-B", "TNC"]
Policy = Literal["bpa", "exploration", "random", "trueskill"]
ExplorationRule = Literal["match_quality", "ranking_variance"]
InitMethod = Literal["percentile", "rank", "midpoint"]
Weighting = Literal["log_odds", "accuracy", "equal"]


def check_literal(owner: str, name: str, value: object, literal: object) -> None:
    """Raise ``ValueError`` naming ``owner.name`` and listing the choices if ``value`` is not in ``literal``."""
    choices = get_args(literal)
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


def _positive(owner: str, name: str, value: float, *, allow_zero: bool = False) -> None:
    if allow_zero and value < 0 or not allow_zero and value <= 0:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{owner}.{name} must be {bound}, got {value!r}")


def _at_least(owner: str, name: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{owner}.{name} must be >= {low}, got {value!r}")


def _open_unit(owner: str, name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{owner}.{name} must lie in (0, 1), got {value!r}")


def _unit(owner: str, name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}.{name} must lie in [0, 1], got {value!r}")


@dataclass
class BPAConfig:
    """Configuration of the global MAP refit and the uncertainty estimate of BPA.

    Source: E3mo-Bench, "Periodic Bayesian Optimization" and "Uncertainty Estimation"; supp. D.4.
    Scores live on the internal [``score_min``, ``score_max``] = [1, 9] scale of the VAD ratings.

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
    delta_init: float = field(
        default=0.5, metadata={"help": "Initial Rao-Kupper tie margin delta (> 0, logit units)."}
    )
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
        default=1.0, metadata={"help": "Base strength lambda_0 of the adaptive quadratic prior toward mu_i^(0)."}
    )
    gamma: float = field(
        default=0.5,
        metadata={"help": "Decay gamma: lambda_i = lambda_0 * (1 + N_i)^(-gamma), N_i = comparisons of i."},
    )
    optimizer: Optimizer = field(
        default="L-BFGS-B", metadata={"help": "Bounded scipy.optimize.minimize method: 'L-BFGS-B' or 'TNC'."}
    )
    max_iter: int = field(default=500, metadata={"help": "Maximum optimiser iterations per MAP refit."})
    tol: float = field(default=1e-8, metadata={"help": "Optimiser tolerance (ftol/gtol for L-BFGS-B)."})
    # uncertainty
    sigma_init: float = field(
        default=2.0, metadata={"help": "Initial (and maximum) candidate uncertainty sigma^(0), score units."}
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
        _positive(name, "slope", self.slope)
        lo, hi = self.delta_bounds
        if not 0.0 < lo < hi:
            raise ValueError(f"{name}.delta_bounds must satisfy 0 < low < high, got {self.delta_bounds!r}")
        if not lo <= self.delta_init <= hi:
            raise ValueError(f"{name}.delta_init must lie in delta_bounds {self.delta_bounds}, got {self.delta_init}")
        _open_unit(name, "eta_init", self.eta_init)
        _positive(name, "xi_bound", self.xi_bound)
        _positive(name, "reliability_prior", self.reliability_prior, allow_zero=True)
        _positive(name, "lambda0", self.lambda0, allow_zero=True)
        _positive(name, "gamma", self.gamma, allow_zero=True)
        check_literal(name, "optimizer", self.optimizer, Optimizer)
        _at_least(name, "max_iter", self.max_iter, 1)
        _positive(name, "tol", self.tol)
        _positive(name, "sigma_init", self.sigma_init)
        _positive(name, "sigma_min", self.sigma_min)
        if self.sigma_min > self.sigma_init:
            raise ValueError(f"{name}.sigma_min must be <= sigma_init, got {self.sigma_min} > {self.sigma_init}")
        _unit(name, "rho", self.rho)
        _positive(name, "sigma_tau", self.sigma_tau)


PAPER_SCHEDULING: dict[str, str] = {"policy": "bpa", "exploration_rule": "match_quality"}
"""The paper's scheduler (E3mo-Bench, "Online Pair Scheduling"): 50/30/20 exploration by TrueSkill match quality /
anchor calibration / bridge pairs. ``SchedulerConfig(**PAPER_SCHEDULING)`` (``emoreward rank --method bpa --policy
paper``). Not the default: it needed more comparisons on the simulation benchmark
(``benchmarks/benchmark_bpa.py simulation``)."""


@dataclass
class SchedulerConfig:
    """Configuration of online pair scheduling and initialisation in BPA.

    The default policy is exploration only by the ranking-variance rule (``emoreward.ranking.bpa.design``), the
    best on the simulation benchmark (``benchmarks/benchmark_bpa.py simulation``); the paper's 50/30/20 scheduler
    is ``SchedulerConfig(**PAPER_SCHEDULING)``.

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
    n_levels: int = field(
        default=4, metadata={"help": "Number of equal-width score levels on [1, 9] that bridge pairs connect."}
    )
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
        for share in ("exploration_share", "anchor_share", "bridge_share"):
            _unit(name, share, getattr(self, share))
        total = self.exploration_share + self.anchor_share + self.bridge_share
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"{name}.exploration_share + anchor_share + bridge_share must be 1, got {total}")
        _at_least(name, "n_levels", self.n_levels, 2)
        _at_least(name, "anchor_neighbours", self.anchor_neighbours, 1)
        _positive(name, "ts_beta", self.ts_beta)
        _positive(name, "ts_tau", self.ts_tau, allow_zero=True)
        _open_unit(name, "ts_draw_probability", self.ts_draw_probability)
        _positive(name, "anchor_sigma", self.anchor_sigma)
        _at_least(name, "refit_every", self.refit_every, 1)
        _at_least(name, "budget", self.budget, 1)
        _at_least(name, "min_comparisons", self.min_comparisons, 0)
        p_lo, p_hi = self.init_percentiles
        if not 0.0 <= p_lo < p_hi <= 100.0:
            raise ValueError(
                f"{name}.init_percentiles must satisfy 0 <= low < high <= 100, got {self.init_percentiles}"
            )
        r_lo, r_hi = self.init_range
        if not r_lo < r_hi:
            raise ValueError(f"{name}.init_range must satisfy low < high, got {self.init_range!r}")


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
        _positive(name, "smoothing", self.smoothing, allow_zero=True)
        _positive(name, "tie_threshold", self.tie_threshold, allow_zero=True)
