"""Percentile bootstrap intervals of Bradley-Terry fits, resampling samples with replacement (`bootstrap_ci`,
`BootstrapCI`; Efron & Tibshirani 1993, ch. 13)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix

from emoreward.ranking.batched import fit_batch, strongly_connected_rows
from emoreward.ranking.bradley_terry import (
    SCORE_TOLERANCE,
    BTResult,
    FitFn,
    batch_spec,
    single_blas_thread,
)
from emoreward.ranking.counts import PairwiseCounts, encode_records
from emoreward.ranking.records import PairwiseRecord


@dataclass(frozen=True)
class BootstrapCI:
    """Bootstrap distribution of fitted scores and the percentile intervals drawn from it.

    Attributes:
        items (`list[str]`): the M items, column order of ``scores``.
        lower, upper (`np.ndarray` of shape `(M,)`): percentile interval per item over the resamples in which it was
            compared (NaN if never); always contains the estimate (``widened``: extended to it).
        scores (`np.ndarray` of shape `(n_boot, M)`): every resample's scores, NaN where the item was not compared.
        alpha (`float`): 1 - coverage; n_units (`int`): resampled units (samples, or records without samples).
        estimate (`BTResult`): the fit on all records, with this interval attached.
        n_compared (`np.ndarray` of shape `(M,)`, int): resamples in which the item was compared.
        unit_counts (`np.ndarray` of shape `(M,)`, int): units on which the item was compared in the full data.
        n_disconnected (`int`): resamples whose comparison graph was disconnected.
    """

    items: list[str]
    lower: np.ndarray
    upper: np.ndarray
    scores: np.ndarray
    alpha: float
    n_units: int
    estimate: BTResult
    n_compared: np.ndarray = None  # type: ignore[assignment]
    unit_counts: np.ndarray = None  # type: ignore[assignment]
    widened: np.ndarray = None  # type: ignore[assignment]
    n_disconnected: int = 0

    def __post_init__(self) -> None:
        m, n_boot = len(self.items), self.scores.shape[0]
        if self.n_compared is None:
            object.__setattr__(self, "n_compared", np.full(m, n_boot, dtype=np.int64))
        if self.unit_counts is None:
            object.__setattr__(self, "unit_counts", np.full(m, self.n_units, dtype=np.int64))
        if self.widened is None:
            object.__setattr__(self, "widened", np.zeros(m, dtype=bool))

    @property
    def n_boot(self) -> int:
        """Number of resamples."""
        return int(self.scores.shape[0])

    @property
    def at_edge(self) -> np.ndarray:
        """`np.ndarray` of shape `(M,)`, bool: the estimate is an end of a non-degenerate interval (the bootstrap
        distribution on one side of it, e.g. a model winning every pair of the binarized W)."""
        est = self.estimate.scores
        wide = self.upper - self.lower > SCORE_TOLERANCE
        return wide & ((np.abs(est - self.lower) <= SCORE_TOLERANCE) | (np.abs(est - self.upper) <= SCORE_TOLERANCE))

    def sparse_items(self, min_units: int = 10) -> list[str]:
        """Items with few comparisons: compared on fewer than ``min_units`` units, or absent from some resamples
        (their interval then rests on fewer than ``n_boot`` resamples)."""
        return [
            name
            for k, name in enumerate(self.items)
            if self.unit_counts[k] < min_units or self.n_compared[k] < self.n_boot
        ]


def bootstrap_ci(
    records: Iterable[PairwiseRecord],
    fit_fn: FitFn,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int | None = 0,
    items: Sequence[str] | None = None,
    warm_start: bool = True,
    progress: bool | None = False,
    desc: str = "bootstrap",
    batched: bool = True,
) -> BootstrapCI:
    """Percentile bootstrap intervals of fitted scores, resampling samples with replacement.

    The unit is the sample (``PairwiseRecord.sample``): judgements on one sample are correlated, so they are kept
    or repeated together; a record without a sample is its own unit. Efron & Tibshirani (1993), ch. 13.

    An item not compared in a resample has only the prior's score there, so each item's interval uses the
    resamples in which it was compared (``n_compared``); each resample is shifted so that the items it compared
    keep their full-data mean. Resample scores within ``SCORE_TOLERANCE`` of the estimate count as equal to it,
    and an interval that still excludes the estimate is extended to it (``widened``). With ``warm_start``,
    ``fit_fn`` gets ``initial_scores`` (and ``initial_tie_parameter``) from the estimate when its signature takes
    them; the optimum is the same as from zero (convex objectives, tight tolerance).

    Args:
        records (`Iterable[PairwiseRecord]`): all comparisons.
        fit_fn (`Callable[[PairwiseCounts], BTResult]`): the fit, e.g. ``functools.partial(fit_bradley_terry_ties,
            tie_model="davidson")``; pass ``on_disconnected="warn"`` for sparse designs (counted in
            ``n_disconnected``).
        n_boot (`int`): resamples (>= 1); alpha (`float`): 1 - coverage, in (0, 1).
        seed (`int` or `None`): seed of ``numpy.random.default_rng``; the same seed gives the same result.
        items (`Sequence[str]`, *optional*): fixed item order (default: sorted item names).
        warm_start (`bool`): start every refit from the full-data fit.
        progress (`bool` or `None`): a tqdm bar on stderr (``None``: only on a terminal); desc: its label.
        batched (`bool`): fit all resamples together (:func:`emoreward.ranking.batched.fit_batch`, the same optimum
            to about 1e-8) when ``fit_fn`` is one of this package's fits (`batch_spec`); the rest, or all with
            ``False``, are refitted one at a time with ``fit_fn`` (the reference path).

    Returns:
        `BootstrapCI`, its ``estimate`` the fit on all records with the interval attached.

    Raises:
        ValueError: if there are no records, ``n_boot < 1`` or ``alpha`` is outside (0, 1); errors of ``fit_fn``
            (e.g. a disconnected resample) propagate.
    """
    from tqdm.auto import tqdm

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    records = records if isinstance(records, list) else list(records)
    if not records:
        raise ValueError("bootstrap_ci needs at least one record")
    encoded = encode_records(records, items)
    full = PairwiseCounts.from_encoded(encoded)
    m = full.n_items
    units, n_units = sample_units([r.sample for r in records])
    cols = encoded.winner_loser_cells()
    is_tie = encoded.outcome == 2

    def per_unit(mask: np.ndarray) -> csr_matrix:
        ones = np.ones(int(mask.sum()))
        return csr_matrix((ones, (units[mask], cols[mask])), shape=(n_units, m * m))

    unit_wins_t, unit_ties_t = per_unit(~is_tie).T.tocsr(), per_unit(is_tie).T.tocsr()
    # units x items: 1 where the item was compared on the unit
    appears = csr_matrix(  # converting from (row, col) sums duplicates; then 1 per (unit, item)
        (np.ones(2 * len(records)), (np.concatenate([units, units]), np.concatenate([encoded.a, encoded.b]))),
        shape=(n_units, m),
    )
    appears.data[:] = 1.0
    unit_counts = np.asarray(appears.sum(axis=0)).ravel().astype(np.int64)
    appears_t = appears.T.tocsr()
    estimate = fit_fn(full)
    warm: dict[str, Any] = {}
    if warm_start and _accepts(fit_fn, "initial_scores"):
        warm["initial_scores"] = estimate.scores
        if estimate.tie_parameter is not None and _accepts(fit_fn, "initial_tie_parameter"):
            warm["initial_tie_parameter"] = estimate.tie_parameter
    weights = resample_unit_weights(n_units, n_boot, seed)
    weights_t = weights.T.astype(float)
    all_wins = np.asarray(unit_wins_t @ weights_t).T.reshape(n_boot, m, m)
    all_ties = np.asarray(unit_ties_t @ weights_t).T.reshape(n_boot, m, m)
    all_ties = all_ties + np.swapaxes(all_ties, 1, 2)
    present = np.asarray(appears_t @ weights_t).T > 0
    connected = strongly_connected_rows(all_wins + np.swapaxes(all_wins, 1, 2) + all_ties > 0, present)
    boot = np.empty((n_boot, m))
    refit = np.arange(n_boot)
    spec = batch_spec(fit_fn) if batched else None
    bar = tqdm(total=n_boot, desc=desc, disable=tqdm_disable(progress), leave=False, mininterval=0.5)
    if spec is not None:
        start = estimate.scores if warm_start else None
        tie = estimate.tie_parameter if warm_start else None
        fitted = fit_batch(all_wins, all_ties, spec, start, tie)
        boot[:] = fitted.scores
        refit = np.flatnonzero(~fitted.converged)
        bar.update(n_boot - len(refit))
    with single_blas_thread(), warnings.catch_warnings():  # BLAS limit once for the loop
        warnings.filterwarnings("ignore", message="comparison graph is disconnected")
        for b in refit:
            counts = PairwiseCounts(full.items, all_wins[b], all_ties[b])
            boot[b] = np.array(fit_fn(counts, **warm).scores, dtype=float)
            bar.update(1)
    bar.close()
    n_disconnected = int((~connected).sum())
    est = np.asarray(estimate.scores, dtype=float)
    boot = snap_to_estimate(recentre(boot, est, present), est)
    n_compared = np.sum(np.isfinite(boot), axis=0).astype(np.int64)
    lower, upper, widened = percentile_interval(boot, est, alpha)
    ci = BootstrapCI(
        list(full.items),
        lower,
        upper,
        boot,
        alpha,
        n_units,
        estimate,
        n_compared,
        unit_counts,
        widened,
        n_disconnected,
    )
    if list(ci.items) != list(estimate.items):
        raise ValueError(f"bootstrap items {ci.items} differ from result items {estimate.items}")
    return replace(ci, estimate=estimate.with_interval(ci.lower, ci.upper, 1.0 - ci.alpha))


def recentre(boot: np.ndarray, estimate: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Resample scores `(B, M)` shifted so that the items each resample compared (``present``, `(B, M)` bool) keep
    their mean in the ``estimate`` `(M,)` (a resample that compared every item is left as fitted); NaN where an item
    was not compared (its score there is the prior's)."""
    partial = ~present.all(axis=1)
    counts = np.maximum(present.sum(axis=1), 1)
    shift = (np.where(present, estimate, 0.0).sum(axis=1) - np.where(present, boot, 0.0).sum(axis=1)) / counts
    return np.where(present, boot + np.where(partial, shift, 0.0)[:, None], np.nan)


