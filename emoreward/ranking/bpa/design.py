"""Ranking-targeted pair selection for BPA exploration (ours; the paper's rule is TrueSkill match quality): the pair
that most lowers the variance of the score differences whose order is in doubt, under the full Laplace covariance
(`ranking_variance_gains`), and the information bound no pair selection can beat (`centred_design_comparisons`).
See docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from emoreward.ranking.tie_models.rao_kupper import RaoKupper


_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite.hermgauss(10)
_GH_WEIGHTS = _GH_WEIGHTS / np.sqrt(np.pi)


def outcome_fisher_information(
    score_diff: np.ndarray, delta: float, slope: float = 1.0, eta: np.ndarray | float = 1.0
) -> np.ndarray:
    """Fisher information (score^-2) about ``mu_a - mu_b`` of one answer: ``J = sum_y (d q_y / d Delta)^2 / q_y``,
    ``q_y = eta P_RK(y | s Delta, delta) + (1 - eta) / 3``; ``score_diff`` (any shape) and ``eta`` broadcast."""
    z = slope * np.asarray(score_diff, float)
    eta = np.asarray(eta, float)
    pa, pb = (np.exp(log_p) for log_p in RaoKupper.log_probabilities(z, delta)[:2])
    pt = 1.0 - pa - pb
    da, db = pa * (1.0 - pa), -pb * (1.0 - pb)
    guess = (1.0 - eta) / 3.0
    info = sum((eta * d) ** 2 / np.maximum(eta * p + guess, 1e-300) for p, d in ((pa, da), (pb, db), (pt, -da - db)))
    return slope**2 * info


def expected_fisher_information(
    diff_mean: np.ndarray, diff_var: np.ndarray, delta: float, slope: float = 1.0, eta: float = 1.0
) -> np.ndarray:
    """`outcome_fisher_information` averaged over ``Delta ~ N(diff_mean, diff_var)`` (10-point Gauss-Hermite), in
    the input shape (score^-2)."""
    m = np.asarray(diff_mean, float)[..., None]
    sd = np.sqrt(np.maximum(np.asarray(diff_var, float), 0.0))[..., None]
    info = outcome_fisher_information(m + np.sqrt(2.0) * sd * _GH_NODES, delta, slope, eta)
    return info @ _GH_WEIGHTS


def record_information_matrix(idx_a: np.ndarray, idx_b: np.ndarray, info: np.ndarray, n_candidates: int) -> np.ndarray:
    """``sum_m info_m (e_a - e_b)(e_a - e_b)^T`` over candidates `(n_candidates, n_candidates)` from item indices
    ``idx_a``, ``idx_b`` `(M,)` (candidates first; anchors are fixed) and each record's ``info`` `(M,)`."""
    n_items = int(max(idx_a.max(initial=-1), idx_b.max(initial=-1), n_candidates - 1)) + 1
    fisher = np.zeros((n_items, n_items))
    np.add.at(fisher, (idx_a, idx_a), info)
    np.add.at(fisher, (idx_b, idx_b), info)
    np.add.at(fisher, (idx_a, idx_b), -info)
    np.add.at(fisher, (idx_b, idx_a), -info)
    return fisher[:n_candidates, :n_candidates]


def ranking_variance_gains(
    mean: np.ndarray, cov: np.ndarray, delta: float, slope: float = 1.0, eta: float = 1.0
) -> np.ndarray:
    """Expected reduction of doubt-weighted difference variance from asking each pair (the rule, ours).

    Posterior ``N(m, Sigma)`` over candidate scores: ``m`` the provisional scores, ``Sigma`` the inverse expected
    Fisher information of the records at the last refit plus the adaptive prior, updated after every pair by
    `rank_one_update`. ``J_kl``: one answer's information about ``mu_k - mu_l`` (Rao-Kupper, Crowd-BT with the mean
    reliability) averaged over the posterior of the difference. Doubt weights ``w_ij = phi(d_ij / s_ij) / s_ij``
    (``d_ij = m_i - m_j``, ``s_ij^2 = Var(mu_i - mu_j)``): the posterior density of the difference at zero. Asking
    ``(k, l)`` lowers the weighted sum of ``Var(mu_i - mu_j)`` by ``gain_kl = J_kl (e_kl^T A e_kl) / (1 + J_kl
    s_kl^2)``, ``A = Sigma L_w Sigma`` with ``L_w`` the Laplacian of ``w``. Source: greedy A-optimal design
    (Chaloner & Verdinelli 1995) on the differences whose order is in doubt.

    Args:
        mean (`np.ndarray` of shape `(N,)`): current scores of all items, candidates first, anchors last.
        cov (`np.ndarray` of shape `(n, n)`): posterior covariance of the ``n <= N`` candidate scores.
        delta, slope, eta (`float`): tie margin of the last refit, logistic slope, mean reliability of the next answer.

    Returns:
        `np.ndarray` of shape `(N, N)`: ``gain[k, l]``, symmetric, ``-inf`` on the diagonal and between two anchors.
    """
    mean = np.asarray(mean, float)
    n, n_items = cov.shape[0], mean.shape[0]
    full = np.zeros((n_items, n_items))
    full[:n, :n] = cov
    d = np.diag(full)
    var = np.maximum(d[:, None] + d[None, :] - 2.0 * full, 1e-12)
    diff = mean[:, None] - mean[None, :]
    sd = np.sqrt(var)
    weight = norm.pdf(diff / sd) / sd
    np.fill_diagonal(weight, 0.0)
    laplacian = np.diag(weight.sum(axis=1)) - weight
    a = full @ laplacian @ full
    a_diag = np.diag(a)
    quad = a_diag[:, None] + a_diag[None, :] - 2.0 * a
    info = expected_fisher_information(diff, var, delta, slope, eta)
    gain = info * quad / (1.0 + info * var)
    gain[n:, n:] = -np.inf
    np.fill_diagonal(gain, -np.inf)
    return gain


