"""The one solver of every pairwise fit: a batched damped Newton (`damped_newton`) over rows of parameters, and the
count-table fits on it (`fit_batch`: B tables at once; a one-table fit is a batch of one row).

The likelihoods come from `emoreward.ranking.tie_models` (one object per model); the length-controlled fit gives
the same driver its own objective (`emoreward.ranking.length_batched`). A row the solver does not finish is flagged
in ``converged``. See docs/ranking.md ("Bootstrap: every resample fitted at once").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from emoreward.ranking.tie_models import PairModel


DEFAULT_PRIOR_VARIANCE = 10.0


def prior_precision(prior_variance: float | None) -> float:
    """Precision of the prior (0 for none). The default variance, 10, makes a strength ratio of e^sqrt(10) ~ 24 one
    prior standard deviation."""
    if prior_variance is None:
        return 0.0
    if not (prior_variance > 0 and math.isfinite(prior_variance)):
        raise ValueError(f"prior_variance must be a positive finite number or None, got {prior_variance!r}")
    return 1.0 / prior_variance


Objective = Callable[[np.ndarray, np.ndarray, bool], tuple]


def damped_newton(
    objective: Objective,
    x: np.ndarray,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    flat: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
    rows_per_chunk: int | None = None,
    give_up: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Minimise ``objective`` for every row of ``x`` at once: damped Newton with per-row Armijo backtracking.

    Each iteration takes the gradient and exact Hessian of the active rows, solves the ``(R, K, K)`` systems
    together and halves the step per row until the objective decreases enough (Armijo); a row is done when its
    largest move is below ``tol``. A coordinate at a bound it presses against stays there (a tie parameter for
    data without ties); a coordinate with no curvature (an item never compared, no prior) is held; ``flat`` (a
    direction the objective does not see, e.g. a common shift of the scores without a prior) is taken out of the
    step.

    Args:
        objective: ``objective(xs (R, K), rows (R,), derivatives) -> (f (R,), g (R, K), h (R, K, K))`` (``g``,
            ``h`` None without ``derivatives``); ``rows`` index the original rows (their data).
        x (`np.ndarray` of shape `(B, K)`): the start of every row.
        lower, upper (`np.ndarray` of shape `(K,)`, *optional*): bounds (``-inf`` / ``inf`` where none).
        flat (`np.ndarray` of shape `(K,)`, *optional*): a unit direction of zero curvature.
        max_iter (`int`): iterations at most; tol (`float`): the largest move at which a row is done.
        rows_per_chunk (`int`, *optional*): rows solved together (bounds the Hessians' memory).
        give_up (*optional*): ``give_up(xs) -> (R,) bool``: rows to stop, unfinished (e.g. diverging).

    Returns:
        ``(x (B, K), converged (B,) bool, iterations)``.
    """
    x = np.array(x, dtype=float)
    n_rows, k = x.shape
    lower = np.full(k, -np.inf) if lower is None else np.asarray(lower, dtype=float)
    upper = np.full(k, np.inf) if upper is None else np.asarray(upper, dtype=float)
    bounded = bool(np.isfinite(lower).any() or np.isfinite(upper).any())
    diag = np.arange(k)
    converged = np.zeros(n_rows, dtype=bool)
    iterations = 0
    chunk = n_rows if rows_per_chunk is None else max(1, rows_per_chunk)
    for begin in range(0, n_rows, chunk):
        active = np.arange(begin, min(begin + chunk, n_rows))
        for iteration in range(1, max_iter + 1):
            if give_up is not None:
                active = active[~give_up(x[active])]
                if active.size == 0:
                    break
            iterations = max(iterations, iteration)
            xs = x[active]
            f, g, h = objective(xs, active, True)
            if bounded:  # a coordinate at a bound it presses against stays there
                frozen = ((xs <= lower) & (g > 0)) | ((xs >= upper) & (g < 0))
                g = np.where(frozen, 0.0, g)
                h = np.where(frozen[:, :, None] | frozen[:, None, :], 0.0, h)
                h[:, diag, diag] += frozen
            h[:, diag, diag] += h[:, diag, diag] <= 0  # no curvature: no data and no prior
            if flat is not None:
                h += np.outer(flat, flat)
            try:
                step = np.linalg.solve(h, g[:, :, None])[:, :, 0]
            except np.linalg.LinAlgError:
                step = np.stack([np.linalg.lstsq(hb, gb, rcond=None)[0] for hb, gb in zip(h, g)])
            slope = (g * step).sum(axis=1)
            bad = ~(slope > 0) | ~np.isfinite(slope)
            step[bad] = g[bad] / np.maximum(np.abs(np.diagonal(h, axis1=1, axis2=2)[bad]), 1.0)
            slope[bad] = (g[bad] * step[bad]).sum(axis=1)
            alpha = np.ones(len(active))
            searched = np.zeros(len(active), dtype=bool)
            new = xs.copy()
            for _ in range(40):
                todo = ~searched
                cand = xs[todo] - alpha[todo, None] * step[todo]
                if bounded:
                    cand = np.clip(cand, lower, upper)
                f_new, _, _ = objective(cand, active[todo], False)
                ok = f_new <= f[todo] - 1e-4 * alpha[todo] * slope[todo] + 1e-13 * (1.0 + np.abs(f[todo]))
                idx = np.flatnonzero(todo)
                new[idx[ok]] = cand[ok]
                searched[idx[ok]] = True
                alpha[idx[~ok]] *= 0.5
                if searched.all():
                    break
            moved = np.abs(new - xs).max(axis=1)
            x[active] = new
            finished = searched & (moved < tol)
            converged[active[finished]] = True
            active = active[~finished & searched]
            if active.size == 0:
                break
    return x, converged, iterations


