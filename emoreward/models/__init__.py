"""Reward models: backbones, the value head, LoRA, save / load / merged export."""

from emoreward.models.backbones import BACKBONES, BackboneSpec, get_backbone
from emoreward.models.reward_model import EmoRewardModel, Encoded, RewardModelSettings


__all__ = ["BACKBONES", "BackboneSpec", "EmoRewardModel", "Encoded", "RewardModelSettings", "get_backbone"]


def load_reward_model(directory, **kwargs):
    """Load any saved emoreward reward model (text or multimodal) from its directory.

    Transitional entry point: the class is picked from the files in the directory. Every route (evaluate,
    rank, serve, GRPO reward, export) loads reward models through this function.

    Raises:
        FileNotFoundError: `directory` is not an emoreward model directory.
    """
    return EmoRewardModel.from_pretrained(directory, **kwargs)


__all__ += ["load_reward_model"]