def rank_one_update(cov: np.ndarray, i: int, j: int, info: float) -> np.ndarray:
    """``(Sigma^-1 + info e e^T)^-1`` `(n, n)` by Sherman-Morrison: ``cov`` after one more answer on ``(i, j)``
    with Fisher information ``info``; ``e = e_i - e_j`` over candidates (indices ``>= n`` are anchors)."""
    n = cov.shape[0]
    e = np.zeros(n)
    if i < n:
        e[i] += 1.0
    if j < n:
        e[j] -= 1.0
    v = cov @ e
    denom = 1.0 + info * float(e @ v)
    return cov - info * np.outer(v, v) / denom


def crowd_fisher_information(
    score_diff: np.ndarray,
    delta: float,
    slope: float,
    etas: np.ndarray,
    weights: np.ndarray | None = None,
    diff_var: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Fisher information (score^-2) about ``mu_a - mu_b`` of one answer from a crowd whose annotator is drawn at
    random (``weights``, uniform if omitted): ``J_crowd = sum_k w_k E[J(Delta; eta_k)]`` with ``Delta ~
    N(score_diff, diff_var)``: the ``w``-average of the annotators' informations (ours)."""
    etas = np.asarray(etas, float)
    weights = np.full(etas.shape, 1.0 / etas.size) if weights is None else np.asarray(weights, float)
    return sum(w * expected_fisher_information(score_diff, diff_var, delta, slope, e) for w, e in zip(weights, etas))


def centred_design_comparisons(
    precision_from: float,
    precision_to: float,
    delta: float,
    slope: float,
    etas: np.ndarray,
    weights: np.ndarray | None = None,
    n_grid: int = 400,
) -> float:
    """Comparisons per candidate that an ideal adaptive design needs to raise every candidate's precision (the
    information bound used to judge pair selection; ours, an idealisation).

    A comparison adds the crowd information ``J`` of a score difference to both candidates' precision; the best a
    design can do at precision ``P`` is to pair candidates of equal posterior means, ``Delta ~ N(0, 2 / P)``. Hence
    ``n / n_candidates >= integral_{P_0}^{P_1} dP / (2 E[J_crowd(Delta)])`` (trapezoid rule on ``n_grid`` points);
    a design that ignores the scores needs ``(P_1 - P_0) / (2 J_bar)``, ``J_bar`` its mean information per comparison.

    Args:
        precision_from, precision_to (`float`): per-candidate precision (score^-2), ``0 < from <= to``.
        delta, slope, etas, weights: the crowd, as in `crowd_fisher_information`.
        n_grid (`int`): integration points (>= 2).

    Returns:
        `float`: comparisons per candidate (multiply by the number of candidates for the total).

    Raises:
        ValueError: if the precisions are not ``0 < from <= to`` or ``n_grid < 2``.
    """
    if not 0.0 < precision_from <= precision_to:
        raise ValueError(f"need 0 < precision_from <= precision_to, got {precision_from}, {precision_to}")
    if n_grid < 2:
        raise ValueError(f"n_grid must be >= 2, got {n_grid}")
    grid = np.linspace(precision_from, precision_to, n_grid)
    info = crowd_fisher_information(np.zeros_like(grid), delta, slope, etas, weights, diff_var=2.0 / grid)
    return float(np.trapezoid(1.0 / (2.0 * info), grid))
