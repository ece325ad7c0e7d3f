"""Training objectives of reward models (`length_debias:` in a recipe): one registry the trainer, the value-head
probes and scoring use. `none` and `reweight`: pairwise NLL; `penalty`: head - alpha * standardised length (a
`score_transform`); `disentangled`: ODIN (Chen et al. 2024, section 3, eq. 3), scored by its quality head.
See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from emoreward.training.losses import RewardLoss, reward_model_loss


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.models.base import RewardModel


ObjectiveName = Literal["none", "reweight", "penalty", "disentangled"]


@dataclass(frozen=True)
class Objective:
    """One training objective (see the module docstring).

    Attributes:
        name: the `length_debias` value.
        num_heads: value-head outputs the network needs.
        weighted: the loss weighs pairs (`length_balance_weights`).
        disentangled: two heads with ODIN's extra terms (the loss needs lengths and the head weight).
        after_fit: `(model, pairs, batch_size) -> score_transform or None`, run once the network is trained.
    """

    name: str
    num_heads: int = 1
    weighted: bool = False
    disentangled: bool = False
    after_fit: Callable[[RewardModel, Sequence[PreferencePair], int | None], dict | None] | None = None

    def loss(
        self,
        logits: torch.Tensor,
        *,
        tie: torch.Tensor | None,
        ties: str,
        tie_parameter: float,
        weight: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        head_weight: torch.Tensor | None = None,
        odin_length_weight: float = 1.0,
        odin_orthogonal_weight: float = 1.0,
        margin: torch.Tensor | None = None,
    ) -> RewardLoss:
        """The loss of a batch (`emoreward.training.losses.reward_model_loss` with this objective's terms).

        Args:
            logits: `(2 * batch, num_heads)` value-head outputs, chosen rows first, then rejected.
            tie: `(batch,)` 1.0 for tie pairs; `ties`, `tie_parameter`: the tie likelihood.
            weight: `(batch,)` length-balance weights (read only by `reweight`).
            lengths: `(2 * batch,)` description lengths in characters (read only by `disentangled`).
            head_weight: `(num_heads, hidden)` value-head weight (read only by `disentangled`).
            margin: `(batch,)` TRL's per-pair margin (every objective; see `reward_model_loss`).
        """
        return reward_model_loss(
            logits,
            tie=tie,
            ties=ties,
            tie_parameter=tie_parameter,
            weights=weight if self.weighted else None,
            lengths=lengths if self.disentangled else None,
            head_weight=head_weight if self.disentangled else None,
            odin_length_weight=odin_length_weight,
            odin_orthogonal_weight=odin_orthogonal_weight,
            margin=margin,
        )


def length_penalty_from_rewards(rewards: np.ndarray, lengths: np.ndarray) -> dict:
    """The length penalty that makes `rewards` uncorrelated with standardised `lengths` (least-squares slope).

    Returns:
        `{"type": "length_penalty", "alpha", "mean", "std"}` (lengths in characters), a `score_transform`.

    Raises:
        ValueError: every length is the same.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    rewards = np.asarray(rewards, dtype=np.float64)
    if lengths.std() == 0:
        raise ValueError("cannot fit a length penalty: every description has the same length")
    z = (lengths - lengths.mean()) / lengths.std()
    alpha = float(np.dot(z, rewards - rewards.mean()) / np.dot(z, z))
    return {"type": "length_penalty", "alpha": alpha, "mean": float(lengths.mean()), "std": float(lengths.std())}


def fit_length_penalty(model: RewardModel, pairs: Sequence[PreferencePair], batch_size: int | None = None) -> dict:
    """Fit the `penalty` objective's transform on the distinct descriptions of `pairs`, scored without any
    transform, through the model's own `score` (text or media).

    Returns:
        the `score_transform` dict (see `length_penalty_from_rewards`).
    """
    from emoreward.models.base import RewardContext

    items: dict[tuple, tuple[str, RewardContext]] = {}
    for p in pairs:
        ctx = RewardContext.from_pair(p)
        for d in (p.description_1, p.description_2):
            items.setdefault((d, model.context_key(ctx)), (d, ctx))
    descriptions = [d for d, _ in items.values()]
    saved, model.settings.score_transform = model.settings.score_transform, None
    try:
        rewards = model.score(descriptions, [c for _, c in items.values()], batch_size=batch_size)
    finally:
        model.settings.score_transform = saved
    return length_penalty_from_rewards(rewards, np.array([len(d) for d in descriptions]))


OBJECTIVES: dict[str, Objective] = {
    "none": Objective("none"),
    "reweight": Objective("reweight", weighted=True),
    "penalty": Objective("penalty", after_fit=fit_length_penalty),
    "disentangled": Objective("disentangled", num_heads=2, disentangled=True),
}


def get_objective(name: str) -> Objective:
    """Registry lookup.

    Raises:
        ValueError: an unknown name (lists the available ones).
    """
    if name not in OBJECTIVES:
        raise ValueError(f"unknown length_debias objective {name!r}; available: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


__all__ = [
    "OBJECTIVES",
    "Objective",
    "ObjectiveName",
    "fit_length_penalty",
    "get_objective",
    "length_penalty_from_rewards",
]
