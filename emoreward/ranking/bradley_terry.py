"""Bradley-Terry ranking of models from pairwise judgements, with and without ties.

- :func:`fit_bradley_terry`: Bradley-Terry on win counts, or on EMER-Ranker's binarized matrix W
  (EMER-Ranker, section 2, eq. 1-4; :func:`fit_binarized_bradley_terry` does both steps).
- :func:`fit_bradley_terry_ties`: tie-aware models on win/loss/tie counts: EmoPrefer's additive form
  (EmoPrefer, appendix F, eq. 2-3), Rao-Kupper (1967) and Davidson (1970).

All fits are maximum a-posteriori estimates of the log-strengths ``s_i = log(theta_i)`` under a weak Gaussian prior
``s_i ~ N(0, prior_variance)`` (`prior_precision`), so that an undefeated or winless item keeps a finite score (the
papers' maximum-likelihood estimate is infinite then): the likelihoods of `emoreward.ranking.tie_models`, minimised
by the one Newton driver of `emoreward.ranking.batched` (a batch of one table).
Reported scores are log-strengths centred to mean 0 (``exp(s_i - s_j)`` is the odds of ``i`` beating ``j``).
Bootstrap intervals: `emoreward.ranking.bootstrap`; the hierarchical scheme: `emoreward.ranking.hierarchical`.
See docs/ranking.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from emoreward.data.text import markdown_cell
from emoreward.ranking.batched import DEFAULT_PRIOR_VARIANCE, BatchSpec, fit_batch, prior_precision
from emoreward.ranking.counts import (
    EqualCounts,
    OnDisconnected,
    PairwiseCounts,
    check_connected,
)
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL, TIE_MODELS, PairModel, get_model


TieModel = str | PairModel  # a name in TIE_MODELS or the object (emoreward.ranking.tie_models)
TieHandling = Literal["drop", "half"]
TIE_HANDLING: tuple[str, ...] = ("drop", "half")

# Scores closer than this (natural-log strength units) are equal, a shared rank: the fits stop at a tight tolerance,
# so items the data cannot separate land within ~1e-8 of each other.
SCORE_TOLERANCE = 1e-6

FitFn = Callable[[PairwiseCounts], "BTResult"]
RecordsFn = Callable[[list[tuple[str, str]]], Iterable[PairwiseRecord]]


@dataclass(frozen=True)
class BTResult:
    """A fitted Bradley-Terry (or tie-aware) model.

    Attributes:
        items (`list[str]`): the M items, in the order of ``scores``.
        scores (`np.ndarray` of shape `(M,)`): log-strengths ``log(theta_i)``, centred to mean 0 (natural log).
        model (`str`): ``"bradley-terry"`` or a tie model's name (`TIE_MODELS`).
        log_likelihood (`float`): data log-likelihood (prior excluded); n_comparisons: comparisons in it.
        tie_parameter (`float` or `None`): the tie model's ``beta`` (centred scale) or ``nu``; ``None`` without.
        prior_variance (`float` or `None`): variance of the Gaussian prior on log-strengths; ``None`` for MLE.
        ci_lower, ci_upper (`np.ndarray` of shape `(M,)` or `None`): bootstrap interval; ci_level: its coverage.
        ranking (`list[str]`): items best first; equal scores (within ``SCORE_TOLERANCE``) by name.
        ranks (`list[int]`): the rank of every item of ``ranking``, shared by equal scores ("1, 2, 2, 4").
    """

    items: list[str]
    scores: np.ndarray
    model: str
    log_likelihood: float
    n_comparisons: float
    tie_parameter: float | None = None
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE
    ci_lower: np.ndarray | None = None
    ci_upper: np.ndarray | None = None
    ci_level: float | None = None
    ranking: list[str] = field(init=False)
    ranks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, dtype=float)
        if scores.shape != (len(self.items),):
            raise ValueError(f"BTResult.scores must have shape ({len(self.items)},), got {scores.shape}")
        object.__setattr__(self, "scores", scores)
        groups = equal_score_groups(self.items, scores)
        object.__setattr__(self, "ranking", [name for g in groups for name in g])
        object.__setattr__(self, "ranks", competition_ranks(groups))

    def rank(self, item: str) -> int:
        """The (shared) rank of ``item``, 1 = best; raises ValueError for an unknown item."""
        if item not in self.items:
            raise ValueError(f"unknown item {item!r}; available: {self.items}")
        return self.ranks[self.ranking.index(item)]

    def tied_groups(self) -> list[list[str]]:
        """Groups of two or more items whose scores are equal (within ``SCORE_TOLERANCE``), best first."""
        return [g for g in equal_score_groups(self.items, self.scores) if len(g) > 1]

    def score(self, item: str) -> float:
        """The centred log-strength of ``item``; raises ValueError for an unknown item."""
        if item not in self.items:
            raise ValueError(f"unknown item {item!r}; available: {self.items}")
        return float(self.scores[self.items.index(item)])

    def with_interval(self, lower: np.ndarray, upper: np.ndarray, level: float) -> BTResult:
        """A copy with a confidence interval attached (`lower`, `upper` of shape `(M,)`, in ``items`` order; `level`
        its coverage, e.g. 0.95), as `emoreward.ranking.bootstrap.bootstrap_ci` computes it."""
        return replace(self, ci_lower=np.array(lower, copy=True), ci_upper=np.array(upper, copy=True), ci_level=level)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (plain floats, lists and ``None``; non-finite numbers become ``None``)."""
        return {
            "model": self.model,
            "items": list(self.items),
            "scores": finite_floats(self.scores),
            "ranking": list(self.ranking),
            "ranks": list(self.ranks),
            "tie_parameter": finite_float(self.tie_parameter),
            "log_likelihood": finite_float(self.log_likelihood),
            "n_comparisons": finite_float(self.n_comparisons),
            "prior_variance": finite_float(self.prior_variance),
            "ci_lower": None if self.ci_lower is None else finite_floats(self.ci_lower),
            "ci_upper": None if self.ci_upper is None else finite_floats(self.ci_upper),
            "ci_level": finite_float(self.ci_level),
        }

    def to_markdown(self, digits: int = 3) -> str:
        """Markdown table, best first: rank, item, score and (when present) the bootstrap interval."""
        has_ci = self.ci_lower is not None and self.ci_upper is not None
        ci_head = f" {100 * (self.ci_level or 0):g}% CI |" if has_ci else ""
        lines = [f"| rank | item | score |{ci_head}", "|---:|---|---:|" + ("---|" if has_ci else "")]
        for rank, item in zip(self.ranks, self.ranking):
            k = self.items.index(item)
            fixed = f".{digits}f"  # every number as its JSON value (`number_cell`: null is `-`)
            row = f"| {rank} | {markdown_cell(item)} | {number_cell(self.scores[k], fixed)} |"
            if has_ci:
                row += f" [{number_cell(self.ci_lower[k], fixed)}, {number_cell(self.ci_upper[k], fixed)}] |"
            lines.append(row)
        caption = (
            f"{self.model}; n_comparisons={self.n_comparisons:g}; "
            f"log-likelihood={number_cell(self.log_likelihood, f'.{digits}f')}"
        )
        if self.tie_parameter is not None:
            caption += f"; tie parameter={number_cell(self.tie_parameter, f'.{digits}f')}"
        return "\n".join(lines) + f"\n\n{caption}\n"


