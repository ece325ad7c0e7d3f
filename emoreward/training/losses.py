"""Pairwise reward-model likelihoods, with and without ties.

All functions take the reward difference `d = r(chosen) - r(rejected)` (`torch.Tensor` of shape `(batch,)`)
and return per-pair negative log-likelihoods of shape `(batch,)`. For a tie pair the order of the two
descriptions does not matter (the tie likelihoods are even in `d`).
"""

from __future__ import annotations

import math

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
