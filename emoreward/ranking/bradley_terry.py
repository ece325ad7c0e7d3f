"""Bradley-Terry ranking of models from pairwise judgements, with and without ties.

- :func:`fit_bradley_terry`: Bradley-Terry on win counts, or on EMER-Ranker's binarized matrix W
  (EMER-Ranker, section 2, eq. 1-4; :func:`fit_binarized_bradley_terry` does both steps).
- :func:`fit_bradley_terry_ties`: tie-aware models on win/loss/tie counts: EmoPrefer's additive form
  (EmoPrefer, appendix F, eq. 2-3), Rao-Kupper (1967) and Davidson (1970).
- :func:`bootstrap_ci`: percentile confidence intervals by resampling samples (videos) with replacement.
- :func:`rank_hierarchical`: EMER-Ranker's hierarchical comparison (section 5).

All fits are maximum a-posteriori estimates of the log-strengths ``s_i = log(theta_i)`` under a weak isotropic
Gaussian prior ``s_i ~ N(0, prior_variance)`` (default variance 10, i.e. a strength ratio of e^sqrt(10) ~ 24 is
one prior standard deviation), so that an undefeated or winless item keeps a finite score. The papers use the
plain maximum-likelihood estimate, which is infinite in that case. Every optimisation is
``scipy.optimize.minimize(method="L-BFGS-B")`` with the analytic gradient, over centred log-strengths with a
diagonal preconditioner (see ``_minimize``; neither moves the optimum); bootstrap refits start from the full-data
fit. Reported scores are log-strengths centred to mean 0 (natural-log units: ``exp(s_i - s_j)`` is the odds of
``i`` beating ``j`` under Bradley-Terry).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from scipy.optimize import minimize
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.special import expit

from emoreward.data.text import markdown_cell
from emoreward.ranking.counts import (
    EqualCounts,
    OnDisconnected,
    PairwiseCounts,
    check_connected,
    encode_records,
)
from emoreward.ranking.records import PairwiseRecord


TieModel = Literal["emoprefer", "rao-kupper", "davidson"]
TIE_MODELS: tuple[str, ...] = ("emoprefer", "rao-kupper", "davidson")
TieHandling = Literal["drop", "half"]
TIE_HANDLING: tuple[str, ...] = ("drop", "half")

DEFAULT_PRIOR_VARIANCE = 10.0
# Scores closer than this (natural-log strength units, a strength ratio of 1.000001) are equal: a shared rank. The
# fits stop at a tight tolerance, so items the data cannot separate land within ~1e-8 of each other, not exactly.
SCORE_TOLERANCE = 1e-6
# Bounds on the tie log-parameter keep the fit finite when a data set (or bootstrap resample) has no ties.
_TIE_LOG_BOUNDS = (-30.0, 30.0)
_OPTIONS = {"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-8}

FitFn = Callable[[PairwiseCounts], "BTResult"]
RecordsFn = Callable[[list[tuple[str, str]]], Iterable[PairwiseRecord]]


@dataclass(frozen=True)
class BTResult:
    """A fitted Bradley-Terry (or tie-aware) model.

    Attributes:
        items (`list[str]`): the M items, in the order of ``scores``.
        scores (`np.ndarray` of shape `(M,)`): log-strengths ``log(theta_i)``, centred to mean 0 (natural log).
        model (`str`): ``"bradley-terry"``, ``"emoprefer"``, ``"rao-kupper"`` or ``"davidson"``.
        log_likelihood (`float`): data log-likelihood (natural log, prior excluded) at the fitted parameters.
        n_comparisons (`float`): comparisons in the likelihood (one per compared pair for a binarized W).
        tie_parameter (`float` or `None`): EmoPrefer's ``beta`` on the centred scale (``theta_i = exp(score_i)``),
            Rao-Kupper's ``nu >= 1`` or Davidson's ``nu > 0``; ``None`` for plain Bradley-Terry.
        prior_variance (`float` or `None`): variance of the Gaussian prior on log-strengths; ``None`` for MLE.
        ci_lower, ci_upper (`np.ndarray` of shape `(M,)` or `None`): bootstrap percentile interval of ``scores``.
        ci_level (`float` or `None`): coverage of that interval, e.g. 0.95.
        ranking (`list[str]`): items sorted by score, best first; items with equal scores (within
            ``SCORE_TOLERANCE``) share a rank and are listed by name, never by their position in ``items``.
        ranks (`list[int]`): the rank of every item of ``ranking`` (same order), shared by equal scores
            (standard competition ranking "1, 2, 2, 4").
    """

    items: list[str]
    scores: np.ndarray
    model: str
    log_likelihood: float
    n_comparisons: float
    tie_parameter: float | None = None
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    ci_lower: np.ndarray | None = None
    ci_upper: np.ndarray | None = None
    ci_level: float | None = None
    ranking: list[str] = field(init=False)
    ranks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, dtype=float)
        if scores.shape != (len(self.items),):
            raise ValueError(f"BTResult.scores must have shape ({len(self.items)},), got {scores.shape}")
        object.__setattr__(self, "scores", scores)
        groups = equal_score_groups(self.items, scores)
        object.__setattr__(self, "ranking", [name for g in groups for name in g])
        ranks, position = [], 1
        for g in groups:
            ranks += [position] * len(g)
            position += len(g)
        object.__setattr__(self, "ranks", ranks)

    def rank(self, item: str) -> int:
        """The (shared) rank of ``item``, 1 = best; raises ValueError for an unknown item."""
        if item not in self.items:
            raise ValueError(f"unknown item {item!r}; available: {self.items}")
        return self.ranks[self.ranking.index(item)]

    def tied_groups(self) -> list[list[str]]:
        """Groups of two or more items whose scores are equal (within ``SCORE_TOLERANCE``), best first."""
        return [g for g in equal_score_groups(self.items, self.scores) if len(g) > 1]

    def score(self, item: str) -> float:
        """The centred log-strength of ``item``; raises ValueError for an unknown item."""
        if item not in self.items:
            raise ValueError(f"unknown item {item!r}; available: {self.items}")
        return float(self.scores[self.items.index(item)])

    def with_ci(self, ci: BootstrapCI) -> BTResult:
        """A copy with the bootstrap interval of ``ci`` attached; raises ValueError if the items differ."""
        if list(ci.items) != list(self.items):
            raise ValueError(f"bootstrap items {ci.items} differ from result items {self.items}")
        return replace(self, ci_lower=ci.lower.copy(), ci_upper=ci.upper.copy(), ci_level=1.0 - ci.alpha)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (plain floats, lists and ``None``; non-finite numbers become ``None``)."""
        return {
            "model": self.model,
            "items": list(self.items),
            "scores": _floats(self.scores),
            "ranking": list(self.ranking),
            "ranks": list(self.ranks),
            "tie_parameter": _float(self.tie_parameter),
            "log_likelihood": _float(self.log_likelihood),
            "n_comparisons": _float(self.n_comparisons),
            "prior_variance": _float(self.prior_variance),
            "ci_lower": None if self.ci_lower is None else _floats(self.ci_lower),
            "ci_upper": None if self.ci_upper is None else _floats(self.ci_upper),
            "ci_level": _float(self.ci_level),
        }

    def to_markdown(self, digits: int = 3) -> str:
        """Markdown table, best first: rank, item, score and (when present) the bootstrap interval."""
        has_ci = self.ci_lower is not None and self.ci_upper is not None
        ci_head = f" {100 * (self.ci_level or 0):g}% CI |" if has_ci else ""
        lines = [f"| rank | item | score |{ci_head}", "|---:|---|---:|" + ("---|" if has_ci else "")]
        for rank, item in zip(self.ranks, self.ranking):
            k = self.items.index(item)
            row = f"| {rank} | {markdown_cell(item)} | {self.scores[k]:.{digits}f} |"
            if has_ci:
                row += f" [{self.ci_lower[k]:.{digits}f}, {self.ci_upper[k]:.{digits}f}] |"
            lines.append(row)
        caption = (
            f"{self.model}; n_comparisons={self.n_comparisons:g}; log-likelihood={self.log_likelihood:.{digits}f}"
        )
        if self.tie_parameter is not None:
            caption += f"; tie parameter={self.tie_parameter:.{digits}f}"
        return "\n".join(lines) + f"\n\n{caption}\n"


