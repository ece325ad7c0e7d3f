"""Separation: when maximum likelihood has no finite answer. The one detector of every logistic-type fit (the
length-controlled ranking, `evaluate`'s length-controlled logit); fits that find it report a finite estimate
bounded by a stated prior, flagged. See docs/ranking.md.
"""

from __future__ import annotations

import numpy as np


DIFFERENCE_ORDERS: dict[int, tuple[tuple[str, str], ...]] = {
    0: (("i", "j"),),
    1: (("j", "i"),),
    2: (("i", "j"), ("j", "i")),
}
"""A logistic-type model of the difference ``x``: a win orders the pair, a tie binds it (`PairModel.orders`)."""


def _order_rows(x, outcome, orders, level):
    """The separation constraints of every row: ``(rows (R, K), record (R,), equal (R,) bool)``, one row
    ``v(ahead) - v(behind)`` per order of the row's outcome (``v("i") = level + x / 2``, ``v("j") = level - x / 2``,
    ``v("0") = 0``); both orders of one pair are one equality row."""
    half = 0.5 * x
    side = {"i": lambda r: level[r] + half[r], "j": lambda r: level[r] - half[r]}
    rows, record, equal = [], [], []
    for code, pairs in orders.items():
        picked = np.flatnonzero(outcome == code)
        if not len(picked):
            continue
        for ahead, behind in pairs:
            if (behind, ahead) in pairs and (behind, ahead) < (ahead, behind):
                continue  # the equality row is written once
            v = side[ahead](picked) if ahead != "0" else 0.0
            v = v - (side[behind](picked) if behind != "0" else 0.0)
            rows.append(np.broadcast_to(v, (len(picked), x.shape[1])))
            record.append(picked)
            equal.append(np.full(len(picked), (behind, ahead) in pairs))
    if not rows:
        return np.zeros((0, x.shape[1])), np.zeros(0, np.int64), np.zeros(0, bool)
    record = np.concatenate(record)
    order = np.argsort(record, kind="stable")  # the rows' order: the program's (and its optimum's) for one order each
    return np.concatenate(rows)[order], record[order], np.concatenate(equal)[order]


def separating_direction(
    x: np.ndarray, outcome: np.ndarray, orders: dict | None = None, level: np.ndarray | None = None
) -> np.ndarray | None:
    """A direction ``g`` of the columns of ``x`` that orders every decisive outcome and leaves ties at 0, or None.

    Linear program (Konis 2007, "Linear programming algorithms for detecting separated data in binary logistic
    regression models", DPhil thesis, Oxford): maximise ``sum_r y_r x_r . g`` subject to ``y_r x_r . g >= 0`` on
    decisive rows, ``x_r . g = 0`` on ties, ``|g_k| <= 1``; a positive optimum is a direction along which the
    likelihood rises without bound (complete or quasi-complete separation). A pair model's ``orders``
    (`emoreward.ranking.tie_models.PairModel.orders`) say which constraints each outcome sets.

    Args:
        x (`np.ndarray` of shape `(N, K)`): the unpenalised regressors (an intercept is a column of ones); for a pair
            model, its two sides' difference.
        outcome (`np.ndarray` of shape `(N,)`): ``0`` where the outcome is the positive one (``y = +1``), ``1``
            where it is the negative one (``y = -1``), ``2`` for a tie.
        orders (`dict`, *optional*): per outcome, ``(ahead, behind)`` among ``"i"``, ``"j"``, ``"0"``
            (default `DIFFERENCE_ORDERS`, the constraints above).
        level (`np.ndarray` of shape `(N, K)`, *optional*): the mean of the two sides (needed where ``orders``
            name the tie level ``"0"``); default 0.

    Returns:
        `np.ndarray` of shape `(K,)` (``|g_k| <= 1``) or `None` when the outcomes are not separated. The rows with
        every constraint at 0 are those the direction leaves undecided.
    """
    from scipy.optimize import linprog

    x = np.asarray(x, dtype=float).reshape(len(outcome), -1)
    level = np.zeros_like(x) if level is None else np.asarray(level, dtype=float).reshape(x.shape)
    rows, _, equal = _order_rows(x, np.asarray(outcome), DIFFERENCE_ORDERS if orders is None else orders, level)
    yz, ties = rows[~equal], rows[equal]
    if yz.shape[0] == 0 or x.shape[1] == 0:
        return None
    res = linprog(
        -yz.sum(axis=0),
        A_ub=-yz,
        b_ub=np.zeros(yz.shape[0]),
        A_eq=ties if ties.shape[0] else None,
        b_eq=np.zeros(ties.shape[0]) if ties.shape[0] else None,
        bounds=[(-1.0, 1.0)] * x.shape[1],
        method="highs",
    )
    if res.status == 0 and -res.fun > 1e-9 * max(1.0, float(np.abs(yz).sum())):
        return np.asarray(res.x, dtype=float)
    return None


