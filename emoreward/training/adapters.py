"""Backbone adapters: what differs between training a text and a multimodal reward model (model, dataset, collator,
forward), behind one interface picked by `ADAPTERS[config.kind]`. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from emoreward.training.objectives import get_objective
from emoreward.training.preprocess import (
    EXTRA_COLUMNS,
    MediaPreferenceCollator,
    TextPreferenceCollator,
    build_media_dataset,
    build_text_dataset,
)


if TYPE_CHECKING:
    from datasets import Dataset

    from emoreward.data import PreferencePair
    from emoreward.models.base import RewardModel
    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.preprocess import ExclusionReport


class BackboneAdapter(Protocol):
    """The kind-specific part of training (see the module docstring)."""

    kind: str

    def build_model(self, config: EmoRewardConfig) -> RewardModel: ...

    def build_dataset(
        self, pairs: Sequence[PreferencePair], model: RewardModel, config: EmoRewardConfig
    ) -> tuple[Dataset, ExclusionReport]: ...

    def collator(self, model: RewardModel, config: EmoRewardConfig): ...

    def signature_columns(self, config: EmoRewardConfig) -> Sequence[str]: ...

    def logits(self, network: torch.nn.Module, inputs: dict) -> torch.Tensor: ...


def _lora_config(config: EmoRewardConfig, task_type: str | None):
    from peft import LoraConfig

    return LoraConfig(
        task_type=task_type,
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
    )


def _model_kwargs(config: EmoRewardConfig) -> dict | None:
    return config.model_init_kwargs if isinstance(config.model_init_kwargs, dict) else None


class TextAdapter:
    """Text backbones: `TextRewardModel`, TRL's preference collator, `model(...).logits`."""

    kind = "text"

    def build_model(self, config: EmoRewardConfig):
        from emoreward.models.text import TextRewardModel

        return TextRewardModel.from_backbone(
            config.model_name_or_path,
            gguf_file=config.gguf_file,
            # SEQ_CLS puts the value head (`score` / `classifier`) in modules_to_save
            lora_config=_lora_config(config, "SEQ_CLS") if config.use_peft else None,
            instruction=config.instruction,
            max_length=config.max_length,
            dtype=torch.float32,  # master weights; `bf16: true` turns on autocast for the compute
            trust_remote_code=config.trust_remote_code,
            model_kwargs=_model_kwargs(config),
            train_head_bias=config.center_rewards_coefficient is not None,
            num_heads=get_objective(config.length_debias).num_heads,
        )

    def build_dataset(self, pairs, model, config):
        return build_text_dataset(list(pairs), model, ties=config.ties, truncation=config.truncation)

    def collator(self, model, config):
        return TextPreferenceCollator(
            pad_token_id=model.tokenizer.pad_token_id, pad_to_multiple_of=config.pad_to_multiple_of
        )

    def signature_columns(self, config):
        return ["chosen_ids", "rejected_ids", "margin", config.length_column_name, *EXTRA_COLUMNS]

    def logits(self, network, inputs):
        inputs["use_cache"] = False
        return network(**inputs).logits


class MediaAdapter:
    """Multimodal backbones: `MediaRewardModel`, the media collator (media decoded per batch, prefixes cached),
    `ValueHeadModel.forward`."""

    kind = "media"

    def build_model(self, config: EmoRewardConfig):
        from emoreward.models.media import MediaRewardModel

        return MediaRewardModel.from_backbone(
            config.backbone,
            config.model_name_or_path,
            lora_config=_lora_config(config, None) if config.use_peft else None,
            train_projector=config.train_projector,
            media_options=config.media_options(),
            instruction=config.instruction,
            max_length=config.max_length,
            video_min_pixels=config.video_min_pixels,
            video_max_pixels=config.video_max_pixels,
            model_kwargs=_model_kwargs(config),
            num_heads=get_objective(config.length_debias).num_heads,
        )

    def build_dataset(self, pairs, model, config):
        return build_media_dataset(
            list(pairs), model, ties=config.ties, truncation=config.truncation, media_errors=config.media_errors
        )

    def collator(self, model, config):
        return MediaPreferenceCollator(model, model.tokenizer.pad_token_id, config.pad_to_multiple_of)

    def signature_columns(self, config):
        return [
            "chosen_ids", "rejected_ids", "prefix_length", "sample_id", "video", "audio", "subtitle",
            config.length_column_name, *EXTRA_COLUMNS,
        ]  # fmt: skip

    def logits(self, network, inputs):
        return network(**inputs)


ADAPTERS: dict[str, BackboneAdapter] = {"text": TextAdapter(), "media": MediaAdapter()}


def adapter_for(config: EmoRewardConfig) -> BackboneAdapter:
    """The adapter of a recipe's backbone kind (`config.kind`)."""
    return ADAPTERS[config.kind]


__all__ = ["ADAPTERS", "BackboneAdapter", "MediaAdapter", "TextAdapter", "adapter_for"]