@dataclass(frozen=True)
class BootstrapCI:
    """Bootstrap distribution of fitted scores and the percentile intervals drawn from it.

    Attributes:
        items (`list[str]`): the M items, column order of ``scores``.
        lower, upper (`np.ndarray` of shape `(M,)`): percentile interval ``[alpha/2, 1 - alpha/2]`` per item,
            over the resamples in which the item was compared (NaN if it never was); always contains the estimate
            (see ``widened``).
        scores (`np.ndarray` of shape `(n_boot, M)`): the fitted scores of every resample, NaN where the item was
            not compared in that resample (its score there is the prior's, not the data's).
        alpha (`float`): 1 - coverage.
        n_units (`int`): number of resampled units (samples, or records when there are no samples).
        estimate (`BTResult`): the fit on all records, with this interval attached.
        n_compared (`np.ndarray` of shape `(M,)`, int): resamples in which the item was compared (its interval
            rests on these).
        unit_counts (`np.ndarray` of shape `(M,)`, int): units (samples) on which the item was compared in the
            full data.
        widened (`np.ndarray` of shape `(M,)`, bool): the percentile interval excluded the estimate and was
            extended to it (reported as a warning; see :func:`bootstrap_ci`).
        n_disconnected (`int`): resamples whose comparison graph (over the items compared there) was disconnected.
    """

    items: list[str]
    lower: np.ndarray
    upper: np.ndarray
    scores: np.ndarray
    alpha: float
    n_units: int
    estimate: BTResult
    n_compared: np.ndarray = None  # type: ignore[assignment]
    unit_counts: np.ndarray = None  # type: ignore[assignment]
    widened: np.ndarray = None  # type: ignore[assignment]
    n_disconnected: int = 0

    def __post_init__(self) -> None:
        m, n_boot = len(self.items), self.scores.shape[0]
        if self.n_compared is None:
            object.__setattr__(self, "n_compared", np.full(m, n_boot, dtype=np.int64))
        if self.unit_counts is None:
            object.__setattr__(self, "unit_counts", np.full(m, self.n_units, dtype=np.int64))
        if self.widened is None:
            object.__setattr__(self, "widened", np.zeros(m, dtype=bool))

    @property
    def n_boot(self) -> int:
        """Number of resamples."""
        return int(self.scores.shape[0])

    @property
    def at_edge(self) -> np.ndarray:
        """`np.ndarray` of shape `(M,)`, bool: the estimate is an end of a non-degenerate interval.

        This happens when the bootstrap distribution sits on one side of the estimate, e.g. for EMER-Ranker's
        binarized W: a model that wins (or loses) all its pairs there can only lose (or win) some in a resample.
        """
        est = self.estimate.scores
        wide = self.upper - self.lower > SCORE_TOLERANCE
        return wide & ((np.abs(est - self.lower) <= SCORE_TOLERANCE) | (np.abs(est - self.upper) <= SCORE_TOLERANCE))

    def sparse_items(self, min_units: int = 10) -> list[str]:
        """Items with few comparisons: compared on fewer than ``min_units`` units, or absent from some resamples
        (their interval then rests on fewer than ``n_boot`` resamples)."""
        return [
            name
            for k, name in enumerate(self.items)
            if self.unit_counts[k] < min_units or self.n_compared[k] < self.n_boot
        ]


