"""A reward function for TRL's GRPOTrainer backed by an emotion reward model.

    from trl import GRPOConfig, GRPOTrainer
    from emoreward.export import EmotionReward

    reward = EmotionReward("outputs/rm/model")          # a directory written by `emoreward train`
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], train_dataset=dataset, args=GRPOConfig(...))

GRPOTrainer calls each reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns)``,
where ``columns`` holds every dataset column except ``prompt`` (repeated for each generation), plus
``trainer_state``, ``log_extra`` and ``log_metric``. This function reads the sample's media from the columns
``subtitle``, ``video`` and ``audio`` (names configurable) and returns one float reward per completion.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emoreward.models import EmoRewardModel


def completion_text(completion: Any) -> str:
    """The text of one completion: a string (standard format) or a list of messages (conversational format,
    the assistant turns joined).

    Raises:
        ValueError: on any other shape.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) for m in completion):
        turns = [m for m in completion if m.get("role", "assistant") == "assistant"]
        return "\n".join(str(m.get("content") or "") for m in turns)
    raise ValueError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")


class EmotionReward:
    """Reward function with GRPOTrainer's signature: ``(prompts, completions, **kwargs) -> list[float]``.

    Each completion is taken as an emotion description of the sample its prompt came from; its reward is
    r(description | instruction, subtitle) from the reward model (unnormalised logit; GRPO normalises
    advantages within each group of generations anyway).

    Args:
        model (`EmoRewardModel`, `str` or `Path`): the reward model or a saved model directory.
        subtitle_column (`str`): dataset column with the sample's subtitle (missing column or ``None``: none).
        video_column, audio_column (`str`): dataset columns with media paths. The current reward models are
            text-only: when these columns hold paths, ``on_unused_media`` says what happens.
        on_unused_media (`"warn"`, `"error"` or `"ignore"`): a text-only model given video / audio paths
            warns once (default), raises ValueError, or says nothing.
        batch_size (`int`): sequences per forward pass.
        scale (`float`): multiply rewards by this (e.g. to weigh this reward against others).
        name (`str`): the name GRPOTrainer logs the reward under (``rewards/<name>/mean``).
    """

    def __init__(
        self,
        model: EmoRewardModel | str | Path,
        subtitle_column: str = "subtitle",
        video_column: str = "video",
        audio_column: str = "audio",
        on_unused_media: str = "warn",
        batch_size: int = 16,
        scale: float = 1.0,
        name: str = "emotion_reward",
    ):
        if on_unused_media not in ("warn", "error", "ignore"):
            raise ValueError(f"on_unused_media must be 'warn', 'error' or 'ignore', got {on_unused_media!r}")
        self.model = model if isinstance(model, EmoRewardModel) else EmoRewardModel.from_pretrained(model)
        self.subtitle_column = subtitle_column
        self.media_columns = (video_column, audio_column)
        self.on_unused_media = on_unused_media
        self.batch_size = batch_size
        self.scale = float(scale)
        self.__name__ = name
        self.n_calls = 0
        self.n_scored = 0
        self._warned = False

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """Rewards, one per completion (``len(completions)`` floats).

        Raises:
            ValueError: if a column's length differs from ``len(completions)``, a completion has an unknown
                shape, or media paths are given with ``on_unused_media="error"``.
        """
        n = len(completions)
        if prompts is not None and len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        subtitles = self._column(kwargs, self.subtitle_column, n)
        for column in self.media_columns:
            values = self._column(kwargs, column, n)
            if any(v for v in values) and self.on_unused_media != "ignore":
                message = (
                    f"column {column!r} holds media paths, but this reward model is text-only: it conditions on "
                    f"the subtitle ({self.subtitle_column!r}) only"
                )
                if self.on_unused_media == "error":
                    raise ValueError(message)
                if not self._warned:
                    warnings.warn(message, UserWarning, stacklevel=2)
                    self._warned = True
        texts = [completion_text(c) for c in completions]
        scores = self.model.score(texts, [s if s else None for s in subtitles], batch_size=self.batch_size)
        self.n_calls += 1
        self.n_scored += n
        return (self.scale * np.asarray(scores, dtype=np.float64)).tolist()

    @staticmethod
    def _column(kwargs: dict[str, Any], column: str, n: int) -> list[Any]:
        values = kwargs.get(column)
        if values is None:
            return [None] * n
        values = list(values)
        if len(values) != n:
            raise ValueError(f"column {column!r} has {len(values)} values for {n} completions")
        return values


__all__ = ["EmotionReward", "completion_text"]
