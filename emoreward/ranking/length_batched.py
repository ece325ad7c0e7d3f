"""The length-controlled objective's solvers, for any pair model of `emoreward.ranking.tie_models`: damped Newton for
any weighting of the records, and every bootstrap resample at once from sums per sample.

Per record ``r``: the two sides' log-strengths ``s_i = b_a + gamma . z_r / 2`` and ``s_j = b_b - gamma . z_r / 2``
(their difference is the linear predictor ``x_r . theta``, ``x_r = (e_a - e_b, z_r)``), the pair model's negative
log-likelihood at them (`PairModel.terms`: Bradley-Terry drops ties), weighted per record, plus the `Prior`.
:func:`damped_newton` minimises it with the one Newton driver; :func:`fit_resamples` fits every resample at once
(``batched=False``: one at a time, the reference path), its passes over the records in `emoreward.ranking.length_pass`.
See docs/ranking.md ("Length-controlled ranking").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from emoreward.ranking.batched import damped_newton as newton
from emoreward.ranking.bootstrap import sample_units
from emoreward.ranking.bradley_terry import single_blas_thread
from emoreward.ranking.counts import encode_records
from emoreward.ranking.length_pass import Ordered, derivative_pass, reference_at
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import PairModel


DIVERGED = 15.0
"""A logit change beyond this per RMS covariate difference (odds e^15 ~ 3e6) only arises when the covariate
separates the verdicts: such a fit is a solver artefact, not an estimate."""
_MAX_ITER = 100
_CHUNK_CELLS = 2_000_000  # resamples x records per batch of damped_newton
# The predicted distance to the optimum (max-abs, parameter units) at which a resample is done. The fits promise the
# one-at-a-time path's optimum to 1e-8 (`fit_resamples`' ``batched``); the largest distance left ran to 2.3x this
# tolerance on OV-MERD under every tie model (benchmarks/results/2026-12-07-lcspeed3.md), hence 3e-9, not 1e-8.
_TOL = 3e-9
_QUADRATIC = 1e-2  # Newton steps below this are in the quadratic regime, where the next is c |step|^2
_MAX_PASSES = 8
_DTYPES = (np.float32, np.float64)
_ROUGH = 1e-4  # median step before a Newton pass above this: the pass in float32 (its gradient good to about 1e-6)
_CHORD = 1e-3  # a chord steps' predicted rate (2 |step|^2 / |previous step|^2) below this: no more Newton passes
_BOOT_CHUNK = 1024  # resamples per batch
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

    @property
    def level(self) -> np.ndarray:
        """`(N, M + K)`: the mean of the two sides' rows, ``((e_a + e_b) / 2, 0)`` (`utils.separation`'s level)."""
        level = np.zeros_like(self.x)
        rows = np.arange(len(self.a))
        level[rows, self.a] += 0.5
        level[rows, self.b] += 0.5
        return level

    def subset(self, keep: np.ndarray, columns: int | None = None) -> Design:
        """The records ``keep`` (bool `(N,)`), with the first ``columns`` parameters (default: all)."""
        x = self.x[keep] if columns is None else self.x[keep][:, :columns]
        return Design(x, self.outcome[keep], self.units[keep], self.n_units, self.a[keep], self.b[keep], self.m)


def build_design(
    records: list[PairwiseRecord], items: list[str], covariates: np.ndarray, model: PairModel
) -> tuple[Design, np.ndarray]:
    """The `Design` of ``records``; a model without a tie parameter (Bradley-Terry) drops ties.

    Args:
        records (`list[PairwiseRecord]`): the verdicts, each with its sample.
        items (`list[str]`): the models, in parameter order.
        covariates (`np.ndarray` of shape `(N, 2, K)`): each record's covariate values of its two descriptions
            (``item_a``'s, then ``item_b``'s); the design's covariates are their differences.
        model (`PairModel`): the pair model (`emoreward.ranking.tie_models`).

    Returns:
        ``(design, keep)``: ``keep`` (`np.ndarray` of shape `(N,)`, bool) marks the records in the design.
    """
    covariates = np.asarray(covariates, dtype=float)
    if covariates.shape[:2] != (len(records), 2) or covariates.ndim != 3:
        raise ValueError(f"covariates must have shape ({len(records)}, 2, K), got {covariates.shape}")
    encoded = encode_records(records, items)
    units, n_units = sample_units([r.sample for r in records])
    keep = np.ones(len(records), dtype=bool) if model.has_tie else encoded.outcome != 2
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


def n_params(design: Design, model: PairModel) -> int:
    """Parameters of the fit: ``M + K`` (effects, coefficients), plus the tie log-parameter of a tie model."""
    return design.x.shape[1] + model.has_tie


def _sides(design: Design) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The rows of ``s_i`` and ``s_j`` in the parameters (``(e_a, z / 2)`` and ``(e_b, -z / 2)``), each as its
    non-zero columns and values, both of shape `(N, 1 + K)`."""
    m, (n, p) = design.m, design.x.shape
    covariate_cols = np.broadcast_to(np.arange(m, p), (n, p - m))
    half = 0.5 * design.x[:, m:]
    ones = np.ones((n, 1))
    side_i = (np.concatenate([design.a[:, None], covariate_cols], axis=1), np.concatenate([ones, half], axis=1))
    side_j = (np.concatenate([design.b[:, None], covariate_cols], axis=1), np.concatenate([ones, -half], axis=1))
    return side_i, side_j