def equal_score_groups(items: Sequence[str], scores: np.ndarray, tol: float = SCORE_TOLERANCE) -> list[list[str]]:
    """Items grouped by equal score, best group first; within a group, items by name.

    Scores are sorted in decreasing order and a new group starts wherever the gap to the previous score exceeds
    ``tol``, so items the data cannot separate share a group whatever their order in ``items``.

    Args:
        items (`Sequence[str]`): the M items.
        scores (`np.ndarray` of shape `(M,)`): their scores (NaN sorts last, each NaN its own group).
        tol (`float`): largest gap between neighbouring scores of one group.

    Returns:
        `list[list[str]]`: the groups, covering every item once.
    """
    scores = np.asarray(scores, dtype=float)
    key = np.where(np.isfinite(scores), -scores, np.inf)
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    with np.errstate(invalid="ignore"):  # inf - inf between two NaN scores
        # a new group where the gap exceeds tol, and at every non-finite score (each NaN its own group)
        breaks = (np.flatnonzero(~(np.diff(ordered) <= tol) | ~np.isfinite(ordered[1:])) + 1).tolist()
    order = order.tolist()
    bounds = [0, *breaks, len(order)]
    groups = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    return [[items[g[0]]] if len(g) == 1 else sorted(items[k] for k in g) for g in groups]


# ----------------------------------------------------------------------------------------------- likelihoods


def _pairs(counts: PairwiseCounts) -> tuple[np.ndarray, ...]:
    """Compared unordered pairs ``i < j`` with their wins of i, wins of j and ties, each of shape `(P,)`."""
    i, j = _upper_pairs(counts.n_items)
    keep = counts.totals[i, j] > 0
    i, j = i[keep], j[keep]
    return i, j, counts.wins[i, j], counts.wins[j, i], counts.ties[i, j]


@functools.lru_cache(maxsize=8)
def _upper_pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(m, k=1)``, cached (read-only) because every bootstrap refit needs it."""
    i, j = np.triu_indices(m, k=1)
    i.flags.writeable = False
    j.flags.writeable = False
    return i, j


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _softplus_expit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``softplus(x) = log(1 + e^x)`` and ``expit(x) = 1 / (1 + e^-x)``, stably, from one ``exp(-|x|)``.

    Several times faster than ``np.logaddexp(0, x)`` plus ``scipy.special.expit``, and as accurate (to a few ulp).
    """
    e = np.exp(-np.abs(x))
    return np.maximum(x, 0.0) + np.log1p(e), np.where(x >= 0, 1.0, e) / (1.0 + e)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a * b)`` without BLAS (whose threads, when not limited, spin on a loaded machine)."""
    return float(np.sum(a * b))


def _bt_nll(s: np.ndarray, i: np.ndarray, j: np.ndarray, w: np.ndarray, lo: np.ndarray) -> tuple[float, np.ndarray]:
    """Bradley-Terry negative log-likelihood and gradient in log-strengths (EMER-Ranker, eq. 4).

    With ``d = s_i - s_j`` and ``softplus(-d) = softplus(d) - d``: ``nll = sum(w softplus(-d) + lo softplus(d))
    = sum((w + lo) softplus(d) - w d)`` and ``d nll / d d = (w + lo) expit(d) - w``.
    """
    d = s[i] - s[j]
    n = w + lo
    sp, sig = _softplus_expit(d)
    nll = _dot(n, sp) - _dot(w, d)
    g = n * sig - w
    m = s.shape[0]
    return nll, np.bincount(i, g, m) - np.bincount(j, g, m)


def _tie_nll(
    model: str, x: np.ndarray, i: np.ndarray, j: np.ndarray, w: np.ndarray, lo: np.ndarray, t: np.ndarray
) -> tuple[float, np.ndarray]:
    """Negative log-likelihood and gradient of a tie model in ``x = [log theta (M), eta]``.

    - emoprefer: P(i>j), P(j>i), P(tie) proportional to theta_i, theta_j, beta, with ``beta = exp(eta)``.
    - davidson: proportional to theta_i, theta_j, nu * sqrt(theta_i theta_j), with ``nu = exp(eta)``; dividing by
      sqrt(theta_i theta_j) leaves logits ``d/2, -d/2, eta`` with ``d = s_i - s_j``.
    - rao-kupper: P(i>j) = theta_i / (theta_i + nu theta_j), P(tie) = 1 - P(i>j) - P(j>i), ``nu = 1 + exp(eta)``.

    The three-way log-sum-exp is written out (max shift, three ``exp``, one ``log``) rather than calling
    ``scipy.special.logsumexp`` on a stacked array, which was most of the cost of a fit.
    """
    s, eta = x[:-1], float(x[-1])
    m = s.shape[0]
    grad = np.empty_like(x)
    n = w + lo + t
    n_ties = float(t.sum())
    if model in ("emoprefer", "davidson"):
        if model == "davidson":
            z0 = 0.5 * (s[i] - s[j])
            z1 = -z0
        else:
            z0, z1 = s[i], s[j]
        top = np.maximum(np.maximum(z0, z1), eta)
        e0, e1, e2 = np.exp(z0 - top), np.exp(z1 - top), np.exp(eta - top)
        total = e0 + e1 + e2
        lse = top + np.log(total)
        nll = _dot(n, lse) - _dot(w, z0) - _dot(lo, z1) - eta * n_ties
        r = n / total
        g0, g1 = r * e0 - w, r * e1 - lo  # d nll / d logits of win and loss
        if model == "davidson":
            gd = 0.5 * (g0 - g1)
            grad[:m] = np.bincount(i, gd, m) - np.bincount(j, gd, m)
        else:
            grad[:m] = np.bincount(i, g0, m) + np.bincount(j, g1, m)
        grad[-1] = _dot(r, e2) - n_ties
        return nll, grad
    # rao-kupper: log P(i>j) = -softplus(a - d), log P(j>i) = -softplus(a + d), P(tie) = (nu^2 - 1) P(i>j) P(j>i)
    a = float(_softplus(eta))  # log nu
    log_nu2m1 = eta + float(np.logaddexp(math.log(2.0), eta))  # log(nu^2 - 1)
    d = s[i] - s[j]
    wt, lt = w + t, lo + t
    sp_w, sw = _softplus_expit(a - d)
    sp_l, sl = _softplus_expit(a + d)
    nll = _dot(wt, sp_w) + _dot(lt, sp_l) - n_ties * log_nu2m1
    gd = lt * sl - wt * sw
    grad[:m] = np.bincount(i, gd, m) - np.bincount(j, gd, m)
    grad[-1] = (_dot(wt, sw) + _dot(lt, sl)) * float(expit(eta)) - n_ties * (1.0 + float(expit(eta - math.log(2.0))))
    return nll, grad


def _minimize(
    fun: Callable,
    x0: np.ndarray,
    bounds: list | None,
    what: str,
    scale: float,
    n_scores: int | None = None,
    curvature: np.ndarray | None = None,
) -> np.ndarray:
    """L-BFGS-B with the analytic gradient; warns unless the solution is a stationary point.

    L-BFGS-B can stop with "ABNORMAL" when the objective is flat to machine precision at the optimum, so
    convergence is judged on the projected gradient, relative to ``scale`` (the number of comparisons).

    Two changes of variable speed it up without moving the optimum (``x = T(y)``, minimised over ``y``):

    - ``n_scores``: the first ``n_scores`` coordinates (the log-strengths) are kept centred to mean 0. The
      likelihoods depend on differences of log-strengths only (EmoPrefer's on ``s`` and ``log beta`` shifted
      together), so with the prior ``N(0, v)`` the optimum is centred anyway; without it the centred optimum is the
      one reported. This removes the flat direction ``s + c`` (curvature ``1 / v``, thousands of times smaller
      than the rest), which made L-BFGS-B take many more iterations.
    - ``curvature``: a positive estimate of the diagonal of the Hessian; ``x = y / sqrt(curvature)`` (diagonal
      preconditioning), so that strengths compared often and the tie parameter (curvature ~ the number of
      comparisons) are on one scale.
    """
    m = x0.shape[0]
    c = np.ones(m) if curvature is None else 1.0 / np.sqrt(curvature)
    k = 0 if n_scores is None else n_scores

    def to_x(y: np.ndarray) -> np.ndarray:
        x = y * c
        if k:
            x[:k] -= x[:k].mean()
        return x

    def fun_y(y: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = fun(to_x(y))
        g = np.array(g, dtype=float)
        if k:
            g[:k] -= g[:k].mean()
        return f, g * c

    start = np.array(x0, dtype=float)
    if k:
        start[:k] -= start[:k].mean()
    y_bounds = None
    if bounds is not None:
        y_bounds = [
            (None if lo is None else lo / c[n], None if hi is None else hi / c[n]) for n, (lo, hi) in enumerate(bounds)
        ]
    with _single_blas_thread():
        res = minimize(fun_y, start / c, jac=True, method="L-BFGS-B", bounds=y_bounds, options=_OPTIONS)
    x = to_x(res.x)
    if not res.success:
        grad = np.array(res.jac, dtype=float) / c
        if bounds is not None:
            lo = np.array([-np.inf if b[0] is None else b[0] for b in bounds])
            hi = np.array([np.inf if b[1] is None else b[1] for b in bounds])
            grad[((x <= lo) & (grad > 0)) | ((x >= hi) & (grad < 0))] = 0.0
        if np.max(np.abs(grad)) > 1e-6 * (1.0 + scale):
            warnings.warn(f"{what}: L-BFGS-B did not converge ({res.message})", RuntimeWarning, stacklevel=3)
    return x


def _score_curvature(s: np.ndarray, i: np.ndarray, j: np.ndarray, n: np.ndarray, precision: float) -> np.ndarray:
    """Diagonal of the Bradley-Terry Hessian at ``s`` for ``n`` comparisons per pair, plus the prior precision."""
    e = np.exp(-np.abs(s[i] - s[j]))
    v = n * e / (1.0 + e) ** 2  # n expit(d) expit(-d)
    h = np.bincount(i, v, s.shape[0]) + np.bincount(j, v, s.shape[0]) + precision
    return np.where(h > 0, h, 1.0)


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:  # threadpoolctl comes with scikit-learn; without it the fits are only slower on a busy machine
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def _single_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread for a tiny optimisation.

    L-BFGS-B's small BLAS calls gain nothing from threads, and on a loaded machine OpenBLAS's spinning threads
    made a 1000-resample bootstrap about 10x slower (measured on 2 cores).
    """
    controller = _blas_controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1)