def snap_to_estimate(boot: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """``boot`` with values within ``SCORE_TOLERANCE`` of the estimate set to it (NaN stays NaN): a resample that
    reproduces the full-data comparisons lands exactly on the estimate, not 1e-9 beside it."""
    return np.where(np.abs(boot - estimate) <= SCORE_TOLERANCE, estimate, boot)


def percentile_interval(
    boot: np.ndarray, estimate: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile interval ``[alpha/2, 1 - alpha/2]`` per column of ``boot`` `(B, K)` over the finite resamples,
    extended to contain ``estimate`` `(K,)` (Efron & Tibshirani 1993, ch. 13).

    Returns:
        ``(lower (K,), upper (K,), widened (K,) bool)``: NaN where no resample (or the estimate) is finite;
        ``widened`` where the interval was extended to the estimate.
    """
    estimate = np.asarray(estimate, dtype=float)
    boot = snap_to_estimate(boot, estimate)
    k = boot.shape[1]
    lower, upper = np.full(k, np.nan), np.full(k, np.nan)
    seen = np.isfinite(boot).any(axis=0) & np.isfinite(estimate)
    if seen.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lower[seen], upper[seen] = np.nanpercentile(
                boot[:, seen], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0
            )
    widened = seen & ((estimate < lower - SCORE_TOLERANCE) | (estimate > upper + SCORE_TOLERANCE))
    return np.where(seen, np.fmin(lower, estimate), lower), np.where(seen, np.fmax(upper, estimate), upper), widened


def tqdm_disable(progress: bool | None) -> bool | None:
    """tqdm's ``disable`` for ``progress``: ``None`` lets tqdm hide the bar when its stream is not a terminal."""
    return None if progress is None else not progress


def resample_unit_weights(n_units: int, n_boot: int, seed: int | None) -> np.ndarray:
    """How often each unit is drawn in each resample (``n_units`` draws with replacement): `(n_boot, n_units)` int.
    Every bootstrap of the ranking draws here, so one seed gives the same resamples in all of them."""
    rng = np.random.default_rng(seed)
    # every resample at once: the same draws, in the same order, as one resample at a time
    picks = rng.integers(0, n_units, (n_boot, n_units))
    offsets = (np.arange(n_boot) * n_units)[:, None]
    return np.bincount((picks + offsets).ravel(), minlength=n_boot * n_units).reshape(n_boot, n_units)


def sample_units(samples: list[Any]) -> tuple[np.ndarray, int]:
    """Bootstrap unit of every record, numbered in order of first appearance: its sample, or itself if none."""
    if None not in samples:
        first = dict.fromkeys(samples)  # insertion-ordered unique samples
        index = {sample: k for k, sample in enumerate(first)}
        return np.fromiter(map(index.__getitem__, samples), dtype=np.int64, count=len(samples)), len(index)
    unit_ids: dict[Any, int] = {}
    keys = [("sample", s) if s is not None else ("record", k) for k, s in enumerate(samples)]
    units = np.fromiter((unit_ids.setdefault(key, len(unit_ids)) for key in keys), dtype=np.int64, count=len(keys))
    return units, len(unit_ids)


def _accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (explicitly or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if name in params:
        return params[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
