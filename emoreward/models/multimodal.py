"""Multimodal emotion reward models: r(description | video frames, audio, subtitle) on Qwen2.5-VL, the
Qwen2.5-Omni thinker, Qwen2-Audio, or any text LM.

`MultimodalRewardModel` (a `torch.nn.Module`) is the backbone's decoder stack (`backbone.model`, no LM head)
plus a value head `score = Linear(hidden, 1, bias=False)` read at the last non-pad token, the convention verl,
OpenRLHF and TRL use. `MultimodalEmoRewardModel` adds what turns a sample into inputs (`RewardPromptBuilder`),
LoRA, scoring, save / load and merged export.

Inputs come from the backbone's official transformers processor (`Qwen2_5_VLProcessor`, `Qwen2_5OmniProcessor`,
`Qwen2AudioProcessor`): its placeholder expansion, Whisper features and, for Qwen2.5-Omni with
`use_audio_in_video`, its time-interleaved audio-in-video layout. The one replaced piece is the video processor:
transformers' `Qwen2VLVideoProcessor` needs torchvision, so `SampledFramesVideoProcessor` runs the official
torchvision-free `Qwen2VLImageProcessorPil` on every sampled frame and stacks frame pairs in the official
temporal-patch order (tests compare both with the official code).

Scoring many descriptions of one sample (`score_descriptions`) runs the media prefix once and scores every
description against its KV cache; equal to scoring each full sequence on its own (`shared_prefix=False`)
within float rounding.

Layout of one sequence (Qwen chat template, rendered by the tokenizer's own template)::

    <|im_start|>user\\n [media spans] {instruction}\\nSubtitle: ... <|im_end|>\\n<|im_start|>assistant\\n
    {description}<|im_end|>\\n
    '---------------------- prefix (never truncated) ------------------------------'------ suffix ------'

Media spans, as the official processors expand them:

- Qwen2.5-VL: `<|vision_start|><|video_pad|>*N<|vision_end|>`.
- Qwen2.5-Omni, audio from a separate file: `<|vision_bos|><|VIDEO|>*N<|vision_eos|>` then
  `<|audio_bos|><|AUDIO|>*K<|audio_eos|>`.
- Qwen2.5-Omni with `use_audio_in_video` (the video's own track): one span
  `<|vision_bos|><|audio_bos|> V..V A..A V..V A..A ... <|audio_eos|><|vision_eos|>`, video and audio tokens
  interleaved in chunks of `seconds_per_chunk` seconds (TMRoPE, Qwen2.5-Omni report, section 2.2); the thinker
  is run with `use_audio_in_video=True` so its 3-D rotary positions follow that layout.
- Qwen2-Audio: `<|audio_bos|><|AUDIO|>*K<|audio_eos|>`.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import Qwen2_5_VLProcessor, Qwen2_5OmniProcessor, Qwen2AudioProcessor
from transformers.video_processing_utils import VideoProcessorMixin

from emoreward.data.media import MediaOptions, SampleMedia


logger = logging.getLogger(__name__)

MULTIMODAL_SETTINGS_FILE = "emoreward_multimodal.json"
VALUE_HEAD_FILE = "value_head.safetensors"
_MEDIA = "\u2063EMOREWARD_MEDIA\u2063"
_DESCRIPTION = "\u2063EMOREWARD_DESCRIPTION\u2063"
_LM_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

DEFAULT_MULTIMODAL_INSTRUCTION = (
    "Describe the emotional state of the person in this clip: facial expression, voice, words, intensity and "
    "how it changes over time."
)


# ---------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class MultimodalBackboneSpec:
    """One multimodal backbone family.

    Attributes:
        name: registry key.
        model_class: `transformers` class name of the full model (its `.model` is the decoder stack used).
        default_model: hub id of the 7B checkpoint the recipes use.
        sees_video, hears_audio: which media the backbone takes.
        mrope: the decoder uses 3-D multimodal rotary positions (`rope_deltas` after a prefix pass).
        processor_class: `transformers` class name of the official processor that lays out the inputs.
        interleaves_audio_in_video: with `use_audio_in_video`, the official processor interleaves the video's
            audio with its frames and the model must be told (Qwen2.5-Omni); other audio backbones just take
            the video's track as their audio.
        encoders: sub-modules of `backbone.model` frozen by default (vision / audio encoders).
        projectors: sub-modules trained with `train_projector` (encoder-to-LM projections).
    """

    name: str
    model_class: str
    default_model: str | None
    sees_video: bool
    hears_audio: bool
    mrope: bool
    processor_class: str | None = None
    interleaves_audio_in_video: bool = False
    encoders: tuple[str, ...] = ()
    projectors: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def load_class(self):
        import transformers

        return getattr(transformers, self.model_class)


MULTIMODAL_BACKBONES: dict[str, MultimodalBackboneSpec] = {
    "qwen2.5-vl": MultimodalBackboneSpec(
        "qwen2.5-vl",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        sees_video=True,
        hears_audio=False,
        mrope=True,
        processor_class="Qwen2_5_VLProcessor",
        encoders=("visual",),
        projectors=("visual.merger",),
    ),
    "qwen2.5-omni-thinker": MultimodalBackboneSpec(
        "qwen2.5-omni-thinker",
        "Qwen2_5OmniThinkerForConditionalGeneration",
        "Qwen/Qwen2.5-Omni-7B",
        sees_video=True,
        hears_audio=True,
        mrope=True,
        processor_class="Qwen2_5OmniProcessor",
        interleaves_audio_in_video=True,
        encoders=("visual", "audio_tower"),
        projectors=("visual.merger", "audio_tower.proj"),
        aliases=("qwen2.5-omni",),
    ),
    "qwen2-audio": MultimodalBackboneSpec(
        "qwen2-audio",
        "Qwen2AudioForConditionalGeneration",
        "Qwen/Qwen2-Audio-7B-Instruct",
        sees_video=False,
        hears_audio=True,
        mrope=False,
        processor_class="Qwen2AudioProcessor",
        encoders=("audio_tower",),
        projectors=("multi_modal_projector",),
    ),
    "text": MultimodalBackboneSpec(
        "text", "AutoModelForCausalLM", None, sees_video=False, hears_audio=False, mrope=False
    ),
}


def get_multimodal_backbone(name: str) -> MultimodalBackboneSpec:
    """Registry lookup by name or alias.

    Raises:
        ValueError: unknown name (the message lists the available backbones).
    """
    for spec in MULTIMODAL_BACKBONES.values():
        if name == spec.name or name in spec.aliases:
            return spec
    available = sorted([*MULTIMODAL_BACKBONES, *(a for s in MULTIMODAL_BACKBONES.values() for a in s.aliases)])
    raise ValueError(f"unknown multimodal backbone {name!r}; available: {available}")


def lora_target_regex(spec: MultimodalBackboneSpec) -> str:
    """peft `target_modules` regex: the language model's linear layers only, never an encoder's."""
    if spec.encoders:
        excluded = "|".join(spec.encoders)
        return rf"^(?!.*\.({excluded})\.).*\.({'|'.join(_LM_LINEAR)})$"
    return rf"^.*\.({'|'.join(_LM_LINEAR)})$"


# ---------------------------------------------------------------------------------------------- the module
def init_value_head(head: nn.Linear, std: float) -> None:
    """Normal(0, std) initialisation that is correct under DeepSpeed ZeRO-3, where a parameter created inside
    `zero.Init` is a 0-sized shard: gather it, initialise on rank 0, let DeepSpeed scatter it back."""
    weight = head.weight
    if hasattr(weight, "ds_id"):  # a ZeRO-3 partitioned parameter
        import deepspeed

        with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
            nn.init.normal_(weight, mean=0.0, std=std)
    else:
        nn.init.normal_(weight, mean=0.0, std=std)


class MultimodalRewardModel(nn.Module):
    """Backbone decoder + value head `score` (Linear(hidden, 1, bias=False)) read at the last non-pad token.

    Args:
        backbone: the full `transformers` model (`Qwen2_5_VLForConditionalGeneration`, ...); its `.model`
            (decoder stack with media merging, no LM head) is run.
        spec: its registry entry.
        use_audio_in_video: the sequences carry the video's own audio interleaved with its frames (the official
            Qwen2.5-Omni processor's `load_audio_from_video` layout); passed to the thinker so its rotary
            positions follow that layout. Must match how the inputs were built (`MediaOptions`).

    Raises:
        ValueError: `use_audio_in_video` for a backbone without that layout (`spec.interleaves_audio_in_video`).
    """

    main_input_name = "input_ids"
    base_model_prefix = ""  # peft asks for it (transformers weight-conversion scopes)
    supports_gradient_checkpointing = True

    def __init__(self, backbone: nn.Module, spec: MultimodalBackboneSpec, *, use_audio_in_video: bool = False):
        super().__init__()
        if use_audio_in_video and not spec.interleaves_audio_in_video:
            raise ValueError(f"{spec.name!r} has no interleaved audio-in-video layout (use_audio_in_video)")
        self.backbone = backbone
        self.spec = spec
        self.use_audio_in_video = use_audio_in_video
        text_config = backbone.config.get_text_config()
        weight = next(backbone.parameters())
        self.score = nn.Linear(text_config.hidden_size, 1, bias=False, dtype=weight.dtype, device=weight.device)
        init_value_head(self.score, getattr(text_config, "initializer_range", 0.02))
        self.config = backbone.config
        self.config.num_labels = 1  # TRL's RewardTrainer checks it

    @property
    def inner(self) -> nn.Module:
        return self.backbone.model

    def _media_kwargs(self, input_ids: torch.Tensor, media: dict) -> dict:
        kwargs = {k: v for k, v in media.items() if v is not None}
        if self.spec.name == "qwen2.5-vl" and "pixel_values_videos" in kwargs:
            video_id = self.config.video_token_id
            kwargs["mm_token_type_ids"] = (input_ids == video_id).int() * 2  # text 0, image 1, video 2
        if self.spec.name == "qwen2.5-omni-thinker":
            # the interleaved audio-in-video layout changes how the thinker counts spans and assigns positions
            kwargs["use_audio_in_video"] = self.use_audio_in_video
        return kwargs

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **media) -> torch.Tensor:
        """Rewards of a batch of sequences.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, seq_len)`), attention_mask (same shape; padding
                on either side).
            **media: the backbone's media tensors (`pixel_values_videos`, `video_grid_thw`,
                `second_per_grid_ts` / `video_second_per_grid`, `input_features`, `feature_attention_mask`),
                one media item per sequence that has media, in batch order.

        Returns:
            rewards (`torch.Tensor` of shape `(batch_size,)`): unnormalised scalar rewards.
        """
        if getattr(self.inner, "rope_deltas", None) is not None:
            self.inner.rope_deltas = None  # stateful across calls in transformers; always recompute
        out = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **self._media_kwargs(input_ids, media)
        )
        hidden = out.last_hidden_state
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask.long() * positions).argmax(-1)  # last non-pad token, whatever the padding side
        return self.score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last]).squeeze(-1)

    @torch.no_grad()
    def score_shared_prefix(
        self, prefix_ids: list[int], media: dict, suffixes: list[list[int]], *, pad_token_id: int, batch_size: int = 16
    ) -> torch.Tensor:
        """Rewards of `prefix + suffix` for every suffix, running the prefix (and its media encoders) once.

        The prefix's KV cache is repeated over a batch of suffixes; suffix positions continue the prefix's
        (for M-RoPE backbones: text positions shifted by the prefix's `rope_deltas`), so every reward equals
        `forward` on the full sequence up to float rounding.

        Returns:
            `torch.Tensor` of shape `(len(suffixes),)`.
        """
        inner = self.inner
        lm = getattr(inner, "language_model", inner)
        device = self.score.weight.device
        if getattr(inner, "rope_deltas", None) is not None:
            inner.rope_deltas = None
        ids = torch.tensor([prefix_ids], device=device)
        mask = torch.ones_like(ids)
        media = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in media.items()}
        out = inner(input_ids=ids, attention_mask=mask, use_cache=True, **self._media_kwargs(ids, media))
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        delta = getattr(inner, "rope_deltas", None) if self.spec.mrope else None
        cache_kw = "cache" if "cache" in inspect.signature(lm.forward).parameters else "past_key_values"
        n_prefix = len(prefix_ids)
        rewards = []
        for start in range(0, len(suffixes), batch_size):
            chunk = suffixes[start : start + batch_size]
            m, width = len(chunk), max(len(s) for s in chunk)
            sids = torch.full((m, width), pad_token_id, dtype=torch.long, device=device)
            smask = torch.zeros((m, width), dtype=torch.long, device=device)
            for row, seq in enumerate(chunk):
                sids[row, : len(seq)] = torch.tensor(seq, device=device)
                smask[row, : len(seq)] = 1
            chunk_cache = copy.deepcopy(cache)
            chunk_cache.batch_repeat_interleave(m)
            pos = (n_prefix + torch.arange(width, device=device)).unsqueeze(0).expand(m, -1)
            if self.spec.mrope:
                shift = delta.to(device).reshape(-1)[0] if delta is not None else 0
                pos = (pos + shift).unsqueeze(0).expand(3, -1, -1)
            hidden = lm(
                inputs_embeds=lm.get_input_embeddings()(sids),
                attention_mask=torch.cat([torch.ones((m, n_prefix), dtype=torch.long, device=device), smask], dim=1),
                position_ids=pos,
                use_cache=True,
                **{cache_kw: chunk_cache},
            ).last_hidden_state
            last = smask.sum(-1) - 1
            rewards.append(self.score(hidden[torch.arange(m, device=device), last]).squeeze(-1))
        return torch.cat(rewards)

    # Trainer / peft hooks, delegated to the backbone
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        self.backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, **kwargs
        )

    def activation_checkpointing_enable(self, *args, **kwargs) -> None:
        self.backbone.activation_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.backbone.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        self.backbone.enable_input_require_grads()

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def add_model_tags(self, tags: list[str] | str) -> None:
        self.backbone.add_model_tags(tags)


# ---------------------------------------------------------------------------------------------- inputs
@dataclass
class VisionPatching:
    """Qwen2-VL video processing parameters (from the backbone's image processor config, saved with a model).

    `min_pixels` / `max_pixels` bound the area of every frame after resizing (`smart_resize`); the rest are the
    vision encoder's patch geometry and the pixel normalisation.
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28

    @classmethod
    def from_image_processor(cls, processor, *, min_pixels: int | None = None, max_pixels: int | None = None):
        """Parameters of a loaded Qwen2-VL image processor; `min_pixels` / `max_pixels` override its size."""
        size = getattr(processor, "size", None) or {}
        get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
        return cls(
            patch_size=processor.patch_size,
            temporal_patch_size=processor.temporal_patch_size,
            merge_size=processor.merge_size,
            image_mean=tuple(processor.image_mean),
            image_std=tuple(processor.image_std),
            min_pixels=min_pixels or get("shortest_edge", None) or getattr(processor, "min_pixels", cls.min_pixels),
            max_pixels=max_pixels or get("longest_edge", None) or getattr(processor, "max_pixels", cls.max_pixels),
        )

    @property
    def size(self) -> dict[str, int]:
        """The `size` argument of the Qwen2-VL processors (pixel area bounds)."""
        return {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}

    def image_processor(self):
        """The official torchvision-free `transformers.Qwen2VLImageProcessorPil` with these parameters."""
        from transformers import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
            image_mean=list(self.image_mean),
            image_std=list(self.image_std),
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )


class SampledFramesVideoProcessor(VideoProcessorMixin):
    """Qwen2-VL video processing of frames that `emoreward.data.media` already sampled, without torchvision.

    transformers' `Qwen2VLVideoProcessor` (the video part of the Qwen2.5-VL and Qwen2.5-Omni processors) imports
    torchvision, which cannot be installed beside every torch build. This processor gives the same outputs from
    official code that does not: every frame goes through `transformers.Qwen2VLImageProcessorPil` (smart_resize,
    PIL bicubic resize, rescale, normalise, spatial patch order with 2x2 merge windows contiguous); the only step
    done here is stacking consecutive frames into temporal patches, in the order of
    `Qwen2VLVideoProcessor.patchify`. Tests check both exactly: a two-frame clip of one frame equals the official
    image processor's output for that frame, and any clip equals the official `patchify` (executed from the
    transformers source) on the image processor's normalised frames. The one known difference to the
    torchvision processor is the resize kernel (PIL's bicubic here, torchvision's antialiased bicubic there).

    Called by the official processors as their `video_processor` (see `official_processor`).

    Args:
        image_processor: a `Qwen2VLImageProcessorPil` (its patch geometry, normalisation and size are used).
    """

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, image_processor, **kwargs):
        super().__init__(**kwargs)
        self.image_processor = image_processor
        self.patch_size = image_processor.patch_size
        self.temporal_patch_size = image_processor.temporal_patch_size
        self.merge_size = image_processor.merge_size
        self.size = dict(image_processor.size)

    def __call__(
        self,
        videos,
        *,
        fps: float | None = None,
        size: dict[str, int] | None = None,
        return_metadata: bool = False,
        return_tensors=None,
        **kwargs,
    ):
        """Patches of already-sampled videos.

        Args:
            videos: one video or a list of them; each a `uint8` array of shape `(T, H, W, 3)`.
            fps: the rate the frames were sampled at (frames per second of video); gives the metadata's
                `sampled_fps`, from which the processors derive the temporal positions.
            size: `{"shortest_edge": min_pixels, "longest_edge": max_pixels}` (default: the image processor's).
            return_metadata: also return `video_metadata` (a `VideoMetadata` per video).

        Returns:
            `BatchFeature` with `pixel_values_videos` (`torch.FloatTensor` of shape
            `(sum of grid_t * grid_h * grid_w, 3 * temporal_patch * patch * patch)`), `video_grid_thw`
            (`torch.LongTensor` of shape `(num_videos, 3)`) and, with `return_metadata`, `video_metadata`.

        Raises:
            ValueError: no `fps`, a video that is not `(T, H, W, 3)` uint8, or an option this processor does not
                implement (frame sampling, custom resizing) given a value.
        """
        from transformers.image_processing_utils import BatchFeature
        from transformers.video_utils import VideoMetadata, make_batched_videos

        unsupported = {k: v for k, v in kwargs.items() if v is not None and k not in _IGNORED_VIDEO_KWARGS}
        if unsupported:
            raise ValueError(
                f"SampledFramesVideoProcessor takes frames already sampled and implements only fps, size and "
                f"return_metadata; got {sorted(unsupported)}"
            )
        if fps is None or not fps > 0:
            raise ValueError(f"the sampling rate of the frames is needed (fps > 0), got {fps!r}")
        tp, ps = self.temporal_patch_size, self.patch_size
        pixels, grids, metadata = [], [], []
        for video in make_batched_videos(videos):
            video = np.asarray(video)
            if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
                raise ValueError(
                    f"a video must be a uint8 array of shape (T, H, W, 3), got {video.dtype} {video.shape}"
                )
            n_frames = len(video)
            if n_frames % tp:  # the official patchify repeats the last frame
                video = np.concatenate([video, np.repeat(video[-1:], tp - n_frames % tp, axis=0)])
            out = self.image_processor(images=list(video), size=size or self.size, return_tensors="np")
            grid = np.asarray(out["image_grid_thw"])  # (T, 3): [1, grid_h, grid_w] per frame
            grid_h, grid_w = int(grid[0, 1]), int(grid[0, 2])
            n_patches = grid_h * grid_w
            flat = np.asarray(out["pixel_values"])  # (T * n_patches, C * tp * ps * ps), each frame repeated tp times
            channels = flat.shape[1] // (tp * ps * ps)
            frames = flat.reshape(len(video), n_patches, channels, tp, ps, ps)[:, :, :, 0]
            grid_t = len(video) // tp
            # (grid_t, tp, patches, C, ps, ps) -> (grid_t, patches, C, tp, ps, ps): Qwen2VLVideoProcessor.patchify
            patches = frames.reshape(grid_t, tp, n_patches, channels, ps, ps).transpose(0, 2, 3, 1, 4, 5)
            pixels.append(np.ascontiguousarray(patches).reshape(grid_t * n_patches, channels * tp * ps * ps))
            grids.append([grid_t, grid_h, grid_w])
            metadata.append(VideoMetadata(total_num_frames=n_frames, fps=fps, frames_indices=list(range(n_frames))))
        data = {
            "pixel_values_videos": torch.from_numpy(np.concatenate(pixels)),
            "video_grid_thw": torch.tensor(grids, dtype=torch.long),
        }
        if return_metadata:
            data["video_metadata"] = metadata
        return BatchFeature(data, skip_tensor_conversion=["video_metadata"])


# options the official processors may pass that do not change the result for pre-sampled RGB frames
_IGNORED_VIDEO_KWARGS = {"do_sample_frames", "do_convert_rgb", "input_data_format", "device", "video_metadata"}


class _AcceptsAnyVideoProcessor:
    """Mixin for an official processor class: its constructor's type check accepts any `VideoProcessorMixin` as
    the video processor (transformers resolves the expected class through its video processor registry, which
    is empty without torchvision). Nothing else of the official class changes."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor":
            if not isinstance(argument, VideoProcessorMixin):
                raise TypeError(f"video_processor must be a VideoProcessorMixin, got {type(argument).__name__}")
            return type(argument)
        return super().check_argument_for_proper_class(argument_name, argument)


class Qwen2_5_VLFramesProcessor(_AcceptsAnyVideoProcessor, Qwen2_5_VLProcessor):
    """`transformers.Qwen2_5_VLProcessor` taking a `SampledFramesVideoProcessor`."""


class Qwen2_5OmniFramesProcessor(_AcceptsAnyVideoProcessor, Qwen2_5OmniProcessor):
    """`transformers.Qwen2_5OmniProcessor` taking a `SampledFramesVideoProcessor`."""


_PROCESSORS = {
    "Qwen2_5_VLProcessor": Qwen2_5_VLFramesProcessor,
    "Qwen2_5OmniProcessor": Qwen2_5OmniFramesProcessor,
    "Qwen2AudioProcessor": Qwen2AudioProcessor,
}
_OMNI_TOKEN_NAMES = (
    "image_token", "video_token", "audio_token", "vision_bos_token", "vision_eos_token", "audio_bos_token",
    "audio_eos_token",
)  # fmt: skip


def official_processor(spec: MultimodalBackboneSpec, tokenizer, image_processor=None, feature_extractor=None):
    """The backbone's official `transformers` processor (`spec.processor_class`), with
    `SampledFramesVideoProcessor` as its video processor for video backbones (the official class unchanged but
    for its constructor's type check, see `_AcceptsAnyVideoProcessor`).

    Args:
        tokenizer: the checkpoint's tokenizer. Qwen2.5-Omni's must name its media tokens (`video_token`,
            `audio_bos_token`, ... in `tokenizer_config.json`, as the release ships them).
        image_processor: a `Qwen2VLImageProcessorPil` (video backbones).
        feature_extractor: a `WhisperFeatureExtractor` (audio backbones).

    Returns:
        the processor, or None for the text backbone.

    Raises:
        ValueError: a Qwen2.5-Omni tokenizer without its media token names, or a missing part.
    """
    if spec.processor_class is None:
        return None
    cls = _PROCESSORS[spec.processor_class]
    if spec.sees_video and image_processor is None:
        raise ValueError(f"{spec.name} sees video: it needs its image processor")
    if spec.hears_audio and feature_extractor is None:
        raise ValueError(f"{spec.name} hears audio: it needs its feature extractor")
    if cls is Qwen2_5_VLFramesProcessor:
        video = SampledFramesVideoProcessor(image_processor)
        return cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video)
    if cls is Qwen2_5OmniFramesProcessor:
        missing = [n for n in _OMNI_TOKEN_NAMES if getattr(tokenizer, n, None) is None]
        if missing:
            raise ValueError(
                f"the Qwen2.5-Omni tokenizer does not name its media tokens {missing} (tokenizer_config.json of "
                "the release has them, e.g. video_token: <|VIDEO|>)"
            )
        video = SampledFramesVideoProcessor(image_processor)
        return cls(
            image_processor=image_processor,
            video_processor=video,
            feature_extractor=feature_extractor,
            tokenizer=tokenizer,
        )
    return cls(feature_extractor=feature_extractor, tokenizer=tokenizer)


@dataclass
class EncodedPrefix:
    """The media + context part of a sequence (never truncated) and its media tensors (batch of one).

    Attributes:
        input_ids: token ids of the prefix.
        media: the backbone's media tensors (`pixel_values_videos`, `video_grid_thw`, `second_per_grid_ts` or
            `video_second_per_grid`, `input_features`, `feature_attention_mask`), leading dimension per item.
        n_media_tokens: tokens of the media spans, their start / end markers included.
    """

    input_ids: list[int]
    media: dict[str, torch.Tensor]
    n_media_tokens: int


# processor outputs that are not media tensors: the text side is rebuilt per sequence
_TEXT_KEYS = {"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"}


class RewardPromptBuilder:
    """Turns (media, subtitle, description) into token ids and media tensors, the same way for training and
    scoring, through the backbone's official processor (see the module docstring for the layout).

    Args:
        spec: backbone family.
        tokenizer: its tokenizer (chat template used when present, else ChatML).
        model_config: the backbone config (media token ids; Qwen2.5-Omni's `seconds_per_chunk` and
            `position_id_per_seconds`, so the interleaved layout matches the thinker's rotary positions).
        media_options: fps, frame cap, the `use_audio_in_video` flag, audio sampling rate.
        vision: video processing parameters (video backbones).
        feature_extractor: Whisper feature extractor (audio backbones).
        instruction: the user turn's text before the subtitle.
        max_length: token limit of one full sequence.

    Raises:
        ValueError: a part the backbone needs is missing, `use_audio_in_video` for a backbone without audio, or the
            tokenizer's media tokens differ from the model config's.
    """

    def __init__(
        self,
        spec: MultimodalBackboneSpec,
        tokenizer,
        model_config,
        media_options: MediaOptions,
        *,
        vision: VisionPatching | None = None,
        feature_extractor=None,
        instruction: str = DEFAULT_MULTIMODAL_INSTRUCTION,
        max_length: int = 4096,
    ):
        if spec.sees_video and vision is None:
            raise ValueError(f"{spec.name} sees video: give `vision` (video processing parameters)")
        if spec.hears_audio and feature_extractor is None:
            raise ValueError(f"{spec.name} hears audio: give a `feature_extractor`")
        if media_options.use_audio_in_video and not spec.hears_audio:
            raise ValueError(f"use_audio_in_video=True but {spec.name} cannot hear audio")
        self.spec, self.tokenizer, self.config = spec, tokenizer, model_config
        self.options, self.vision, self.feature_extractor = media_options, vision, feature_extractor
        self.instruction, self.max_length = instruction, max_length
        self.processor = official_processor(
            spec, tokenizer, vision.image_processor() if vision is not None else None, feature_extractor
        )
        self._templates: dict[str, tuple[str, str, str]] = {}
        self._media_ids = self._check_media_tokens()

    @property
    def needs_video(self) -> bool:
        return self.spec.sees_video

    @property
    def needs_audio(self) -> bool:
        return self.spec.hears_audio

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _check_media_tokens(self) -> set[int]:
        """Ids of every media token (spans and their markers); the processor's must be the model's."""
        if self.processor is None:
            return set()
        config, proc = self.config, self.processor
        pairs = {"video_token_id": getattr(proc, "video_token_id", None)}
        pairs["audio_token_id" if self.spec.name != "qwen2-audio" else "audio_token_index"] = (
            self.tokenizer.convert_tokens_to_ids(proc.audio_token) if hasattr(proc, "audio_token") else None
        )
        for attr, proc_id in pairs.items():
            model_id = getattr(config, attr, None)
            if proc_id is not None and model_id is not None and int(model_id) != int(proc_id):
                raise ValueError(
                    f"the tokenizer's media token has id {proc_id} but the model config's {attr} is {model_id}: "
                    "tokenizer and weights come from different checkpoints"
                )
        names = ["vision_start_token_id", "vision_end_token_id", "video_token_id", "audio_token_id",
                 "audio_start_token_id", "audio_end_token_id", "audio_token_index"]  # fmt: skip
        ids = {int(getattr(config, n)) for n in names if getattr(config, n, None) is not None}
        for name in ("audio_bos_token", "audio_eos_token", "audio_token", "video_token"):
            if getattr(proc, name, None):
                ids.add(int(self.tokenizer.convert_tokens_to_ids(getattr(proc, name))))
        return ids

    def _template(self, context: str) -> tuple[str, str, str]:
        """(text before the media, text between media and description, text after the description)."""
        if context not in self._templates:
            messages = [
                {"role": "user", "content": _MEDIA + context},
                {"role": "assistant", "content": _DESCRIPTION},
            ]
            if self.tokenizer.chat_template:
                text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            else:
                text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            head, rest = text.split(_MEDIA)
            middle, tail = rest.split(_DESCRIPTION)
            self._templates[context] = (head, middle, tail)
        return self._templates[context]

    def context(self, subtitle: str | None) -> str:
        parts = [self.instruction] if self.instruction else []
        if subtitle:
            parts.append(f"Subtitle: {subtitle}")
        return "\n".join(parts)

    def _placeholders_and_inputs(self, media: SampleMedia | None) -> tuple[str, dict]:
        """The unexpanded media placeholders (as the official chat templates write them) and the processor
        arguments that expand them."""
        proc, name = self.processor, self.spec.name
        if self.spec.sees_video and (media is None or media.frames is None):
            raise ValueError(f"{name} needs video frames")
        if self.spec.hears_audio and (media is None or media.audio is None):
            raise ValueError(f"{name} needs audio")
        kwargs: dict = {}
        text = ""
        if self.spec.sees_video:
            if name == "qwen2.5-vl":
                start, end = (self.tokenizer.convert_ids_to_tokens(int(getattr(self.config, a)))
                              for a in ("vision_start_token_id", "vision_end_token_id"))  # fmt: skip
            else:
                start, end = proc.vision_bos_token, proc.vision_eos_token
            text += start + proc.video_token + end
            kwargs.update(videos=[media.frames], videos_kwargs={"fps": media.fps, "size": self.vision.size})
        if self.spec.hears_audio:
            # max_length: Whisper's own default (30 s), stated so that a tokenizer's text max_length cannot leak in
            kwargs.update(
                audio=[media.audio],
                audio_kwargs={
                    "sampling_rate": self.options.sampling_rate,
                    "max_length": self.feature_extractor.n_samples,
                },
            )
            if self.options.use_audio_in_video and self.spec.interleaves_audio_in_video:
                kwargs.update(
                    load_audio_from_video=True,
                    audio_from_video_indices=[0],  # the one audio is the video's own track, decoded already
                    seconds_per_chunk=float(self.config.seconds_per_chunk),
                    position_id_per_seconds=self.config.position_id_per_seconds,
                )
            else:
                text += proc.audio_bos_token + proc.audio_token + proc.audio_eos_token
        return text, kwargs

    def encode_prefix(self, media: SampleMedia | None, subtitle: str | None) -> EncodedPrefix:
        """Token ids and media tensors of the prefix (see the module docstring for the layout), laid out by the
        backbone's official processor.

        Raises:
            ValueError: the backbone needs media that `media` lacks, or the processor rejects the inputs.
        """
        head, middle, _ = self._template(self.context(subtitle))
        if self.processor is None:
            return EncodedPrefix(self._ids(head) + self._ids(middle), {}, 0)
        placeholders, kwargs = self._placeholders_and_inputs(media)
        # truncation off: a media span is never cut (a tokenizer's own max_length must not apply either)
        text_kwargs = {"add_special_tokens": False, "truncation": False}
        try:
            out = self.processor(
                text=[head + placeholders + middle], text_kwargs=text_kwargs, return_tensors="pt", **kwargs
            )
        except ValueError as err:  # e.g. a subtitle that spells a media placeholder token
            source = media.video_path or media.audio_path or "the given media"
            raise ValueError(f"{source}: {type(self.processor).__name__} rejected the prompt: {err}") from err
        ids = out["input_ids"][0].tolist()
        tensors = {k: v for k, v in out.items() if k not in _TEXT_KEYS}
        return EncodedPrefix(ids, tensors, sum(i in self._media_ids for i in ids))

    def encode_suffix(self, description: str, prefix_length: int, *, truncate: bool) -> tuple[list[int], bool]:
        """Token ids of the description and the closing template tokens, and whether it had to be cut to fit
        `max_length` after a prefix of `prefix_length` tokens. Only the description is ever cut.

        Raises:
            ValueError: the prefix and the closing tokens alone leave no room for a description token.
        """
        tail = self._ids(self._template("")[2])
        body = self._ids(description)
        room = self.max_length - prefix_length - len(tail)
        if room <= 0:
            raise ValueError(
                f"max_length={self.max_length} leaves no room for the description after a {prefix_length}-token "
                "media prefix (a media span is never cut)"
            )
        truncated = len(body) > room
        if truncated and truncate:
            body = body[:room]
        return body + tail, truncated


def collate_media(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate per-sequence media tensors along dim 0 (the layout the Qwen backbones take)."""
    out: dict[str, torch.Tensor] = {}
    for key in sorted({k for item in items for k in item}):
        parts = [item[key] for item in items if key in item]
        out[key] = torch.cat(parts, dim=0)
    return out


def pad_sequences(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `(input_ids, attention_mask)`, each of shape `(len(sequences), longest)`."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------- the reward model
@dataclass
class MultimodalRewardSettings:
    """What a saved multimodal reward model needs besides weights (`emoreward_multimodal.json`)."""

    backbone: str = "qwen2.5-vl"
    model_name_or_path: str = ""
    instruction: str = DEFAULT_MULTIMODAL_INSTRUCTION
    max_length: int = 4096
    fps: float = 2.0
    max_frames: int = 16
    use_audio_in_video: bool = False
    sampling_rate: int = 16000
    vision: dict | None = None
    tie_threshold: float = 0.0
    merged: bool = False
    train_projector: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def interleaved_audio_in_video(self) -> bool:
        """The video's audio is interleaved with its frames (Qwen2.5-Omni with `use_audio_in_video`)."""
        return self.use_audio_in_video and get_multimodal_backbone(self.backbone).interleaves_audio_in_video

    def media_options(self, media_root: str | None = None) -> MediaOptions:
        return MediaOptions(media_root, self.fps, self.max_frames, self.use_audio_in_video, self.sampling_rate)

    def save(self, directory: str | Path) -> None:
        from emoreward import __version__

        data = {"emoreward_version": __version__, **asdict(self)}
        (Path(directory) / MULTIMODAL_SETTINGS_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> MultimodalRewardSettings:
        path = Path(directory) / MULTIMODAL_SETTINGS_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"{directory} is not a multimodal emoreward model: {MULTIMODAL_SETTINGS_FILE} missing"
            )
        data = json.loads(path.read_text())
        data.pop("emoreward_version", None)
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        return cls(**data)


def load_processor_parts(path: str | Path, spec: MultimodalBackboneSpec):
    """(tokenizer, image processor or None, feature extractor or None) of a checkpoint: the parts
    `official_processor` assembles (`AutoProcessor` would also load the torchvision video processor).
    `trust_remote_code` stays off."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = AutoImageProcessor.from_pretrained(path) if spec.sees_video else None
    feature_extractor = AutoFeatureExtractor.from_pretrained(path) if spec.hears_audio else None
    return tokenizer, image_processor, feature_extractor


class MultimodalEmoRewardModel:
    """A multimodal emotion reward model: module, prompt builder, settings; score, save, load, export.

    Use `from_backbone` to start training, `from_pretrained` for a saved directory, `score_descriptions` /
    `score_pairs` to get rewards.
    """

    def __init__(self, model: nn.Module, builder: RewardPromptBuilder, settings: MultimodalRewardSettings):
        self.model, self.builder, self.settings = model, builder, settings
        self.tokenizer = builder.tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(
        cls,
        backbone: str,
        model_name_or_path: str | None = None,
        *,
        lora_config=None,
        train_projector: bool = False,
        media_options: MediaOptions | None = None,
        instruction: str | None = None,
        max_length: int = 4096,
        video_min_pixels: int | None = None,
        video_max_pixels: int | None = None,
        dtype: torch.dtype = torch.float32,
        model_kwargs: dict | None = None,
    ) -> MultimodalEmoRewardModel:
        """A fresh reward model: backbone weights from `model_name_or_path` (default: the family's 7B hub id),
        encoders frozen, value head initialised, LoRA (a `peft.LoraConfig`, task_type None) on the language
        model's linear layers when given.

        Raises:
            ValueError: unknown backbone name (lists the available ones).
        """
        spec = get_multimodal_backbone(backbone)
        path = model_name_or_path or spec.default_model
        if path is None:
            raise ValueError(f"backbone {spec.name!r} needs model_name_or_path (a text LM path or hub id)")
        tokenizer, image_processor, feature_extractor = load_processor_parts(path, spec)
        net = spec.load_class().from_pretrained(path, dtype=dtype, trust_remote_code=False, **(model_kwargs or {}))
        vision = (
            VisionPatching.from_image_processor(
                image_processor, min_pixels=video_min_pixels, max_pixels=video_max_pixels
            )
            if spec.sees_video
            else None
        )
        options = media_options or MediaOptions()
        settings = MultimodalRewardSettings(
            backbone=spec.name,
            model_name_or_path=str(path),
            instruction=DEFAULT_MULTIMODAL_INSTRUCTION if instruction is None else instruction,
            max_length=max_length,
            fps=options.fps,
            max_frames=options.max_frames,
            use_audio_in_video=options.use_audio_in_video,
            sampling_rate=options.sampling_rate,
            vision=None if vision is None else asdict(vision),
            train_projector=train_projector,
        )
        model = MultimodalRewardModel(net, spec, use_audio_in_video=settings.interleaved_audio_in_video)
        model.requires_grad_(False)
        model.score.requires_grad_(True)
        if lora_config is not None:
            from peft import get_peft_model

            lora_config = copy.deepcopy(lora_config)
            if lora_config.target_modules is None:
                lora_config.target_modules = lora_target_regex(spec)
            extra = ["score"] + ([f"backbone.model.{p}" for p in spec.projectors] if train_projector else [])
            lora_config.modules_to_save = list(dict.fromkeys([*(lora_config.modules_to_save or []), *extra]))
            model = get_peft_model(model, lora_config)
        else:
            for name, param in model.named_parameters():  # full fine-tuning of the language model
                in_encoder = any(f"backbone.model.{e}." in name for e in spec.encoders)
                in_projector = any(f"backbone.model.{p}." in name for p in spec.projectors)
                if not in_encoder or (train_projector and in_projector):
                    param.requires_grad_(not name.startswith("backbone.lm_head"))
        builder = cls._builder(spec, tokenizer, net.config, settings, vision, feature_extractor, options.media_root)
        return cls(model, builder, settings)

    @staticmethod
    def _builder(spec, tokenizer, config, settings, vision, feature_extractor, media_root=None):
        return RewardPromptBuilder(
            spec,
            tokenizer,
            config,
            settings.media_options(media_root),
            vision=vision,
            feature_extractor=feature_extractor,
            instruction=settings.instruction,
            max_length=settings.max_length,
        )

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, dtype: torch.dtype = torch.float32, media_root: str | None = None
    ) -> MultimodalEmoRewardModel:
        """Load a directory written by `save_pretrained` (adapter + head) or `export_merged` (full weights).

        Raises:
            FileNotFoundError: no `emoreward_multimodal.json` in `directory`.
        """
        from safetensors.torch import load_file
        from transformers import AutoFeatureExtractor, AutoTokenizer

        directory = Path(directory)
        settings = MultimodalRewardSettings.load(directory)
        spec = get_multimodal_backbone(settings.backbone)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        feature_extractor = AutoFeatureExtractor.from_pretrained(directory) if spec.hears_audio else None
        vision = VisionPatching(**settings.vision) if settings.vision else None
        if settings.merged:
            net = spec.load_class().from_pretrained(directory, dtype=dtype, trust_remote_code=False)
            model = MultimodalRewardModel(net, spec, use_audio_in_video=settings.interleaved_audio_in_video)
            model.score.load_state_dict(load_file(str(directory / VALUE_HEAD_FILE)))
        else:
            from peft import PeftModel

            net = spec.load_class().from_pretrained(settings.model_name_or_path, dtype=dtype, trust_remote_code=False)
            module = MultimodalRewardModel(net, spec, use_audio_in_video=settings.interleaved_audio_in_video)
            model = PeftModel.from_pretrained(module, directory)
        model.eval()
        return cls(
            model, cls._builder(spec, tokenizer, net.config, settings, vision, feature_extractor, media_root), settings
        )

    # ------------------------------------------------------------------ scoring
    @property
    def module(self) -> MultimodalRewardModel:
        """The `MultimodalRewardModel` (inside the peft wrapper when LoRA is on; LoRA layers are live in it)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def device(self) -> torch.device:
        return self.module.score.weight.device

    @torch.no_grad()
    def score_descriptions(
        self,
        media: SampleMedia | None,
        subtitle: str | None,
        descriptions: list[str],
        *,
        shared_prefix: bool = True,
        batch_size: int = 16,
        prefix: EncodedPrefix | None = None,
    ) -> np.ndarray:
        """Rewards of several descriptions of ONE sample.

        With `shared_prefix`, the media prefix runs once and every description is scored against its KV cache;
        otherwise every full sequence runs on its own (the reference path). Descriptions are truncated to fit
        `max_length` (the media prefix never is).

        Args:
            media, subtitle: the sample (processed by `builder.encode_prefix`), unless `prefix` is given.
            prefix: the sample's already-processed prefix (`builder.encode_prefix(media, subtitle)`), for callers
                that score the same sample more than once; `media` and `subtitle` are then not read.

        Returns:
            `np.ndarray` of shape `(len(descriptions),)`, float64.
        """
        self.model.eval()
        if prefix is None:
            prefix = self.builder.encode_prefix(media, subtitle)
        n = len(prefix.input_ids)
        suffixes = [self.builder.encode_suffix(d, n, truncate=True)[0] for d in descriptions]
        pad = self.tokenizer.pad_token_id
        if shared_prefix:
            rewards = self.module.score_shared_prefix(
                prefix.input_ids, prefix.media, suffixes, pad_token_id=pad, batch_size=batch_size
            )
            return rewards.float().cpu().numpy().astype(np.float64)
        out = []
        for suffix in suffixes:
            ids, mask = pad_sequences([prefix.input_ids + suffix], pad)
            media_t = {k: v.to(self.device) for k, v in prefix.media.items()}
            out.append(float(self.module(ids.to(self.device), mask.to(self.device), **media_t)))
        return np.array(out, dtype=np.float64)

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Detached copies of every trainable parameter, by name."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ saving
    def _save_processor(self, directory: Path) -> None:
        self.tokenizer.save_pretrained(directory)
        if self.builder.feature_extractor is not None:
            self.builder.feature_extractor.save_pretrained(directory)

    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Write adapter + value head (`adapter_model.safetensors`), tokenizer, feature extractor, settings
        (`emoreward_multimodal.json`, with the video patching parameters) and the model card (README.md)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if hasattr(self.model, "peft_config"):
            self.model.save_pretrained(directory, safe_serialization=True)
        else:  # trained without LoRA: the full backbone + head
            return self._save_full(self.module, directory, model_card)
        self._save_processor(directory)
        self.settings.save(directory)
        (directory / "README.md").write_text(model_card or default_model_card(self.settings))
        return directory

    def _save_full(self, module: MultimodalRewardModel, directory: Path, model_card: str | None) -> Path:
        from safetensors.torch import save_file

        module.backbone.save_pretrained(directory, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in module.score.state_dict().items()}, str(directory / VALUE_HEAD_FILE))
        self._save_processor(directory)
        settings = copy.deepcopy(self.settings)
        settings.merged = True
        settings.save(directory)
        (directory / "README.md").write_text(model_card or default_model_card(settings))
        return directory

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """LoRA merged into the backbone: `<model_class>.from_pretrained(directory)` loads the backbone with no
        missing keys, `value_head.safetensors` holds the head; `from_pretrained(directory)` loads both. The merge
        runs on a copy (this model keeps its adapter)."""
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        return self._save_full(model, Path(directory), model_card)


def default_model_card(settings: MultimodalRewardSettings, *, data: str = "", metrics: str = "") -> str:
    """README.md for a saved model directory: backbone, inputs, data, metrics and intended use."""
    media = {
        "qwen2.5-vl": "video frames",
        "qwen2.5-omni-thinker": "video frames and audio",
        "qwen2-audio": "audio",
        "text": "no media (text only)",
    }[settings.backbone]
    audio_source = "the video's own audio track" if settings.use_audio_in_video else "the sample's .wav file"
    return f"""---
library_name: peft
tags: [emoreward, reward-model, emotion, preference, multimodal]
---
# emoreward multimodal reward model ({settings.backbone})

A scalar reward r(description | media, subtitle) for emotion descriptions: the backbone's decoder plus a value
head `score` (Linear(hidden, 1, bias=False)) read at the last non-pad token. Load it with
`emoreward.models.multimodal.MultimodalEmoRewardModel.from_pretrained(path)`.

- Backbone: `{settings.backbone}` from `{settings.model_name_or_path}`{" (merged weights)" if settings.merged else " (LoRA adapter + value head)"}.
- Inputs: {media}; frames at {settings.fps} fps, at most {settings.max_frames}; audio from {audio_source}; max length {settings.max_length} tokens.
- Tie threshold (three-class verdicts): {settings.tie_threshold:.4g}.
- Data: {data or "see the training report (report.json) next to this directory"}.

{metrics or "Metrics: see report.json / report.md written by the training run."}

Read accuracy beside the length baseline: on EmoPrefer-Data "prefer the longer description" is right on about
80% of two-class pairs.

Intended use: research on emotion-preference evaluation (DMER) and as a reward for RL fine-tuning of emotion
describers. Not for decisions about people. EmoPrefer-Data is CC BY-NC 4.0: non-commercial research only.
"""