def _check_prior(prior_variance: float | None) -> float:
    """Precision of the prior (0 for none)."""
    if prior_variance is None:
        return 0.0
    if not (prior_variance > 0 and math.isfinite(prior_variance)):
        raise ValueError(f"prior_variance must be a positive finite number or None, got {prior_variance!r}")
    return 1.0 / prior_variance


# ------------------------------------------------------------------------------------------------------ fits


def fit_bradley_terry(
    counts: PairwiseCounts,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    ties: TieHandling = "drop",
    on_disconnected: OnDisconnected = "error",
    initial_scores: np.ndarray | None = None,
) -> BTResult:
    """Fit Bradley-Terry strengths to win counts (EMER-Ranker, section 2, eq. 2-4; Hunter 2004).

    ``P(i beats j) = theta_i / (theta_i + theta_j)``; the negative log-likelihood is
    ``-sum_{i != j} wins[i, j] * log P(i beats j)`` (eq. 4 when ``wins`` is the binarized W, see
    :meth:`PairwiseCounts.binarized` and :func:`fit_binarized_bradley_terry`; raw counts give the usual
    count-based Bradley-Terry). A Gaussian prior ``N(0, prior_variance)`` on ``s = log(theta)`` makes it a MAP
    estimate that stays finite for undefeated items; the papers' plain MLE is ``prior_variance=None`` (then the
    comparison graph should be strongly connected or the fit diverges). Minimised with L-BFGS-B and the analytic
    gradient; the result equals ``choix.opt_pairwise(..., alpha=1 / (2 * prior_variance))`` up to centring.

    Args:
        counts (`PairwiseCounts`): M items, ``wins`` of shape `(M, M)` (counts or W in {0, 0.5, 1}).
        prior_variance (`float` or `None`): variance of the prior on log-strengths (natural-log units).
        ties (`Literal["drop", "half"]`): ties are not in the Bradley-Terry model; ``"drop"`` ignores them,
            ``"half"`` counts each tie as half a win for both sides. Use :func:`fit_bradley_terry_ties` to model them.
        on_disconnected (`Literal["error", "warn"]`): what to do if the comparison graph used is disconnected.
        initial_scores (`np.ndarray` of shape `(M,)`, *optional*): starting log-strengths (warm start).

    Returns:
        `BTResult` with ``model="bradley-terry"``, scores of shape `(M,)` centred to mean 0 and
        ``tie_parameter=None``.

    Raises:
        ValueError: on a disconnected comparison graph (``on_disconnected="error"``), a non-positive
            ``prior_variance``, an unknown ``ties`` choice, or ``initial_scores`` of the wrong shape.
    """
    if ties not in TIE_HANDLING:
        raise ValueError(f"ties must be one of {TIE_HANDLING}, got {ties!r}")
    precision = _check_prior(prior_variance)
    wins = counts.wins + 0.5 * counts.ties if ties == "half" else counts.wins
    used = PairwiseCounts(counts.items, wins, np.zeros_like(counts.ties))
    check_connected(used, on_disconnected)
    i, j, w, lo, _ = _pairs(used)
    m = counts.n_items

    def fun(s: np.ndarray) -> tuple[float, np.ndarray]:
        nll, grad = _bt_nll(s, i, j, w, lo)
        return nll + 0.5 * precision * float(s @ s), grad + precision * s

    x0 = _initial(initial_scores, m)
    curvature = _score_curvature(x0, i, j, w + lo, precision)
    s = _minimize(fun, x0, None, "fit_bradley_terry", float(w.sum() + lo.sum()), n_scores=m, curvature=curvature)
    s = s - s.mean()
    return BTResult(
        items=list(counts.items),
        scores=s,
        model="bradley-terry",
        log_likelihood=-_bt_nll(s, i, j, w, lo)[0],
        n_comparisons=float(w.sum() + lo.sum()),
        tie_parameter=None,
        prior_variance=prior_variance,
    )


