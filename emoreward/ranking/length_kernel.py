"""The length-controlled objective's data pass, compiled: gradient and Hessian of every bootstrap resample at once
over a `(pair, sample)` table, with one exponential per (resample, model, sample) instead of one per record.

:mod:`emoreward.ranking.length_batched` solves the objective of :mod:`emoreward.ranking.length_control` (Davidson
1970 with covariates; Bradley-Terry when ``nu = 0``); :func:`table_pass` computes its data part,
``sum_r w_r L(u_r, eta)`` with ``L(u, eta) = log(e^{u/2} + e^{-u/2} + e^eta)``, in float64 throughout (numba;
its docstring says why it is cheap). Rows whose factors could overflow (``|b_m + gamma . F| / 2`` beyond
`FACTOR_BOUND`) are left to the caller's general pass. See docs/ranking.md ("Length-controlled ranking").
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np


FACTOR_BOUND = 300.0
"""A bound on ``|b_m + gamma . F[:, m, s]| / 2`` under which ``G``, ``1 / G`` and their products stay finite in
float64 (e^600 < 1.8e308)."""
_MIN_ROWS_PER_THREAD = 16  # fewer rows than this per thread: one thread (starting threads costs more)


def table_pass(
    theta: np.ndarray,
    counts: np.ndarray,
    mult: np.ndarray,
    features: np.ndarray,
    pair_a: np.ndarray,
    pair_b: np.ndarray,
    m: int,
    davidson: bool,
    hessian: bool,
    threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The data part of the gradient `(R, Q)` and Hessian `(R, Q, Q)` (None unless ``hessian``) of
    ``sum_r w_r L(u_r, eta)``, as :func:`emoreward.ranking.length_batched._pass` computes it, in float64.

    Two facts make this pass cheap:

    1. **The covariates are per description.** A record compares descriptions ``(a, s)`` and ``(b, s)`` and its
       covariate differences are ``z_r = F[:, a, s] - F[:, b, s]``, so with ``G[m, s] = exp((b_m + gamma .
       F[:, m, s]) / 2)`` a record's ``e^{u/2}`` is ``G[a, s] / G[b, s]``: M x S exponentials per resample
       instead of N.
    2. **Only the multiplicity of a (pair, sample) matters.** ``L`` is even in ``u`` and its derivatives in
       ``theta`` do not depend on the verdict (the verdict enters the objective linearly, in the caller's
       ``linear`` term), and a record (b, a) has ``u`` and ``x`` negated: so the records reduce to a count per
       unordered pair and sample, and a resample's weight of a cell is that count times how often the sample was
       drawn.

    The loop runs over resamples, then pairs, then samples: the innermost loop reads contiguous arrays and
    vectorises (numba; ``fastmath`` only reassociates the sums and contracts multiply-adds, so NaN and infinity
    keep their meaning).

    Args:
        theta (`np.ndarray` of shape `(R, Q)`): parameters ``(b (M), gamma (K), [log nu])``; every row within
            `FACTOR_BOUND` (the caller checks).
        counts (`np.ndarray` of shape `(R, S)`): how often each sample was drawn in each resample.
        mult (`np.ndarray` of shape `(P, S)`): records per unordered pair and sample.
        features (`np.ndarray` of shape `(K, M, S)`): per-description covariates ``F`` (any finite value where a
            description is absent: its cells have multiplicity 0).
        pair_a, pair_b (`np.ndarray` of shape `(P,)`, int64): the pairs' models.
        m (`int`): the number of models M.
        davidson (`bool`): Davidson's ties (``log nu`` is the last parameter), else Bradley-Terry.
        hessian (`bool`): also the Hessian.
        threads (`int`, optional): threads to split the rows across (default `fit_threads`: one per CPU this
            process may use). The compiled pass releases the GIL and computes each row alone, so the result does
            not depend on the number of threads.
    """
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    fixed = (
        np.ascontiguousarray(mult, dtype=np.float64),
        np.ascontiguousarray(features, dtype=np.float64),
        np.ascontiguousarray(pair_a, dtype=np.int64),
        np.ascontiguousarray(pair_b, dtype=np.int64),
        m,
        davidson,
        hessian,
    )
    n_rows, q = theta.shape
    grad = np.empty((n_rows, q))
    hess = np.empty((n_rows if hessian else 0, q, q))

    def rows(lo: int, hi: int) -> None:  # writes rows lo:hi of grad and hess
        _table_pass(theta[lo:hi], counts[lo:hi], *fixed, grad[lo:hi], hess[lo:hi] if hessian else hess)

    threads = min(fit_threads() if threads is None else max(1, threads), max(1, n_rows // _MIN_ROWS_PER_THREAD))
    if threads == 1:
        rows(0, n_rows)
    else:
        bounds = np.linspace(0, n_rows, threads + 1).astype(int)
        with ThreadPoolExecutor(threads, thread_name_prefix="emoreward-fit") as pool:
            list(pool.map(rows, bounds[:-1], bounds[1:]))  # list(): raises what a thread raised
    return grad, hess if hessian else None


def fit_threads() -> int:
    """Threads for the compiled pass: the CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _table_pass(
    theta, counts, mult, features, pair_a, pair_b, m, davidson, hessian, grad, hess
):  # pragma: no cover - compiled (its Python source runs only under NUMBA_DISABLE_JIT)
    """:func:`table_pass` on rows ``theta`` `(R, Q)`, written into ``grad`` `(R, Q)` and (``hessian``) ``hess``
    `(R, Q, Q)`."""
    n_rows, q = theta.shape
    k_cov = features.shape[0]
    n_units = counts.shape[1]
    n_pairs = pair_a.shape[0]
    p = m + k_cov
    grad[:, :] = 0.0
    if hessian:
        hess[:, :, :] = 0.0
    g = np.empty((m, n_units))  # a row's G = exp((b_m + gamma . F[:, m, s]) / 2) and 1 / G
    gi = np.empty((m, n_units))
    wpd = np.empty(n_units)  # per sample of the current pair: w (P(a) - P(b))
    whu = np.empty(n_units)  # w h_uu (times 4)
    wue = np.empty(n_units)  # w (P(a) - P(b)) r
    z = np.empty((k_cov, n_units))
    grad_cov = np.empty(k_cov)
    hess_cov = np.empty((k_cov, k_cov))
    tie_cov = np.empty(k_cov)
    for row in range(n_rows):
        grad_cov[:] = 0.0
        hess_cov[:, :] = 0.0
        tie_cov[:] = 0.0
        nu = math.exp(theta[row, q - 1]) if davidson else 0.0
        w = counts[row]
        for mm in range(m):
            base = theta[row, mm]
            for s in range(n_units):
                if w[s] == 0.0:  # a sample the resample did not draw: weight 0, factors left finite
                    g[mm, s] = 1.0
                    gi[mm, s] = 1.0
                    continue
                v = base
                for k in range(k_cov):
                    v += theta[row, m + k] * features[k, mm, s]
                e = math.exp(0.5 * v)
                g[mm, s] = e
                gi[mm, s] = 1.0 / e
        tie_total = 0.0
        tie_square = 0.0
        for pr in range(n_pairs):
            a = pair_a[pr]
            b = pair_b[pr]
            ga, gb, gia, gib, cell = g[a], g[b], gi[a], gi[b], mult[pr]
            sum_pd = 0.0
            sum_r = 0.0
            sum_hu = 0.0
            sum_ue = 0.0
            sum_r2 = 0.0
            for s in range(n_units):
                ws = w[s] * cell[s]
                e = ga[s] * gib[s]  # e^{u/2}
                inv = gia[s] * gb[s]
                total = e + inv
                r = 1.0 / (total + nu)
                pd = (e - inv) * r  # P(a wins) - P(b wins)
                wr = ws * r
                wpd[s] = ws * pd
                sum_pd += ws * pd
                sum_r += wr
                if hessian:
                    hu = wr * r * (4.0 + nu * total)  # 4 (1 - P(tie) - pd^2), without cancellation
                    whu[s] = hu
                    sum_hu += hu
                    if davidson:
                        ue = wr * pd
                        wue[s] = ue
                        sum_ue += ue
                        sum_r2 += wr * r
            grad[row, a] += 0.5 * sum_pd
            grad[row, b] -= 0.5 * sum_pd
            tie_total += sum_r
            if k_cov:
                for k in range(k_cov):
                    fa, fb, zk = features[k, a], features[k, b], z[k]
                    acc = 0.0
                    for s in range(n_units):
                        zk[s] = fa[s] - fb[s]
                        acc += wpd[s] * zk[s]
                    grad_cov[k] += acc
            if not hessian:
                continue
            c = 0.25 * sum_hu
            hess[row, a, a] += c
            hess[row, b, b] += c
            hess[row, a, b] -= c
            hess[row, b, a] -= c
            for k in range(k_cov):
                zk = z[k]
                acc = 0.0
                for s in range(n_units):
                    acc += whu[s] * zk[s]
                hess[row, a, m + k] += 0.25 * acc
                hess[row, b, m + k] -= 0.25 * acc
                for j in range(k, k_cov):
                    zj = z[j]
                    acc = 0.0
                    for s in range(n_units):
                        acc += whu[s] * zk[s] * zj[s]
                    hess_cov[k, j] += acc
                if davidson:
                    acc = 0.0
                    for s in range(n_units):
                        acc += wue[s] * zk[s]
                    tie_cov[k] += acc
            if davidson:
                hess[row, a, q - 1] -= 0.5 * nu * sum_ue
                hess[row, b, q - 1] += 0.5 * nu * sum_ue
                tie_square += sum_r2
        for k in range(k_cov):
            grad[row, m + k] = 0.5 * grad_cov[k]
        if davidson:
            grad[row, q - 1] = nu * tie_total
        if not hessian:
            continue
        for k in range(k_cov):
            for mm in range(m):
                hess[row, m + k, mm] = hess[row, mm, m + k]
            for j in range(k, k_cov):
                hess[row, m + k, m + j] = 0.25 * hess_cov[k, j]
                hess[row, m + j, m + k] = 0.25 * hess_cov[k, j]
        if davidson:
            for k in range(k_cov):
                hess[row, m + k, q - 1] = -0.5 * nu * tie_cov[k]
            for jj in range(p):
                hess[row, q - 1, jj] = hess[row, jj, q - 1]
            hess[row, q - 1, q - 1] = nu * tie_total - nu * nu * tie_square


__all__ = ["FACTOR_BOUND", "fit_threads", "table_pass"]