def _sparse(cols: np.ndarray, vals: np.ndarray, width: int) -> csr_matrix:
    n = cols.shape[0]
    return csr_matrix((vals.ravel(), (np.repeat(np.arange(n), cols.shape[1]), cols.ravel())), shape=(n, width))


def _outer_t(u: tuple, v: tuple, p: int) -> csr_matrix:
    """`(P^2, N)`: per record the flattened ``u v^T``, plus ``v u^T`` when ``u`` is not ``v`` (transposed)."""
    cols = (u[0][:, :, None] * p + v[0][:, None, :]).reshape(len(u[0]), -1)
    vals = (u[1][:, :, None] * v[1][:, None, :]).reshape(len(u[0]), -1)
    out = _sparse(cols, vals, p * p)
    if u is not v:
        cols = (v[0][:, :, None] * p + u[0][:, None, :]).reshape(len(u[0]), -1)
        out = out + _sparse(cols, (v[1][:, :, None] * u[1][:, None, :]).reshape(len(u[0]), -1), p * p)
    return out.T.tocsr()


def _dense(side: tuple, p: int) -> np.ndarray:
    """A side's rows as a dense `(N, P)` array."""
    out = np.zeros((side[0].shape[0], p))
    np.add.at(out, (np.arange(len(out))[:, None], side[0]), side[1])
    return out


def _outcomes(design: Design, weights: np.ndarray) -> list[np.ndarray]:
    """The weights `(B, N)` of a win, a loss and a tie of ``a`` per record (the pair model's ``w``, ``lo``, ``t``)."""
    return [weights * (design.outcome == code) for code in (0, 1, 2)]