def fit_binarized_bradley_terry(counts: PairwiseCounts, equal: EqualCounts = "half", **kwargs: Any) -> BTResult:
    """EMER-Ranker end to end: binarize the counts into W (section 2, eq. 1), then Bradley-Terry on W (eq. 2-4).

    Args:
        counts (`PairwiseCounts`): raw win/tie counts over M items.
        equal (`Literal["half", "drop"]`): treatment of pairs with equal win counts, see
            :meth:`PairwiseCounts.binarized`.
        **kwargs: passed to :func:`fit_bradley_terry` (``prior_variance``, ``on_disconnected``, ...).

    Returns:
        `BTResult` (``n_comparisons`` is the number of compared pairs kept in W).

    Raises:
        ValueError: as :meth:`PairwiseCounts.binarized` and :func:`fit_bradley_terry`.
    """
    return fit_bradley_terry(counts.binarized(equal), **kwargs)


def fit_bradley_terry_ties(
    counts: PairwiseCounts,
    tie_model: TieModel = "emoprefer",
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    on_disconnected: OnDisconnected = "error",
    initial_scores: np.ndarray | None = None,
    initial_tie_parameter: float | None = None,
) -> BTResult:
    """Fit strengths and a tie parameter jointly to win/loss/tie counts.

    With ``theta_i = exp(s_i)``:

    - ``"emoprefer"`` (EmoPrefer, appendix F, eq. 2-3; an additive Rao-Kupper-type form):
      ``P(i>j) = theta_i / (theta_i + theta_j + beta)``, ``P(tie) = beta / (theta_i + theta_j + beta)``, ``beta > 0``.
      ``beta`` has the units of ``theta``: it is reported on the centred scale (mean log-strength 0), so
      ``P(tie)`` between two average items is ``beta / (2 + beta)``.
    - ``"rao-kupper"`` (Rao & Kupper 1967): ``P(i>j) = theta_i / (theta_i + nu * theta_j)``,
      ``P(tie) = (nu^2 - 1) theta_i theta_j / ((theta_i + nu theta_j)(theta_j + nu theta_i))``, ``nu >= 1``.
    - ``"davidson"`` (Davidson 1970): ``P(i>j) = theta_i / (theta_i + theta_j + nu sqrt(theta_i theta_j))``,
      ``P(tie) = nu sqrt(theta_i theta_j) / (...)``, ``nu > 0``.

    The log-strengths and the log tie parameter (``log beta``, ``log(nu - 1)``, ``log nu``) are optimised
    together with L-BFGS-B and the analytic gradient; the prior ``N(0, prior_variance)`` is on the log-strengths
    only, and the tie log-parameter is bounded to [-30, 30] so data without ties still give a finite fit.

    Args:
        counts (`PairwiseCounts`): M items; ``wins`` (win_ij, and lose_ij = wins[j, i]) and ``ties`` (tie_ij).
        tie_model (`Literal["emoprefer", "rao-kupper", "davidson"]`): the tie model.
        prior_variance (`float` or `None`): variance of the prior on log-strengths; ``None`` for plain MLE.
        on_disconnected (`Literal["error", "warn"]`): what to do if the comparison graph is disconnected.
        initial_scores (`np.ndarray` of shape `(M,)`, *optional*): starting log-strengths (warm start).
        initial_tie_parameter (`float`, *optional*): starting ``beta`` or ``nu``, on the scale of
            ``BTResult.tie_parameter`` (warm start, e.g. from a previous fit together with its ``scores``).
            Default: the value at which ``P(tie)`` between equal items matches the observed tie rate.

    Returns:
        `BTResult` with ``model=tie_model``, scores of shape `(M,)` centred to mean 0 and the fitted
        ``tie_parameter`` (``beta`` or ``nu``).

    Raises:
        ValueError: if ``tie_model`` is unknown (the message lists the choices), on a disconnected comparison
            graph with ``on_disconnected="error"``, or a non-positive ``prior_variance``.
    """
    if tie_model not in TIE_MODELS:
        raise ValueError(f"unknown tie_model {tie_model!r}; choose one of {TIE_MODELS}")
    precision = _check_prior(prior_variance)
    check_connected(counts, on_disconnected)
    i, j, w, lo, t = _pairs(counts)
    m = counts.n_items

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        nll, grad = _tie_nll(tie_model, x, i, j, w, lo, t)
        s = x[:-1]
        grad[:-1] += precision * s
        return nll + 0.5 * precision * float(s @ s), grad

    n = float(w.sum() + lo.sum() + t.sum())
    x0 = np.append(_initial(initial_scores, m), _initial_tie_log(tie_model, initial_tie_parameter, t.sum(), n))
    bounds = [(None, None)] * m + [_TIE_LOG_BOUNDS]
    rate = min(max(float(t.sum()) / n if n > 0 else 0.0, 1e-3), 0.999)
    curvature = np.append(_score_curvature(x0[:-1], i, j, w + lo + t, precision), max(n * rate * (1 - rate), 1.0))
    x = _minimize(fun, x0, bounds, f"fit_bradley_terry_ties({tie_model})", n, n_scores=m, curvature=curvature)
    shift = x[:-1].mean()
    x[:-1] -= shift
    if tie_model == "emoprefer":
        x[-1] -= shift  # beta scales with theta
        tie_parameter = math.exp(x[-1])
    elif tie_model == "davidson":
        tie_parameter = math.exp(x[-1])
    else:
        tie_parameter = 1.0 + math.exp(x[-1])
    return BTResult(
        items=list(counts.items),
        scores=x[:-1].copy(),
        model=tie_model,
        log_likelihood=-_tie_nll(tie_model, x, i, j, w, lo, t)[0],
        n_comparisons=n,
        tie_parameter=tie_parameter,
        prior_variance=prior_variance,
    )