def decided_rows(
    x: np.ndarray, outcome: np.ndarray, orders: dict | None = None, level: np.ndarray | None = None
) -> np.ndarray | None:
    """Every row some separating direction decides (a constraint of the row ``!= 0``), or None when the outcomes
    are not separated.

    One `separating_direction` may leave rows at 0 that another decides; the directions add up (a large multiple of
    the first plus the next still orders every row), so `separating_direction` is applied again to the rows left
    undecided until none is separated. The rows left are those the limit of the maximum-likelihood fit still weighs.

    Args:
        x, outcome, orders, level: as `separating_direction`.

    Returns:
        `np.ndarray` of shape `(N,)`, bool, or `None`.
    """
    x = np.asarray(x, dtype=float).reshape(len(outcome), -1)
    level = np.zeros_like(x) if level is None else np.asarray(level, dtype=float).reshape(x.shape)
    orders = DIFFERENCE_ORDERS if orders is None else orders
    outcome = np.asarray(outcome)
    decided = np.zeros(len(outcome), dtype=bool)
    while not decided.all():
        rest = np.flatnonzero(~decided)
        direction = separating_direction(x[rest], outcome[rest], orders, level[rest])
        if direction is None:
            break
        rows, record, _ = _order_rows(x[rest], outcome[rest], orders, level[rest])
        z = rows @ direction
        moved = np.abs(z) > 1e-9 * max(1.0, float(np.abs(z).max()))
        newly = np.zeros(len(rest), dtype=bool)
        newly[record[moved]] = True
        if not newly.any():
            break
        decided[rest[newly]] = True
    return decided if decided.any() else None


def separated(x: np.ndarray, outcome: np.ndarray) -> bool:
    """Whether the outcomes are separated along some direction of ``x`` (`separating_direction`)."""
    return separating_direction(x, outcome) is not None


def firth_logistic(x: np.ndarray, y: np.ndarray, max_iter: int = 200) -> tuple[np.ndarray, np.ndarray, float]:
    """Firth's penalised logistic regression (Firth 1993; Heinze & Schemper 2002): the mode of the likelihood times
    the Jeffreys prior ``|I(beta)|^(1/2)``, finite under separation, the maximum-likelihood estimate to first order
    otherwise. Newton steps on the modified score ``X' (y - p + h (1/2 - p))`` (``h``: the hat diagonal) with step
    halving on the penalised log-likelihood.

    Args:
        x (`np.ndarray` of shape `(N, K)`): regressors (an intercept is a column of ones).
        y (`np.ndarray` of shape `(N,)`): 0 / 1 outcomes.

    Returns:
        ``(beta (K,), standard errors (K,) from the inverse Fisher information, log-likelihood at beta)`` (the
        log-likelihood without the penalty).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)

    def terms(beta):
        eta = x @ beta
        p = 1.0 / (1.0 + np.exp(-eta))
        w = p * (1.0 - p)
        info = x.T @ (x * w[:, None])
        sign, logdet = np.linalg.slogdet(info)
        loglik = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
        return p, w, info, loglik, loglik + 0.5 * (logdet if sign > 0 else -np.inf)

    beta = np.zeros(x.shape[1])
    p, w, info, loglik, penalised = terms(beta)
    for _ in range(max_iter):
        inverse = np.linalg.pinv(info)
        h = w * np.einsum("ij,jk,ik->i", x, inverse, x)
        step = inverse @ (x.T @ (y - p + h * (0.5 - p)))
        t = 1.0
        for _ in range(30):
            trial = terms(beta + t * step)
            if trial[4] >= penalised - 1e-12:
                break
            t *= 0.5
        beta = beta + t * step
        p, w, info, loglik, penalised = trial
        if np.max(np.abs(t * step)) < 1e-10:
            break
    se = np.sqrt(np.maximum(np.diag(np.linalg.pinv(info)), 0.0))
    return beta, se, loglik


__all__ = ["decided_rows", "firth_logistic", "separated", "separating_direction"]
