"""Length-controlled ranking: Bradley-Terry / Davidson with description-length covariates (style control).

On emotion-description data "prefer the longer description" explains most verdicts (about 80% of EmoPrefer's
decisive ones), so a plain Bradley-Terry ranking mixes a model's quality with its verbosity. Chatbot Arena's
*style control* (Li, Angelopoulos, Chiang, "Does style matter? Disentangling style and substance in Chatbot
Arena", LMSYS blog, 2024-08-29; FastChat ``fastchat/serve/monitor/elo_analysis.py``, ``construct_style_matrices``)
adds the standardised style differences of the two answers as covariates beside the model indicators of a
logistic Bradley-Terry model. This module fits that model on description-model verdicts:

    logit P(i beats j | sample s) = (b_i - b_j) + sum_k gamma_k z_k(i, j, s),
    z_k(i, j, s) = (f_k(d_is) - f_k(d_js)) / sigma_k,

where ``d_is`` is the description model ``i`` wrote for sample ``s``, ``f_k`` a per-description covariate
(default ``log_length``: ``log(1 + characters)``, measured by the project's one length function
:func:`emoreward.data.tables.description_length`) and ``sigma_k`` the root-mean-square of the differences over
all records. Ties enter through Davidson's model as in the plain fit
(:func:`emoreward.ranking.bradley_terry.fit_bradley_terry_ties`): ``P(i>j), P(j>i), P(tie)`` proportional to
``exp(u/2), exp(-u/2), nu`` with ``u`` the linear predictor above (with ``u = b_i - b_j`` it is exactly the plain
Davidson fit). ``b`` gets the plain fits' Gaussian prior ``N(0, prior_variance)`` and is centred to mean 0
(natural-log units, as :class:`~emoreward.ranking.bradley_terry.BTResult`); ``gamma`` is unpenalised
(maximum likelihood), so its p-value (normal, bootstrap standard error over samples) means what it says.

Two choices differ from FastChat, both because a description pair has no natural order: FastChat divides the
difference by the sum (``(a - b) / (a + b + 1)``) and z-scores it; we take the log-length difference (the same
quantity to first order, and additive: a description twice as long is one step whatever the lengths) and scale it
by its root-mean-square without centring, since centring would make the fit depend on which description of a pair
is written first. ``coefficient_per_doubling`` reports ``gamma * ln 2 / sigma``: the logit change when one
description is twice as long as the other.

Honest statistics at the edges (each reported as a warning, with ``None`` where a number would mislead): a
covariate without variation is dropped; a covariate collinear with model identity (every model always writes
the same relative length) leaves the split between ``b`` and ``gamma`` to the prior, so neither is reported;
a covariate that separates the decisive verdicts (a linear program finds a ``gamma`` direction that orders every
verdict correctly) has an infinite maximum-likelihood coefficient, so scores, coefficients and p-values are
``None``. Resamples whose Newton iterations diverge (separated resamples) are counted and left out of the
intervals.

Intervals: percentile bootstrap over samples (videos), the resampling of
:func:`emoreward.ranking.bootstrap.bootstrap_ci` (same unit, same random draws for the same seed), with all
resamples fitted together by one batched Newton iteration (`(n_boot, M + K)` parameters).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix
from scipy.stats import norm

from emoreward.data.text import description_length, markdown_cell
from emoreward.ranking.bootstrap import BootstrapCI, sample_units
from emoreward.ranking.bradley_terry import (
    DEFAULT_PRIOR_VARIANCE,
    SCORE_TOLERANCE,
    BTResult,
    finite_float,
    finite_floats,
    prior_precision,
)
from emoreward.ranking.counts import PairwiseCounts, check_connected, encode_records
from emoreward.ranking.records import PairwiseRecord


ControlledModel = Literal["bradley-terry", "davidson"]
CONTROLLED_MODELS: tuple[str, ...] = ("bradley-terry", "davidson")

COVARIATES: dict[str, Callable[[str], float]] = {
    "log_length": lambda text: math.log1p(description_length(text, "chars")),
    "log_words": lambda text: math.log1p(description_length(text, "words")),
    "lines": lambda text: float(text.count("\n") + 1 if text.strip() else 0),
}
"""Per-description covariates by name: ``log(1 + characters)`` (the default), ``log(1 + words)``, line count."""
DEFAULT_COVARIATES: tuple[str, ...] = ("log_length",)

# A logit change beyond this per standard deviation of a covariate (odds e^15 ~ 3e6) only arises when the
# covariate separates the verdicts: such a resample's fit is a solver artefact, not an estimate.
_DIVERGED = 15.0
_TIE_LOG_BOUNDS = (-30.0, 30.0)  # as the plain tie fits
_MAX_ITER = 100
_MIN_BOOT_SE = 20  # resamples needed for a bootstrap standard error; below, the Wald one is reported
_CHUNK_CELLS = 2_000_000  # resamples x records per batch


def description_features(
    descriptions: Mapping[tuple[str, str], str], covariates: Sequence[str | tuple[str, Callable[[str], float]]]
) -> tuple[list[str], dict[tuple[str, str], np.ndarray]]:
    """Per-description covariate values.

    Args:
        descriptions (`Mapping[tuple[str, str], str]`): ``(sample, model) -> description`` (e.g.
            ``DescriptionTable.descriptions``).
        covariates: names from `COVARIATES`, or ``(name, function of the text)`` pairs for user covariates.

    Returns:
        ``(names, values)``: the K covariate names and ``(sample, model) -> np.ndarray of shape (K,)``.

    Raises:
        ValueError: on an unknown covariate name (the message lists `COVARIATES`), a repeated name, or a function
            returning a non-finite value (the message names the sample and model).
    """
    names, fns = [], []
    for cov in covariates:
        if isinstance(cov, str):
            if cov not in COVARIATES:
                raise ValueError(f"unknown covariate {cov!r}; available: {sorted(COVARIATES)}")
            names.append(cov)
            fns.append(COVARIATES[cov])
        else:
            names.append(str(cov[0]))
            fns.append(cov[1])
    if len(set(names)) != len(names):
        raise ValueError(f"covariates repeat: {names}")
    values = {}
    for key, text in descriptions.items():
        row = np.array([float(fn(text)) for fn in fns], dtype=float)
        if not np.all(np.isfinite(row)):
            raise ValueError(
                f"covariate values {dict(zip(names, row.tolist()))} of sample {key[0]!r}, model "
                f"{key[1]!r} are not finite"
            )
        values[key] = row
    return names, values


@dataclass(frozen=True)
class ControlledFit:
    """A length-controlled (style-controlled) Bradley-Terry / Davidson fit with bootstrap intervals.

    Attributes:
        items (`list[str]`): the M models, order of ``scores``.
        scores (`np.ndarray` of shape `(M,)`): model effects ``b``, centred to mean 0 (natural-log strength units,
            comparable with the plain fit's scores); all NaN when the fit is not identified (see ``warnings``).
        ci_lower, ci_upper (`np.ndarray` of shape `(M,)`): bootstrap percentile interval of ``scores``.
        covariates (`list[str]`): the K covariate names.
        coefficients (`np.ndarray` of shape `(K,)`): ``gamma_k``, logit per root-mean-square of the covariate
            difference; NaN for a dropped, collinear or separated covariate.
        coef_lower, coef_upper (`np.ndarray` of shape `(K,)`): bootstrap interval of ``coefficients``.
        std_errors, p_values (`np.ndarray` of shape `(K,)`): standard error of ``gamma_k`` and the two-sided
            normal p-value of ``gamma_k = 0``. The standard error is the bootstrap one over samples (the verdicts on
            one sample are correlated); with fewer than 20 usable resamples, the Wald one (observed information,
            records taken as independent, which understates it).
        scales (`np.ndarray` of shape `(K,)`): ``sigma_k``, root-mean-square of the raw covariate differences.
        model (`str`): ``"bradley-terry"`` (ties dropped) or ``"davidson"``.
        tie_parameter (`float` or `None`): Davidson's ``nu``; ``None`` for Bradley-Terry.
        log_likelihood (`float`): data log-likelihood at the fit (prior excluded).
        n_comparisons (`int`): records in the likelihood.
        ci_level (`float`): coverage of the intervals.
        n_boot (`int`): resamples; ``n_failed`` of them diverged (separated) and are left out.
        warnings (`list[str]`): what a reader must know (dropped, collinear or separated covariates, failed
            resamples).
        boot_scores (`np.ndarray` of shape `(n_boot, M)`), boot_coefficients (`(n_boot, K)`): every resample's
            fit, NaN where an item was not compared or the resample failed.
        prior_variance (`float` or `None`): the prior on ``b``.
        ranking, ranks: as :class:`~emoreward.ranking.bradley_terry.BTResult` (shared ranks within
            ``SCORE_TOLERANCE``).
    """

    items: list[str]
    scores: np.ndarray
    ci_lower: np.ndarray
    ci_upper: np.ndarray
    covariates: list[str]
    coefficients: np.ndarray
    coef_lower: np.ndarray
    coef_upper: np.ndarray
    std_errors: np.ndarray
    p_values: np.ndarray
    scales: np.ndarray
    model: str
    tie_parameter: float | None
    log_likelihood: float
    n_comparisons: int
    ci_level: float
    n_boot: int
    n_failed: int
    warnings: list[str]
    boot_scores: np.ndarray
    boot_coefficients: np.ndarray
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    ranking: list[str] = field(init=False)
    ranks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        ranked = BTResult(list(self.items), self.scores, self.model, self.log_likelihood, float(self.n_comparisons))
        object.__setattr__(self, "ranking", ranked.ranking)  # shared ranks as every plain fit's
        object.__setattr__(self, "ranks", ranked.ranks)

    @property
    def identified(self) -> bool:
        """Whether the model effects are estimates (not NaN because of collinearity or separation)."""
        return bool(np.all(np.isfinite(self.scores)))

    @property
    def coefficient_per_doubling(self) -> np.ndarray:
        """`np.ndarray` of shape `(K,)`: ``gamma_k * ln 2 / sigma_k``, the logit change when the covariate
        difference is ``ln 2`` (for ``log_length``: one description twice as long as the other)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.coefficients * math.log(2.0) / self.scales

    def as_bt_result(self) -> BTResult:
        """The model effects as a `BTResult` (for the tables and plots of plain fits), interval attached."""
        return BTResult(
            items=list(self.items),
            scores=self.scores,
            model=f"{self.model} + {'+'.join(self.covariates)}",
            log_likelihood=self.log_likelihood,
            n_comparisons=float(self.n_comparisons),
            tie_parameter=self.tie_parameter,
            prior_variance=self.prior_variance,
            ci_lower=self.ci_lower,
            ci_upper=self.ci_upper,
            ci_level=self.ci_level,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite numbers become ``None``)."""
        return {
            "model": self.model,
            "items": list(self.items),
            "scores": finite_floats(self.scores),
            "ci_lower": finite_floats(self.ci_lower),
            "ci_upper": finite_floats(self.ci_upper),
            "ranking": list(self.ranking) if self.identified else None,
            "ranks": list(self.ranks) if self.identified else None,
            "covariates": {
                name: {
                    "coefficient": finite_float(self.coefficients[k]),
                    "ci_lower": finite_float(self.coef_lower[k]),
                    "ci_upper": finite_float(self.coef_upper[k]),
                    "std_error": finite_float(self.std_errors[k]),
                    "p_value": finite_float(self.p_values[k]),
                    "scale": finite_float(self.scales[k]),
                    "per_doubling": finite_float(self.coefficient_per_doubling[k]),
                }
                for k, name in enumerate(self.covariates)
            },
            "tie_parameter": finite_float(self.tie_parameter),
            "log_likelihood": finite_float(self.log_likelihood),
            "n_comparisons": int(self.n_comparisons),
            "prior_variance": finite_float(self.prior_variance),
            "ci_level": self.ci_level,
            "n_boot": self.n_boot,
            "n_failed": self.n_failed,
            "warnings": list(self.warnings),
        }

    def coefficients_markdown(self, digits: int = 3) -> str:
        """Markdown table of the covariate coefficients with interval, standard error, p-value, per doubling."""
        pct = f"{100 * self.ci_level:g}%"
        lines = [
            f"| covariate | coefficient (logit / RMS) | {pct} CI | s.e. | p-value | logit per doubling |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for k, name in enumerate(self.covariates):
            c = self.coefficients[k]
            if not math.isfinite(c):
                lines.append(f"| {markdown_cell(name)} | - | - | - | - | - |")
                continue
            lines.append(
                f"| {markdown_cell(name)} | {c:.{digits}f} | [{self.coef_lower[k]:.{digits}f}, {self.coef_upper[k]:.{digits}f}] "
                f"| {self.std_errors[k]:.{digits}f} | {self.p_values[k]:.2g} "
                f"| {self.coefficient_per_doubling[k]:.{digits}f} |"
            )
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the design


@dataclass(frozen=True)
class _Design:
    """Records as arrays: design rows ``x_r = (e_a - e_b, z_r)`` of shape `(N, M + K)`, outcome codes, units."""

    x: np.ndarray
    outcome: np.ndarray
    units: np.ndarray
    n_units: int
    a: np.ndarray
    b: np.ndarray
    m: int


def _design(
    records: list[PairwiseRecord], items: list[str], raw: np.ndarray, model: str
) -> tuple[_Design, np.ndarray]:
    encoded = encode_records(records, items)
    units, n_units = sample_units([r.sample for r in records])
    keep = np.ones(len(records), dtype=bool) if model == "davidson" else encoded.outcome != 2
    m, n = len(items), int(keep.sum())
    a, b = encoded.a[keep], encoded.b[keep]
    x = np.zeros((n, m + raw.shape[1]))
    x[np.arange(n), a] = 1.0
    x[np.arange(n), b] = -1.0
    x[:, m:] = raw[keep]
    return _Design(x, encoded.outcome[keep].astype(np.int64), units[keep], n_units, a, b, m), keep


# ---------------------------------------------------------------------------------------------- batched Newton


def _newton(
    design: _Design,
    weights: np.ndarray,
    precision: float,
    davidson: bool,
    x0: np.ndarray | None = None,
    hessian: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Penalised maximum likelihood for B weightings of the records at once.

    Minimises, per row of ``weights`` (shape `(B, N)`), ``sum_r w_r nll_r + precision/2 |b|^2 + (sum b)^2 / (2M)``;
    the last term only fixes the shift of ``b`` (the likelihood depends on differences), so its optimum has
    ``sum b = 0`` and the others are unchanged. Damped Newton (step halving until the objective decreases).

    Rows that converged (or diverged) drop out of the iteration: the others are evaluated alone.

    Returns:
        ``(params, converged, hessian)``: params of shape `(B, P)` (``P = M + K``, plus Davidson's ``log nu``),
        converged `(B,)` bool, and the Hessian of shape `(B, P, P)` at the solution (``None`` unless ``hessian``).
    """
    x, m = design.x, design.m
    p = x.shape[1]
    q = p + davidson
    n_b = weights.shape[0]
    y = design.outcome
    yw, yl, yt = (y == 0).astype(float), (y == 1).astype(float), (y == 2).astype(float)
    xs, xs_t, outer_t = _sparse_design(design)

    def times_x(v: np.ndarray) -> np.ndarray:  # (B, N) @ x, through the sparse transpose
        return np.asarray(xs_t @ v.T).T

    def times_outer(v: np.ndarray) -> np.ndarray:  # (B, N) @ (row outer products of x), shape (B, P, P)
        return np.asarray(outer_t @ v.T).T.reshape(v.shape[0], p, p)

    has_ties = (weights @ yt) > 0 if davidson else np.zeros(n_b, dtype=bool)
    theta = np.zeros((n_b, q)) if x0 is None else np.broadcast_to(x0, (n_b, q)).copy()
    if davidson:
        theta[:, -1] = np.where(has_ties, np.clip(theta[:, -1], *_TIE_LOG_BOUNDS), _TIE_LOG_BOUNDS[0])
    scale = 1.0 + weights.sum(axis=1)

    def objective(th: np.ndarray, full: bool, weights: np.ndarray):
        n_b = th.shape[0]
        u = np.asarray(xs @ th[:, :p].T).T  # (B, N)
        s = th[:, :m]
        penalty = 0.5 * precision * np.sum(s * s, axis=1) + 0.5 * s.sum(axis=1) ** 2 / m
        if not davidson:
            sign = np.where(y == 0, 1.0, -1.0)
            nll = np.logaddexp(0.0, -sign * u)
            f = np.sum(weights * nll, axis=1) + penalty
            if not full:
                return f
            sig = 1.0 / (1.0 + np.exp(sign * u))  # sigmoid(-sign u)
            gu = -sign * sig
            hu = sig * (1.0 - sig)
            grad = times_x(weights * gu)
            hess = times_outer(weights * hu)
        else:
            eta = th[:, -1:]
            half = 0.5 * u
            top = np.maximum(np.abs(half), eta)
            ew, el, et = np.exp(half - top), np.exp(-half - top), np.exp(eta - top)
            total = ew + el + et
            nll = top + np.log(total) - (yw - yl) * half - yt * eta
            f = np.sum(weights * nll, axis=1) + penalty
            if not full:
                return f
            pw, pl, pt = ew / total, el / total, et / total
            gu = 0.5 * (pw - pl) - 0.5 * (yw - yl)
            ge = pt - yt
            huu = 0.25 * (pw + pl) - 0.25 * (pw - pl) ** 2
            hue = -0.5 * (pw - pl) * pt
            hee = pt * (1.0 - pt)
            grad = np.concatenate([times_x(weights * gu), np.sum(weights * ge, axis=1, keepdims=True)], axis=1)
            hess = np.zeros((n_b, q, q))
            hess[:, :p, :p] = times_outer(weights * huu)
            hess[:, :p, -1] = hess[:, -1, :p] = times_x(weights * hue)
            hess[:, -1, -1] = np.sum(weights * hee, axis=1)
        grad[:, :m] += precision * s + s.sum(axis=1, keepdims=True) / m
        hess[:, :m, :m] += precision * np.eye(m) + 1.0 / m
        return f, grad, hess

    converged = np.zeros(n_b, dtype=bool)
    rows = np.arange(n_b)  # the rows still iterating, and their weights
    w = weights
    for _ in range(_MAX_ITER):
        th = theta[rows]
        f, grad, hess = objective(th, True, w)
        if davidson:  # a resample without ties keeps log nu at its lower bound, as the plain fit does
            no_ties = ~has_ties[rows]
            grad[no_ties, -1] = 0.0
            hess[no_ties, -1, :] = 0.0
            hess[no_ties, :, -1] = 0.0
            hess[no_ties, -1, -1] = 1.0
        done = np.max(np.abs(grad), axis=1) <= 1e-10 * scale[rows]
        converged[rows] = done
        diverged = np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) > 4 * _DIVERGED
        active = ~done & ~diverged
        if not active.any():
            break
        if not active.all():  # converged and diverged rows stay where they are
            rows, w, th, f, grad, hess = rows[active], w[active], th[active], f[active], grad[active], hess[active]
        step = _solve(hess, grad)
        t = np.ones(len(rows))
        row_scale = scale[rows]
        for _ in range(40):
            trial = th - t[:, None] * step
            if davidson:
                trial[:, -1] = np.clip(trial[:, -1], *_TIE_LOG_BOUNDS)
            f_new = objective(trial, False, w)
            bad = ~(f_new <= f + 1e-12 * row_scale)
            if not bad.any():
                break
            t[bad] *= 0.5
        theta[rows] = trial
    if not hessian:
        return theta, converged, None
    _, _, hess = objective(theta, True, weights)
    return theta, converged, hess