def _initial_tie_log(tie_model: str, initial: float | None, n_ties: float, n: float) -> float:
    """Starting tie log-parameter ``eta``: from ``initial`` (``beta``/``nu``) or from the observed tie rate."""
    if initial is not None:
        value = float(initial)
        offset = 1.0 if tie_model == "rao-kupper" else 0.0  # nu = 1 + exp(eta)
        if not (math.isfinite(value) and value > offset):
            raise ValueError(f"initial_tie_parameter must be finite and > {offset:g} for {tie_model}, got {initial!r}")
        return min(max(math.log(value - offset), _TIE_LOG_BOUNDS[0]), _TIE_LOG_BOUNDS[1])
    # P(tie) between equal items matches the observed tie rate.
    rate = min(max(float(n_ties) / n if n > 0 else 0.0, 1e-3), 0.999)
    if tie_model == "rao-kupper":
        return math.log((1 + rate) / (1 - rate) - 1)  # nu = (1 + rate) / (1 - rate)
    return math.log(2 * rate / (1 - rate))  # beta (or nu) = 2 rate / (1 - rate)


def _initial(initial_scores: np.ndarray | None, m: int) -> np.ndarray:
    if initial_scores is None:
        return np.zeros(m)
    x0 = np.asarray(initial_scores, dtype=float)
    if x0.shape != (m,):
        raise ValueError(f"initial_scores must have shape ({m},), got {x0.shape}")
    return x0.copy()


# ------------------------------------------------------------------------------------------------- bootstrap


