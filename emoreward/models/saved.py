"""A saved text reward model known by its folder alone: what its outputs depend on, read without loading its
weights, and the model itself loaded on first use (a ranking rerun served from the score cache needs no weights).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING

from emoreward.data.context import RewardContext, subtitle_key
from emoreward.models.base import RewardModel, TextSettings, load_settings
from emoreward.models.precision import dtype_name, dtype_request, recorded_precision_name


if TYPE_CHECKING:
    import torch


class SavedRewardModel:
    """A text reward model's folder, with the attributes the score cache keys are built from.

    The same values as the loaded model (`load_reward_model(directory, dtype=dtype)`) would give:
    `kind`, `settings`, `source_dir` (its content identity: `emoreward.models.loading.model_identity`),
    `precision_name` (the name of its `scoring_precision`: `emoreward.models.precision.recorded_precision_name`,
    the loaded model's rule on the CPU, where that loader puts a text model), `device` and `context_key`
    (`emoreward.data.context.subtitle_key`). `load()` loads the model once. Nothing here imports torch: a ranking
    rerun from a full score cache starts without it.

    Args:
        directory: a folder written by `save_pretrained` or `export_merged`.
        dtype: the scoring precision asked for (`"auto"`, a dtype or its name), as for `TextRewardModel.from_pretrained`.

    Raises:
        FileNotFoundError: not an emoreward model directory; ValueError: it holds a multimodal model (those load
        their weights in their precision: use `load_reward_model`), or its settings or `dtype` are invalid.
    """

    kind = "text"

    def __init__(self, directory: str | Path, *, dtype: str | torch.dtype = "auto"):
        self.source_dir = Path(directory)
        self.settings = load_settings(self.source_dir)
        if not isinstance(self.settings, TextSettings):
            raise ValueError(f"{directory} holds a {self.settings.kind} reward model; load it with load_reward_model")
        self.device = "cpu"
        self._dtype = dtype
        self.precision_name = recorded_precision_name(dtype, self.settings)
        self.dtype_pin = dtype_request(dtype)[1]  # what decided precision_name (`precision_record`)
        self._loaded: RewardModel | None = None

    def context_key(self, context: RewardContext) -> Hashable:
        """The part of a context the model reads (`subtitle_key`)."""
        return subtitle_key(context)

    def load(self) -> RewardModel:
        """The model itself (`emoreward.models.loading.open_reward_model`), loaded on the first call.

        Raises:
            RuntimeError: the loaded model scores in another precision than the folder said (a changed
                `$EMOREWARD_DTYPE` or device between the two: its cache keys would differ).
        """
        if self._loaded is None:
            from emoreward.models.loading import open_reward_model

            model = open_reward_model(self.source_dir, dtype=self._dtype)
            if dtype_name(model.scoring_precision) != self.precision_name:
                raise RuntimeError(
                    f"{self.source_dir}: the loaded model scores in {dtype_name(model.scoring_precision)}, its "
                    f"folder said {self.precision_name}"
                )
            self._loaded = model
        return self._loaded


__all__ = ["SavedRewardModel"]