def _sparse_design(design: _Design) -> tuple[csr_matrix, csr_matrix, csr_matrix]:
    """``x`` as a sparse matrix, its transpose, and the transpose of its row outer products (shape `(P^2, N)`).

    A row has ``2 + K`` non-zeros (``+1``, ``-1`` and the covariates), so the batched gradient and Hessian cost
    ``B N (2 + K)^2`` instead of ``B N P^2``.
    """
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


# ------------------------------------------------------------------------------------------- edge diagnostics


def _separated(z: np.ndarray, outcome: np.ndarray) -> bool:
    """Whether a direction of the covariates alone orders every decisive verdict (and leaves ties at 0).

    Linear program (Konis 2007, "Linear programming algorithms for detecting separated data in binary logistic
    regression models"): maximise ``sum_r y_r z_r . g`` subject to ``y_r z_r . g >= 0`` on decisive records,
    ``z_r . g = 0`` on ties, ``|g| <= 1``. A positive optimum is a direction along which the likelihood rises
    without bound (the prior on ``b`` keeps every direction that moves ``b`` finite, so only ``g`` matters).
    """
    decisive = outcome != 2
    y = np.where(outcome[decisive] == 0, 1.0, -1.0)
    yz = z[decisive] * y[:, None]
    if yz.shape[0] == 0:
        return False
    ties = z[~decisive]
    res = linprog(
        -yz.sum(axis=0),
        A_ub=-yz,
        b_ub=np.zeros(yz.shape[0]),
        A_eq=ties if ties.shape[0] else None,
        b_eq=np.zeros(ties.shape[0]) if ties.shape[0] else None,
        bounds=[(-1.0, 1.0)] * z.shape[1],
        method="highs",
    )
    return bool(res.status == 0 and -res.fun > 1e-9 * max(1.0, float(np.abs(yz).sum())))


