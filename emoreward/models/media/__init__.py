"""Multimodal reward models (Qwen2.5-VL, Qwen2.5-Omni thinker, Qwen2-Audio): network, inputs, model."""

from emoreward.models.media.model import VALUE_HEAD_FILE, MediaRewardModel
from emoreward.models.media.module import ValueHeadModel, init_value_head
from emoreward.models.media.processing import (
    DEFAULT_MEDIA_INSTRUCTION,
    EncodedPrefix,
    Qwen2_5_VLFramesProcessor,
    Qwen2_5OmniFramesProcessor,
    RewardPromptBuilder,
    SampledFramesVideoProcessor,
    VisionPatching,
    collate_media,
    load_processor_parts,
    official_processor,
    pad_sequences,
)


__all__ = [
    "DEFAULT_MEDIA_INSTRUCTION",
    "VALUE_HEAD_FILE",
    "EncodedPrefix",
    "MediaRewardModel",
    "Qwen2_5OmniFramesProcessor",
    "Qwen2_5_VLFramesProcessor",
    "RewardPromptBuilder",
    "SampledFramesVideoProcessor",
    "ValueHeadModel",
    "VisionPatching",
    "collate_media",
    "init_value_head",
    "load_processor_parts",
    "official_processor",
    "pad_sequences",
]
