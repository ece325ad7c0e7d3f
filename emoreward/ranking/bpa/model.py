"""Global MAP refit of BPA: Rao-Kupper likelihood, Crowd-BT reliabilities, anchors and adaptive prior.

Source: E3mo-Bench, "Periodic Bayesian Optimization", "Uncertainty Estimation" and supp. D.4; the paper's
equations were lost in extraction, so `fit_bpa` writes out the model we chose from the cited sources (Rao & Kupper
1967, Chen et al. 2013, Kunstner et al. 2019). `rao_kupper_probabilities` gives the answer probabilities,
`BPAObjective` the negative log posterior and its gradient, `smooth_uncertainty` the Fisher uncertainty.
See docs/ranking.md ("Active ranking (BPA)").
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
    """Rao-Kupper outcome probabilities in logistic form, `(n, 3)`: ``P(i > j)``, ``P(j > i)``, ``P(tie)`` of
    ``score_diff`` `(n,)` (score units) with tie margin ``delta > 0`` (logit units); ValueError if ``delta <= 0``.

    Source: Rao & Kupper (1967), eq. 2.1-2.2 with ``theta = exp(delta)``; E3mo-Bench "Periodic Bayesian
    Optimization". The likelihood is the ranking's one Rao-Kupper (`emoreward.ranking.tie_models.rao_kupper`).
    """
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    return np.exp(np.stack(RaoKupper.log_probabilities(slope * np.asarray(score_diff, dtype=float), delta), axis=-1))


@dataclass
class EncodedRecords:
    """Pairwise records turned into index arrays over candidates, anchors and annotators.

    Item indices ``0 .. n_candidates - 1`` are candidates, ``n_candidates ..`` are anchors.

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
        """Number of candidates (free scores)."""
        return len(self.candidates)

    def comparison_counts(self) -> np.ndarray:
        """`np.ndarray` of shape `(n_candidates,)`: ``N_i``, the number of records involving each candidate."""
        n = self.n_candidates + len(self.anchors)
        counts = np.bincount(self.idx_a, minlength=n) + np.bincount(self.idx_b, minlength=n)
        return counts[: self.n_candidates].astype(float)


def encode_records(
    records: Sequence[PairwiseRecord],
    candidates: Sequence[str],
    anchors: Mapping[str, float],
    annotators: Sequence[str] | None = None,
) -> EncodedRecords:
    """Index ``records`` against the candidate and anchor sets.

    Args:
        records (`Sequence[PairwiseRecord]`): the judgements (``emoreward.ranking.records``).
        candidates (`Sequence[str]`): items whose scores are estimated.
        anchors (`Mapping[str, float]`): golden anchors and their fixed scores.
        annotators (`Sequence[str]`, optional): annotator order; by default, order of first appearance.

    Returns:
        `EncodedRecords`.

    Raises:
        ValueError: if an item is both candidate and anchor, if a record names an unknown item or annotator,
            or if candidates repeat.
    """
    candidates = list(candidates)
    if len(set(candidates)) != len(candidates):
        raise ValueError("candidates contain duplicates")
    both = set(candidates) & set(anchors)
    if both:
        raise ValueError(f"items are both candidates and anchors: {sorted(both)[:5]}")
    anchor_names = list(anchors)
    items = encode_item_records(records, candidates + anchor_names)  # the one encoder of item names and outcomes
    if annotators is None:
        annotators = list(dict.fromkeys(r.annotator for r in records))
    annotators = list(annotators)
    ann_index = {name: k for k, name in enumerate(annotators)}
    unknown = next((k for k, r in enumerate(records) if r.annotator not in ann_index), None)
    if unknown is not None:
        raise ValueError(f"record {unknown} names unknown annotator {records[unknown].annotator!r}")
    idx_a, idx_b, outcome = items.a, items.b, items.outcome.astype(np.int64)
    annotator = np.fromiter((ann_index[r.annotator] for r in records), dtype=np.int64, count=len(records))
    return EncodedRecords(
        candidates=candidates,
        anchors=anchor_names,
        anchor_scores=np.array([anchors[a] for a in anchor_names], dtype=float),
        annotators=annotators,
        idx_a=idx_a,
        idx_b=idx_b,
        outcome=outcome,
        annotator=annotator,
    )


