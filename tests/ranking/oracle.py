"""The L-BFGS-B reference fits (the library's solver before the one Newton driver): a test oracle.

`fit_bradley_terry` and `fit_bradley_terry_ties` here minimise the same objectives as the library's fits
(`emoreward.ranking.bradley_terry`) with scipy's L-BFGS-B and hand-written gradients, written independently of
`emoreward.ranking.tie_models`, so that a test can compare the two at 1e-6.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from emoreward.ranking.batched import prior_precision
from emoreward.ranking.bradley_terry import BTResult, single_blas_thread
from emoreward.ranking.counts import PairwiseCounts, check_connected
from emoreward.ranking.tie_models import TIE_LOG_BOUNDS


_OPTIONS = {"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-10}
DEFAULT_PRIOR_VARIANCE = 10.0


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


def fit_bradley_terry(
    counts: PairwiseCounts,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    ties: str = "drop",
    on_disconnected: str = "error",
    initial_scores: np.ndarray | None = None,
) -> BTResult:
    """The reference fit (L-BFGS-B) of `emoreward.ranking.bradley_terry.fit_bradley_terry`."""
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


def fit_bradley_terry_ties(
    counts: PairwiseCounts,
    tie_model: str = "emoprefer",
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    on_disconnected: str = "error",
    initial_scores: np.ndarray | None = None,
    initial_tie_parameter: float | None = None,
) -> BTResult:
    """The reference fit (L-BFGS-B) of `emoreward.ranking.bradley_terry.fit_bradley_terry_ties`."""
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
        offset = 1.0 if tie_model == "rao-kupper" else 0.0  # nu = 1 + exp(eta)
        return min(max(math.log(float(initial) - offset), TIE_LOG_BOUNDS[0]), TIE_LOG_BOUNDS[1])
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


def fit_length_controlled(
    z: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    outcome: np.ndarray,
    m: int,
    model: str,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
) -> dict:
    """The reference fit (L-BFGS-B) of the full-data length-controlled fit
    (`emoreward.ranking.length_control.fit_length_controlled`): per record the two sides' log-strengths
    ``s_i = b_a + gamma . z / 2`` and ``s_j = b_b - gamma . z / 2`` in the pair model above (each side a virtual item
    of `_tie_nll`; Bradley-Terry: `_bt_nll`, ties dropped), the prior on ``b`` only, ``b`` centred.

    Args:
        z (`np.ndarray` of shape `(N, K)`): the covariate differences of the records (already scaled);
        a, b, outcome (`(N,)`): the models and the outcome (0: a won, 1: b won, 2: tie); m: the number of models.

    Returns:
        ``{"scores" (M,), "coefficients" (K,), "tie_parameter", "log_likelihood"}``.
    """
    if model == "bradley-terry":
        keep = outcome != 2
        z, a, b, outcome = z[keep], a[keep], b[keep], outcome[keep]
    n, k = z.shape
    precision = prior_precision(prior_variance)
    w, lo, t = ((outcome == code).astype(float) for code in (0, 1, 2))
    side_i, side_j = np.arange(n), n + np.arange(n)
    has_tie = model != "bradley-terry"

    def data(x: np.ndarray) -> tuple[float, np.ndarray]:
        scores, gamma = x[:m], x[m : m + k]
        half = 0.5 * z @ gamma
        virtual = np.concatenate([scores[a] + half, scores[b] - half])
        if has_tie:
            nll, g = _tie_nll(model, np.append(virtual, x[-1]), side_i, side_j, w, lo, t)
        else:
            nll, g = _bt_nll(virtual, side_i, side_j, w, lo)
        g_i, g_j = g[:n], g[n : 2 * n]
        grad = np.zeros_like(x)
        grad[:m] = np.bincount(a, g_i, m) + np.bincount(b, g_j, m)
        grad[m : m + k] = 0.5 * z.T @ (g_i - g_j)
        if has_tie:
            grad[-1] = g[-1]
        return nll, grad

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        nll, grad = data(x)
        grad[:m] += precision * x[:m]
        return nll + 0.5 * precision * float(x[:m] @ x[:m]), grad

    x0 = np.zeros(m + k + has_tie)
    bounds = [(None, None)] * (m + k)
    if has_tie:
        x0[-1] = initial_tie_log(model, None, t.sum(), n)
        bounds.append(TIE_LOG_BOUNDS)
    x = _minimize(fun, x0, bounds, f"fit_length_controlled({model})", n, n_scores=m)
    tie = None
    if has_tie:
        tie = 1.0 + math.exp(x[-1]) if model == "rao-kupper" else math.exp(x[-1])
    return {"scores": x[:m], "coefficients": x[m : m + k], "tie_parameter": tie, "log_likelihood": -data(x)[0]}
