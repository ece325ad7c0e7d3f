"""One pass of the length-controlled resamples over every (resample, verdict) cell: the data gradient and Hessian of
many resamples at once from the pair model's derivatives per verdict, summed per model pair with each resample's
per-sample counts; `emoreward.ranking.length_batched.fit_resamples` drives it. See docs/ranking.md ("Every resample
at once").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from emoreward.ranking.tie_models import PairModel


_PASS_CELLS = 65_536  # resamples x records per chunk of a pass (in L2 cache)


@dataclass(frozen=True)
class Ordered:
    """The records sorted by model pair, then sample, as every pass reads them (built once per design by
    `emoreward.ranking.length_batched`).

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


class Sums:
    """Weighted sums over the records of `(R, N)` arrays, for R resamples with per-sample counts `(R, n_units)`."""

    def __init__(self, rec: Ordered, counts: np.ndarray) -> None:
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


def _pass_arrays(rec: Ordered, theta: np.ndarray, m: int, dtype, hessian: bool):
    """A pass's shapes and outputs: (covariates K, parameters before the tie one P = M + K, the gradient `(R, Q)`,
    the Hessian `(R, Q, Q)` or None)."""
    n_rows, q = theta.shape
    k_cov = rec.half_z[dtype].shape[0]
    return k_cov, m + k_cov, np.zeros((n_rows, q)), np.zeros((n_rows, q, q)) if hessian else None


def _pass_chunks(rec: Ordered, theta: np.ndarray, dtype) -> Iterator[tuple[int, int]]:
    """The resample rows of a pass in chunks of about `_PASS_CELLS` (resample, record) cells: ``(lo, hi)``."""
    n_rows, n = theta.shape[0], rec.half_z[dtype].shape[1]
    chunk = max(1, _PASS_CELLS // max(1, n))
    for lo in range(0, n_rows, chunk):
        yield lo, min(n_rows, lo + chunk)


def derivative_pass(
    rec: Ordered,
    model: PairModel,
    theta: np.ndarray,
    counts: np.ndarray,
    m: int,
    dtype=np.float64,
    hessian=True,
    linear: np.ndarray | None = None,
    reference: Reference | None = None,
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
        th, sums = theta[lo:hi].astype(dtype), Sums(rec, counts[lo:hi].astype(dtype))
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
    rec: Ordered,
    model: PairModel,
    theta: np.ndarray,
    counts: np.ndarray,
    m: int,
    dtype,
    hessian: bool,
    linear: np.ndarray | None = None,
    reference: Reference | None = None,
):
    """:func:`derivative_pass` for a `PairModel.difference_only` model: per record ``d = s_i - s_j = b_a - b_b +
    gamma . z`` and the derivatives in ``d`` and ``eta`` (`PairModel.difference_terms`); the record's parameter row is
    ``x = (e_a - e_b, z)`` (``z = 2 half_z``), so the gradient is ``sum g_d x`` and the Hessian ``sum h_dd x x^T``
    (with ``sum h_de x`` and ``sum h_ee`` for ``eta``): 5 segment sums, and the covariate ones. For a
    `PairModel.exponential_family` model the terms are ``n`` times ``A``'s derivatives up to their factors
    (`PairModel.scaled_log_partition`, the factors of `PairModel.partition_scaling` applied to the sums; the
    outcomes untouched when every record is one trial) and the gradient is their sum less ``linear`` `(R, Q)`, the
    data-linear part (the counts times its per-sample table, once per resample); with ``reference`` (`Reference`:
    the scaled derivatives at the full-data estimate per record, in ``dtype``) the terms are ``n (s' -
    reference)``, small near the estimate, so that float32 sums lose no digits to the cancellation of ``sum n A'``
    against ``sum T``, and the sums ``n reference`` come back in float64 from its per-sample table."""
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
        th, sums = theta_d[lo:hi], Sums(rec, counts_d[lo:hi])
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
class Reference:
    """An `PairModel.exponential_family` model's scaled derivatives at the full-data estimate
    (`PairModel.scaled_log_partition`), per record in `Ordered` order: ``d`` and ``e`` `(1, N)` (``e`` ``None``
    without a tie parameter) in the float32 passes' dtype, and ``table`` `(n_units, Q)`: per sample, ``sum n
    reference x`` (and ``sum n reference_e``) of those very values, in float64."""

    d: np.ndarray
    e: np.ndarray | None
    table: np.ndarray


def reference_at(rec: Ordered, model: PairModel, estimate: np.ndarray, dtype=np.float32) -> Reference:
    """The `Reference` of an `PairModel.exponential_family` ``model`` at ``estimate`` `(Q,)`, its per-record values in
    ``dtype`` (that of the passes that subtract it)."""
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
    return Reference(ref_d, ref_e, table)


__all__ = ["Ordered", "Reference", "Sums", "derivative_pass", "reference_at"]
