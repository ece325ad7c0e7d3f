"""The length-controlled objective's solvers, for any pair model of `emoreward.ranking.tie_models`: damped Newton for
any weighting of the records, and every bootstrap resample at once from sums per sample.

Per record ``r``: the two sides' log-strengths ``s_i = b_a + gamma . z_r / 2`` and ``s_j = b_b - gamma . z_r / 2``
(their difference is the linear predictor ``x_r . theta``, ``x_r = (e_a - e_b, z_r)``), the pair model's negative
log-likelihood at them (`PairModel.terms`: Bradley-Terry drops ties), weighted per record, plus the `Prior`.
:func:`damped_newton` minimises it with the one Newton driver; :func:`fit_resamples` fits every resample at once
(``batched=False``: one at a time, the reference path). See docs/ranking.md ("Length-controlled ranking").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from emoreward.ranking.batched import damped_newton as newton
from emoreward.ranking.bootstrap import sample_units
from emoreward.ranking.bradley_terry import single_blas_thread
from emoreward.ranking.counts import encode_records
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import PairModel


DIVERGED = 15.0
"""A logit change beyond this per RMS covariate difference (odds e^15 ~ 3e6) only arises when the covariate
separates the verdicts: such a fit is a solver artefact, not an estimate."""
_MAX_ITER = 100
_CHUNK_CELLS = 2_000_000  # resamples x records per batch of damped_newton
_PASS_CELLS = 65_536  # resamples x records per chunk of a pass (in L2 cache)
# The predicted distance to the optimum (max-abs, parameter units) at which a resample is done. The fits promise the
# one-at-a-time path's optimum to 1e-8 (`fit_resamples`' ``batched``); the distance left ran to 2.3x its prediction
# on OV-MERD under every tie model (benchmarks/results/2026-12-07-lcspeed3.md), hence 3e-9, not 1e-8.
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


@dataclass(frozen=True)
class _Ordered:
    """The records sorted by model pair, then sample, as every pass reads them.

    ``a``, ``b`` `(N,)`: sorted; ``outcomes[dtype]``: the one-hot ``w``, ``lo``, ``t`` `(1, N)`; ``half_z[dtype]``:
    covariates / 2 `(K, N)`; ``x_t[dtype]``: the design rows ``(e_a - e_b, z)`` transposed `(M + K, N)`;
    ``starts``: the first record of each pair segment; ``on_a``, ``on_b`` `(S, M)`: the segment's ``e_a``,
    ``e_b``; ``aa``, ``bb``, ``ab`` `(S, M^2)`: ``e_a e_a^T``, ``e_b e_b^T``, ``e_a e_b^T + e_b e_a^T`` flattened;
    ``on_diff`` `(S, M)` and ``dd`` `(S, M^2)`: ``e_a - e_b`` and its outer square (a `PairModel.difference_only`
    model's); ``grid``: every segment lists every sample once, in order, so that a weighted sum over a segment is a
    product with the resample's per-sample counts (the weights are never spread over the records); ``z_max`` `(K,)`:
    the largest ``|z_k|``.
    """

    units: np.ndarray
    a: np.ndarray
    b: np.ndarray
    outcomes: dict
    half_z: dict
    x_t: dict
    starts: np.ndarray
    on_a: np.ndarray
    on_b: np.ndarray
    aa: np.ndarray
    bb: np.ndarray
    ab: np.ndarray
    on_diff: np.ndarray
    dd: np.ndarray
    grid: bool
    n_units: int
    z_max: np.ndarray


class _Sums:
    """Weighted sums over the records of `(R, N)` arrays, for R resamples with per-sample counts `(R, n_units)`."""

    def __init__(self, rec: _Ordered, counts: np.ndarray) -> None:
        self.rec = rec
        self.counts = counts[:, :, None] if rec.grid else None
        self.weights = None if rec.grid else np.take(counts, rec.units, axis=1)

    def segments(self, a: np.ndarray) -> np.ndarray:
        """`(R, S)`: per pair segment, ``sum_r w_r a_r``."""
        rows = (self.weights if self.counts is None else self.counts).shape[0]
        if a.shape[0] != rows:  # a (1, N) term
            a = np.broadcast_to(a, (rows, *a.shape[1:]))
        if self.rec.grid:
            return np.matmul(a.reshape(a.shape[0], len(self.rec.starts), -1), self.counts)[:, :, 0]
        return np.add.reduceat(a * self.weights, self.rec.starts, axis=1)

    def total(self, a: np.ndarray) -> np.ndarray:
        """`(R,)`: ``sum_r w_r a_r``."""
        return self.segments(a).sum(axis=1)


def _ordered(design: Design) -> _Ordered:
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
    return _Ordered(
        units, a, b, outcomes, half_z, x_t, starts, on_a, on_b, aa, bb, ab, on_diff, dd, grid, design.n_units, z_max
    )


def _pass_arrays(rec: _Ordered, theta: np.ndarray, m: int, dtype, hessian: bool):
    """A pass's shapes and outputs: (covariates K, parameters before the tie one P = M + K, the gradient `(R, Q)`,
    the Hessian `(R, Q, Q)` or None)."""
    n_rows, q = theta.shape
    k_cov = rec.half_z[dtype].shape[0]
    return k_cov, m + k_cov, np.zeros((n_rows, q)), np.zeros((n_rows, q, q)) if hessian else None


def _pass_chunks(rec: _Ordered, theta: np.ndarray, dtype) -> Iterator[tuple[int, int]]:
    """The resample rows of a pass in chunks of about `_PASS_CELLS` (resample, record) cells: ``(lo, hi)``."""
    n_rows, n = theta.shape[0], rec.half_z[dtype].shape[1]
    chunk = max(1, _PASS_CELLS // max(1, n))
    for lo in range(0, n_rows, chunk):
        yield lo, min(n_rows, lo + chunk)


def _pass(
    rec: _Ordered,
    model: PairModel,
    theta: np.ndarray,
    counts: np.ndarray,
    m: int,
    dtype=np.float64,
    hessian=True,
    linear: np.ndarray | None = None,
    reference: _Reference | None = None,
):
    """The data part of the gradient `(R, Q)` and Hessian `(R, Q, Q)` (``None`` unless ``hessian``) of
    ``sum_r w_r nll_r`` for rows ``theta`` `(R, Q)` with per-sample counts `(R, n_units)`, from the pair model's
    terms at every record's two sides, computed in ``dtype`` over the records (the sums returned in float64). A
    `PairModel.difference_only` model goes through :func:`_difference_pass` (5 terms per record, from
    `PairModel.difference_terms`; for a `PairModel.exponential_family` model from
    `PairModel.scaled_log_partition`, less ``linear`` `(R, Q)`, the part computed once per resample, and from
    ``reference`` on in float32: see there)."""
    if model.difference_only:
        return _difference_pass(rec, model, theta, counts, m, dtype, hessian, linear, reference)
    k_cov, p, grad, hess = _pass_arrays(rec, theta, m, dtype, hessian)
    z, outcomes = rec.half_z[dtype], rec.outcomes[dtype]
    for lo, hi in _pass_chunks(rec, theta, dtype):
        th, sums = theta[lo:hi].astype(dtype), _Sums(rec, counts[lo:hi].astype(dtype))
        shift = th[:, m:p] @ z  # gamma . z / 2, (R, N)
        s_i, s_j = th[:, rec.a] + shift, th[:, rec.b] - shift
        eta = th[:, p:] if model.has_tie else None
        _, g, h = model.terms(s_i, s_j, eta, *outcomes, True)
        grad[lo:hi, :m] = sums.segments(g["i"]) @ rec.on_a + sums.segments(g["j"]) @ rec.on_b
        for k in range(k_cov):
            grad[lo:hi, m + k] = sums.total((g["i"] - g["j"]) * z[k])
        if model.has_tie:
            grad[lo:hi, -1] = sums.total(g["e"])
        if not hessian:
            continue
        seg = {key: sums.segments(v) for key, v in h.items()}
        block = hess[lo:hi]
        block[:, :m, :m] = (seg["ii"] @ rec.aa + seg["jj"] @ rec.bb + seg["ij"] @ rec.ab).reshape(-1, m, m)
        side_i, side_j = h["ii"] - h["ij"], h["ij"] - h["jj"]  # d/d gamma of the two sides' gradients, by z / 2
        curvature = side_i - side_j
        for k in range(k_cov):
            block[:, :m, m + k] = block[:, m + k, :m] = (
                sums.segments(side_i * z[k]) @ rec.on_a + sums.segments(side_j * z[k]) @ rec.on_b
            )
            weighted = curvature * z[k]
            for j in range(k, k_cov):
                block[:, m + k, m + j] = block[:, m + j, m + k] = sums.total(weighted * z[j])
        if model.has_tie:
            column = np.empty((hi - lo, p))
            column[:, :m] = seg["ie"] @ rec.on_a + seg["je"] @ rec.on_b
            for k in range(k_cov):
                column[:, m + k] = sums.total((h["ie"] - h["je"]) * z[k])
            block[:, :p, -1] = block[:, -1, :p] = column
            block[:, -1, -1] = seg["ee"].sum(axis=1)
    return grad, hess


def _difference_pass(
    rec: _Ordered,
    model: PairModel,
    theta: np.ndarray,
    counts: np.ndarray,
    m: int,
    dtype,
    hessian: bool,
    linear: np.ndarray | None = None,
    reference: _Reference | None = None,
):
    """:func:`_pass` for a `PairModel.difference_only` model: per record ``d = s_i - s_j = b_a - b_b + gamma . z``
    and the derivatives in ``d`` and ``eta`` (`PairModel.difference_terms`); the record's parameter row is
    ``x = (e_a - e_b, z)`` (``z = 2 half_z``), so the gradient is ``sum g_d x`` and the Hessian ``sum h_dd x x^T``
    (with ``sum h_de x`` and ``sum h_ee`` for ``eta``): 5 segment sums, and the covariate ones. For a
    `PairModel.exponential_family` model the terms are ``n`` times ``A``'s derivatives up to their factors
    (`PairModel.scaled_log_partition`, the factors of `PairModel.partition_scaling` applied to the sums; the
    outcomes untouched when every record is one trial) and the gradient is their sum less ``linear`` `(R, Q)`:
    ``counts @ _UnitTables.statistics``, the data-linear part; with ``reference`` (`_Reference`: the scaled
    derivatives at the full-data estimate per record, in ``dtype``) the terms are ``n (s' - reference)``, small near
    the estimate, so that float32 sums lose no digits to the cancellation of ``sum n A'`` against ``sum T``, and
    the sums ``n reference`` come back in float64 from its per-sample table."""
    family = model.exponential_family
    trials = model.natural_statistics(*rec.outcomes[dtype])[0] if family else None
    if trials is not None and np.all(trials == 1):
        trials = None
    k_cov, p, grad, hess = _pass_arrays(rec, theta, m, dtype, hessian)
    half_z, outcomes = rec.half_z[dtype], rec.outcomes[dtype]
    scaling = model.partition_scaling if family else None
    theta_d, counts_d = theta.astype(dtype), counts.astype(dtype)
    if family:  # u = argument * d from the scaled parameters; |d| <= max b - min b + sum_k |gamma_k| max |z_k|
        scaled = (theta[:, :p] * scaling.argument).astype(dtype)
        bound = abs(scaling.argument) * (np.ptp(theta[:, :m], axis=1) + np.abs(theta[:, m:p]) @ rec.z_max)
    for lo, hi in _pass_chunks(rec, theta, dtype):
        th, sums = theta_d[lo:hi], _Sums(rec, counts_d[lo:hi])
        eta = th[:, p:] if model.has_tie else None
        if family:
            u = scaled[lo:hi, :p] @ rec.x_t[dtype]  # argument * (b_a - b_b + gamma . z), (R, N)
            terms = model.scaled_log_partition(u, eta, hessian, float(bound[lo:hi].max()))
            if reference is not None:
                np.subtract(terms[0], reference.d, out=terms[0])
                if model.has_tie:
                    np.subtract(terms[2], reference.e, out=terms[2])
            if trials is not None:
                terms = tuple(None if v is None else v * trials for v in terms)
        else:
            d = th[:, :p] @ rec.x_t[dtype]  # b_a - b_b + gamma . z, (R, N)
            terms = model.difference_terms(d, eta, *outcomes, hessian=hessian)
        g_d, h_dd, g_e, h_de, h_ee = terms
        grad[lo:hi, :m] = sums.segments(g_d) @ rec.on_diff
        for k in range(k_cov):  # the factors 2 and 4 of z = 2 half_z applied to the sums
            grad[lo:hi, m + k] = 2 * sums.total(g_d * half_z[k])
        if model.has_tie:
            grad[lo:hi, -1] = sums.total(g_e)
        if not hessian:
            continue
        block = hess[lo:hi]
        block[:, :m, :m] = (sums.segments(h_dd) @ rec.dd).reshape(-1, m, m)
        for k in range(k_cov):
            weighted = h_dd * half_z[k]
            block[:, :m, m + k] = block[:, m + k, :m] = 2 * (sums.segments(weighted) @ rec.on_diff)
            for j in range(k, k_cov):
                block[:, m + k, m + j] = block[:, m + j, m + k] = 4 * sums.total(weighted * half_z[j])
        if model.has_tie:
            column = np.empty((hi - lo, p))
            column[:, :m] = sums.segments(h_de) @ rec.on_diff
            for k in range(k_cov):
                column[:, m + k] = 2 * sums.total(h_de * half_z[k])
            block[:, :p, -1] = block[:, -1, :p] = column
            block[:, -1, -1] = sums.total(h_ee)
    if family:  # the factors, once per row: grad = f (sum n (s' - reference) + counts @ reference table) - linear
        f_d, f_dd, f_e, f_de, f_ee = scaling.factors(theta[:, p:] if model.has_tie else None, len(theta))
        if reference is not None:
            grad += counts @ reference.table
        grad[:, :p] *= f_d
        if model.has_tie:
            grad[:, -1:] *= f_e
        grad -= linear
        if hessian:
            hess[:, :p, :p] *= f_dd[:, :, None]
            if model.has_tie:
                hess[:, :p, -1] *= f_de
                hess[:, -1, :p] *= f_de
                hess[:, -1, -1] *= f_ee[:, 0]
    return grad, hess


@dataclass(frozen=True)
class _Reference:
    """An `PairModel.exponential_family` model's scaled derivatives at the full-data estimate
    (`PairModel.scaled_log_partition`), per record in `_Ordered` order: ``d`` and ``e`` `(1, N)` (``e`` ``None``
    without a tie parameter) in the float32 passes' dtype, and ``table`` `(n_units, Q)`: per sample, ``sum n
    reference x`` (and ``sum n reference_e``) of those very values, in float64."""

    d: np.ndarray
    e: np.ndarray | None
    table: np.ndarray


def _reference(rec: _Ordered, model: PairModel, estimate: np.ndarray, dtype=np.float32) -> _Reference:
    p = rec.x_t[np.float64].shape[0]
    eta = estimate[None, p:] if model.has_tie else None
    u = (model.partition_scaling.argument * estimate[:p]) @ rec.x_t[np.float64]
    terms = model.scaled_log_partition(u[None], eta, False)
    ref_d, ref_e = (None if v is None else v.astype(dtype) for v in (terms[0], terms[2]))
    trials = model.natural_statistics(*rec.outcomes[np.float64])[0][0]
    per_record = [trials * ref_d[0].astype(np.float64) * rec.x_t[np.float64]]
    if ref_e is not None:
        per_record.append((trials * ref_e[0].astype(np.float64))[None])
    table = np.zeros((rec.n_units, estimate.shape[0]))
    np.add.at(table, rec.units, np.concatenate(per_record).T)
    return _Reference(ref_d, ref_e, table)


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
    rec: _Ordered,
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
        family = {np.float64: (linear, None), np.float32: (linear, _reference(rec, model, estimate))}

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
        g, h = _pass(rec, model, th, counts[rows], m, dtype, **parts(rows, dtype))
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
        g, _ = _pass(rec, model, th, counts[rows], m, np.float64, hessian=False, **parts(rows, np.float64))
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
