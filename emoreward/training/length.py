"""The length-penalised reward (`length_debias: penalty`), a baseline for length-robust reward models.

r'(d) = r(d) - alpha * (len(d) - mean) / std, with len in characters and alpha the least-squares slope of the
reward on standardised length over the training descriptions, so that r' is uncorrelated with length on the
training data.
"""

from __future__ import annotations

import numpy as np

from emoreward.data import PreferencePair
from emoreward.models import EmoRewardModel


def fit_length_penalty(model: EmoRewardModel, pairs: list[PreferencePair], batch_size: int = 32) -> dict:
    """Fit alpha on the distinct descriptions of `pairs` (scored without any penalty).

    Returns:
        `{"alpha": float, "mean": float, "std": float}` (mean and std of the lengths in characters), to store
        in `RewardModelSettings.length_penalty`.

    Raises:
        ValueError: if all descriptions have the same length.
    """
    texts = {}
    for p in pairs:
        texts.setdefault((p.description_1, p.media.subtitle), None)
        texts.setdefault((p.description_2, p.media.subtitle), None)
    descriptions = [d for d, _ in texts]
    saved, model.settings.length_penalty = model.settings.length_penalty, None
    try:
        rewards = model.score(descriptions, [s for _, s in texts], batch_size=batch_size)
    finally:
        model.settings.length_penalty = saved
    lengths = np.array([len(d) for d in descriptions], dtype=np.float64)
    if lengths.std() == 0:
        raise ValueError("cannot fit a length penalty: every description has the same length")
    z = (lengths - lengths.mean()) / lengths.std()
    alpha = float(np.dot(z, rewards - rewards.mean()) / np.dot(z, z))
    return {"alpha": alpha, "mean": float(lengths.mean()), "std": float(lengths.std())}
