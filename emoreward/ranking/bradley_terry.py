"""Bradley-Terry ranking of models from pairwise judgements, with and without ties.

- :func:`fit_bradley_terry`: Bradley-Terry on win counts, or on EMER-Ranker's binarized matrix W
  (EMER-Ranker, section 2, eq. 1-4; :func:`fit_binarized_bradley_terry` does both steps).
- :func:`fit_bradley_terry_ties`: tie-aware models on win/loss/tie counts: EmoPrefer's additive form
  (EmoPrefer, appendix F, eq. 2-3), Rao-Kupper (1967) and Davidson (1970).

All fits are maximum a-posteriori estimates of the log-strengths ``s_i = log(theta_i)`` under a weak Gaussian prior
``s_i ~ N(0, prior_variance)`` (`prior_precision`), so that an undefeated or winless item keeps a finite score (the
papers' maximum-likelihood estimate is infinite then), by L-BFGS-B with the analytic gradient (``_minimize``).
Reported scores are log-strengths centred to mean 0 (``exp(s_i - s_j)`` is the odds of ``i`` beating ``j``).
Bootstrap intervals: `emoreward.ranking.bootstrap`; the hierarchical scheme: `emoreward.ranking.hierarchical`.
See docs/ranking.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from emoreward.data.text import markdown_cell
from emoreward.ranking.counts import (
    EqualCounts,
    OnDisconnected,
    PairwiseCounts,
    check_connected,
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
TIE_LOG_BOUNDS = (-30.0, 30.0)
_OPTIONS = {"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-10}

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

    def with_interval(self, lower: np.ndarray, upper: np.ndarray, level: float) -> BTResult:
        """A copy with a confidence interval attached (`lower`, `upper` of shape `(M,)`, in ``items`` order; `level`
        its coverage, e.g. 0.95), as `emoreward.ranking.bootstrap.bootstrap_ci` computes it."""
        return replace(self, ci_lower=np.array(lower, copy=True), ci_upper=np.array(upper, copy=True), ci_level=level)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (plain floats, lists and ``None``; non-finite numbers become ``None``)."""
        return {
            "model": self.model,
            "items": list(self.items),
            "scores": finite_floats(self.scores),
            "ranking": list(self.ranking),
            "ranks": list(self.ranks),
            "tie_parameter": finite_float(self.tie_parameter),
            "log_likelihood": finite_float(self.log_likelihood),
            "n_comparisons": finite_float(self.n_comparisons),
            "prior_variance": finite_float(self.prior_variance),
            "ci_lower": None if self.ci_lower is None else finite_floats(self.ci_lower),
            "ci_upper": None if self.ci_upper is None else finite_floats(self.ci_upper),
            "ci_level": finite_float(self.ci_level),
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
    with single_blas_thread():
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


def single_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread for a tiny optimisation.

    L-BFGS-B's small BLAS calls gain nothing from threads, and on a loaded machine OpenBLAS's spinning threads
    made a 1000-resample bootstrap about 10x slower (measured on 2 cores).
    """
    controller = _blas_controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1)


def prior_precision(prior_variance: float | None) -> float:
    """Precision of the prior (0 for none). The default variance, 10, makes a strength ratio of e^sqrt(10) ~ 24 one
    prior standard deviation."""
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
    precision = prior_precision(prior_variance)
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
    precision = prior_precision(prior_variance)
    check_connected(counts, on_disconnected)
    i, j, w, lo, t = _pairs(counts)
    m = counts.n_items

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        nll, grad = _tie_nll(tie_model, x, i, j, w, lo, t)
        s = x[:-1]
        grad[:-1] += precision * s
        return nll + 0.5 * precision * float(s @ s), grad

    n = float(w.sum() + lo.sum() + t.sum())
    x0 = np.append(_initial(initial_scores, m), initial_tie_log(tie_model, initial_tie_parameter, t.sum(), n))
    bounds = [(None, None)] * m + [TIE_LOG_BOUNDS]
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


def initial_tie_log(tie_model: str, initial: float | None, n_ties: float, n: float) -> float:
    """Starting tie log-parameter ``eta``: from ``initial`` (``beta``/``nu``) or from the observed tie rate."""
    if initial is not None:
        value = float(initial)
        offset = 1.0 if tie_model == "rao-kupper" else 0.0  # nu = 1 + exp(eta)
        if not (math.isfinite(value) and value > offset):
            raise ValueError(f"initial_tie_parameter must be finite and > {offset:g} for {tie_model}, got {initial!r}")
        return min(max(math.log(value - offset), TIE_LOG_BOUNDS[0]), TIE_LOG_BOUNDS[1])
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


def finite_float(x: float | None) -> float | None:
    """``x`` as a float for JSON, ``None`` when it is missing or not finite."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def finite_floats(xs: np.ndarray) -> list[float | None]:
    """:func:`finite_float` of every element (a JSON list)."""
    return [finite_float(v) for v in np.asarray(xs, dtype=float).tolist()]