def damped_newton(
    design: Design,
    model: PairModel,
    weights: np.ndarray,
    precision: float | Prior,
    x0: np.ndarray | None = None,
    hessian: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Penalised maximum likelihood for B weightings of the records at once, by the one Newton driver
    (:func:`emoreward.ranking.batched.damped_newton`): per row of ``weights`` `(B, N)`, ``sum_r w_r nll_r`` (the
    pair model's terms at the record's two sides) plus the `Prior`. A row stops unconverged when its covariate
    coefficients pass ``4 DIVERGED``; a row without ties keeps the tie log-parameter at its lower bound.

    Returns:
        ``(params, converged, hessian)``: params of shape `(B, Q)` (`n_params`: ``M + K``, plus the tie
        log-parameter), converged `(B,)` bool, and the Hessian of shape `(B, Q, Q)` at the solution (``None``
        unless ``hessian``).
    """
    m, p = design.m, design.x.shape[1]
    q = n_params(design, model)
    n_b = weights.shape[0]
    objective = _objective(design, model, weights, precision)
    theta = np.zeros((n_b, q)) if x0 is None else np.broadcast_to(x0, (n_b, q)).copy()
    lower, upper = np.full(q, -np.inf), np.full(q, np.inf)
    if model.has_tie:
        lower[-1], upper[-1] = model.bounds
        has_ties = (weights @ (design.outcome == 2)) > 0
        theta[:, -1] = np.where(has_ties, np.clip(theta[:, -1], lower[-1], upper[-1]), lower[-1])

    def diverged(th: np.ndarray) -> np.ndarray:
        return np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) > 4 * DIVERGED

    rows = max(1, _CHUNK_CELLS // max(1, weights.shape[1]))
    theta, converged, _ = newton(objective, theta, lower, upper, None, _MAX_ITER, 1e-10, rows, diverged)
    if not hessian:
        return theta, converged, None
    return theta, converged, objective(theta, np.arange(n_b), True)[2]


def _objective(design: Design, model: PairModel, weights: np.ndarray, precision: float | Prior):
    """The length-controlled objective of weighted records for :func:`emoreward.ranking.batched.damped_newton`."""
    m, p = design.m, design.x.shape[1]
    q = n_params(design, model)
    prior = as_prior(precision)
    outcomes = _outcomes(design, weights)
    side_i, side_j = _sides(design)
    x_i, x_j = _sparse(*side_i, p), _sparse(*side_j, p)
    x_i_t, x_j_t = x_i.T.tocsr(), x_j.T.tocsr()
    outer = {"ii": _outer_t(side_i, side_i, p), "jj": _outer_t(side_j, side_j, p), "ij": _outer_t(side_i, side_j, p)}

    def times(side_t, v: np.ndarray) -> np.ndarray:  # (R, N) summed through a side's rows: (R, P)
        return np.asarray(side_t @ v.T).T

    def objective(th: np.ndarray, rows: np.ndarray, derivatives: bool):
        s_i, s_j = np.asarray(x_i @ th[:, :p].T).T, np.asarray(x_j @ th[:, :p].T).T  # (R, N)
        w, lo, t = (o[rows] for o in outcomes)
        eta = th[:, p:] if model.has_tie else None
        nll, grad, hess = model.terms(s_i, s_j, eta, w, lo, t, derivatives)
        penalty, prior_grad, prior_hess = prior.terms(th, m)
        if not derivatives:
            return nll + penalty, None, None
        g = np.zeros_like(th)
        g[:, :p] = times(x_i_t, grad["i"]) + times(x_j_t, grad["j"])
        h = np.zeros((len(th), q, q))
        block = times(outer["ii"], hess["ii"]) + times(outer["jj"], hess["jj"]) + times(outer["ij"], hess["ij"])
        h[:, :p, :p] = block.reshape(len(th), p, p)
        if model.has_tie:
            g[:, -1] = grad["e"].sum(axis=1)
            h[:, :p, -1] = h[:, -1, :p] = times(x_i_t, hess["ie"]) + times(x_j_t, hess["je"])
            h[:, -1, -1] = hess["ee"].sum(axis=1)
        return nll + penalty, g + prior_grad, h + prior_hess

    return objective


def data_nll(design: Design, model: PairModel, theta: np.ndarray) -> float:
    """Data negative log-likelihood (no prior) at one parameter vector of shape `(Q,)`."""
    p = design.x.shape[1]
    x_i, x_j = (_dense(side, p) for side in _sides(design))
    w, lo, t = _outcomes(design, np.ones((1, len(design.x))))
    eta = theta[None, p:] if model.has_tie else None
    return float(model.terms((x_i @ theta[:p])[None], (x_j @ theta[:p])[None], eta, w, lo, t, False)[0][0])


def _inverse(hess: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.inv(hess)
    except np.linalg.LinAlgError:
        return np.linalg.pinv(hess)


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
    model: PairModel,
    estimate: np.ndarray,
    unit_weights: np.ndarray,
    precision: float | Prior,
    batched: bool = True,
) -> ResampleFits:
    """Fit every bootstrap resample, started at the full-data ``estimate``, under any pair model.

    A resample's objective is the per-sample objectives weighted by its sample counts. The batched path:

    1. A Newton step from per-sample sums of the gradient and Hessian at the common start (one dense product
       ``(B, S) @ (S, Q + Q^2)``): the resample's exact gradient and Hessian there; for a
       `PairModel.difference_only` model with at most 17 parameters a Chebyshev step (the step plus
       ``H^-1 T[step, step] / 2``, ``T`` the resample's third derivatives there, from per-sample sums of central
       differences of `PairModel.difference_terms`).
    2. Newton steps over all ``B x N`` records (the pair model's `PairModel.terms` at each record's two sides, or
       `PairModel.difference_terms` for a `PairModel.difference_only` model, summed per model pair with the
       resample's per-sample counts), in float32 while the median step before is above 1e-4 (a model not
       `PairModel.difference_only`: the first pass only, its gradient-only passes costing about its full ones).
       A resample leaves them when its step is below 1e-2 and the chord rate it predicts, ``2 |step|^2 /
       |previous step|^2``, below 1e-3; after a float64 Newton step it is done when the distance left,
       ``c |step|^2`` with ``c = |step| / |previous step|^2``, is below ``_TOL`` (max-abs).
    3. Chord steps: float64 gradient-only passes with the last Newton step's Hessian, which converge linearly at
       a rate ``rho`` (at most ``2 |step| / |Newton step|`` at the first, the Hessian being off by about ``2c``
       times the Newton step; then the ratio of the last two steps), until the distance left,
       ``rho |step| / (1 - rho)``, is below ``_TOL`` (max-abs; 3e-9, for the promised 1e-8 below).

    A resample this path does not finish (a model it never draws, no ties under a tie model, a tie parameter at its
    bound, a diverging coefficient, a step that does not contract (``rho >= 0.5``), a non-finite value) is fitted by
    :func:`damped_newton`.

    Args:
        design (`Design`): the records; model (`PairModel`): the pair model.
        estimate (`np.ndarray` of shape `(Q,)`): the full-data fit (`n_params`).
        unit_weights (`np.ndarray` of shape `(B, n_units)`): how often each sample was drawn in each resample.
        precision (`float` or `Prior`): the prior precision on the model effects.
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
    if estimate.shape != (n_params(design, model),):
        raise ValueError(f"estimate must have shape ({n_params(design, model)},), got {estimate.shape}")
    theta, converged = np.broadcast_to(estimate, (n_b, q)).copy(), np.zeros(n_b, dtype=bool)
    with single_blas_thread():  # small products: OpenBLAS threads only spin
        if batched and q <= _MAX_PARAMS and design.x.shape[0]:
            rec, tables = _ordered(design), _unit_tables(design, model, estimate)
            for lo in range(0, n_b, _BOOT_CHUNK):
                rows = slice(lo, lo + _BOOT_CHUNK)
                part = theta[rows]
                converged[rows] = _fit_regular(
                    design, model, rec, tables, estimate, unit_weights[rows], precision, part
                )
                theta[rows] = part
        fast = converged.copy()
        rest = np.flatnonzero(~converged)
        step = 1 if not batched else max(1, len(rest))
        for lo in range(0, len(rest), step):
            rows = rest[lo : lo + step]
            w = unit_weights[rows][:, design.units]
            theta[rows], converged[rows], _ = damped_newton(design, model, w, precision, estimate, hessian=False)
    return ResampleFits(theta, converged, fast)


def _ordered(design: Design) -> Ordered:
    m = design.m
    pair = design.a * m + design.b
    order = np.lexsort((design.units, pair))
    pair, units = pair[order], design.units[order]
    a, b = design.a[order], design.b[order]
    starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    eye = np.eye(m)
    on_a, on_b = eye[a[starts]], eye[b[starts]]
    aa = (on_a[:, :, None] * on_a[:, None, :]).reshape(len(starts), m * m)
    bb = (on_b[:, :, None] * on_b[:, None, :]).reshape(len(starts), m * m)
    ab = (on_a[:, :, None] * on_b[:, None, :] + on_b[:, :, None] * on_a[:, None, :]).reshape(len(starts), m * m)
    grid = len(units) == len(starts) * design.n_units and bool(
        np.all(units.reshape(len(starts), -1) == np.arange(design.n_units))
    )
    outcome = design.outcome[order]
    outcomes = {dt: [(outcome == code).astype(dt)[None] for code in (0, 1, 2)] for dt in _DTYPES}
    half_z = {dt: np.ascontiguousarray(0.5 * design.x[order, m:].T, dtype=dt) for dt in _DTYPES}
    x_t = {dt: np.ascontiguousarray(design.x[order].T, dtype=dt) for dt in _DTYPES}
    on_diff = on_a - on_b
    dd = (on_diff[:, :, None] * on_diff[:, None, :]).reshape(len(starts), m * m)
    z_max = np.abs(design.x[:, m:]).max(axis=0, initial=0.0)
    return Ordered(
        units, a, b, outcomes, half_z, x_t, starts, on_a, on_b, aa, bb, ab, on_diff, dd, grid, design.n_units, z_max
    )


@dataclass(frozen=True)
class _UnitTables:
    """Per-sample sums at the full-data estimate: the gradient `(n_units, Q)` and the Hessian `(n_units, Q^2)`,
    and which models each sample shows `(n_units, M)`; for a `PairModel.difference_only` model the third
    derivatives' unique entries `(n_units, T)` and their map from every index `(Q, Q, Q)` (`_third_table`); for a
    `PairModel.exponential_family` model the data-linear part of the gradient, ``sum (T_d x_r, T_e)``
    (`PairModel.natural_statistics`), `(n_units, Q)`: the gradient anywhere is ``sum n A'`` less this."""

    grad: np.ndarray
    hess: np.ndarray
    present: np.ndarray
    third: np.ndarray | None = None
    third_map: np.ndarray | None = None
    statistics: np.ndarray | None = None


_STEP = 1e-4  # central-difference step (in d and eta) of the third derivatives
_MAX_CUBIC = 1_000  # unique third-derivative entries (Q = 17: 969) above which the start is a plain Newton step


def _per_unit_symmetric(design: Design, q: int, has_tie: bool, derivs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A `PairModel.difference_only` model's derivative tensor of one order (symmetric, `(Q,) * order`), summed per
    sample: its unique entries `(n_units, T)` and the map from every index to its entry `(Q,) * order`. ``derivs``
    `(N, order + 1)`: per record the order's derivatives in ``d`` and ``eta``, by the number of ``eta`` among the
    variables. An entry over a record's non-zero coordinates (``min(a, b)``, ``max(a, b)``, the covariates,
    ``eta``) is the derivative with as many ``eta`` as it has, times the product of the other coordinates' design
    values."""
    order = derivs.shape[1] - 1
    m, p = design.m, design.x.shape[1]
    n = design.x.shape[0]
    low, high = np.minimum(design.a, design.b), np.maximum(design.a, design.b)
    cols = np.concatenate([low[:, None], high[:, None], np.broadcast_to(np.arange(m, q), (n, q - m))], axis=1)
    vals = np.ones(cols.shape)
    vals[:, 0] = np.where(design.a == low, 1.0, -1.0)
    vals[:, 1] = -vals[:, 0]
    vals[:, 2 : 2 + p - m] = design.x[:, m:]
    is_eta = np.arange(cols.shape[1]) == cols.shape[1] - 1 if has_tie else np.zeros(cols.shape[1], bool)
    tuples = np.array(list(itertools.combinations_with_replacement(range(q), order)), dtype=np.int64)
    full = np.zeros(q**order, dtype=np.int64)
    for perm in itertools.permutations(range(order)):
        full[np.ravel_multi_index(tuples[:, list(perm)].T, (q,) * order)] = np.arange(len(tuples))
    combos = np.array(list(itertools.combinations_with_replacement(range(cols.shape[1]), order)))
    entry = np.zeros((n, len(combos)), dtype=np.int64)
    value = derivs[:, is_eta[combos].sum(axis=1)]
    for k in range(order):
        entry = entry * q + cols[:, combos[:, k]]
        value = value * vals[:, combos[:, k]]
    index = design.units[:, None] * len(tuples) + full[entry]
    sums = np.bincount(index.ravel(), value.ravel(), minlength=design.n_units * len(tuples))
    return sums.reshape(design.n_units, len(tuples)), full.reshape((q,) * order)


def _third_table(design: Design, model: PairModel, estimate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A `PairModel.difference_only` model's third derivatives at ``estimate``, summed per sample
    (`_per_unit_symmetric`): per record by central differences of `PairModel.difference_terms` in ``d`` and
    ``eta``."""
    p = design.x.shape[1]
    n = design.x.shape[0]
    d = (design.x @ estimate[:p])[None]
    eta = estimate[None, p:] if model.has_tie else None
    w, lo, t = _outcomes(design, np.ones((1, n)))
    up, down = (model.difference_terms(d + h, eta, w, lo, t) for h in (_STEP, -_STEP))
    derivs = [(up[1] - down[1])[0] / (2 * _STEP)]  # d^3 / dd^3
    if model.has_tie:
        derivs += [(up[3] - down[3])[0] / (2 * _STEP), (up[4] - down[4])[0] / (2 * _STEP)]  # d^2 e, d e^2
        up, down = (model.difference_terms(d, eta + h, w, lo, t) for h in (_STEP, -_STEP))
        derivs.append((up[4] - down[4])[0] / (2 * _STEP))  # e^3
    else:
        derivs += [np.zeros(n)] * 3
    return _per_unit_symmetric(design, estimate.shape[0], model.has_tie, np.stack(derivs, axis=1))


def _difference_tables(design: Design, model: PairModel, estimate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A `PairModel.difference_only` model's gradient `(n_units, Q)` and Hessian `(n_units, Q^2)` at ``estimate``,
    summed per sample (`_per_unit_symmetric`, from `PairModel.difference_terms`)."""
    p, q = design.x.shape[1], estimate.shape[0]
    n = design.x.shape[0]
    eta = estimate[None, p:] if model.has_tie else None
    w, lo, t = _outcomes(design, np.ones((1, n)))
    terms = model.difference_terms((design.x @ estimate[:p])[None], eta, w, lo, t)
    g_d, h_dd, g_e, h_de, h_ee = (np.zeros(n) if v is None else v[0] for v in terms)
    grad, grad_map = _per_unit_symmetric(design, q, model.has_tie, np.stack([g_d, g_e], axis=1))
    hess, hess_map = _per_unit_symmetric(design, q, model.has_tie, np.stack([h_dd, h_de, h_ee], axis=1))
    return grad[:, grad_map], hess[:, hess_map.ravel()]


def _side_tables(design: Design, model: PairModel, estimate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Any pair model's gradient `(n_units, Q)` and Hessian `(n_units, Q^2)` at ``estimate``, summed per sample,
    from `PairModel.terms` at every record's two sides."""
    p, q, n = design.x.shape[1], estimate.shape[0], design.x.shape[0]
    side_i, side_j = _sides(design)
    x_i, x_j = (_dense(side, p) for side in (side_i, side_j))
    eta = estimate[None, p:] if model.has_tie else None
    w, lo, t = _outcomes(design, np.ones((1, n)))
    _, g, h = model.terms((x_i @ estimate[:p])[None], (x_j @ estimate[:p])[None], eta, w, lo, t, True)
    g, h = {k: v[0] for k, v in g.items()}, {k: v[0] for k, v in h.items()}
    # every record's non-zero gradient and Hessian entries (a side's columns, the tie parameter's column p), summed
    # per sample by one bincount each: entry (u, v) of h_ab x_a x_b^T is h_ab x_a[u] x_b[v]
    tie = (np.full((n, 1), p), np.ones((n, 1)))
    grad_parts = [(side_i, g["i"]), (side_j, g["j"])]
    hess_parts = [(side_i, side_i, h["ii"]), (side_j, side_j, h["jj"]), (side_i, side_j, h["ij"])]
    hess_parts.append((side_j, side_i, h["ij"]))
    if model.has_tie:
        grad_parts.append((tie, g["e"]))
        hess_parts += [(side_i, tie, h["ie"]), (tie, side_i, h["ie"]), (side_j, tie, h["je"]), (tie, side_j, h["je"])]
        hess_parts.append((tie, tie, h["ee"]))

    def per_unit(cols: list, vals: list, width: int) -> np.ndarray:
        index = np.concatenate([(design.units[:, None] * width + c.reshape(n, -1)).ravel() for c in cols])
        values = np.concatenate([v.ravel() for v in vals])
        return np.bincount(index, values, minlength=design.n_units * width).reshape(design.n_units, width)

    grad = per_unit([side[0] for side, _ in grad_parts], [side[1] * v[:, None] for side, v in grad_parts], q)
    hess = per_unit(
        [a[0][:, :, None] * q + b[0][:, None, :] for a, b, _ in hess_parts],
        [v[:, None, None] * a[1][:, :, None] * b[1][:, None, :] for a, b, v in hess_parts],
        q * q,
    )
    return grad, hess


def _unit_tables(design: Design, model: PairModel, estimate: np.ndarray) -> _UnitTables:
    m, q, n = design.m, estimate.shape[0], design.x.shape[0]
    # a difference model from its derivatives in (d, eta): 10 Hessian entries per record instead of 25 (K = 1, a tie)
    tables = _difference_tables if model.difference_only else _side_tables
    grad, hess = tables(design, model, estimate)
    present = np.zeros((design.n_units, m), dtype=bool)
    present[design.units, design.a] = present[design.units, design.b] = True
    cubic = model.difference_only and math.comb(q + 2, 3) <= _MAX_CUBIC
    third = _third_table(design, model, estimate) if cubic else (None, None)
    statistics = None
    if model.exponential_family:
        w, lo, t = _outcomes(design, np.ones((1, n)))
        _, t_d, t_e = model.natural_statistics(w[0], lo[0], t[0])
        per_record = t_d[:, None] * design.x if t_e is None else np.column_stack([t_d[:, None] * design.x, t_e])
        statistics = np.zeros((design.n_units, q))
        np.add.at(statistics, design.units, per_record)
    return _UnitTables(grad, hess, present, *third, statistics)


def _fit_regular(
    design: Design,
    model: PairModel,
    rec: Ordered,
    tables: _UnitTables,
    estimate: np.ndarray,
    counts: np.ndarray,
    precision: float | Prior,
    theta: np.ndarray,
) -> np.ndarray:
    """The resamples the batched path can finish, fitted into ``theta`` `(B, Q)` in place; returns which (`(B,)`
    bool)."""
    m, p = design.m, design.x.shape[1]
    q = estimate.shape[0]
    prior = as_prior(precision)
    regular = np.zeros(counts.shape[0], dtype=bool)
    _, prior_grad, prior_hess = prior.terms(estimate[None], m)
    grad = counts @ tables.grad + prior_grad
    hess = (counts @ tables.hess).reshape(-1, q, q) + prior_hess
    step = _solve(hess, grad)
    if tables.third is not None:  # Chebyshev: the second-order term of the gradient along the Newton step
        # T[step, step]_i = sum_{j <= k} (2 - [j = k]) T_ijk step_j step_k: the unique pairs only
        j, k = np.triu_indices(q)
        pairs = step[:, j] * step[:, k] * np.where(j == k, 1.0, 2.0)
        third = (counts @ tables.third)[:, tables.third_map[:, j, k]]  # (B, Q, Q (Q + 1) / 2)
        step = step + 0.5 * _solve(hess, np.matmul(third, pairs[:, :, None])[:, :, 0])
    start = estimate - step
    family = {}  # an exponential family's gradient parts per resample, once: for float64 passes and float32 ones
    if tables.statistics is not None:
        linear = counts @ tables.statistics
        family = {np.float64: (linear, None), np.float32: (linear, reference_at(rec, model, estimate))}

    def parts(rows: np.ndarray, dtype) -> dict:
        if not family:
            return {}
        linear, reference = family[dtype]
        return {"linear": linear[rows], "reference": reference}

    def ok(th: np.ndarray) -> np.ndarray:
        fine = np.isfinite(th).all(axis=1) & (np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) <= 4 * DIVERGED)
        if model.has_tie:
            fine &= (th[:, -1] > model.bounds[0]) & (th[:, -1] < model.bounds[1])
        return fine

    # a model the resample never draws, or no ties under a tie model (the tie parameter at its bound): damped_newton
    fine = ok(start) & ((counts @ tables.present) > 0).all(axis=1)
    if model.has_tie:
        fine &= counts @ np.bincount(design.units[design.outcome == 2], minlength=design.n_units) > 0
    rows = np.flatnonzero(fine)
    th = start[rows]
    previous = np.max(np.abs(start - estimate), axis=1)[rows]
    near = []  # (rows, theta, inverse Hessian, Newton step size) of the resamples handed to the chord steps
    for n_pass in range(_MAX_PASSES):
        if not len(rows):
            break
        # a generic model's gradient-only pass costs about its full one: only its first Newton pass in float32
        rough = (model.difference_only or n_pass == 0) and float(np.median(previous)) > _ROUGH
        dtype = np.float32 if rough else np.float64
        g, h = derivative_pass(rec, model, th, counts[rows], m, dtype, **parts(rows, dtype))
        _, pg, ph = prior.terms(th, m)
        inverse = _inverse(h + ph)
        step = np.einsum("bij,bj->bi", inverse, g + pg)
        size = np.max(np.abs(step), axis=1, initial=0.0)
        th = th - step
        # Newton's quadratic convergence, its constant measured from the last two steps: c = size / previous^2
        with np.errstate(divide="ignore", invalid="ignore"):
            left = size**3 / previous**2
        finished = ok(th) & (size <= _QUADRATIC) & ((left <= _TOL) | (size <= _TOL)) & (not rough)
        theta[rows[finished]] = th[finished]
        regular[rows[finished]] = True
        going = ~finished & ok(th) & np.isfinite(size) & (size < 0.5 * previous)
        with np.errstate(divide="ignore", invalid="ignore"):
            close = going & (size <= _QUADRATIC) & (2 * size**2 <= _CHORD * previous**2)
        near.append((rows[close], th[close], inverse[close], size[close]))
        going &= ~close
        rows, th, previous = rows[going], th[going], size[going]
    if not near:
        return regular
    rows, th, inverse, previous = (np.concatenate(part) for part in zip(*near))
    # chord steps: float64 gradients with the last Newton Hessian, converging linearly at a rate rho; the Hessian is
    # off by about 2c |Newton step| (c = |chord step| / |Newton step|^2), so the first rho = 2 |step| / |Newton
    # step| at most, then the ratio of the last two steps; a resample is done when the distance left,
    # rho |step| / (1 - rho), is below _TOL
    factor = 2.0
    for _ in range(_MAX_PASSES):
        if not len(rows):
            break
        g, _ = derivative_pass(rec, model, th, counts[rows], m, np.float64, hessian=False, **parts(rows, np.float64))
        step = np.einsum("bij,bj->bi", inverse, g + prior.terms(th, m)[1])
        size = np.max(np.abs(step), axis=1, initial=0.0)
        th = th - step
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = factor * size / previous
            left = rho * size / (1.0 - rho)
        finished = ok(th) & ((size == 0) | ((rho < 0.5) & (left <= _TOL)))
        theta[rows[finished]] = th[finished]
        regular[rows[finished]] = True
        # the first rate is a bound (a float32 Newton step near its noise floor makes it loose): contraction is
        # required from the second step on
        going = ~finished & ok(th) & np.isfinite(size) & ((rho < 0.5) | (factor > 1.0))
        rows, th, inverse, previous, factor = rows[going], th[going], inverse[going], size[going], 1.0
    return regular


__all__ = [
    "DIVERGED",
    "Design",
    "Prior",
    "ResampleFits",
    "build_design",
    "damped_newton",
    "data_nll",
    "fit_resamples",
    "n_params",
]
