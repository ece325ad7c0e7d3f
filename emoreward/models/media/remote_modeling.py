"""The remote-code classes of a multimodal export (`modeling_emoreward.py`):
`AutoModelForSequenceClassification.from_pretrained(export, trust_remote_code=True)` reads the export with
transformers and torch only, and `logits[:, 0]` is the reward. See docs/serving.md.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from emoreward.models.media.positions import qwen2_5_vl_positions  # emoreward-export: inline positions.py


def _last_token(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The hidden state of every row's last non-pad token (either padding side): `(batch, hidden)`."""
    index = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (attention_mask.long() * index).argmax(-1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _register_key_renaming(class_name: str, rules: list[tuple[str, str]]) -> None:
    """Tell transformers how this class's checkpoint keys map onto its modules (it applies no built-in renaming
    to custom code): `(regex, replacement)` pairs, as its own conversion mappings write them."""
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    mapping = [WeightRenaming(source_patterns=source, target_patterns=target) for source, target in rules]
    register_checkpoint_conversion_mapping(class_name, mapping, overwrite=True)


# the release's key names (what transformers 5 writes for <X>ForConditionalGeneration) -> this file's modules
_register_key_renaming(
    "Qwen2_5_VLForSequenceClassification",
    [(r"^visual\.", "model.visual."), (r"^model\.(?!language_model\.|visual\.)(.+)", r"model.language_model.\1")],
)
_register_key_renaming(
    "Qwen2AudioForSequenceClassification",
    [
        (r"^language_model\.score\.", "score."),
        (r"^language_model\.model\.", "model.language_model."),
        (r"^audio_tower\.", "model.audio_tower."),
        (r"^multi_modal_projector\.", "model.multi_modal_projector."),
    ],
)


class _ScoreHolder(nn.Module):
    """Holds `score` under the name `language_model` (the key `language_model.score.weight`)."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.score = nn.Linear(hidden_size, num_labels, bias=False)


class Qwen2_5_VLForSequenceClassification(transformers.Qwen2_5_VLPreTrainedModel):
    """Qwen2.5-VL reward model: `Qwen2_5_VLModel` + `language_model.score` at the last non-pad token."""

    config_class = transformers.Qwen2_5_VLConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = transformers.Qwen2_5_VLModel(config)
        self.language_model = _ScoreHolder(config.text_config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        pixel_values_videos: torch.Tensor | None = None,
        video_grid_thw: torch.LongTensor | None = None,
        second_per_grid_ts: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        """Args: the Qwen2.5-VL processor's outputs (one video per sequence that has one, in batch order).
        Returns: `logits` of shape `(batch, num_labels)`; column 0 is the reward."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        position_ids = None
        if video_grid_thw is not None:
            vision = self.config.vision_config
            position_ids, _ = qwen2_5_vl_positions(
                input_ids,
                attention_mask,
                video_grid_thw=video_grid_thw,
                second_per_grid_ts=second_per_grid_ts,
                video_token_id=self.config.video_token_id,
                image_token_id=self.config.image_token_id,
                spatial_merge_size=vision.spatial_merge_size,
                tokens_per_second=vision.tokens_per_second,
            )
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values_videos=pixel_values_videos,
            video_grid_thw=video_grid_thw,
            second_per_grid_ts=second_per_grid_ts,
            use_cache=False,
        )
        return SequenceClassifierOutput(
            logits=self.language_model.score(_last_token(out.last_hidden_state, attention_mask))
        )


class Qwen2_5OmniForSequenceClassification(transformers.Qwen2_5OmniPreTrainedModel):
    """Qwen2.5-Omni reward model: the thinker's `Qwen2_5OmniThinkerModel` (weights under `thinker.`) +
    `language_model.score` at the last non-pad token. `use_audio_in_video` (default: the config's
    `emoreward_use_audio_in_video`) says the video's audio is interleaved with its frames."""

    config_class = transformers.Qwen2_5OmniConfig

    def __init__(self, config):
        super().__init__(config)
        self.thinker = transformers.Qwen2_5OmniThinkerForConditionalGeneration._from_config(config.thinker_config)
        hidden = config.thinker_config.text_config.hidden_size
        self.language_model = _ScoreHolder(hidden, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        use_audio_in_video: bool | None = None,
        **media,
    ) -> SequenceClassifierOutput:
        """Args: the Qwen2.5-Omni processor's outputs (`pixel_values_videos`, `video_grid_thw`,
        `video_second_per_grid`, `input_features`, `feature_attention_mask`).
        Returns: `logits` of shape `(batch, num_labels)`; column 0 is the reward."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if use_audio_in_video is None:
            use_audio_in_video = bool(getattr(self.config, "emoreward_use_audio_in_video", False))
        inner = self.thinker.model
        inner.rope_deltas = None  # stateful in transformers: always recompute
        media = {k: v for k, v in media.items() if v is not None}
        out = inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_audio_in_video=use_audio_in_video,
            use_cache=False,
            **media,
        )
        return SequenceClassifierOutput(
            logits=self.language_model.score(_last_token(out.last_hidden_state, attention_mask))
        )


class Qwen2AudioForSequenceClassification(transformers.Qwen2AudioPreTrainedModel):
    """Qwen2-Audio reward model: `Qwen2AudioModel` + the value head `score` (stored as
    `language_model.score.weight`) at the last non-pad token."""

    config_class = transformers.Qwen2AudioConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = transformers.Qwen2AudioModel(config)
        self.score = nn.Linear(config.text_config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        input_features: torch.Tensor | None = None,
        feature_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        """Args: the Qwen2-Audio processor's outputs. Returns: `logits` `(batch, num_labels)`; column 0 the reward."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=(attention_mask.long().cumsum(-1) - 1).clamp(min=0),  # either padding side
            input_features=input_features,
            feature_attention_mask=feature_attention_mask,
            use_cache=False,
        )
        return SequenceClassifierOutput(logits=self.score(_last_token(out.last_hidden_state, attention_mask)))
