"""Global MAP refit of BPA (E3mo-Bench, "Periodic Bayesian Optimization", "Uncertainty Estimation", supp. D.4):
Rao-Kupper likelihood with tie margin, Crowd-BT reliabilities, fixed anchors, adaptive prior (`BPAObjective`,
`fit_bpa`) and the empirical-Fisher uncertainty (`smooth_uncertainty`). See docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from emoreward.ranking.bpa.config import BPAConfig
from emoreward.ranking.counts import encode_records as encode_item_records
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.tie_models.rao_kupper import RaoKupper


def rao_kupper_probabilities(score_diff: np.ndarray, delta: float, slope: float = 1.0) -> np.ndarray:
    """Rao-Kupper outcome probabilities `(n, 3)`: ``P(i > j)``, ``P(j > i)``, ``P(tie)`` of ``score_diff`` `(n,)`
    (score units) with tie margin ``delta > 0`` (logit units; ValueError otherwise). Rao & Kupper (1967), eq. 2.1-2.2
    with ``theta = exp(delta)``, through `emoreward.ranking.tie_models.rao_kupper`."""
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    return np.exp(np.stack(RaoKupper.log_probabilities(slope * np.asarray(score_diff, dtype=float), delta), axis=-1))


@dataclass
class EncodedRecords:
    """Pairwise records as index arrays; item indices ``0 .. n_candidates - 1`` are candidates, then anchors.

    Attributes:
        candidates (`list[str]`): candidate names, in parameter order.
        anchors (`list[str]`): anchor names.
        anchor_scores (`np.ndarray` of shape `(n_anchors,)`): fixed anchor scores.
        annotators (`list[str]`): annotator names, in parameter order.
        idx_a, idx_b (`np.ndarray` of shape `(M,)`, int): item indices.
        outcome (`np.ndarray` of shape `(M,)`, int): 0 = item_a preferred, 1 = item_b, 2 = tie.
        annotator (`np.ndarray` of shape `(M,)`, int): annotator indices.
    """

    candidates: list[str]
    anchors: list[str]
    anchor_scores: np.ndarray
    annotators: list[str]
    idx_a: np.ndarray
    idx_b: np.ndarray
    outcome: np.ndarray
    annotator: np.ndarray

    @property
    def n_candidates(self) -> int:
        return len(self.candidates)

    def comparison_counts(self) -> np.ndarray:
        """`np.ndarray` of shape `(n_candidates,)`: ``N_i``, the number of records involving each candidate."""
        n = self.n_candidates + len(self.anchors)
        counts = np.bincount(self.idx_a, minlength=n) + np.bincount(self.idx_b, minlength=n)
        return counts[: self.n_candidates].astype(float)


def check_items(candidates: Sequence[str], anchors: Mapping[str, float], config: BPAConfig | None = None) -> None:
    """Raise ``ValueError`` if candidates repeat, an item is both candidate and anchor, or (given ``config``) an anchor
    score lies outside [score_min, score_max]."""
    if len(set(candidates)) != len(candidates):
        raise ValueError("candidates contain duplicates")
    both = set(candidates) & set(anchors)
    if both:
        raise ValueError(f"items are both candidates and anchors: {sorted(both)[:5]}")
    for name, value in anchors.items() if config is not None else ():
        if not config.score_min <= value <= config.score_max:
            raise ValueError(f"anchor {name!r} score {value} outside [{config.score_min}, {config.score_max}]")


def encode_records(
    records: Sequence[PairwiseRecord],
    candidates: Sequence[str],
    anchors: Mapping[str, float],
    annotators: Sequence[str] | None = None,
) -> EncodedRecords:
    """Index ``records`` against the ``candidates`` (scores estimated) and ``anchors`` (name -> fixed score) as
    `EncodedRecords`; ``annotators`` gives the annotator order (default: order of first appearance).

    Raises:
        ValueError: if an item is both candidate and anchor, if a record names an unknown item or annotator,
            or if candidates repeat.
    """
    candidates = list(candidates)
    check_items(candidates, anchors)
    anchor_names = list(anchors)
    items = encode_item_records(records, candidates + anchor_names)  # the one encoder of item names and outcomes
    if annotators is None:
        annotators = list(dict.fromkeys(r.annotator for r in records))
    annotators = list(annotators)
    ann_index = {name: k for k, name in enumerate(annotators)}
    unknown = next((k for k, r in enumerate(records) if r.annotator not in ann_index), None)
    if unknown is not None:
        raise ValueError(f"record {unknown} names unknown annotator {records[unknown].annotator!r}")
    annotator = np.fromiter((ann_index[r.annotator] for r in records), dtype=np.int64, count=len(records))
    anchor_scores = np.array([anchors[a] for a in anchor_names], dtype=float)
    outcome = items.outcome.astype(np.int64)
    return EncodedRecords(candidates, anchor_names, anchor_scores, annotators, items.a, items.b, outcome, annotator)


class BPAObjective:
    """Negative log posterior of BPA and its analytic gradient: the model `fit_bpa` maximises.

    ``theta`` `(n_candidates + n_annotators + 1,)` holds the candidate scores ``mu`` (score units, box [score_min,
    score_max]; anchors enter with fixed scores), reliability logits ``xi`` (``eta = sigmoid(xi)``, box) and the tie
    margin ``delta`` (box). With ``Delta_m = s (mu_a - mu_b)`` and ``Lambda`` the logistic function:

    - Rao-Kupper (Rao & Kupper 1967) in logistic form: ``P(a) = Lambda(Delta - delta)``, ``P(b) = Lambda(-Delta -
      delta)``, ``P(tie) = (exp(2 delta) - 1) P(a) P(b)``;
    - Crowd-BT mixture (Chen et al. 2013), the paper's "random guess" read as uniform over the three answers:
      ``q_m = eta_k P_RK(y_m) + (1 - eta_k) / 3``;
    - ``L = -sum_m log q_m + sum_i 0.5 lambda_i (mu_i - mu_i^(0))^2 + sum_k 0.5 c (xi_k - logit(eta_init))^2`` with
      the adaptive prior ``lambda_i = lambda_0 (1 + N_i)^(-gamma)`` (``N_i``: comparisons of ``i``) and a weak
      reliability prior ``c`` that keeps a rarely seen annotator's ``xi_k`` finite.

    Args: ``data`` (`EncodedRecords`), ``init_scores`` (`np.ndarray` `(n_candidates,)`, the prior locations
    ``mu^(0)``; ValueError on another shape), ``config`` (`BPAConfig`).

    Source: E3mo-Bench, "Periodic Bayesian Optimization" (L_total = L_data + L_prior) and supp. D.4; the paper's
    equations were lost in extraction, so this is our reading of the cited sources.
    """

    def __init__(self, data: EncodedRecords, init_scores: np.ndarray, config: BPAConfig) -> None:
        init_scores = np.asarray(init_scores, dtype=float)
        if init_scores.shape != (data.n_candidates,):
            raise ValueError(f"init_scores must have shape ({data.n_candidates},), got {init_scores.shape}")
        self.data = data
        self.config = config
        self.init_scores = init_scores
        self.n_candidates = data.n_candidates
        self.n_annotators = len(data.annotators)
        self.prior_precision = prior_precision(data.comparison_counts(), config)
        self.xi0 = math.log(config.eta_init / (1.0 - config.eta_init))

    # -- parameter packing -------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Length of ``theta``."""
        return self.n_candidates + self.n_annotators + 1

    def pack(self, scores: np.ndarray, xi: np.ndarray, delta: float) -> np.ndarray:
        """Concatenate ``(mu, xi, delta)`` into ``theta`` of shape ``(size,)``."""
        return np.concatenate([np.asarray(scores, float), np.asarray(xi, float), [float(delta)]])

    def unpack(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Split ``theta`` into ``mu`` `(n_candidates,)`, ``xi`` `(n_annotators,)` and ``delta``."""
        n, k = self.n_candidates, self.n_annotators
        return theta[:n], theta[n : n + k], float(theta[n + k])

    def bounds(self) -> list[tuple[float, float]]:
        """Box bounds for ``theta``: scores in [score_min, score_max], ``|xi| <= xi_bound``, delta in bounds."""
        c = self.config
        return (
            [(c.score_min, c.score_max)] * self.n_candidates
            + [(-c.xi_bound, c.xi_bound)] * self.n_annotators
            + [tuple(c.delta_bounds)]
        )

    # -- likelihood ----------------------------------------------------------------------------------------------
    def _record_terms(self, theta: np.ndarray):
        """Per-record log-likelihood and its partial derivatives w.r.t. Delta, delta and xi."""
        d, s = self.data, self.config.slope
        scores, xi, delta = self.unpack(theta)
        mu = np.concatenate([scores, d.anchor_scores])
        z = s * (mu[d.idx_a] - mu[d.idx_b])
        log_pa, log_pb, log_pt = RaoKupper.log_probabilities(z, delta)
        pa, pb = np.exp(log_pa), np.exp(log_pb)
        dlogc = 2.0 / (-math.expm1(-2.0 * delta))  # d/d delta of log(exp(2 delta) - 1)
        y = d.outcome
        log_p = np.where(y == 0, log_pa, np.where(y == 1, log_pb, log_pt))
        # d log P / d z and d log P / d delta for each outcome
        dz = np.where(y == 0, 1.0 - pa, np.where(y == 1, -(1.0 - pb), pb - pa))
        ddelta = np.where(y == 0, -(1.0 - pa), np.where(y == 1, -(1.0 - pb), dlogc - (1.0 - pa) - (1.0 - pb)))
        eta = expit(xi)[d.annotator]
        p = np.exp(log_p)
        q = eta * p + (1.0 - eta) / 3.0
        log_q = np.log(q)
        w = eta * p / q  # d log q / d log p
        dq_dxi = (p - 1.0 / 3.0) * eta * (1.0 - eta) / q
        return log_q, w * dz * s, w * ddelta, dq_dxi

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log posterior (nats) and its gradient `(size,)` at ``theta`` `(size,)`."""
        d, c = self.data, self.config
        n, k = self.n_candidates, self.n_annotators
        scores, xi, _ = self.unpack(theta)
        log_q, g_mu, g_delta, g_xi = self._record_terms(theta)
        n_items = n + len(d.anchors)
        grad_items = np.bincount(d.idx_a, weights=g_mu, minlength=n_items) - np.bincount(
            d.idx_b, weights=g_mu, minlength=n_items
        )
        resid = scores - self.init_scores
        xi_resid = xi - self.xi0
        value = (
            -log_q.sum()
            + 0.5 * float(self.prior_precision @ resid**2)
            + 0.5 * c.reliability_prior * float(xi_resid @ xi_resid)
        )
        grad = np.empty(self.size)
        grad[:n] = -grad_items[:n] + self.prior_precision * resid
        grad[n : n + k] = -np.bincount(d.annotator, weights=g_xi, minlength=k) + c.reliability_prior * xi_resid
        grad[n + k] = -g_delta.sum()
        return float(value), grad

    def empirical_fisher_diag(self, theta: np.ndarray) -> np.ndarray:
        """`(n_candidates,)`: diagonal empirical Fisher of the candidate scores at ``theta`` `(size,)` plus the
        adaptive prior, ``sum_m (d log q_m / d mu_i)^2 + lambda_i`` (score^-2). Source: E3mo-Bench, "Uncertainty
        Estimation" (Kunstner et al. 2019; MacKay 1992)."""
        d = self.data
        n_items = self.n_candidates + len(d.anchors)
        _, g_mu, _, _ = self._record_terms(theta)
        sq = g_mu**2
        info = np.bincount(d.idx_a, weights=sq, minlength=n_items) + np.bincount(
            d.idx_b, weights=sq, minlength=n_items
        )
        return info[: self.n_candidates] + self.prior_precision


def prior_precision(counts: np.ndarray, config: BPAConfig) -> np.ndarray:
    """Adaptive prior precision ``lambda_i = lambda_0 (1 + N_i)^(-gamma)`` (score^-2) of comparison counts ``N_i``."""
    return config.lambda0 * (1.0 + np.asarray(counts, float)) ** (-config.gamma)


def smooth_uncertainty(fisher: np.ndarray, previous: np.ndarray, config: BPAConfig) -> np.ndarray:
    """``clip((1 - rho) previous + rho fisher^(-1/2), sigma_min, sigma_init)`` `(n,)`: smoothed, clipped uncertainty
    from the empirical-Fisher diagonal (score^-2). Source: E3mo-Bench, "Uncertainty Estimation"."""
    raw = 1.0 / np.sqrt(np.maximum(fisher, 1e-12))
    mixed = (1.0 - config.rho) * np.asarray(previous, float) + config.rho * raw
    return np.clip(mixed, config.sigma_min, config.sigma_init)


@dataclass
class BPAFit:
    """Result of one global BPA MAP refit.

    Attributes:
        scores (`dict[str, float]`): MAP score of every candidate and (fixed) anchor, [1, 9] scale.
        sigma (`dict[str, float]`): smoothed, clipped uncertainty of every candidate (score units).
        reliabilities (`dict[str, float]`): Crowd-BT ``eta_k`` per annotator, in (0, 1).
        delta (`float`): Rao-Kupper tie margin.
        n_comparisons (`dict[str, int]`): ``N_i`` per candidate.
        neg_log_posterior (`float`): objective at the optimum (nats).
        converged (`bool`): the optimiser's success flag.
        message (`str`): the optimiser's message.
        anchors (`dict[str, float]`): the fixed anchor scores used.
        slope (`float`): logistic slope per score unit used by the likelihood.
    """

    scores: dict[str, float]
    sigma: dict[str, float]
    reliabilities: dict[str, float]
    delta: float
    n_comparisons: dict[str, int]
    neg_log_posterior: float
    converged: bool
    message: str
    anchors: dict[str, float] = field(default_factory=dict)
    slope: float = 1.0

    @property
    def mean_sigma(self) -> float:
        """Mean candidate uncertainty (score units); BPA stops when it falls below ``sigma_tau``."""
        return float(np.mean(list(self.sigma.values()))) if self.sigma else 0.0

    def predict(self, item_a: str, item_b: str) -> np.ndarray:
        """`(3,)`: Rao-Kupper ``P(a), P(b), P(tie)`` of a faithful annotator (eta = 1); KeyError for an unknown item."""
        diff = self.scores[item_a] - self.scores[item_b]
        return rao_kupper_probabilities(np.array([diff]), self.delta, self.slope)[0]


_MAX_ITER_OPTION = {"L-BFGS-B": "maxiter", "TNC": "maxfun"}  # scipy's name of the iteration limit, per method


def fit_bpa(
    records: Sequence[PairwiseRecord],
    candidates: Sequence[str],
    anchors: Mapping[str, float] | None = None,
    init_scores: Mapping[str, float] | None = None,
    config: BPAConfig | None = None,
    previous: BPAFit | None = None,
) -> BPAFit:
    """Global MAP refit of BPA over all collected records, with its uncertainty.

    MAP of `BPAObjective` (the model) jointly over scores, ``xi_k`` and ``delta`` by bounded
    ``scipy.optimize.minimize`` with the analytic gradient; uncertainty ``sigma_i`` from the diagonal empirical
    Fisher (Kunstner et al. 2019) by `smooth_uncertainty`. Source: E3mo-Bench, "Periodic Bayesian Optimization",
    "Uncertainty Estimation" and supp. D.4.

    Args:
        records (`Sequence[PairwiseRecord]`): every judgement collected so far (any annotators).
        candidates (`Sequence[str]`): items whose scores are estimated; anchors: golden anchors with fixed scores.
        init_scores (`Mapping[str, float]`, optional): prior locations ``mu_i^(0)``; default: mid-scale.
        config (`BPAConfig`, optional): hyperparameters.
        previous (`BPAFit`, optional): warm start, and the ``sigma_old`` of the smoothing (else ``sigma_init``).

    Raises:
        ValueError: if records name unknown items, candidates overlap anchors, an anchor score or initial score
            lies outside [score_min, score_max], or ``candidates`` is empty.
    """
    config = config or BPAConfig()
    anchors = dict(anchors or {})
    candidates = list(candidates)
    if not candidates:
        raise ValueError("fit_bpa needs at least one candidate")
    check_items(candidates, anchors, config)
    mid = 0.5 * (config.score_min + config.score_max)
    init = np.array([float((init_scores or {}).get(c, mid)) for c in candidates])
    bad = (init < config.score_min) | (init > config.score_max)
    if bad.any():
        raise ValueError(
            f"init_scores of {candidates[int(np.argmax(bad))]!r} outside [{config.score_min}, {config.score_max}]"
        )
    data = encode_records(records, candidates, anchors)
    objective = BPAObjective(data, init, config)

    start_scores = init.copy()
    xi = np.full(len(data.annotators), objective.xi0)
    delta = config.delta_init
    prev_sigma = np.full(len(candidates), config.sigma_init)
    if previous is not None:
        start_scores = np.array([previous.scores.get(c, init[i]) for i, c in enumerate(candidates)])
        rel = previous.reliabilities
        xi = np.array([math.log(rel[a] / (1 - rel[a])) if a in rel else objective.xi0 for a in data.annotators])
        xi = np.clip(xi, -config.xi_bound, config.xi_bound)
        delta = float(np.clip(previous.delta, *config.delta_bounds))
        prev_sigma = np.array([previous.sigma.get(c, config.sigma_init) for c in candidates])
    theta0 = objective.pack(np.clip(start_scores, config.score_min, config.score_max), xi, delta)
    options = {_MAX_ITER_OPTION[config.optimizer]: config.max_iter, "ftol": config.tol, "gtol": config.tol}
    res = minimize(objective, theta0, jac=True, method=config.optimizer, bounds=objective.bounds(), options=options)
    theta = res.x
    scores, xi_hat, delta_hat = objective.unpack(theta)
    sigma = smooth_uncertainty(objective.empirical_fisher_diag(theta), prev_sigma, config)
    counts = data.comparison_counts()
    all_scores = {c: float(scores[i]) for i, c in enumerate(candidates)}
    all_scores.update(anchors)
    return BPAFit(
        scores=all_scores,
        sigma={c: float(sigma[i]) for i, c in enumerate(candidates)},
        reliabilities={a: float(expit(xi_hat[k])) for k, a in enumerate(data.annotators)},
        delta=float(delta_hat),
        n_comparisons={c: int(counts[i]) for i, c in enumerate(candidates)},
        neg_log_posterior=float(res.fun),
        converged=bool(res.success),
        message=str(res.message),
        anchors=anchors,
        slope=config.slope,
    )
