"""Many Bradley-Terry fits at once: damped Newton iterations over a `(B, M)` array of log-strengths, one count table
per row (the bootstrap's resamples), for every model the ranking fits.

`fit_batch` reaches the optimum of the one-table fits of `emoreward.ranking.bradley_terry` (same objectives, prior
and centring; only the solver differs); `batch_spec` picks the objective of a fit function. A row the solver does
not finish is flagged in ``BatchFit.converged`` and refitted one table at a time.
See docs/ranking.md ("Bootstrap: every resample fitted at once").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from emoreward.ranking.bradley_terry import (
    DEFAULT_PRIOR_VARIANCE,
    TIE_LOG_BOUNDS,
    TIE_MODELS,
    fit_binarized_bradley_terry,
    fit_bradley_terry,
    fit_bradley_terry_ties,
    initial_tie_log,
    prior_precision,
)


_LOG2 = math.log(2.0)


@dataclass(frozen=True)
class BatchFit:
    """Fits of B count tables over the same M items.

    Attributes:
        scores (`np.ndarray` of shape `(B, M)`): centred log-strengths of every table (as ``BTResult.scores``).
        tie_parameter (`np.ndarray` of shape `(B,)` or `None`): ``beta`` / ``nu`` per table (tie models).
        converged (`np.ndarray` of shape `(B,)`, bool): the row reached a stationary point; refit the others.
        iterations (`int`): Newton iterations run.
    """

    scores: np.ndarray
    tie_parameter: np.ndarray | None
    converged: np.ndarray
    iterations: int


@dataclass(frozen=True)
class BatchSpec:
    """What a one-table fit computes, for :func:`fit_batch`: ``model`` (``"bradley-terry"`` or a tie model),
    ``binarize`` (EMER-Ranker's W, with its ``equal`` rule), ``ties`` (``"drop"``/``"half"``, plain BT) and
    ``prior_variance``."""

    model: str
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    ties: str = "drop"
    binarize: bool = False
    equal: str = "half"


def batch_spec(fit_fn: Any) -> BatchSpec | None:
    """The `BatchSpec` of a one-table fit: `fit_bradley_terry`, `fit_binarized_bradley_terry`,
    `fit_bradley_terry_ties` or a ``functools.partial`` of them; ``None`` for any other callable, or for
    keyword arguments the batched solver does not know (the caller then fits one table at a time)."""
    kwargs: dict[str, Any] = {}
    while isinstance(fit_fn, functools.partial):
        if fit_fn.args:
            return None
        kwargs = {**fit_fn.keywords, **kwargs}
        fit_fn = fit_fn.func
    kwargs.pop("on_disconnected", None)  # the batch never raises: disconnected rows are counted by the caller
    known = {"prior_variance"}
    if fit_fn is fit_bradley_terry:
        if not set(kwargs) <= known | {"ties"}:
            return None
        return BatchSpec(
            "bradley-terry", kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE), kwargs.get("ties", "drop")
        )
    if fit_fn is fit_binarized_bradley_terry:
        if not set(kwargs) <= known | {"equal"}:
            return None
        prior = kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE)
        return BatchSpec("bradley-terry", prior, binarize=True, equal=kwargs.get("equal", "half"))
    if fit_fn is fit_bradley_terry_ties:
        if not set(kwargs) <= known | {"tie_model"} or kwargs.get("tie_model", "emoprefer") not in TIE_MODELS:
            return None
        return BatchSpec(kwargs.get("tie_model", "emoprefer"), kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE))
    return None


def binarize_batch(wins: np.ndarray, ties: np.ndarray, equal: str = "half") -> np.ndarray:
    """EMER-Ranker's W of every table (:meth:`emoreward.ranking.counts.PairwiseCounts.binarized`), shape `(B, M, M)`."""
    compared = (wins + np.swapaxes(wins, 1, 2) + ties) > 0
    w = np.where(compared & (wins > np.swapaxes(wins, 1, 2)), 1.0, 0.0)
    if equal == "half":
        w = np.where(compared & (wins == np.swapaxes(wins, 1, 2)), 0.5, w)
    idx = np.arange(wins.shape[1])
    w[:, idx, idx] = 0.0
    return w


@functools.lru_cache(maxsize=8)
def _layout(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pair indices ``i < j`` of M items and their one-hot matrices, each of shape `(P, M)`, which sum per-pair
    terms into per-item ones with one matrix product."""
    i, j = np.triu_indices(m, k=1)
    one_i, one_j = np.zeros((len(i), m)), np.zeros((len(i), m))
    one_i[np.arange(len(i)), i] = 1.0
    one_j[np.arange(len(i)), j] = 1.0
    return i, j, one_i, one_j


def strongly_connected_rows(directed: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Whether each table's directed graph over its ``present`` items is strongly connected (every item reaches
    every other); for a symmetric graph, whether it is connected.

    With ``directed[b, i, j]`` = "i beat (or tied) j in table b", this is Ford's (1957) condition for a finite
    maximum-likelihood Bradley-Terry fit (Hunter 2004, assumption 1): where it fails, a group of items never lost
    to the rest (separation) and its MLE is infinite.

    Args:
        directed (`np.ndarray` of shape `(B, M, M)`, bool): the edges of every table.
        present (`np.ndarray` of shape `(B, M)`, bool): the items of each table.

    Returns:
        `np.ndarray` of shape `(B,)`, bool (True for a table with fewer than two items).
    """
    n_rows, m = present.shape
    rows = np.arange(n_rows)
    first = np.argmax(present, axis=1)
    connected = np.ones(n_rows, dtype=bool)
    for adjacency in (directed, np.swapaxes(directed, 1, 2)):  # reached from the first item, and reaching it
        edges = adjacency.astype(float)
        reached = np.zeros((n_rows, m), dtype=bool)
        reached[rows, first] = present[rows, first]
        for _ in range(m):  # breadth-first growth, all tables at once
            grown = reached | ((np.einsum("bij,bj->bi", edges, reached.astype(float)) > 0) & present)
            if np.array_equal(grown, reached):
                break
            reached = grown
        connected &= (reached == present).all(axis=1)
    return connected | (present.sum(axis=1) < 2)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _expit(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


def _softmax3(z0: np.ndarray, z1: np.ndarray, z2: np.ndarray) -> tuple[np.ndarray, ...]:
    top = np.maximum(np.maximum(z0, z1), z2)
    e0, e1, e2 = np.exp(z0 - top), np.exp(z1 - top), np.exp(z2 - top)
    total = e0 + e1 + e2
    return e0 / total, e1 / total, e2 / total, top + np.log(total)


def _pair_terms(model: str, x: np.ndarray, i, j, w, lo, t, derivatives: bool):
    """Negative log-likelihood per row and, with ``derivatives``, the per-pair gradient and Hessian entries in
    the coordinates (s_i, s_j, eta): ``(nll (B,), {"i", "j", "e"}: (B, P), {"ii", "jj", "ij", "ie", "je", "ee"})``."""
    s = x[:, : x.shape[1] - (model != "bradley-terry")]
    d = s[:, i] - s[:, j]
    if model == "bradley-terry":
        n = w + lo
        nll = (n * _softplus(d) - w * d).sum(axis=1)
        if not derivatives:
            return nll, None, None
        sig = _expit(d)
        gd, hd = n * sig - w, n * sig * (1.0 - sig)
        return nll, {"i": gd, "j": -gd}, {"ii": hd, "jj": hd, "ij": -hd}
    eta = x[:, -1:]
    if model in ("emoprefer", "davidson"):
        n = w + lo + t
        z0, z1 = (0.5 * d, -0.5 * d) if model == "davidson" else (s[:, i], s[:, j])
        p0, p1, p2, lse = _softmax3(z0, z1, np.broadcast_to(eta, z0.shape))
        nll = (n * lse - w * z0 - lo * z1).sum(axis=1) - eta[:, 0] * t.sum(axis=1)
        if not derivatives:
            return nll, None, None
        r0, r1, r2 = n * p0 - w, n * p1 - lo, n * p2 - t
        if model == "emoprefer":
            grad = {"i": r0, "j": r1, "e": r2}
            hess = {
                "ii": n * p0 * (1 - p0),
                "jj": n * p1 * (1 - p1),
                "ij": -n * p0 * p1,
                "ie": -n * p0 * p2,
                "je": -n * p1 * p2,
                "ee": n * p2 * (1 - p2),
            }
            return nll, grad, hess
        gd = 0.5 * (r0 - r1)
        hdd = 0.25 * n * (p0 + p1 - (p0 - p1) ** 2)
        hde = 0.5 * n * p2 * (p1 - p0)
        return (
            nll,
            {"i": gd, "j": -gd, "e": r2},
            {"ii": hdd, "jj": hdd, "ij": -hdd, "ie": hde, "je": -hde, "ee": n * p2 * (1 - p2)},
        )
    # rao-kupper: log P(i>j) = -softplus(a - d), log P(j>i) = -softplus(a + d), a = log nu = softplus(eta)
    a = _softplus(eta)
    log_nu2m1 = eta[:, 0] + np.logaddexp(_LOG2, eta[:, 0])
    wt, lt = w + t, lo + t
    big_a, big_b = a - d, a + d
    nll = (wt * _softplus(big_a) + lt * _softplus(big_b)).sum(axis=1) - t.sum(axis=1) * log_nu2m1
    if not derivatives:
        return nll, None, None
    sa, sb = _expit(big_a), _expit(big_b)
    da, db = sa * (1 - sa), sb * (1 - sb)
    fd, fa = lt * sb - wt * sa, wt * sa + lt * sb
    fdd, fda = wt * da + lt * db, lt * db - wt * da
    q = _expit(eta)
    g1 = 1.0 + _expit(eta - _LOG2)
    g2 = _expit(eta - _LOG2) * (1.0 - _expit(eta - _LOG2))
    fe = fa * q - t * g1  # the -T log(nu^2 - 1) term, spread over the pairs by their ties
    fde = fda * q
    fee = fdd * q**2 + fa * q * (1 - q) - t * g2
    return nll, {"i": fd, "j": -fd, "e": fe}, {"ii": fdd, "jj": fdd, "ij": -fdd, "ie": fde, "je": -fde, "ee": fee}


def fit_batch(
    wins: np.ndarray,
    ties: np.ndarray,
    spec: BatchSpec,
    initial_scores: np.ndarray | None = None,
    initial_tie_parameter: float | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> BatchFit:
    """Fit every count table of a batch with the objective of ``spec``.

    The objectives are those of :func:`emoreward.ranking.bradley_terry.fit_bradley_terry` (counts, or EMER-Ranker's
    binarized W, eq. 1-4) and :func:`~emoreward.ranking.bradley_terry.fit_bradley_terry_ties` (EmoPrefer appendix
    F, Rao-Kupper 1967, Davidson 1970), with the same Gaussian prior, bounds on the tie log-parameter and centring,
    so the optimum is the same; only the solver differs. Each damped Newton iteration computes the gradient and the
    exact Hessian of every row (the per-pair derivatives of a multinomial logit with linear logits; Rao-Kupper's
    through ``log nu = softplus(eta)``), solves the ``(B, K, K)`` systems together (``K = M``, or ``M + 1`` with
    the tie parameter) and backtracks per row until the objective decreases (Armijo). Started at the full-data fit,
    3-8 iterations reach the optimum to about 1e-12. A row not finished (no decrease, or not converged within
    ``max_iter``) is flagged in ``BatchFit.converged``: the caller refits it with the one-table path.

    Args:
        wins (`np.ndarray` of shape `(B, M, M)`): ``wins[b, i, j]``, wins of i over j in table b.
        ties (`np.ndarray` of shape `(B, M, M)`, symmetric per table): ties.
        spec (`BatchSpec`): the model (from :func:`batch_spec`).
        initial_scores (`np.ndarray` of shape `(M,)`, *optional*): start of every row (warm start: the full-data
            fit); default 0.
        initial_tie_parameter (`float`, *optional*): starting ``beta`` / ``nu`` (default: as the one-table fit).
        max_iter (`int`): Newton iterations at most; tol (`float`): converged when the largest step is below it.

    Returns:
        `BatchFit`.

    Raises:
        ValueError: on shapes that disagree or an unknown model.
    """
    wins = np.asarray(wins, dtype=float)
    ties = np.asarray(ties, dtype=float)
    if wins.ndim != 3 or wins.shape != ties.shape or wins.shape[1] != wins.shape[2]:
        raise ValueError(f"wins and ties must both have shape (B, M, M), got {wins.shape} and {ties.shape}")
    model = spec.model
    if model != "bradley-terry" and model not in TIE_MODELS:
        raise ValueError(f"unknown model {model!r}")
    precision = prior_precision(spec.prior_variance)
    n_rows, m = wins.shape[:2]
    if model == "bradley-terry":
        if spec.binarize:
            wins, ties = binarize_batch(wins, ties, spec.equal), np.zeros_like(ties)
        elif spec.ties == "half":
            wins = wins + 0.5 * ties
        ties = np.zeros_like(ties)
    k = m + (model != "bradley-terry")
    i, j, one_i, one_j = _layout(m)
    w, lo, t = wins[:, i, j], wins[:, j, i], ties[:, i, j]
    x = np.zeros((n_rows, k))
    if initial_scores is not None:
        x[:, :m] = np.asarray(initial_scores, dtype=float)
    x[:, :m] -= x[:, :m].mean(axis=1, keepdims=True)
    lower, upper = TIE_LOG_BOUNDS
    if k > m:
        n_all = (w + lo + t).sum(axis=1)
        n_ties = t.sum(axis=1)
        if initial_tie_parameter is not None:
            x[:, m] = initial_tie_log(model, initial_tie_parameter, 0.0, 1.0)
        else:
            x[:, m] = [initial_tie_log(model, None, nt, na) for nt, na in zip(n_ties, n_all)]
        # no ties: the optimum is the lower bound; only ties: the upper bound (the likelihood is monotone in eta)
        x[:, m] = np.where(n_ties == 0, lower, np.where(n_ties == n_all, upper, x[:, m]))
    diag = np.arange(m)
    # directions the objective does not see when there is no prior: a common shift of the scores (EmoPrefer: of
    # the scores and eta together); the Newton step is taken orthogonal to it
    flat = np.zeros(k)
    flat[:m] = 1.0
    if model == "emoprefer":
        flat[m] = 1.0
    flat /= np.linalg.norm(flat)

    def objective(xs: np.ndarray, rows: np.ndarray, derivatives: bool):
        nll, grad, hess = _pair_terms(model, xs, i, j, w[rows], lo[rows], t[rows], derivatives)
        s = xs[:, :m]
        f = nll + 0.5 * precision * (s * s).sum(axis=1)
        if not derivatives:
            return f, None, None
        g = np.zeros_like(xs)
        g[:, :m] = grad["i"] @ one_i + grad["j"] @ one_j + precision * s
        h = np.zeros((len(xs), k, k))
        h[:, i, j] = hess["ij"]
        h[:, j, i] = hess["ij"]
        h[:, diag, diag] = hess["ii"] @ one_i + hess["jj"] @ one_j + precision
        if k > m:
            g[:, m] = grad["e"].sum(axis=1)
            column = hess["ie"] @ one_i + hess["je"] @ one_j
            h[:, :m, m] = column
            h[:, m, :m] = column
            h[:, m, m] = hess["ee"].sum(axis=1)
        return f, g, h

    converged = np.zeros(n_rows, dtype=bool)
    iterations = 0
    rows_per_chunk = max(1, 4_000_000 // (k * k + 8 * len(i)))  # bounds the (rows, K, K) Hessians
    for begin in range(0, n_rows, rows_per_chunk):
        active = np.arange(begin, min(begin + rows_per_chunk, n_rows))
        for iteration in range(1, max_iter + 1):
            iterations = max(iterations, iteration)
            xs = x[active]
            f, g, h = objective(xs, active, True)
            frozen = np.zeros((len(active), k), dtype=bool)
            if k > m:  # the tie parameter at a bound it presses against stays there
                eta, ge = xs[:, m], g[:, m]
                frozen[:, m] = ((eta <= lower) & (ge > 0)) | ((eta >= upper) & (ge < 0))
            g = np.where(frozen, 0.0, g)
            h = np.where(frozen[:, :, None] | frozen[:, None, :], 0.0, h)
            h[:, np.arange(k), np.arange(k)] += frozen
            absent = (
                np.diagonal(h, axis1=1, axis2=2) <= 0
            )  # no data and no prior (never compared, prior_variance None)
            h[:, np.arange(k), np.arange(k)] += absent
            if precision == 0.0:
                h += np.einsum("a,b->ab", flat, flat)
            try:
                step = np.linalg.solve(h, g[:, :, None])[:, :, 0]
            except np.linalg.LinAlgError:
                step = np.stack([np.linalg.lstsq(hb, gb, rcond=None)[0] for hb, gb in zip(h, g)])
            slope = (g * step).sum(axis=1)
            bad = ~(slope > 0) | ~np.isfinite(slope)
            step[bad] = g[bad] / np.maximum(np.abs(np.diagonal(h, axis1=1, axis2=2)[bad]), 1.0)
            slope[bad] = (g[bad] * step[bad]).sum(axis=1)
            alpha = np.ones(len(active))
            done_search = np.zeros(len(active), dtype=bool)
            new = xs.copy()
            for _ in range(40):
                todo = ~done_search
                cand = xs[todo] - alpha[todo, None] * step[todo]
                if k > m:
                    cand[:, m] = np.clip(cand[:, m], lower, upper)
                f_new, _, _ = objective(cand, active[todo], False)
                ok = f_new <= f[todo] - 1e-4 * alpha[todo] * slope[todo] + 1e-13 * (1.0 + np.abs(f[todo]))
                idx = np.flatnonzero(todo)
                new[idx[ok]] = cand[ok]
                done_search[idx[ok]] = True
                alpha[idx[~ok]] *= 0.5
                if done_search.all():
                    break
            moved = np.abs(new - xs).max(axis=1)
            x[active] = new
            finished = done_search & (moved < tol)
            converged[active[finished]] = True
            failed = ~done_search
            active = active[~finished & ~failed]
            if active.size == 0:
                break
    scores = x[:, :m] - x[:, :m].mean(axis=1, keepdims=True)
    tie = None
    if k > m:
        eta = x[:, m] - (x[:, :m].mean(axis=1) if model == "emoprefer" else 0.0)
        tie = 1.0 + np.exp(eta) if model == "rao-kupper" else np.exp(eta)
    ok = np.isfinite(scores).all(axis=1) & converged
    if precision == 0.0:  # no prior: a finite optimum needs every item to beat (or tie) and be beaten by the rest
        beats = (w + t > 0, lo + t > 0)  # i -> j and j -> i, per pair
        directed = np.zeros((n_rows, m, m), dtype=bool)
        directed[:, i, j], directed[:, j, i] = beats
        present = (w + lo + t) @ one_i + (w + lo + t) @ one_j > 0
        ok &= strongly_connected_rows(directed, present)
    return BatchFit(scores, tie, ok, iterations)


__all__ = ["BatchFit", "BatchSpec", "batch_spec", "binarize_batch", "fit_batch"]
