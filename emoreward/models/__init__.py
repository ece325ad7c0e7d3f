"""Reward models: one interface (`RewardModel`), one backbone registry, text and multimodal implementations.

Load any saved model with `load_reward_model(directory)`; score with `model.score(descriptions, contexts)`.
The implementations (`TextRewardModel`, `MediaRewardModel`) import transformers and are loaded on first use.
"""

from emoreward.models.backbones import BACKBONES, BackboneSpec, get_backbone, register_backbone
from emoreward.models.base import (
    SETTINGS_FILE,
    MediaSettings,
    RewardContext,
    RewardModel,
    RewardSettings,
    ScoreInfo,
    TextSettings,
    load_reward_model,
    load_settings,
)


def __getattr__(name: str):
    if name == "TextRewardModel":
        from emoreward.models.text import TextRewardModel

        return TextRewardModel
    if name == "MediaRewardModel":
        from emoreward.models.media import MediaRewardModel

        return MediaRewardModel
    raise AttributeError(f"module 'emoreward.models' has no attribute {name!r}")


__all__ = [
    "BACKBONES",
    "SETTINGS_FILE",
    "BackboneSpec",
    "MediaRewardModel",
    "MediaSettings",
    "RewardContext",
    "RewardModel",
    "RewardSettings",
    "ScoreInfo",
    "TextRewardModel",
    "TextSettings",
    "get_backbone",
    "load_reward_model",
    "load_settings",
    "register_backbone",
]
