"""The length-controlled objective's solvers: damped Newton for any weighting of the records, and every bootstrap
resample at once from sufficient statistics per sample.

Per record ``r``: ``u_r = x_r . theta``, ``x_r = (e_a - e_b, z_r)``, the Davidson (1970) negative log-likelihood
``L(u, eta) - y_r u / 2 - t_r eta``, ``L(u, eta) = log(e^{u/2} + e^{-u/2} + e^eta)`` (Bradley-Terry: ``e^eta = 0``,
ties dropped), weighted per record, plus the `Prior`. :func:`damped_newton` minimises it with the one Newton driver;
:func:`fit_resamples` fits every resample at once (``batched=False``: one at a time, the reference path).
See docs/ranking.md ("Length-controlled ranking").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from emoreward.ranking.batched import damped_newton as newton
from emoreward.ranking.bootstrap import sample_units
from emoreward.ranking.bradley_terry import single_blas_thread
from emoreward.ranking.counts import encode_records
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import MODELS, TIE_LOG_BOUNDS


DIVERGED = 15.0
"""A logit change beyond this per RMS covariate difference (odds e^15 ~ 3e6) only arises when the covariate
separates the verdicts: such a fit is a solver artefact, not an estimate."""
_MAX_ITER = 100
_CHUNK_CELLS = 2_000_000  # resamples x records per batch of damped_newton
_PASS_CELLS = {np.float32: 131_072, np.float64: 65_536}  # resamples x records per chunk of a pass (in L2 cache)
_SATURATED = {np.float32: 40.0, np.float64: 300.0}  # |u/2| - max(eta, 0) beyond which the probabilities are exact
_TOL = 3e-8  # predicted distance to the optimum (max-abs, parameter units) at which a resample is done
_MAX_PASSES = 8
_FLOOR = 1e-6  # a float64 step this small may stall on float32 noise in the Hessian's step: no contraction needed
_BOOT_CHUNK = 1024  # resamples per batch
_SWITCH = 1e-2  # Newton step (max-abs) below which the float64 gradient passes take over
_MAX_CUBIC = 1_000  # unique third-derivative entries above which the start is a plain Newton step
_MAX_PARAMS = 48  # parameters above which every resample goes through damped_newton


@dataclass(frozen=True)
class Design:
    """Records as arrays: design rows ``x_r = (e_a - e_b, z_r)`` of shape `(N, M + K)`, outcome codes (0: ``a``
    wins, 1: ``b`` wins, 2: tie), bootstrap units (samples) and the model indices ``a``, ``b`` of shape `(N,)`."""

    x: np.ndarray
    outcome: np.ndarray
    units: np.ndarray
    n_units: int
    a: np.ndarray
    b: np.ndarray
    m: int


def build_design(
    records: list[PairwiseRecord], items: list[str], covariates: np.ndarray, model: str
) -> tuple[Design, np.ndarray]:
    """The `Design` of ``records``; Bradley-Terry drops ties.

    Args:
        records (`list[PairwiseRecord]`): the verdicts, each with its sample.
        items (`list[str]`): the models, in parameter order.
        covariates (`np.ndarray` of shape `(N, 2, K)`): each record's covariate values of its two descriptions
            (``item_a``'s, then ``item_b``'s); the design's covariates are their differences.
        model (`str`): ``"davidson"`` or ``"bradley-terry"``.

    Returns:
        ``(design, keep)``: ``keep`` (`np.ndarray` of shape `(N,)`, bool) marks the records in the design.
    """
    covariates = np.asarray(covariates, dtype=float)
    if covariates.shape[:2] != (len(records), 2) or covariates.ndim != 3:
        raise ValueError(f"covariates must have shape ({len(records)}, 2, K), got {covariates.shape}")
    encoded = encode_records(records, items)
    units, n_units = sample_units([r.sample for r in records])
    keep = np.ones(len(records), dtype=bool) if model == "davidson" else encoded.outcome != 2
    m, n, k_cov = len(items), int(keep.sum()), covariates.shape[2]
    a, b, u, values = encoded.a[keep], encoded.b[keep], units[keep], covariates[keep]
    x = np.zeros((n, m + k_cov))
    x[np.arange(n), a] = 1.0
    x[np.arange(n), b] = -1.0
    x[:, m:] = values[:, 0] - values[:, 1]
    outcome = encoded.outcome[keep].astype(np.int64)
    return Design(x, outcome, u, n_units, a, b, m), keep


# ------------------------------------------------------------------------------------ damped Newton, any weights


@dataclass(frozen=True)
class Prior:
    """The penalty of the objective, the one place every solver takes it from: the Gaussian prior
    ``N(0, 1/effects)`` on the model effects ``b`` and the centring term ``(sum b)^2 / (2M)``; the covariate
    coefficients ``gamma`` are unpenalised (maximum likelihood; where none exists, `length_control` says so)."""

    effects: float

    def terms(self, theta: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(penalty (R,), gradient (R, Q), Hessian (1, Q, Q))`` at ``theta`` `(R, Q)`."""
        q = theta.shape[1]
        s = theta[:, :m]
        penalty = 0.5 * self.effects * np.sum(s * s, axis=1) + 0.5 * s.sum(axis=1) ** 2 / m
        grad = np.zeros_like(theta)
        grad[:, :m] = self.effects * s + s.sum(axis=1, keepdims=True) / m
        hess = np.zeros((1, q, q))
        hess[0, :m, :m] = self.effects * np.eye(m) + 1.0 / m
        return penalty, grad, hess