def _collinear(x: np.ndarray, m: int) -> bool:
    """Whether a covariate column is a linear combination of the model-indicator columns (rank deficiency)."""
    gram_b = x[:, :m].T @ x[:, :m]
    gram = x.T @ x
    return np.linalg.matrix_rank(gram) < np.linalg.matrix_rank(gram_b) + (x.shape[1] - m)


# ------------------------------------------------------------------------------------------------------- fit


def fit_length_controlled(
    records: Sequence[PairwiseRecord],
    features: Mapping[tuple[str, str], np.ndarray],
    covariates: Sequence[str] = DEFAULT_COVARIATES,
    model: ControlledModel = "davidson",
    items: Sequence[str] | None = None,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | None = 0,
) -> ControlledFit:
    """Fit the length-controlled model of the module docstring, with bootstrap intervals over samples.

    Args:
        records (`Sequence[PairwiseRecord]`): the verdicts; every record needs a ``sample``.
        features (`Mapping[tuple[str, str], np.ndarray]`): ``(sample, model) -> raw covariate values`` of shape
            `(K,)` (see :func:`description_features`).
        covariates (`Sequence[str]`): the K names, in the order of the feature vectors.
        model (`Literal["bradley-terry", "davidson"]`): ``"bradley-terry"`` drops ties (as
            :func:`~emoreward.ranking.bradley_terry.fit_bradley_terry`'s default), ``"davidson"`` models them.
        items (`Sequence[str]`, *optional*): item order (default: sorted names).
        prior_variance (`float` or `None`): Gaussian prior on the model effects, as the plain fits.
        n_boot (`int`): resamples (>= 1); alpha: 1 - coverage; seed: as
            :func:`~emoreward.ranking.bootstrap.bootstrap_ci` (same seed, same resamples).

    Returns:
        `ControlledFit`; a degenerate covariate or fit shows in ``warnings`` (each also raised as a
        `UserWarning`) with ``None``/NaN where a number would mislead.

    Raises:
        ValueError: on an unknown ``model``, no records, a record without sample or features (the message names the
            record), feature vectors of the wrong length, a disconnected comparison graph, ``n_boot < 1`` or
            ``alpha`` outside (0, 1).
    """
    if model not in CONTROLLED_MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {CONTROLLED_MODELS}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    precision = prior_precision(prior_variance)
    records = list(records)
    if not records:
        raise ValueError("fit_length_controlled needs at least one record")
    covariates = list(covariates)
    k_cov = len(covariates)
    raw = np.empty((len(records), k_cov))
    for n, r in enumerate(records):
        fa, fb = features.get((r.sample, r.item_a)), features.get((r.sample, r.item_b))
        if r.sample is None or fa is None or fb is None:
            missing = r.item_a if fa is None else r.item_b
            raise ValueError(
                f"record {n} ({r.item_a} vs {r.item_b}, sample {r.sample!r}): no covariates for "
                f"model {missing!r} on this sample"
            )
        fa, fb = np.asarray(fa, dtype=float), np.asarray(fb, dtype=float)
        if fa.shape != (k_cov,) or fb.shape != (k_cov,):
            raise ValueError(f"record {n}: covariate vectors must have shape ({k_cov},) for {covariates}")
        raw[n] = fa - fb
    items = sorted({r.item_a for r in records} | {r.item_b for r in records}) if items is None else list(items)
    check_connected(PairwiseCounts.from_records(records, items), "error")
    notes: list[str] = []
    scales = np.sqrt(np.mean(raw**2, axis=0)) if len(raw) else np.zeros(k_cov)
    kept = scales > 0
    for k in np.flatnonzero(~kept):
        notes.append(f"covariate {covariates[k]!r} does not differ within any compared pair: dropped")
    z = raw[:, kept] / scales[kept]
    design, _ = _design(records, items, z, model)
    m, k_kept = len(items), int(kept.sum())
    davidson = model == "davidson"
    unidentified = False
    if k_kept and _collinear(design.x, m):
        notes.append(
            f"covariates {[c for c, k in zip(covariates, kept) if k]} are collinear with model identity (each "
            "model's relative length is the same on every sample): model effects and coefficients are not "
            "separately identified; reported as null"
        )
        unidentified = True
    elif k_kept and _separated(design.x[:, m:], design.outcome):
        notes.append(
            f"covariates {[c for c, k in zip(covariates, kept) if k]} separate the verdicts (the longer/shorter "
            "description wins every decisive verdict): the maximum-likelihood coefficient is infinite; scores, "
            "coefficients and p-values reported as null"
        )
        unidentified = True

    ones = np.ones((1, design.x.shape[0]))
    theta, ok, hess = _newton(design, ones, precision, davidson)
    est = theta[0]
    cov = np.linalg.pinv(hess[0])
    p = design.x.shape[1]
    se = np.full(k_cov, np.nan)
    coef = np.full(k_cov, np.nan)
    pval = np.full(k_cov, np.nan)
    if not unidentified:
        coef[kept] = est[m:p]
        se[kept] = np.sqrt(np.maximum(np.diag(cov)[m:p], 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            pval[kept] = 2.0 * norm.sf(np.abs(coef[kept] / se[kept]))
    if not unidentified and k_kept and (not ok[0] or np.max(np.abs(est[m:p])) > _DIVERGED):
        notes.append(
            f"covariates {[c for c, k in zip(covariates, kept) if k]} nearly separate the verdicts (fitted "
            f"coefficient beyond {_DIVERGED:g} logits per RMS difference, or no convergence): the estimate rests on "
            "the few verdicts length does not decide; scores, coefficients and p-values reported as null"
        )
        unidentified = True
        coef[:] = se[:] = pval[:] = np.nan
    scores = est[:m] - est[:m].mean()
    tie_parameter = math.exp(float(est[-1])) if davidson else None
    log_lik = -_newton_nll(design, est, davidson)

    # bootstrap: the resamples of bootstrap_ci (one bincount of n_units draws per resample, same generator)
    rng = np.random.default_rng(seed)
    boot_s = np.full((n_boot, m), np.nan)
    boot_c = np.full((n_boot, k_cov), np.nan)
    n_failed = 0
    present_rows = np.zeros((design.n_units, m))
    np.add.at(present_rows, (design.units, design.a), 1.0)
    np.add.at(present_rows, (design.units, design.b), 1.0)
    chunk = max(1, _CHUNK_CELLS // max(1, design.x.shape[0]))
    if not unidentified:
        for start in range(0, n_boot, chunk):
            stop = min(n_boot, start + chunk)
            unit_w = np.stack(
                [
                    np.bincount(rng.integers(0, design.n_units, design.n_units), minlength=design.n_units)
                    for _ in range(start, stop)
                ]
            ).astype(float)
            th, conv, _ = _newton(design, unit_w[:, design.units], precision, davidson, est, hessian=False)
            good = conv & (np.max(np.abs(th[:, m:p]), axis=1, initial=0.0) <= _DIVERGED)
            n_failed += int((~good).sum())
            present = (unit_w @ present_rows) > 0
            s = th[:, :m].copy()
            s[~present] = np.nan
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                shift = np.nanmean(np.where(present, scores, np.nan), axis=1) - np.nanmean(s, axis=1)
            s += shift[:, None]
            s[~good] = np.nan
            c = np.full((stop - start, k_cov), np.nan)
            c[:, kept] = th[:, m:p]
            c[~good] = np.nan
            boot_s[start:stop], boot_c[start:stop] = s, c
    else:
        scores = np.full(m, np.nan)
        for _ in range(n_boot):  # keep the generator's state in step with an identified fit
            rng.integers(0, design.n_units, design.n_units)
    if n_failed:
        notes.append(
            f"{n_failed} of {n_boot} resamples separated (their coefficients diverged): left out of the intervals"
        )
    if not ok[0] and not unidentified:
        notes.append("the full-data Newton iteration did not converge: treat the fit with care")
    lo_s, hi_s = _percentile(boot_s, scores, alpha)
    lo_c, hi_c = _percentile(boot_c, coef, alpha)
    good_boot = np.isfinite(boot_c[:, kept]).all(axis=1) if k_kept else np.zeros(n_boot, dtype=bool)
    if not unidentified and good_boot.sum() >= _MIN_BOOT_SE:
        # the verdicts on one sample are correlated (C(M, 2) per sample): the bootstrap over samples gives the
        # standard error, the observed information (records as independent) understates it
        se[kept] = np.std(boot_c[good_boot][:, kept], axis=0, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            pval[kept] = 2.0 * norm.sf(np.abs(coef[kept] / se[kept]))
    for note in notes:
        warnings.warn(f"length-controlled fit: {note}", UserWarning, stacklevel=2)
    return ControlledFit(
        items=items,
        scores=scores,
        ci_lower=lo_s,
        ci_upper=hi_s,
        covariates=covariates,
        coefficients=coef,
        coef_lower=lo_c,
        coef_upper=hi_c,
        std_errors=se,
        p_values=pval,
        scales=scales,
        model=model,
        tie_parameter=tie_parameter,
        log_likelihood=log_lik,
        n_comparisons=int(design.x.shape[0]),
        ci_level=1.0 - alpha,
        n_boot=n_boot,
        n_failed=n_failed,
        warnings=notes,
        boot_scores=boot_s,
        boot_coefficients=boot_c,
        prior_variance=prior_variance,
    )


def _newton_nll(design: _Design, theta: np.ndarray, davidson: bool) -> float:
    """Data negative log-likelihood (no prior) at one parameter vector."""
    p = design.x.shape[1]
    u = design.x @ theta[:p]
    y = design.outcome
    if not davidson:
        return float(np.sum(np.logaddexp(0.0, -np.where(y == 0, 1.0, -1.0) * u)))
    eta = float(theta[-1])
    logits = np.stack([0.5 * u, -0.5 * u, np.full_like(u, eta)], axis=1)
    top = logits.max(axis=1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return float(np.sum(lse - logits[np.arange(len(y)), y]))


def _percentile(boot: np.ndarray, est: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval per column over finite resamples, extended to contain the estimate (as bootstrap_ci)."""
    k = boot.shape[1]
    lo, hi = np.full(k, np.nan), np.full(k, np.nan)
    boot = np.where(np.abs(boot - est) <= SCORE_TOLERANCE, est, boot)
    seen = np.isfinite(boot).any(axis=0) & np.isfinite(est)
    if seen.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            q = np.nanpercentile(boot[:, seen], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
        lo[seen], hi[seen] = np.fmin(q[0], est[seen]), np.fmax(q[1], est[seen])
    return lo, hi


# ----------------------------------------------------------------------------------------- plain vs controlled


def order_changes(plain: BootstrapCI | BTResult, controlled: ControlledFit) -> list[tuple[str, str]]:
    """Pairs of models whose order the length control reverses beyond the intervals.

    A pair ``(i, j)`` is listed when the plain fit puts ``i`` above ``j`` and the controlled fit puts ``j`` above
    ``i``, and in at least one of the two fits the two intervals do not overlap (so the change is not within the
    noise of both fits).

    Returns:
        `list[tuple[str, str]]`: ``(above in the plain fit, above in the controlled fit)`` pairs; empty when the
        controlled fit is not identified.
    """
    result = plain.estimate if isinstance(plain, BootstrapCI) else plain
    if not controlled.identified:
        return []
    index = {name: k for k, name in enumerate(controlled.items)}
    out = []
    for a in range(len(result.items)):
        for b in range(len(result.items)):
            ia, ib = result.items[a], result.items[b]
            if ia not in index or ib not in index:
                continue
            ca, cb = index[ia], index[ib]
            if not (result.scores[a] > result.scores[b] + SCORE_TOLERANCE):
                continue
            if not (controlled.scores[cb] > controlled.scores[ca] + SCORE_TOLERANCE):
                continue
            apart_plain = result.ci_lower is not None and result.ci_lower[a] > result.ci_upper[b]
            apart_ctrl = controlled.ci_lower[cb] > controlled.ci_upper[ca]
            if apart_plain or apart_ctrl:
                out.append((ia, ib))
    return out


def comparison_markdown(plain: BootstrapCI | BTResult, controlled: ControlledFit, digits: int = 2) -> str:
    """Markdown table, controlled order first: rank, model, controlled score [CI], plain rank and score [CI]."""
    result = plain.estimate if isinstance(plain, BootstrapCI) else plain
    pct = f"{100 * controlled.ci_level:g}%"
    lines = [
        f"| controlled rank | model | controlled score | {pct} CI | plain rank | plain score | plain {pct} CI |",
        "|---:|---|---:|---|---:|---:|---|",
    ]
    order = controlled.ranking if controlled.identified else list(result.ranking)
    ranks = controlled.ranks if controlled.identified else [None] * len(order)
    for rank, name in zip(ranks, order):
        k = controlled.items.index(name)
        ctrl = "-" if rank is None else f"{controlled.scores[k]:.{digits}f}"
        ci = "-" if rank is None else f"[{controlled.ci_lower[k]:.{digits}f}, {controlled.ci_upper[k]:.{digits}f}]"
        j = result.items.index(name)
        pci = "-" if result.ci_lower is None else f"[{result.ci_lower[j]:.{digits}f}, {result.ci_upper[j]:.{digits}f}]"
        lines.append(
            f"| {'-' if rank is None else rank} | {markdown_cell(name)} | {ctrl} | {ci} | {result.rank(name)} "
            f"| {result.scores[j]:.{digits}f} | {pci} |"
        )
    return "\n".join(lines) + "\n\n" + controlled.coefficients_markdown(digits)
