"""Reward effects of a ranking: the additive model of the raw rewards with no tie threshold (`RewardEffects`,
`fit_reward_effects`), and the tie probability a fitted tie parameter implies (`tie_probability_between_equals`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from emoreward.ranking.bootstrap import (
    percentile_interval,
    recentre,
    resample_unit_weights,
    snap_to_estimate,
    tqdm_disable,
)
from emoreward.ranking.bradley_terry import finite_floats
from emoreward.ranking.edges import intervals_defined
from emoreward.ranking.scoring import ScoreMatrix
from emoreward.ranking.tie_models import TIE_MODELS


def tie_probability_between_equals(model: str, tie_parameter: float) -> float:
    """P(tie) between two models of equal strength implied by a fitted tie parameter, as the tie model says
    (`PairModel.tie_probability_between_equals`). Raises ValueError for an unknown tie model."""
    if model not in TIE_MODELS:
        raise ValueError(f"unknown tie model {model!r}; choose one of {tuple(TIE_MODELS)}")
    return TIE_MODELS[model].tie_probability_between_equals(tie_parameter)


@dataclass
class RewardEffects:
    """Model effects of an additive model of the raw rewards, with no tie threshold (reward-model judges).

    ``r[m, s] = a_m + b_s + noise`` by least squares, a free effect ``b_s`` per sample, ``sum_m a_m = 0``:
    ``a_m - a_k`` is the mean reward difference of models m and k on the same samples.

    Attributes:
        items (`list[str]`): the M models.
        scores (`np.ndarray` of shape `(M,)`): effects ``a_m`` in reward units (value-head logits), mean 0.
        lower, upper (`np.ndarray` of shape `(M,)`): percentile bootstrap interval over samples, as
            :func:`emoreward.ranking.bootstrap.bootstrap_ci`'s; NaN with one sample.
        n_compared (`np.ndarray` of shape `(M,)`, int): resamples in which the model was compared.
        alpha (`float`): 1 - coverage.
    """

    items: list[str]
    scores: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    n_compared: np.ndarray
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            "items": list(self.items),
            "scores": finite_floats(self.scores),
            "ci_lower": finite_floats(self.lower),
            "ci_upper": finite_floats(self.upper),
            "n_compared": self.n_compared.tolist(),
            "ci_level": 1.0 - self.alpha,
            "units": "reward (value-head logits)",
        }


def _additive_effects(rewards: np.ndarray, observed: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Least-squares model effects of ``r[m, s] = a_m + b_s`` with sample weights; NaN for models not compared.

    Eliminating ``b_s`` leaves ``L a = c`` with ``L = diag(sum_s w_s O_ms) - O diag(w / n) O^T`` and
    ``c_m = sum_s w_s O_ms (r_ms - mean_k r_ks)``, an M x M system (``O`` the observed mask, ``n_s`` models per
    sample; samples with one model carry no difference and drop out).
    """
    o = observed.astype(float)
    n_s = o.sum(axis=0)
    w = np.where(n_s >= 2, weight, 0.0)
    safe_n = np.maximum(n_s, 1.0)
    centred = np.where(observed, rewards - (np.where(observed, rewards, 0.0).sum(axis=0) / safe_n), 0.0)
    lap = np.diag((o * w).sum(axis=1)) - (o * (w / safe_n)) @ o.T
    c = (centred * w).sum(axis=1)
    present = np.diag(lap) > 0
    out = np.full(observed.shape[0], np.nan)
    if present.any():
        sol = np.linalg.lstsq(lap[np.ix_(present, present)], c[present], rcond=None)[0]
        out[present] = sol - sol.mean()
    return out


def additive_effects_batch(rewards: np.ndarray, observed: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`_additive_effects` for weights `(B, N)` at once (the minimum-norm least-squares solutions by the
    pseudo-inverse): effects `(B, M)`, mean 0 over each row's compared models, NaN for the others."""
    o = observed.astype(float)
    n_s = o.sum(axis=0)
    w = np.where(n_s >= 2, np.asarray(weights, dtype=float), 0.0)
    safe_n = np.maximum(n_s, 1.0)
    centred = np.where(observed, rewards - (np.where(observed, rewards, 0.0).sum(axis=0) / safe_n), 0.0)
    m = o.shape[0]
    outer = (o.T[:, :, None] * o.T[:, None, :]).reshape(o.shape[1], m * m)  # O_ms O_ks per sample
    lap = -((w / safe_n) @ outer).reshape(-1, m, m)
    lap[:, np.arange(m), np.arange(m)] += w @ o.T
    c = w @ centred.T
    present = np.diagonal(lap, axis1=1, axis2=2) > 0
    sol = (np.linalg.pinv(lap, rtol=m * np.finfo(float).eps, hermitian=True) @ c[:, :, None])[:, :, 0]
    count = np.maximum(present.sum(axis=1, keepdims=True), 1)
    sol = sol - np.where(present, sol, 0.0).sum(axis=1, keepdims=True) / count
    return np.where(present, sol, np.nan)


def fit_reward_effects(
    scores: ScoreMatrix,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    progress: bool | None = False,
    batched: bool = True,
) -> RewardEffects:
    """Fit `RewardEffects` to a reward matrix, with a percentile bootstrap over samples.

    Args:
        scores (`ScoreMatrix`): rewards of shape `(M, N)`, NaN where a model has no description.
        n_boot (`int`): resamples (>= 1); alpha (`float`): 1 - coverage; seed (`int`): resampling seed.
        progress (`bool` or `None`): tqdm bar (``None``: only when stderr is a terminal).
        batched (`bool`): solve every resample's system together (:func:`additive_effects_batch`); ``False``
            solves one resample at a time (the reference path; the same effects to about 1e-12).

    Returns:
        `RewardEffects`.

    Raises:
        ValueError: if ``n_boot < 1`` or ``alpha`` is outside (0, 1).
    """
    from tqdm.auto import tqdm

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rewards = np.asarray(scores.scores, dtype=float)
    observed = np.isfinite(rewards)
    n = rewards.shape[1]
    estimate = _additive_effects(rewards, observed, np.ones(n))
    weights = resample_unit_weights(n, n_boot, seed).astype(float)
    if batched:
        boot = additive_effects_batch(rewards, observed, weights)
    else:
        boot = np.empty((n_boot, rewards.shape[0]))
        for b in tqdm(range(n_boot), desc="bootstrap reward effects", disable=tqdm_disable(progress), leave=False):
            boot[b] = _additive_effects(rewards, observed, weights[b])
    boot = snap_to_estimate(recentre(boot, estimate, np.isfinite(boot) & np.isfinite(estimate)), estimate)
    n_compared = np.isfinite(boot).sum(axis=0).astype(np.int64)
    lower, upper = np.full(len(estimate), np.nan), np.full(len(estimate), np.nan)
    if intervals_defined(n):  # one sample: every resample is the data, no interval
        lower, upper = percentile_interval(boot, estimate, alpha)[:2]
    return RewardEffects(list(scores.models), estimate, lower, upper, n_compared, alpha)