@dataclass(frozen=True)
class BatchFit:
    """Fits of B count tables over the same M items.

    Attributes:
        scores (`np.ndarray` of shape `(B, M)`): centred log-strengths of every table (as ``BTResult.scores``).
        tie_parameter (`np.ndarray` of shape `(B,)` or `None`): ``beta`` / ``nu`` per table (tie models).
        converged (`np.ndarray` of shape `(B,)`, bool): the row reached a stationary point (and, without a prior,
            a finite one).
        iterations (`int`): Newton iterations run.
        log_likelihood (`np.ndarray` of shape `(B,)`): data log-likelihood (prior excluded) of every row.
        solved (`np.ndarray` of shape `(B,)`, bool): the solver finished the row (converged, finite or not).
    """

    scores: np.ndarray
    tie_parameter: np.ndarray | None
    converged: np.ndarray
    iterations: int
    log_likelihood: np.ndarray | None = None
    solved: np.ndarray | None = None


@dataclass(frozen=True)
class BatchSpec:
    """What a one-table fit computes, for :func:`fit_batch`: ``model`` (the pair model object: Bradley-Terry or a
    tie model, `emoreward.ranking.tie_models`),
    ``binarize`` (EMER-Ranker's W, with its ``equal`` rule), ``ties`` (``"drop"``/``"half"``, plain BT) and
    ``prior_variance``."""

    model: PairModel
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    ties: str = "drop"
    binarize: bool = False
    equal: str = "half"


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
def _layout(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Pair indices ``i < j`` of M items, each of shape `(P,)` (cached, read-only)."""
    i, j = np.triu_indices(m, k=1)
    i.flags.writeable = False
    j.flags.writeable = False
    return i, j


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


def order_graph(
    model: PairModel, w: np.ndarray, lo: np.ndarray, t: np.ndarray, i: np.ndarray, j: np.ndarray, m: int
) -> np.ndarray:
    """The directed graph of every table's verdicts under ``model``'s `PairModel.orders`: an edge ahead -> behind
    for every order a verdict sets between two items, and i -> j where i is ahead of the tie level and the tie
    level ahead of j (the shared tie parameter links them: EmoPrefer's).

    Args:
        model (`PairModel`): the pair model; w, lo, t (`(B, P)`): wins of i, of j, ties per pair ``(i, j)`` (`(P,)`).

    Returns:
        `np.ndarray` of shape `(B, M, M)`, bool.
    """
    n_rows = w.shape[0]
    directed = np.zeros((n_rows, m + 1, m + 1), dtype=bool)  # node M: the tie level
    ends = {"i": i, "j": j}
    for code, counts in enumerate((w, lo, t)):
        for ahead, behind in model.orders.get(code, ()):
            directed[:, ends.get(ahead, m), ends.get(behind, m)] |= counts > 0
    items = directed[:, :m, :m] | (directed[:, :m, m, None] & directed[:, None, m, :m])
    items[:, np.arange(m), np.arange(m)] = False
    return items


def fit_batch(
    wins: np.ndarray,
    ties: np.ndarray,
    spec: BatchSpec,
    initial_scores: np.ndarray | None = None,
    initial_tie_parameter: float | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> BatchFit:
    """Fit every count table of a batch with the objective of ``spec``: the model's likelihood
    (`emoreward.ranking.tie_models`: Bradley-Terry on counts or EMER-Ranker's binarized W, eq. 1-4; EmoPrefer
    appendix F, Rao-Kupper 1967, Davidson 1970) plus the Gaussian prior ``N(0, prior_variance)`` on the
    log-strengths, minimised by :func:`damped_newton` with the tie log-parameter within the model's ``bounds``;
    scores are centred to mean 0. Started at the full-data fit, 3-8 iterations reach the optimum to about 1e-12.

    Args:
        wins (`np.ndarray` of shape `(B, M, M)`): ``wins[b, i, j]``, wins of i over j in table b.
        ties (`np.ndarray` of shape `(B, M, M)`, symmetric per table): ties.
        spec (`BatchSpec`): the model (from :func:`batch_spec`).
        initial_scores (`np.ndarray` of shape `(M,)` or `(B, M)`, *optional*): start (warm start); default 0.
        initial_tie_parameter (`float`, *optional*): starting ``beta`` / ``nu`` (default: where P(tie | equal)
            is the table's tie rate).
        max_iter (`int`): Newton iterations at most; tol (`float`): converged when the largest step is below it.

    Returns:
        `BatchFit`.

    Raises:
        ValueError: on shapes that disagree.
    """
    wins = np.asarray(wins, dtype=float)
    ties = np.asarray(ties, dtype=float)
    if wins.ndim != 3 or wins.shape != ties.shape or wins.shape[1] != wins.shape[2]:
        raise ValueError(f"wins and ties must both have shape (B, M, M), got {wins.shape} and {ties.shape}")
    model = spec.model
    precision = prior_precision(spec.prior_variance)
    n_rows, m = wins.shape[:2]
    if not model.has_tie:
        if spec.binarize:
            wins = binarize_batch(wins, ties, spec.equal)
        elif spec.ties == "half":
            wins = wins + 0.5 * ties
        ties = np.zeros_like(ties)
    k = m + model.has_tie
    i, j = _layout(m)
    w, lo, t = wins[:, i, j], wins[:, j, i], ties[:, i, j]
    x = np.zeros((n_rows, k))
    if initial_scores is not None:
        x[:, :m] = np.asarray(initial_scores, dtype=float)
    x[:, :m] -= x[:, :m].mean(axis=1, keepdims=True)
    lower, upper = np.full(k, -np.inf), np.full(k, np.inf)
    if model.has_tie:
        lower[m], upper[m] = model.bounds
        n_all, n_ties = (w + lo + t).sum(axis=1), t.sum(axis=1)
        x[:, m] = [model.initial_tie_log(initial_tie_parameter, nt, na) for nt, na in zip(n_ties, n_all)]
        # no ties: the optimum is the lower bound; only ties: the upper bound (the likelihood is monotone in eta)
        x[:, m] = np.where(n_ties == 0, lower[m], np.where(n_ties == n_all, upper[m], x[:, m]))
    diag = np.arange(m)

    def per_item(on_i: np.ndarray, on_j: np.ndarray) -> np.ndarray:
        """`(R, M)`: per-pair terms `(R, P)` summed onto their items ``i`` and ``j``."""
        r = len(on_i)
        index = np.concatenate([i, j])[None, :] + m * np.arange(r)[:, None]
        return np.bincount(index.ravel(), np.concatenate([on_i, on_j], axis=1).ravel(), r * m).reshape(r, m)

    def objective(xs: np.ndarray, rows: np.ndarray, derivatives: bool):
        s = xs[:, :m]
        eta = xs[:, m:] if model.has_tie else None
        nll, grad, hess = model.terms(s[:, i], s[:, j], eta, w[rows], lo[rows], t[rows], derivatives)
        f = nll + 0.5 * precision * (s * s).sum(axis=1)
        if not derivatives:
            return f, None, None
        g = np.zeros_like(xs)
        g[:, :m] = per_item(grad["i"], grad["j"]) + precision * s
        h = np.zeros((len(xs), k, k))
        h[:, i, j] = hess["ij"]
        h[:, j, i] = hess["ij"]
        h[:, diag, diag] = per_item(hess["ii"], hess["jj"]) + precision
        if model.has_tie:
            g[:, m] = grad["e"].sum(axis=1)
            column = per_item(hess["ie"], hess["je"])
            h[:, :m, m] = column
            h[:, m, :m] = column
            h[:, m, m] = hess["ee"].sum(axis=1)
        return f, g, h

    flat = None
    if precision == 0.0:  # without a prior a common shift of the scores (and eta, when it shifts with them) is free
        flat = np.zeros(k)
        flat[:m] = 1.0
        if model.shifts_with_scores:
            flat[m] = 1.0
        flat /= np.linalg.norm(flat)
    rows_per_chunk = max(1, 4_000_000 // (k * k + 8 * len(i)))  # bounds the (rows, K, K) Hessians
    x, solved, iterations = damped_newton(objective, x, lower, upper, flat, max_iter, tol, rows_per_chunk)
    shift = x[:, :m].mean(axis=1)
    scores = x[:, :m] - shift[:, None]
    eta = None  # the tie log-parameter on the centred scale
    if model.has_tie:
        eta = x[:, m:] - (shift[:, None] if model.shifts_with_scores else 0.0)
    tie = None if eta is None else model.tie_parameter(eta[:, 0])
    nll = model.terms(scores[:, i], scores[:, j], eta, w, lo, t, False)[0]
    ok = np.isfinite(scores).all(axis=1) & solved
    if precision == 0.0:  # no prior: a finite optimum needs every item ordered both ways against the rest
        present = per_item(w + lo + t, w + lo + t) > 0
        ok &= strongly_connected_rows(order_graph(model, w, lo, t, i, j, m), present)
    return BatchFit(scores, tie, ok, iterations, -nll, solved)


__all__ = [
    "BatchFit",
    "BatchSpec",
    "binarize_batch",
    "damped_newton",
    "fit_batch",
    "order_graph",
    "prior_precision",
]