def as_prior(precision: float | Prior) -> Prior:
    """``precision`` (the precision on the model effects) as a `Prior`."""
    return precision if isinstance(precision, Prior) else Prior(float(precision))


def damped_newton(
    design: Design,
    weights: np.ndarray,
    precision: float | Prior,
    davidson: bool,
    x0: np.ndarray | None = None,
    hessian: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Penalised maximum likelihood for B weightings of the records at once, by the one Newton driver
    (:func:`emoreward.ranking.batched.damped_newton`): per row of ``weights`` `(B, N)`, ``sum_r w_r nll_r`` (the
    pair model's terms at ``u_r``) plus the `Prior`. A row stops unconverged when its covariate coefficients pass
    ``4 DIVERGED``; a Davidson row without ties keeps ``log nu`` at its lower bound.

    Returns:
        ``(params, converged, hessian)``: params of shape `(B, P)` (``P = M + K``, plus Davidson's ``log nu``),
        converged `(B,)` bool, and the Hessian of shape `(B, P, P)` at the solution (``None`` unless ``hessian``).
    """
    m, p = design.m, design.x.shape[1]
    q = p + davidson
    n_b = weights.shape[0]
    objective = _objective(design, weights, precision, davidson)
    theta = np.zeros((n_b, q)) if x0 is None else np.broadcast_to(x0, (n_b, q)).copy()
    lower, upper = np.full(q, -np.inf), np.full(q, np.inf)
    if davidson:
        lower[-1], upper[-1] = MODELS["davidson"].bounds
        has_ties = (weights @ (design.outcome == 2)) > 0
        theta[:, -1] = np.where(has_ties, np.clip(theta[:, -1], lower[-1], upper[-1]), lower[-1])

    def diverged(th: np.ndarray) -> np.ndarray:
        return np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) > 4 * DIVERGED

    rows = max(1, _CHUNK_CELLS // max(1, weights.shape[1]))
    theta, converged, _ = newton(objective, theta, lower, upper, None, _MAX_ITER, 1e-10, rows, diverged)
    if not hessian:
        return theta, converged, None
    return theta, converged, objective(theta, np.arange(n_b), True)[2]


def _objective(design: Design, weights: np.ndarray, precision: float | Prior, davidson: bool):
    """The length-controlled objective of weighted records for :func:`emoreward.ranking.batched.damped_newton`."""
    m, p = design.m, design.x.shape[1]
    q = p + davidson
    model = MODELS["davidson" if davidson else "bradley-terry"]
    prior = as_prior(precision)
    y = design.outcome
    outcomes = [weights * (y == code) for code in (0, 1, 2)]  # (B, N) weights of a win, loss, tie of a_r
    xs, xs_t, outer_t = _sparse_design(design)

    def times_x(v: np.ndarray) -> np.ndarray:  # (B, N) @ x, through the sparse transpose
        return np.asarray(xs_t @ v.T).T

    def objective(th: np.ndarray, rows: np.ndarray, derivatives: bool):
        u = np.asarray(xs @ th[:, :p].T).T  # (R, N)
        w, lo, t = (o[rows] for o in outcomes)
        eta = th[:, p:] if davidson else None
        nll, grad, hess = model.terms(u, np.zeros_like(u), eta, w, lo, t, derivatives)
        penalty, prior_grad, prior_hess = prior.terms(th, m)
        if not derivatives:
            return nll + penalty, None, None
        g = np.zeros_like(th)
        g[:, :p] = times_x(grad["i"])
        h = np.zeros((len(th), q, q))
        h[:, :p, :p] = np.asarray(outer_t @ hess["ii"].T).T.reshape(len(th), p, p)
        if davidson:
            g[:, -1] = grad["e"].sum(axis=1)
            h[:, :p, -1] = h[:, -1, :p] = times_x(hess["ie"])
            h[:, -1, -1] = hess["ee"].sum(axis=1)
        return nll + penalty, g + prior_grad, h + prior_hess

    return objective


def data_nll(design: Design, theta: np.ndarray, davidson: bool) -> float:
    """Data negative log-likelihood (no prior) at one parameter vector of shape `(P,)`."""
    u = (design.x @ theta[: design.x.shape[1]])[None]
    w, lo, t = ((design.outcome == code).astype(float)[None] for code in (0, 1, 2))
    eta = theta[None, -1:] if davidson else None
    return float(MODELS["davidson" if davidson else "bradley-terry"].terms(u, 0.0 * u, eta, w, lo, t, False)[0][0])


def _sparse_design(design: Design) -> tuple[csr_matrix, csr_matrix, csr_matrix]:
    """``x`` as a sparse matrix, its transpose, and the transpose of its row outer products (shape `(P^2, N)`)."""
    x, m = design.x, design.m
    n, p = x.shape
    cols = np.concatenate([design.a[:, None], design.b[:, None], np.broadcast_to(np.arange(m, p), (n, p - m))], axis=1)
    vals = x[np.arange(n)[:, None], cols]
    rows = np.repeat(np.arange(n), cols.shape[1])
    xs = csr_matrix((vals.ravel(), (rows, cols.ravel())), shape=(n, p))
    pair_cols = (cols[:, :, None] * p + cols[:, None, :]).reshape(n, -1)
    pair_vals = (vals[:, :, None] * vals[:, None, :]).reshape(n, -1)
    outer = csr_matrix(
        (pair_vals.ravel(), (np.repeat(np.arange(n), pair_cols.shape[1]), pair_cols.ravel())), shape=(n, p * p)
    )
    return xs, xs.T.tocsr(), outer.T.tocsr()


def _solve(hess: np.ndarray, grad: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(hess, grad[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return np.einsum("bij,bj->bi", np.linalg.pinv(hess), grad)


# ------------------------------------------------------------------------------------------ every resample at once


@dataclass(frozen=True)
class ResampleFits:
    """Fits of B resamples: ``params`` `(B, Q)` (uncentred, as :func:`damped_newton`), ``converged`` `(B,)`
    (False where :func:`damped_newton` stopped without converging, e.g. a diverging coefficient) and ``batched``
    `(B,)` (finished by the batched path; the others were fitted by :func:`damped_newton`)."""

    params: np.ndarray
    converged: np.ndarray
    batched: np.ndarray


def fit_resamples(
    design: Design,
    estimate: np.ndarray,
    unit_weights: np.ndarray,
    precision: float | Prior,
    davidson: bool,
    batched: bool = True,
) -> ResampleFits:
    """Fit every bootstrap resample, started at the full-data ``estimate``.

    A resample's objective is the per-sample objectives weighted by its sample counts. The batched path:

    1. A Chebyshev step from per-sample sums of the gradient, Hessian and third derivatives at the common start
       (one dense product ``(B, S) @ (S, unique tensor entries)``).
    2. Newton steps in float32 over all ``B x N`` records while the step exceeds 1e-2 (the model block summed per
       model pair).
    3. Gradient passes in float64 with that Hessian, corrected along the last step by the third derivatives,
       until the distance left, ``rho |step| / (1 - rho)``, is below 3e-8 (max-abs).

    A resample this path does not finish (no ties in a Davidson resample, a tie parameter at its bound, a diverging
    coefficient, a step that does not contract, a non-finite value) is fitted by :func:`damped_newton`.

    Args:
        design (`Design`): the records.
        estimate (`np.ndarray` of shape `(Q,)`): the full-data fit (``Q = M + K``, plus Davidson's ``log nu``).
        unit_weights (`np.ndarray` of shape `(B, n_units)`): how often each sample was drawn in each resample.
        precision (`float` or `Prior`): the prior precision on the model effects; davidson (`bool`): Davidson's ties.
        batched (`bool`): all resamples at once (default) or one at a time (the same optimum to about 1e-8).

    Returns:
        `ResampleFits`.

    Raises:
        ValueError: if ``unit_weights`` is not `(B, n_units)` or ``estimate`` does not have the design's parameters.
    """
    unit_weights = np.asarray(unit_weights, dtype=float)
    n_b, q = unit_weights.shape[0], estimate.shape[0]
    if unit_weights.ndim != 2 or unit_weights.shape[1] != design.n_units:
        raise ValueError(f"unit_weights must have shape (B, {design.n_units}), got {unit_weights.shape}")
    if estimate.shape != (design.x.shape[1] + davidson,):
        raise ValueError(f"estimate must have shape ({design.x.shape[1] + davidson},), got {estimate.shape}")
    theta, converged = np.broadcast_to(estimate, (n_b, q)).copy(), np.zeros(n_b, dtype=bool)
    with single_blas_thread():  # small products: OpenBLAS threads only spin
        if batched and q <= _MAX_PARAMS and design.x.shape[0]:
            rec, tables = _ordered(design), _unit_tables(design, estimate, davidson)
            for lo in range(0, n_b, _BOOT_CHUNK):  # bounds the (B, Q, Q, Q) third derivatives
                rows = slice(lo, lo + _BOOT_CHUNK)
                part = theta[rows]
                converged[rows] = _fit_regular(
                    design, rec, tables, estimate, unit_weights[rows], precision, davidson, part
                )
                theta[rows] = part
        fast = converged.copy()
        rest = np.flatnonzero(~converged)
        step = 1 if not batched else max(1, len(rest))
        for lo in range(0, len(rest), step):
            rows = rest[lo : lo + step]
            w = unit_weights[rows][:, design.units]
            theta[rows], converged[rows], _ = damped_newton(design, w, precision, davidson, estimate, hessian=False)
    return ResampleFits(theta, converged, fast)


@dataclass(frozen=True)
class _Ordered:
    """The records sorted by model pair, then sample, as every pass reads them.

    ``half_x[dtype]``: ``x^T / 2`` of shape `(P, N)`; ``z[dtype]``: covariates `(K, N)`; ``starts``: the first
    record of each pair segment; ``diff`` `(S, M)`: ``e_a - e_b`` of each segment, ``outer`` `(S, M^2)` its outer
    product; ``grid``: every segment lists every sample once, in order, so that a weighted sum over a segment is a
    product with the resample's per-sample counts (the weights are never spread over the records).
    """

    units: np.ndarray
    half_x: dict
    z: dict
    starts: np.ndarray
    diff: np.ndarray
    outer: np.ndarray
    grid: bool
    n_units: int
    z_max: np.ndarray


class _Sums:
    """Weighted sums over the records of `(R, N)` arrays, for R resamples with per-sample counts `(R, n_units)`."""

    def __init__(self, rec: _Ordered, counts: np.ndarray, dtype) -> None:
        self.rec, counts = rec, counts.astype(dtype)
        self.counts = counts[:, :, None] if rec.grid else None
        self.weights = None if rec.grid else np.take(counts, rec.units, axis=1)

    def segments(self, a: np.ndarray) -> np.ndarray:
        """`(R, S)`: per pair segment, ``sum_r w_r a_r``."""
        if self.rec.grid:
            return np.matmul(a.reshape(a.shape[0], len(self.rec.starts), -1), self.counts)[:, :, 0]
        return np.add.reduceat(a * self.weights, self.rec.starts, axis=1)

    def total(self, a: np.ndarray) -> np.ndarray:
        """`(R,)`: ``sum_r w_r a_r``."""
        return self.segments(a).sum(axis=1)


def _ordered(design: Design) -> _Ordered:
    m, p = design.m, design.x.shape[1]
    pair = design.a * m + design.b
    order = np.lexsort((design.units, pair))
    pair, units, x = pair[order], design.units[order], design.x[order]
    starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    diff = np.zeros((len(starts), m))
    diff[np.arange(len(starts)), design.a[order][starts]] = 1.0
    diff[np.arange(len(starts)), design.b[order][starts]] = -1.0
    outer = (diff[:, :, None] * diff[:, None, :]).reshape(len(starts), m * m)
    grid = len(units) == len(starts) * design.n_units and bool(
        np.all(units.reshape(len(starts), -1) == np.arange(design.n_units))
    )
    half_x = {dt: np.ascontiguousarray(0.5 * x.T, dtype=dt) for dt in (np.float32, np.float64)}
    z = {dt: np.ascontiguousarray(x[:, m:p].T, dtype=dt) for dt in (np.float32, np.float64)}
    z_max = np.abs(x[:, m:p]).max(axis=0, initial=0.0)
    return _Ordered(units, half_x, z, starts, diff, outer, grid, design.n_units, z_max)


def _probabilities(half_u: np.ndarray, log_nu: np.ndarray | None, dtype, bound: float = np.inf):
    """Davidson's ``P(a wins) - P(b wins)`` and ``1 / (e^{u/2} + e^{-u/2} + nu)`` (so ``P(tie) = nu`` times it)
    of `(R, N)` half linear predictors, computed in place; Bradley-Terry (``log_nu`` None) is ``nu = 0``.

    ``bound`` (a bound on ``|u/2|``) skips the clip that keeps the exponentials finite where it cannot act.
    """
    top = _SATURATED[dtype] + (0.0 if log_nu is None else max(float(np.max(log_nu)), 0.0))
    if bound > top:  # beyond ``top`` the probabilities are 0 or 1 to the working precision
        np.clip(half_u, -top, top, out=half_u)
    e = np.exp(half_u, out=half_u)
    inv = np.reciprocal(e)
    den = e + inv
    if log_nu is not None:
        den += np.exp(log_nu).astype(dtype)[:, None]
    r = np.reciprocal(den, out=den)
    diff = np.subtract(e, inv, out=e)
    diff *= r
    return diff, r


def _pass(rec: _Ordered, theta, counts, m: int, davidson: bool, dtype, hessian: bool):
    """The data part of the gradient `(R, Q)` (and Hessian `(R, Q, Q)`) of the nonlinear term ``sum_r w_r L``, for
    rows ``theta`` `(R, Q)` with per-sample counts `(R, n_units)`, over the records in ``dtype`` (sums per pair
    segment in ``dtype``, the rest in float64)."""
    n_rows, q = theta.shape
    p, n = rec.half_x[dtype].shape
    grad = np.zeros((n_rows, q))
    hess = np.zeros((n_rows, q, q)) if hessian else None
    z = rec.z[dtype]
    # |u/2| <= (max b - min b + sum_k |gamma_k| max |z_k|) / 2: where that is small, no clip is needed
    bounds = 0.5 * (np.ptp(theta[:, :m], axis=1) + np.abs(theta[:, m:p]) @ rec.z_max)
    nu = np.exp(theta[:, -1]) if davidson else np.zeros(n_rows)
    chunk = max(1, _PASS_CELLS[dtype] // max(1, n))
    for lo in range(0, n_rows, chunk):
        hi = min(n_rows, lo + chunk)
        th, sums = theta[lo:hi], _Sums(rec, counts[lo:hi], dtype)
        half_u = th[:, :p].astype(dtype) @ rec.half_x[dtype]
        pd, r = _probabilities(half_u, th[:, -1] if davidson else None, dtype, float(bounds[lo:hi].max()))
        grad[lo:hi, :m] = 0.5 * (sums.segments(pd) @ rec.diff)
        for k in range(p - m):
            grad[lo:hi, m + k] = 0.5 * sums.total(pd * z[k])
        if davidson:  # sum_r w P(tie) = nu sum_r w r
            grad[lo:hi, -1] = nu[lo:hi] * sums.total(r)
        if hessian:
            ties = (nu[lo:hi], grad[lo:hi, -1]) if davidson else None
            hess[lo:hi] = _hessian_block(rec, sums, pd, r, ties, m)
    return grad, hess


def _hessian_block(rec: _Ordered, sums: _Sums, pd, r, ties, m: int) -> np.ndarray:
    """`(R, Q, Q)` data Hessian from the probabilities (``pd`` and ``r`` are overwritten): ``h_uu = (1 - P(tie) -
    pd^2) / 4``, ``h_u,eta = -pd P(tie) / 2``, ``h_eta,eta = P(tie) (1 - P(tie))`` with ``P(tie) = nu r``;
    ``ties``: ``(nu, sum_r w_r P(tie))`` per row, or None (Bradley-Terry)."""
    nu, tie_total = ties if ties is not None else (None, None)
    z = rec.z[pd.dtype.type]
    k_cov, n_rows = z.shape[0], pd.shape[0]
    p = m + k_cov
    block = np.zeros((n_rows, p + (nu is not None), p + (nu is not None)))
    ue = pd * r if nu is not None else None
    huu = np.multiply(pd, pd, out=pd)
    if nu is not None:
        huu += r * nu[:, None].astype(pd.dtype)
    np.subtract(1.0, huu, out=huu)
    block[:, :m, :m] = 0.25 * (sums.segments(huu) @ rec.outer).reshape(-1, m, m)
    for k in range(k_cov):
        hz = huu * z[k]
        block[:, :m, m + k] = block[:, m + k, :m] = 0.25 * (sums.segments(hz) @ rec.diff)
        for j in range(k, k_cov):
            block[:, m + k, m + j] = block[:, m + j, m + k] = 0.25 * sums.total(hz * z[j])
    if nu is not None:
        column = np.empty((n_rows, p))
        column[:, :m] = sums.segments(ue) @ rec.diff
        for k in range(k_cov):
            column[:, m + k] = sums.total(ue * z[k])
        column *= -0.5 * nu[:, None]
        block[:, :p, -1] = block[:, -1, :p] = column
        block[:, -1, -1] = tie_total - nu**2 * sums.total(np.multiply(r, r, out=r))
    return block


def _prior(theta: np.ndarray, m: int, precision: float | Prior) -> tuple[np.ndarray, np.ndarray]:
    """Gradient `(R, Q)` and Hessian `(Q, Q)` of the prior and the centring term (`Prior.terms`)."""
    _, grad, hess = as_prior(precision).terms(theta, m)
    return grad, hess[0]


def _symmetric_index(q: int, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices `(T,)` of the sorted index tuples of a symmetric tensor of side q, and the map from every full
    index (shape ``(q,) * order``) to its tuple's position."""
    tuples = np.array(list(itertools.combinations_with_replacement(range(q), order)), dtype=np.int64)
    full = np.zeros(q**order, dtype=np.int64)
    for perm in itertools.permutations(range(order)):
        full[np.ravel_multi_index(tuples[:, list(perm)].T, (q,) * order)] = np.arange(len(tuples))
    return np.ravel_multi_index(tuples.T, (q,) * order), full.reshape((q,) * order)


def _derivatives(pd: np.ndarray, pt: np.ndarray | None) -> list[np.ndarray]:
    """Derivatives of ``L(u, eta)`` of orders 1-3, each `(N, order + 1)` by the number of ``eta`` among the
    variables (Bradley-Terry: one column, ``u`` only)."""
    if pt is None:
        pt = np.zeros_like(pd)
    ps = 1.0 - pt
    return [
        np.stack([0.5 * pd, pt], axis=1),
        np.stack([0.25 * (ps - pd * pd), -0.5 * pd * pt, pt * ps], axis=1),
        np.stack(
            [
                0.25 * pd * (0.5 * pt - ps + pd * pd),
                0.25 * pt * (2.0 * pd * pd - ps),
                -0.5 * pd * pt * (ps - pt),
                pt * ps * (ps - pt),
            ],
            axis=1,
        ),
    ]


@dataclass(frozen=True)
class _UnitTables:
    """Per-sample sums at the full-data estimate: the unique entries of the gradient, Hessian and (when not too
    many) third-derivative tensors, side by side in ``columns`` `(n_units, T)` (``sizes``: where each order starts;
    ``maps``: full index -> unique entry), and the linear data term `(n_units, Q)`."""

    columns: np.ndarray
    sizes: np.ndarray
    maps: list
    linear: np.ndarray


def _unit_tables(design: Design, estimate: np.ndarray, davidson: bool) -> _UnitTables:
    m, p = design.m, design.x.shape[1]
    q, n, n_units = estimate.shape[0], design.x.shape[0], design.n_units
    # a record's non-zero coordinates, in increasing order: min(a, b), max(a, b), the covariates, (Davidson) log nu,
    # which takes the eta derivatives; a tensor entry is then one sorted combination of them
    lo, hi = np.minimum(design.a, design.b), np.maximum(design.a, design.b)
    cols = np.concatenate([lo[:, None], hi[:, None], np.broadcast_to(np.arange(m, q), (n, q - m))], axis=1)
    vals = np.ones(cols.shape)
    vals[:, 0] = np.where(design.a == lo, 1.0, -1.0)
    vals[:, 1] = -vals[:, 0]
    vals[:, 2 : 2 + p - m] = design.x[:, m:]
    n_nonzero = cols.shape[1]
    is_eta = np.arange(n_nonzero) == n_nonzero - 1 if davidson else np.zeros(n_nonzero, dtype=bool)
    pd, r = _probabilities((0.5 * design.x @ estimate[:p])[None, :], estimate[-1:] if davidson else None, np.float64)
    derivs = _derivatives(pd[0], r[0] * np.exp(estimate[-1]) if davidson else None)
    y = design.outcome
    half_y = 0.5 * np.where(y == 0, 1.0, np.where(y == 1, -1.0, 0.0))
    linear = vals * np.where(is_eta, (y == 2)[:, None], half_y[:, None])
    orders = 3 if len(_symmetric_index(q, 3)[0]) <= _MAX_CUBIC else 2
    columns, maps = [], []
    for order in range(1, orders + 1):
        flat, full_map = _symmetric_index(q, order)
        combos = np.array(list(itertools.combinations_with_replacement(range(n_nonzero), order)))
        entry = np.zeros((n, len(combos)), dtype=np.int64)
        value = derivs[order - 1][:, is_eta[combos].sum(axis=1)]
        for k in range(order):
            entry = entry * q + cols[:, combos[:, k]]
            value = value * vals[:, combos[:, k]]
        if order == 1:
            value = value - linear
        index = design.units[:, None] * len(flat) + full_map.ravel()[entry]
        sums = np.bincount(index.ravel(), value.ravel(), minlength=n_units * len(flat))
        columns.append(sums.reshape(n_units, len(flat)))
        maps.append(full_map)
    linear_units = np.bincount((design.units[:, None] * q + cols).ravel(), linear.ravel(), minlength=n_units * q)
    sizes = np.cumsum([0] + [c.shape[1] for c in columns])
    return _UnitTables(np.concatenate(columns, axis=1), sizes, maps, linear_units.reshape(n_units, q))


def _start(tables: _UnitTables, estimate, counts, m: int, precision: float | Prior):
    """Every resample's Chebyshev step from ``estimate`` (a Newton step when the third derivatives are too many).

    Returns:
        ``(start (B, Q), linear (B, Q), third (B, Q, Q, Q) or None)``: ``linear`` is the resample's
        ``sum_r w_r (y_r x_r / 2 + t_r e_eta)`` (minus the gradient of the linear data term), ``third`` its third
        derivatives at ``estimate``.
    """
    total = counts @ tables.columns  # (B, every unique derivative entry): one dense product
    sizes, maps = tables.sizes, tables.maps
    prior_grad, prior_hess = _prior(estimate[None], m, precision)
    grad = total[:, : sizes[1]] + prior_grad
    hess = total[:, sizes[1] : sizes[2]][:, maps[1]] + prior_hess
    step = _solve(hess, grad)
    third = None
    if len(maps) == 3:  # Chebyshev: the second-order term of the gradient along the Newton step
        third = total[:, sizes[2] : sizes[3]][:, maps[2]]
        step = step + 0.5 * _solve(hess, np.einsum("bijk,bj,bk->bi", third, step, step))
    return estimate - step, counts @ tables.linear, third


def _fit_regular(
    design: Design,
    rec: _Ordered,
    tables: _UnitTables,
    estimate,
    counts,
    precision: float | Prior,
    davidson: bool,
    theta,
) -> np.ndarray:
    """The resamples the batched path can finish, fitted into ``theta`` `(B, Q)` in place; returns which (`(B,)`
    bool)."""
    m, p = design.m, design.x.shape[1]
    regular = np.zeros(counts.shape[0], dtype=bool)
    start, linear, third = _start(tables, estimate, counts, m, precision)

    def ok(th):
        fine = np.isfinite(th).all(axis=1) & (np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) <= 4 * DIVERGED)
        if davidson:
            fine &= (th[:, -1] > TIE_LOG_BOUNDS[0]) & (th[:, -1] < TIE_LOG_BOUNDS[1])
        return fine

    def gradient(th, rows, dtype, hessian):
        g, h = _pass(rec, th, counts[rows], m, davidson, dtype, hessian)
        pg, ph = _prior(th, m, precision)
        return g - linear[rows] + pg, None if h is None else h + ph

    fine = ok(start)
    if davidson:  # a resample without ties has its tie parameter at the bound: damped_newton's case
        fine &= counts @ np.bincount(design.units[design.outcome == 2], minlength=design.n_units) > 0
    rows = np.flatnonzero(fine)
    th = start[rows]
    previous = np.full(len(rows), np.inf)
    # Newton steps in float32 while they are large (their gradients are good to about 1e-6)
    polish_rows, polish = [], []
    for _ in range(_MAX_PASSES):
        if not len(rows):
            break
        g, h = gradient(th, rows, np.float32, True)
        finite = np.isfinite(g).all(axis=1) & np.isfinite(h).all(axis=(1, 2))
        rows, th, g, h, previous = rows[finite], th[finite], g[finite], h[finite], previous[finite]
        step = _solve(h, g)
        size = np.max(np.abs(step), axis=1, initial=0.0)
        th = th - step
        keep = ok(th) & np.isfinite(size) & (size < 0.5 * previous)
        small = keep & (size <= _SWITCH)
        if small.any():  # the Hessian at the new point, to first order, and how far it may still be off (rho)
            hess, inverse, rho = h[small], None, np.full(int(small.sum()), 0.5)
            if third is not None:
                bend = _along(third, rows[small], step[small])
                inverse = _inverse(hess - bend)
                rho = np.minimum(np.abs(inverse @ bend).sum(axis=2).max(axis=1), 0.5)
            polish_rows.append(rows[small])
            polish.append((th[small], _inverse(hess) if inverse is None else inverse, rho, size[small]))
        going = keep & ~small
        rows, th, previous = rows[going], th[going], size[going]
    if not polish_rows:
        return regular
    rows = np.concatenate(polish_rows)
    th, inverse, rho, previous = (np.concatenate(part) for part in zip(*polish))
    # float64 gradients with that Hessian: linear convergence to the exact optimum at rate rho; a resample is done
    # when the distance left after its step, rho |step| / (1 - rho), is below _TOL
    for _ in range(_MAX_PASSES):
        g, _ = gradient(th, rows, np.float64, False)
        step = np.einsum("bij,bj->bi", inverse, g)
        size = np.max(np.abs(step), axis=1, initial=0.0)
        th = th - step
        finished = ok(th) & (rho * size <= _TOL * (1.0 - rho))
        theta[rows[finished]] = th[finished]
        regular[rows[finished]] = True
        rho = size / previous  # measured from now on
        going = ~finished & ok(th) & np.isfinite(size) & ((rho < 0.5) | (size <= _FLOOR))
        rows, th, inverse, rho, previous = rows[going], th[going], inverse[going], rho[going], size[going]
        rho = np.minimum(rho, 0.5)
        if not len(rows):
            break
    return regular


def _along(third: np.ndarray, rows: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``third[rows] . step`` `(R, Q, Q)` for third derivatives `(B, Q, Q, Q)`; where most rows are wanted, the
    product over every row beats copying the wanted ones out."""
    if 2 * len(rows) < len(third):
        return np.einsum("bijk,bk->bij", third[rows], step)
    full = np.zeros(third.shape[:2])
    full[rows] = step
    return np.einsum("bijk,bk->bij", third, full)[rows]


def _inverse(hess: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.inv(hess)
    except np.linalg.LinAlgError:
        return np.linalg.pinv(hess)


__all__ = ["DIVERGED", "Design", "ResampleFits", "build_design", "damped_newton", "data_nll", "fit_resamples"]
