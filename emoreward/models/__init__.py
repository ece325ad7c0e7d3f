"""Reward models: backbones, the value head, LoRA, save / load / merged export."""

from emoreward.models.backbones import BACKBONES, BackboneSpec, get_backbone
from emoreward.models.reward_model import EmoRewardModel, Encoded, RewardModelSettings


__all__ = ["BACKBONES", "BackboneSpec", "EmoRewardModel", "Encoded", "RewardModelSettings", "get_backbone"]