def bootstrap_ci(
    records: Iterable[PairwiseRecord],
    fit_fn: FitFn,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | None = 0,
    items: Sequence[str] | None = None,
    warm_start: bool = True,
    progress: bool | None = False,
    desc: str = "bootstrap",
) -> BootstrapCI:
    """Percentile bootstrap intervals of fitted scores, resampling samples with replacement.

    The resampled unit is the sample (``PairwiseRecord.sample``, e.g. a video): all comparisons made on a
    sample are kept or repeated together, because judgements on one sample are correlated. A record without a
    sample is its own unit (so data without samples resamples records). Each resample's counts are built as a
    weighted sum of per-unit count matrices (one sparse matrix product), then ``fit_fn`` is called on them.
    Percentile intervals follow Efron & Tibshirani (1993), ch. 13.

    Items absent from a resample: an item never compared in a resample gets its score from the prior alone
    (0, whatever the data say), so it does not enter that item's interval: each item's interval is drawn from
    the resamples in which it was compared (``n_compared`` says how many). Scores are identified up to a
    common shift only, so every resample is shifted so that the items it compared have the mean they have in
    the full-data fit (a no-op when every item is compared: both means are 0).

    The interval always contains the estimate. Resample scores within ``SCORE_TOLERANCE`` of the estimate count
    as equal to it: a resample that reproduces the full-data comparisons (as is common for the binarized W, a
    discrete statistic) then lands exactly on the estimate, not 1e-9 beside it. If the percentile interval still
    excludes the estimate (the bootstrap distribution lies on one side of it: for the binarized W, resampling
    flips or evens out close pairs, which shrinks every resample's scores toward 0), the interval is extended to
    the estimate and ``widened`` flags the item.

    With ``warm_start`` (default), every refit starts from the full-data estimate: ``fit_fn`` gets
    ``initial_scores=estimate.scores`` (and ``initial_tie_parameter=estimate.tie_parameter`` for a tie model) when
    its signature accepts them (as :func:`fit_bradley_terry`, :func:`fit_binarized_bradley_terry`,
    :func:`fit_bradley_terry_ties` and ``functools.partial`` of them do; other callables are called with the
    counts only). The optimum is the same as from a cold start (the objectives are convex in the log-strengths;
    the fits stop at a tight tolerance), only fewer iterations are needed; ``warm_start=False`` starts every refit
    from zero as before.

    Args:
        records (`Iterable[PairwiseRecord]`): all comparisons.
        fit_fn (`Callable[[PairwiseCounts], BTResult]`): the fit, e.g. ``fit_bradley_terry``,
            ``fit_binarized_bradley_terry`` or ``functools.partial(fit_bradley_terry_ties, tie_model="davidson")``.
            With sparse designs pass ``on_disconnected="warn"``, since a resample may drop a bridging sample
            (resamples with a disconnected graph are counted in ``n_disconnected``, not warned about one by one).
        n_boot (`int`): number of resamples (>= 1).
        alpha (`float`): 1 - coverage, in (0, 1); the interval is the ``[alpha/2, 1 - alpha/2]`` percentiles.
        seed (`int` or `None`): seed of ``numpy.random.default_rng``; the same seed gives the same result.
        items (`Sequence[str]`, *optional*): fixed item order (default: sorted item names).
        warm_start (`bool`): start every refit from the full-data fit (see above).
        progress (`bool` or `None`): a tqdm progress bar on stderr; ``None`` shows it only when stderr is a
            terminal.
        desc (`str`): the progress bar's label.

    Returns:
        `BootstrapCI` with ``lower``/``upper`` of shape `(M,)`, ``scores`` of shape `(n_boot, M)` and ``estimate``,
        the fit on all records with the interval attached.

    Raises:
        ValueError: if there are no records, ``n_boot < 1`` or ``alpha`` is outside (0, 1); errors of ``fit_fn``
            (e.g. a disconnected resample) propagate.
    """
    from tqdm.auto import tqdm

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    records = records if isinstance(records, list) else list(records)
    if not records:
        raise ValueError("bootstrap_ci needs at least one record")
    encoded = encode_records(records, items)
    full = PairwiseCounts.from_encoded(encoded)
    m = full.n_items
    units, n_units = _sample_units([r.sample for r in records])
    cols = encoded.winner_loser_cells()
    is_tie = encoded.outcome == 2

    def per_unit(mask: np.ndarray) -> csr_matrix:
        ones = np.ones(int(mask.sum()))
        return csr_matrix((ones, (units[mask], cols[mask])), shape=(n_units, m * m))

    unit_wins_t, unit_ties_t = per_unit(~is_tie).T.tocsr(), per_unit(is_tie).T.tocsr()
    # units x items: 1 where the item was compared on the unit
    appears = csr_matrix(  # converting from (row, col) sums duplicates; then 1 per (unit, item)
        (np.ones(2 * len(records)), (np.concatenate([units, units]), np.concatenate([encoded.a, encoded.b]))),
        shape=(n_units, m),
    )
    appears.data[:] = 1.0
    unit_counts = np.asarray(appears.sum(axis=0)).ravel().astype(np.int64)
    appears_t = appears.T.tocsr()
    estimate = fit_fn(full)
    warm: dict[str, Any] = {}
    if warm_start and _accepts(fit_fn, "initial_scores"):
        warm["initial_scores"] = estimate.scores
        if estimate.tie_parameter is not None and _accepts(fit_fn, "initial_tie_parameter"):
            warm["initial_tie_parameter"] = estimate.tie_parameter
    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, m))
    n_disconnected = 0
    hub = int(np.argmax((full.totals > 0).sum(axis=1)))  # the item compared with most others
    with _single_blas_thread(), warnings.catch_warnings():  # BLAS limit once for the loop
        warnings.filterwarnings("ignore", message="comparison graph is disconnected")
        for b in tqdm(range(n_boot), desc=desc, disable=tqdm_disable(progress), leave=False, mininterval=0.5):
            weight = np.bincount(rng.integers(0, n_units, n_units), minlength=n_units).astype(float)
            wins = (unit_wins_t @ weight).reshape(m, m)
            ties = (unit_ties_t @ weight).reshape(m, m)
            counts = PairwiseCounts(full.items, wins, ties + ties.T)
            scores = np.array(fit_fn(counts, **warm).scores, dtype=float)
            present = (appears_t @ weight) > 0
            if not present.all():
                scores[~present] = np.nan
                scores[present] += estimate.scores[present].mean() - scores[present].mean()
            n_disconnected += not _connected(counts, present, hub)
            boot[b] = scores
    est = np.asarray(estimate.scores, dtype=float)
    boot = np.where(np.abs(boot - est) <= SCORE_TOLERANCE, est, boot)  # NaN stays NaN
    n_compared = np.sum(np.isfinite(boot), axis=0).astype(np.int64)
    lower, upper = np.full(m, np.nan), np.full(m, np.nan)
    seen = n_compared > 0
    if seen.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns are handled by `seen`
            lo, hi = np.nanpercentile(boot[:, seen], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
        lower[seen], upper[seen] = lo, hi
    widened = seen & ((est < lower - SCORE_TOLERANCE) | (est > upper + SCORE_TOLERANCE))
    lower = np.where(seen, np.fmin(lower, est), lower)
    upper = np.where(seen, np.fmax(upper, est), upper)
    ci = BootstrapCI(
        list(full.items),
        lower,
        upper,
        boot,
        alpha,
        n_units,
        estimate,
        n_compared,
        unit_counts,
        widened,
        n_disconnected,
    )
    return replace(ci, estimate=estimate.with_ci(ci))


def _connected(counts: PairwiseCounts, present: np.ndarray, hub: int) -> bool:
    """Whether the comparison graph over the ``present`` items is connected.

    Fast path: the ``hub`` item compared with every other present item (common in dense designs) connects them
    all; otherwise the components are counted.
    """
    if present.sum() < 2:
        return True
    if present[hub]:
        row = (counts.wins[hub] + counts.wins[:, hub] + counts.ties[hub]) > 0
        row[hub] = True
        if row[present].all():
            return True
    compared = counts.totals[np.ix_(present, present)] > 0
    return int(connected_components(csr_matrix(compared), directed=False)[0]) == 1


def tqdm_disable(progress: bool | None) -> bool | None:
    """tqdm's ``disable`` for ``progress``: ``None`` lets tqdm hide the bar when its stream is not a terminal."""
    return None if progress is None else not progress


def _sample_units(samples: list[Any]) -> tuple[np.ndarray, int]:
    """Bootstrap unit of every record, numbered in order of first appearance: its sample, or itself if none."""
    if None not in samples:
        first = dict.fromkeys(samples)  # insertion-ordered unique samples
        index = {sample: k for k, sample in enumerate(first)}
        return np.fromiter(map(index.__getitem__, samples), dtype=np.int64, count=len(samples)), len(index)
    unit_ids: dict[Any, int] = {}
    keys = [("sample", s) if s is not None else ("record", k) for k, s in enumerate(samples)]
    units = np.fromiter((unit_ids.setdefault(key, len(unit_ids)) for key in keys), dtype=np.int64, count=len(keys))
    return units, len(unit_ids)


def _accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (explicitly or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if name in params:
        return params[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------------------------------------- hierarchical


@dataclass(frozen=True)
class HierarchicalResult:
    """Outcome of :func:`rank_hierarchical`.

    Attributes:
        groups (`list[list[str]]`): the groups as given.
        group_results (`list[BTResult]`): the within-group fit of each group (``None`` for a one-item group).
        final (`BTResult`): the fit over the group winners.
        winner (`str`): the best item overall (``final.ranking[0]``).
        n_comparisons (`int`): records used in all stages together.
    """

    groups: list[list[str]]
    group_results: list[BTResult | None]
    final: BTResult
    winner: str
    n_comparisons: int

    @property
    def group_winners(self) -> list[str]:
        """The winner of each group, in group order."""
        return [g[0] if res is None else res.ranking[0] for g, res in zip(self.groups, self.group_results)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every stage."""
        return {
            "groups": [list(g) for g in self.groups],
            "group_winners": self.group_winners,
            "group_results": [None if r is None else r.to_dict() for r in self.group_results],
            "final": self.final.to_dict(),
            "winner": self.winner,
            "n_comparisons": self.n_comparisons,
        }


def rank_hierarchical(
    records: Iterable[PairwiseRecord] | RecordsFn,
    groups: Sequence[Sequence[str]],
    fit_fn: FitFn = fit_binarized_bradley_terry,
) -> HierarchicalResult:
    """EMER-Ranker's hierarchical comparison (EMER-Ranker, section 5).

    To save annotations, the M models are split into groups; models are compared pairwise only within each group
    to find each group's top model, and the group winners are then compared with each other. With two groups of
    M/2 models this needs ``2 * C(M/2, 2) * N + N`` comparisons over N samples instead of ``C(M, 2) * N`` (the
    paper writes ``C(M/2, 2) * N + N``, which counts one group only). Section 5 only identifies the overall best
    model; the within-group and final fits are all returned, but scores are not comparable across stages.
    With more than two groups the winners are compared round-robin and ranked with ``fit_fn``.

    Args:
        records (`Iterable[PairwiseRecord]` or `Callable[[list[tuple[str, str]]], Iterable[PairwiseRecord]]`):
            either all available judgements (only the within-group pairs, then the winners' pairs, are used, which
            simulates the cheaper design), or a function that returns judgements for the requested item pairs
            (e.g. runs a judge or collects annotations on demand), called once per group and once for the final.
        groups (`Sequence[Sequence[str]]`): at least two disjoint, non-empty groups of item names.
        fit_fn (`Callable[[PairwiseCounts], BTResult]`): the fit used at every stage; default EMER-Ranker's
            Bradley-Terry on the binarized W (:func:`fit_binarized_bradley_terry`).

    Returns:
        `HierarchicalResult` with per-group fits, the final fit over the group winners and the overall winner.

    Raises:
        ValueError: if fewer than two groups are given, a group is empty, an item is in two groups, a function
            returns a record for a pair it was not asked for, or a stage has no comparisons (raised by the fit).
    """
    groups = [list(g) for g in groups]
    if len(groups) < 2:
        raise ValueError(f"rank_hierarchical needs at least two groups, got {len(groups)}")
    if any(len(g) == 0 for g in groups):
        raise ValueError("rank_hierarchical: every group must contain at least one item")
    flat = [name for g in groups for name in g]
    if len(set(flat)) != len(flat):
        raise ValueError(f"rank_hierarchical: groups must be disjoint, got {groups}")
    pool = None if callable(records) else list(records)
    n_used = 0

    def stage(stage_items: list[str]) -> BTResult:
        nonlocal n_used
        wanted = list(itertools.combinations(stage_items, 2))
        allowed = set(wanted) | {(b, a) for a, b in wanted}
        if pool is None:
            got = list(records(wanted))  # type: ignore[operator]
            bad = [(r.item_a, r.item_b) for r in got if (r.item_a, r.item_b) not in allowed]
            if bad:
                raise ValueError(f"records function returned pairs it was not asked for: {bad[:5]}")
        else:
            got = [r for r in pool if (r.item_a, r.item_b) in allowed]
        n_used += len(got)
        return fit_fn(PairwiseCounts.from_records(got, stage_items))

    group_results: list[BTResult | None] = []
    winners = []
    for g in groups:
        res = stage(g) if len(g) > 1 else None
        group_results.append(res)
        winners.append(g[0] if res is None else _top(res, f"group {g}"))
    final = stage(winners)
    return HierarchicalResult(groups, group_results, final, _top(final, "final stage"), n_used)


def _top(result: BTResult, where: str) -> str:
    """Best item, warning when the top two scores are equal (the order between them is then arbitrary)."""
    order = np.sort(result.scores)[::-1]
    if order.size > 1 and order[0] - order[1] < 1e-6:
        warnings.warn(f"{where}: the top two items have equal scores; picking {result.ranking[0]!r}", stacklevel=3)
    return result.ranking[0]


# ---------------------------------------------------------------------------------------------------- helpers


def _float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _floats(xs: np.ndarray) -> list[float | None]:
    return [_float(v) for v in np.asarray(xs, dtype=float).tolist()]
