"""Pairwise reward-model likelihoods, with and without ties: functions of `d = r(chosen) - r(rejected)` (shape
`(batch,)`) returning per-pair negative log-likelihoods (shape `(batch,)`). See docs/training.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def bradley_terry_nll(d: torch.Tensor) -> torch.Tensor:
    """-log P(chosen > rejected) = -log sigmoid(d) (Bradley & Terry 1952)."""
    return F.softplus(-d)


def rao_kupper_nll(d: torch.Tensor, tie: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Rao-Kupper model with log-threshold `epsilon` > 0 (Rao & Kupper 1967; theta = exp(epsilon)).

    P(chosen > rejected) = sigmoid(d - eps); P(tie) = 1 - sigmoid(d - eps) - sigmoid(-d - eps), computed as
    log P(tie) = log(expm1(2 eps)) - softplus(eps - d) - softplus(eps + d).

    Args:
        d: reward differences, shape `(batch,)`.
        tie: 1.0 for tie pairs, 0.0 otherwise, shape `(batch,)`.
        epsilon: tie threshold in reward units (> 0).
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    win = F.softplus(epsilon - d)
    tie_nll = -math.log(math.expm1(2 * epsilon)) + F.softplus(epsilon - d) + F.softplus(epsilon + d)
    return torch.where(tie > 0.5, tie_nll, win)


def davidson_nll(d: torch.Tensor, tie: torch.Tensor, nu: float) -> torch.Tensor:
    """Davidson model with tie parameter `nu` > 0 (Davidson 1970).

    P(chosen > rejected) = e^{d/2} / (e^{d/2} + e^{-d/2} + nu); P(tie) = nu / (e^{d/2} + e^{-d/2} + nu).
    """
    if nu <= 0:
        raise ValueError(f"nu must be > 0, got {nu}")
    log_nu = torch.full_like(d, math.log(nu))
    log_z = torch.logsumexp(torch.stack([d / 2, -d / 2, log_nu]), dim=0)
    return torch.where(tie > 0.5, log_z - log_nu, log_z - d / 2)


def pairwise_nll(d: torch.Tensor, tie: torch.Tensor | None, mode: str, parameter: float) -> torch.Tensor:
    """Dispatch on the `ties` config value (`"drop"` -> Bradley-Terry, `"rao-kupper"`, `"davidson"`).

    Raises:
        ValueError: unknown mode (the message lists the available ones).
    """
    if mode == "drop":
        return bradley_terry_nll(d)
    tie = tie if tie is not None else torch.zeros_like(d)
    if mode == "rao-kupper":
        return rao_kupper_nll(d, tie, parameter)
    if mode == "davidson":
        return davidson_nll(d, tie, parameter)
    raise ValueError(f"unknown tie mode {mode!r}; available: ['drop', 'rao-kupper', 'davidson']")


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of two `(n,)` tensors (differentiable; 0 if either is constant)."""
    x, y = x - x.mean(), y - y.mean()
    return (x * y).sum() / (x.norm() * y.norm() + 1e-8)


@dataclass
class RewardLoss:
    """Output of `reward_model_loss`: the scalar `loss`, and for the disentangled reward the correlations of
    the quality head and of the length head with length (`corr_quality_length`, `corr_lengthhead_length`)."""

    loss: torch.Tensor
    corr_quality_length: torch.Tensor | None = None
    corr_lengthhead_length: torch.Tensor | None = None


def reward_model_loss(
    logits: torch.Tensor,
    *,
    tie: torch.Tensor | None,
    ties: str,
    tie_parameter: float,
    weights: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    head_weight: torch.Tensor | None = None,
    odin_length_weight: float = 1.0,
    odin_orthogonal_weight: float = 1.0,
    margin: torch.Tensor | None = None,
) -> RewardLoss:
    """The reward-model loss of `EmoRewardTrainer` (and of value-head probes), for every `length_debias` option.

    Args:
        logits: `(2 * batch, num_heads)` value-head outputs, the chosen rows first, then the rejected ones.
            With two heads (`length_debias: disentangled`, ODIN) head 0 is the quality reward and head 1 the
            length reward; the pairwise likelihood sees their sum.
        tie: `(batch,)` 1.0 for tie pairs; `ties`, `tie_parameter`: see `pairwise_nll`.
        weights: `(batch,)` per-pair weights (`length_debias: reweight`), or None for the plain mean.
        lengths: `(2 * batch,)` description lengths, needed with two heads.
        head_weight: `(2, hidden)` value-head weights, needed with two heads (orthogonality term).
        margin: `(batch,)` TRL's per-pair margin (the data's `margin` column, 0 where absent): the pairwise
            likelihood of a decided pair reads `chosen - rejected - margin`, TRL's
            `-logsigmoid(r_chosen - r_rejected - margin)` (`trl.RewardTrainer.compute_loss`; Touvron et al. 2023,
            Llama 2, eq. 2); tie pairs ignore it.
        odin_length_weight, odin_orthogonal_weight: ODIN's weights (Chen et al. 2024, "ODIN: Disentangled Reward
            Mitigates Hacking in RLHF", eq. 3): |corr(quality, length)| - corr(length head, length), and
            |cos(w_quality, w_length)|.

    Returns:
        `RewardLoss`.

    Raises:
        ValueError: two heads without `lengths` or `head_weight`.
    """
    disentangled = logits.shape[-1] == 2
    total = logits[:, 0] + logits[:, 1] if disentangled else logits[:, 0]
    chosen, rejected = torch.chunk(total, chunks=2)
    d = chosen - rejected
    if margin is not None:
        d = d - (margin.to(d.dtype) if tie is None else margin.to(d.dtype) * (1 - tie.to(d.dtype)))
    nll = pairwise_nll(d, tie, ties, tie_parameter)
    loss = (nll * weights).sum() / weights.sum() if weights is not None else nll.mean()
    if not disentangled:
        return RewardLoss(loss)
    if lengths is None or head_weight is None:
        raise ValueError("the disentangled (two-head) reward needs `lengths` and `head_weight`")
    lengths = lengths.to(logits.dtype)
    corr_q, corr_l = pearson(logits[:, 0], lengths), pearson(logits[:, 1], lengths)
    cos = F.cosine_similarity(head_weight[0], head_weight[1], dim=0)
    loss = loss + odin_length_weight * (corr_q.abs() - corr_l) + odin_orthogonal_weight * cos.abs()
    return RewardLoss(loss, corr_q, corr_l)