class BPAObjective:
    """Negative log posterior of BPA and its analytic gradient.

    Parameter vector ``theta`` of shape ``(n_candidates + n_annotators + 1,)``: candidate scores ``mu``
    (score units), reliability logits ``xi`` (``eta = sigmoid(xi)``) and the tie margin ``delta``.

    ``L(theta) = -sum_m log[eta_k P_RK(y_m | Delta_m, delta) + (1 - eta_k) / 3]
    + sum_i 0.5 lambda_i (mu_i - mu_i^(0))^2 + sum_k 0.5 c (xi_k - xi_0)^2``.

    Args:
        data (`EncodedRecords`): the indexed records.
        init_scores (`np.ndarray` of shape `(n_candidates,)`): prior locations ``mu^(0)``.
        config (`BPAConfig`): model hyperparameters.

    Raises:
        ValueError: if ``init_scores`` has the wrong shape.

    Source: E3mo-Bench, "Periodic Bayesian Optimization" (L_total = L_data + L_prior); Crowd-BT (Chen et al.
    2013); supp. D.4.
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
        self.prior_precision = config.lambda0 * (1.0 + data.comparison_counts()) ** (-config.gamma)
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
    def _all_scores(self, scores: np.ndarray) -> np.ndarray:
        return np.concatenate([scores, self.data.anchor_scores])

    def _record_terms(self, theta: np.ndarray):
        """Per-record log-likelihood and its partial derivatives w.r.t. Delta, delta and xi."""
        d, s = self.data, self.config.slope
        scores, xi, delta = self.unpack(theta)
        mu = self._all_scores(scores)
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
        """Negative log posterior and its gradient.

        Args:
            theta (`np.ndarray` of shape `(size,)`): parameters.

        Returns:
            (`float`, `np.ndarray` of shape `(size,)`): value (nats) and gradient.
        """
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
        """Diagonal empirical Fisher of the candidate scores plus the adaptive prior precision.

        Args:
            theta (`np.ndarray` of shape `(size,)`): parameters (normally the MAP).

        Returns:
            `np.ndarray` of shape `(n_candidates,)`: ``sum_m (d log P_m / d mu_i)^2 + lambda_i`` (score^-2).

        Source: E3mo-Bench, "Uncertainty Estimation" (Kunstner et al. 2019; MacKay 1992).
        """
        d = self.data
        n_items = self.n_candidates + len(d.anchors)
        _, g_mu, _, _ = self._record_terms(theta)
        sq = g_mu**2
        info = np.bincount(d.idx_a, weights=sq, minlength=n_items) + np.bincount(
            d.idx_b, weights=sq, minlength=n_items
        )
        return info[: self.n_candidates] + self.prior_precision


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

    def candidate_scores(self) -> dict[str, float]:
        """Scores of candidates only (anchors left out)."""
        return {k: v for k, v in self.scores.items() if k not in self.anchors}

    def predict(self, item_a: str, item_b: str) -> np.ndarray:
        """`np.ndarray` of shape `(3,)`: Rao-Kupper ``P(a), P(b), P(tie)`` of a faithful annotator (eta = 1).

        Raises:
            KeyError: if an item is unknown.
        """
        return rao_kupper_probabilities(np.array([self.scores[item_a] - self.scores[item_b]]), self.delta, self.slope)[
            0
        ]


def fit_bpa(
    records: Sequence[PairwiseRecord],
    candidates: Sequence[str],
    anchors: Mapping[str, float] | None = None,
    init_scores: Mapping[str, float] | None = None,
    config: BPAConfig | None = None,
    previous: BPAFit | None = None,
) -> BPAFit:
    """Global MAP refit of BPA over all collected records.

    Source: E3mo-Bench, "Periodic Bayesian Optimization", "Uncertainty Estimation" and supp. D.4. The paper's
    equations were lost in extraction; we follow the cited sources and write out what we chose:

    - Rao-Kupper (Rao & Kupper 1967) in logistic form, with ``Delta_ij = s * (mu_i - mu_j)`` and tie margin
      ``delta > 0`` (``theta = exp(delta)`` in the original parametrisation)::

          P(i > j) = Lambda(Delta_ij - delta)
          P(j > i) = Lambda(-Delta_ij - delta)
          P(tie)   = 1 - P(i > j) - P(j > i) = (exp(2 delta) - 1) * P(i > j) * P(j > i)

    - Crowd-BT mixture (Chen et al. 2013), with the paper's "random guess" read as uniform over the three
      answers: ``P_k(y) = eta_k * P_RK(y) + (1 - eta_k) / 3``, ``eta_k = sigmoid(xi_k)`` (supp. D.4 optimises
      ``xi_k``), plus a weak Gaussian prior ``0.5 * c * (xi_k - logit(eta_init))^2`` so that an annotator seen
      only a few times keeps a finite ``xi_k``.
    - Adaptive quadratic prior toward the initial score: ``0.5 * lambda_i * (mu_i - mu_i^(0))^2`` with
      ``lambda_i = lambda_0 * (1 + N_i)^(-gamma)``, ``N_i`` the number of comparisons involving candidate ``i``.
    - Golden anchors enter ``Delta`` with fixed scores and are not optimisation variables.
    - MAP jointly over candidate scores (box [1, 9]), ``xi_k`` (box) and ``delta`` (box) by bounded
      ``scipy.optimize.minimize`` with the analytic gradient (`BPAObjective`).
    - Uncertainty: diagonal empirical Fisher (Kunstner et al. 2019) ``I_i = sum_m (d log P_m / d mu_i)^2 +
      lambda_i``, ``sigma_Fisher = I_i^(-1/2)``, smoothed ``sigma_new = (1 - rho) * sigma_old + rho *
      sigma_Fisher`` and clipped to ``[sigma_min, sigma_init]`` (`smooth_uncertainty`).

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
    for name, value in anchors.items():
        if not config.score_min <= value <= config.score_max:
            raise ValueError(f"anchor {name!r} score {value} outside [{config.score_min}, {config.score_max}]")
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
    if config.optimizer == "L-BFGS-B":
        options = {"maxiter": config.max_iter, "ftol": config.tol, "gtol": config.tol}
    elif config.optimizer == "TNC":
        options = {"maxfun": config.max_iter, "ftol": config.tol, "gtol": config.tol}
    else:  # unreachable: BPAConfig checks optimizer
        raise ValueError(f"unknown optimizer {config.optimizer!r}")
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