def equal_score_groups(items: Sequence[str], scores: np.ndarray, tol: float = SCORE_TOLERANCE) -> list[list[str]]:
    """Items grouped by equal score (`list[list[str]]`, best group first, items by name within a group): sorted
    ``scores`` `(M,)` start a new group where the gap exceeds ``tol``; NaN sorts last, each NaN its own group."""
    scores = np.asarray(scores, dtype=float)
    key = np.where(np.isfinite(scores), -scores, np.inf)
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    with np.errstate(invalid="ignore"):  # inf - inf between two NaN scores
        # a new group where the gap exceeds tol, and at every non-finite score (each NaN its own group)
        breaks = (np.flatnonzero(~(np.diff(ordered) <= tol) | ~np.isfinite(ordered[1:])) + 1).tolist()
    order = order.tolist()
    bounds = [0, *breaks, len(order)]
    groups = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    return [[items[g[0]]] if len(g) == 1 else sorted(items[k] for k in g) for g in groups]


def competition_ranks(groups: list[list[str]]) -> list[int]:
    """Standard competition ranks ("1, 2, 2, 4") of `equal_score_groups`, one per item in group order."""
    return [1 + sum(map(len, groups[:k])) for k, g in enumerate(groups) for _ in g]


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:  # threadpoolctl comes with scikit-learn; the fits work without it
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def single_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread: small solves gain nothing from its threads, which spin on a loaded machine
    (docs/speed.md)."""
    controller = _blas_controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1)


# ------------------------------------------------------------------------------------------------------ fits


def fit_bradley_terry(
    counts: PairwiseCounts,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    ties: TieHandling = "drop",
    on_disconnected: OnDisconnected = "error",
    initial_scores: np.ndarray | None = None,
) -> BTResult:
    """Fit Bradley-Terry strengths to win counts (EMER-Ranker, section 2, eq. 2-4; Hunter 2004).

    ``P(i beats j) = theta_i / (theta_i + theta_j)``, negative log-likelihood ``-sum wins[i, j] log P(i beats j)``
    (eq. 4 on the binarized W). The prior ``N(0, prior_variance)`` on ``log theta`` keeps undefeated items finite;
    ``None`` is the papers' MLE (needs a strongly connected graph). Damped Newton
    (`emoreward.ranking.batched.damped_newton`); equals ``choix.opt_pairwise(..., alpha=1 / (2 * prior_variance))``
    up to centring.

    Args:
        counts (`PairwiseCounts`): M items, ``wins`` of shape `(M, M)` (counts or W in {0, 0.5, 1}).
        prior_variance (`float` or `None`): variance of the prior on log-strengths (natural-log units).
        ties (`Literal["drop", "half"]`): ignore ties, or count each as half a win for both sides.
        on_disconnected (`Literal["error", "warn"]`): what to do if the comparison graph used is disconnected.
        initial_scores (`np.ndarray` of shape `(M,)`, *optional*): starting log-strengths (warm start).

    Returns:
        `BTResult` with ``model="bradley-terry"``.

    Raises:
        ValueError: on a disconnected comparison graph (``on_disconnected="error"``), a non-positive
            ``prior_variance``, an unknown ``ties`` choice, or ``initial_scores`` of the wrong shape.
    """
    if ties not in TIE_HANDLING:
        raise ValueError(f"ties must be one of {TIE_HANDLING}, got {ties!r}")
    prior_precision(prior_variance)
    wins = counts.wins + 0.5 * counts.ties if ties == "half" else counts.wins
    used = PairwiseCounts(counts.items, wins, np.zeros_like(counts.ties))
    check_connected(used, on_disconnected)
    spec = BatchSpec(get_model("bradley-terry"), prior_variance)
    fit = _fit_one(used, spec, initial_scores, None, "fit_bradley_terry")
    n = float(used.wins.sum())
    return BTResult(
        list(counts.items), fit.scores[0], "bradley-terry", float(fit.log_likelihood[0]), n, None, prior_variance
    )


def fit_binarized_bradley_terry(counts: PairwiseCounts, equal: EqualCounts = "half", **kwargs: Any) -> BTResult:
    """EMER-Ranker end to end: binarize the counts into W (section 2, eq. 1), then Bradley-Terry on W (eq. 2-4).

    ``equal``: pairs with equal win counts (:meth:`PairwiseCounts.binarized`); ``**kwargs`` go to
    :func:`fit_bradley_terry`. ``n_comparisons`` of the result counts the compared pairs kept in W; errors as those.
    """
    return fit_bradley_terry(counts.binarized(equal), **kwargs)


def fit_bradley_terry_ties(
    counts: PairwiseCounts,
    tie_model: TieModel = DEFAULT_TIE_MODEL,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    on_disconnected: OnDisconnected = "error",
    initial_scores: np.ndarray | None = None,
    initial_tie_parameter: float | None = None,
) -> BTResult:
    """Fit strengths and a tie parameter jointly to win/loss/tie counts.

    Each tie model's probabilities, source and parameter transform are its `emoreward.ranking.tie_models` object
    (EmoPrefer appendix F eq. 2-3, Rao & Kupper 1967, Davidson 1970); log-strengths and the transformed tie
    parameter are fitted together by damped Newton (`emoreward.ranking.batched.damped_newton`), the prior
    ``N(0, prior_variance)`` on the log-strengths only, the tie parameter within the model's ``bounds``.

    Args:
        counts (`PairwiseCounts`): M items; ``wins`` (win_ij, and lose_ij = wins[j, i]) and ``ties`` (tie_ij).
        tie_model (`str` or `PairModel`): the tie model object (`emoreward.ranking.fit.FitSpec.model`) or its name
            in `TIE_MODELS` (``"davidson"``, the default ``DEFAULT_TIE_MODEL``, ``"rao-kupper"``, ``"emoprefer"``).
        prior_variance (`float` or `None`): variance of the prior on log-strengths; ``None`` for plain MLE.
        on_disconnected (`Literal["error", "warn"]`): what to do if the comparison graph is disconnected.
        initial_scores (`np.ndarray` of shape `(M,)`, *optional*): starting log-strengths (warm start).
        initial_tie_parameter (`float`, *optional*): starting ``beta`` or ``nu`` (as ``BTResult.tie_parameter``);
            default: where ``P(tie)`` between equal items matches the observed tie rate.

    Returns:
        `BTResult` with ``model`` the tie model's name and the fitted ``tie_parameter``.

    Raises:
        ValueError: if ``tie_model`` is unknown (the message lists the choices), on a disconnected comparison
            graph with ``on_disconnected="error"``, or a non-positive ``prior_variance``.
    """
    model = as_tie_model(tie_model)
    prior_precision(prior_variance)
    check_connected(counts, on_disconnected)
    spec = BatchSpec(model, prior_variance)
    fit = _fit_one(counts, spec, initial_scores, initial_tie_parameter, f"fit_bradley_terry_ties({model.name})")
    n = float(counts.wins.sum() + np.triu(counts.ties, 1).sum())
    tie = float(fit.tie_parameter[0])
    return BTResult(
        list(counts.items), fit.scores[0], model.name, float(fit.log_likelihood[0]), n, tie, prior_variance
    )


def as_tie_model(tie_model: TieModel) -> PairModel:
    """The tie model object of ``tie_model`` (the object itself, or its name in `TIE_MODELS`).

    Raises:
        ValueError: for a name that is not a tie model (the message lists the choices).
    """
    if isinstance(tie_model, PairModel) and tie_model.has_tie:
        return tie_model
    if not isinstance(tie_model, str) or tie_model not in TIE_MODELS:
        raise ValueError(f"unknown tie_model {tie_model!r}; choose one of {tuple(TIE_MODELS)}")
    return TIE_MODELS[tie_model]


def _fit_one(counts: PairwiseCounts, spec: BatchSpec, initial_scores, initial_tie_parameter, what: str):
    """`fit_batch` on one table; warns unless the solver reached a stationary point."""
    x0 = _initial(initial_scores, counts.n_items)
    with single_blas_thread():
        fit = fit_batch(counts.wins[None], counts.ties[None], spec, x0, initial_tie_parameter, max_iter=200)
    if not fit.solved[0]:
        warnings.warn(f"{what}: the Newton fit did not converge", RuntimeWarning, stacklevel=3)
    return fit


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
            get_model("bradley-terry"),
            kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE),
            kwargs.get("ties", "drop"),
        )
    if fit_fn is fit_binarized_bradley_terry:
        if not set(kwargs) <= known | {"equal"}:
            return None
        prior = kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE)
        return BatchSpec(get_model("bradley-terry"), prior, binarize=True, equal=kwargs.get("equal", "half"))
    if fit_fn is fit_bradley_terry_ties:
        if not set(kwargs) <= known | {"tie_model"}:
            return None
        try:
            model = as_tie_model(kwargs.get("tie_model", DEFAULT_TIE_MODEL))
        except ValueError:
            return None
        return BatchSpec(model, kwargs.get("prior_variance", DEFAULT_PRIOR_VARIANCE))
    return None


def _initial(initial_scores: np.ndarray | None, m: int) -> np.ndarray:
    if initial_scores is None:
        return np.zeros(m)
    x0 = np.asarray(initial_scores, dtype=float)
    if x0.shape != (m,):
        raise ValueError(f"initial_scores must have shape ({m},), got {x0.shape}")
    return x0.copy()


def finite_float(x: float | None) -> float | None:
    """``x`` as a float for JSON, ``None`` when it is missing or not finite."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def number_cell(x: float | None, spec: str) -> str:
    """A number for a Markdown table cell, from the same value the JSON holds: ``format(x, spec)``, or ``-`` where
    :func:`finite_float` gives ``None`` (missing, NaN, infinite). Every report table formats numbers through it, so a
    table never shows ``nan`` for a value the JSON has as null."""
    value = finite_float(x)
    return "-" if value is None else format(value, spec)


def finite_floats(xs: np.ndarray) -> list[float | None]:
    """:func:`finite_float` of every element (a JSON list)."""
    return [finite_float(v) for v in np.asarray(xs, dtype=float).tolist()]
