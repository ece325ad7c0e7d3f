"""Inputs of multimodal reward models: (media, subtitle, description) -> token ids and media tensors through the
backbone's official `transformers` processor; `SampledFramesVideoProcessor` replaces the torchvision video
processor with the same official layout. `RewardPromptBuilder` lays out every sequence. See docs/multimodal.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2_5_VLProcessor, Qwen2_5OmniProcessor, Qwen2AudioProcessor, Qwen3VLProcessor
from transformers.video_processing_utils import VideoProcessorMixin

from emoreward.data.media import MediaOptions, SampleMedia
from emoreward.data.text import normal_text
from emoreward.models.backbones import BackboneSpec
from emoreward.models.layout import context_text


_MEDIA = "\u2063EMOREWARD_MEDIA\u2063"
_DESCRIPTION = "\u2063EMOREWARD_DESCRIPTION\u2063"

DEFAULT_MEDIA_INSTRUCTION = (
    "Describe the emotional state of the person in this clip: facial expression, voice, words, intensity and "
    "how it changes over time."
)


@dataclass
class VisionPatching:
    """Qwen2-VL video processing parameters (from the backbone's image processor config, saved with a model):
    `min_pixels` / `max_pixels` bound every resized frame's area; the rest are patch geometry and normalisation."""

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
    """Qwen2-VL video processing of frames that `emoreward.data.media` already sampled, without torchvision (which
    transformers' `Qwen2VLVideoProcessor` imports): every frame goes through the official
    `Qwen2VLImageProcessorPil`, and consecutive frames are stacked into temporal patches in the order of
    `Qwen2VLVideoProcessor.patchify` (tests compare both with the official code). The one known difference is the
    resize kernel (PIL's bicubic, not torchvision's antialiased bicubic). Used as the official processors'
    `video_processor` (`official_processor`).

    Args:
        image_processor: a `Qwen2VLImageProcessorPil` (its patch geometry, normalisation and size are used)."""

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
            fps: the rate the frames were sampled at (the metadata's `sampled_fps`, giving temporal positions).
            size: `{"shortest_edge": min_pixels, "longest_edge": max_pixels}` (default: the image processor's).
            return_metadata: also return `video_metadata` (a `VideoMetadata` per video).

        Returns:
            `BatchFeature` with `pixel_values_videos` (shape `(sum of grid_t * grid_h * grid_w, 3 * temporal_patch *
            patch * patch)`), `video_grid_thw` (shape `(num_videos, 3)`) and, with `return_metadata`, `video_metadata`.

        Raises:
            ValueError: no `fps`, a video that is not `(T, H, W, 3)` uint8, or an option not implemented here."""
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
    """Mixin for an official processor class whose constructor must accept any `VideoProcessorMixin` as its video
    processor (the registry transformers checks against is empty without torchvision)."""

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


class Qwen3VLFramesProcessor(_AcceptsAnyVideoProcessor, Qwen3VLProcessor):
    """`transformers.Qwen3VLProcessor` (Qwen3.5) taking a `SampledFramesVideoProcessor`: its per-frame timestamps
    (`<t seconds>` before every temporal patch) come from the sampled frames' metadata (indices at `fps`)."""


_PROCESSORS = {
    "Qwen2_5_VLProcessor": Qwen2_5_VLFramesProcessor,
    "Qwen3VLProcessor": Qwen3VLFramesProcessor,
    "Qwen2_5OmniProcessor": Qwen2_5OmniFramesProcessor,
    "Qwen2AudioProcessor": Qwen2AudioProcessor,
}
_OMNI_TOKEN_NAMES = (
    "image_token", "video_token", "audio_token", "vision_bos_token", "vision_eos_token", "audio_bos_token",
    "audio_eos_token",
)  # fmt: skip


def official_processor(spec: BackboneSpec, tokenizer, image_processor=None, feature_extractor=None):
    """The backbone's official `transformers` processor (`spec.processor_class`), with `SampledFramesVideoProcessor`
    as its video processor for video backbones.

    Args:
        tokenizer: the checkpoint's tokenizer (Qwen2.5-Omni's must name its media tokens, as the release ships it).
        image_processor: a `Qwen2VLImageProcessorPil` (video backbones).
        feature_extractor: a `WhisperFeatureExtractor` (audio backbones).

    Returns:
        the processor, or None for a text backbone.

    Raises:
        ValueError: a Qwen2.5-Omni tokenizer without its media token names, or a missing part."""
    if spec.processor_class is None:
        return None
    cls = _PROCESSORS[spec.processor_class]
    if spec.sees_video and image_processor is None:
        raise ValueError(f"{spec.name} sees video: it needs its image processor")
    if spec.hears_audio and feature_extractor is None:
        raise ValueError(f"{spec.name} hears audio: it needs its feature extractor")
    if cls in (Qwen2_5_VLFramesProcessor, Qwen3VLFramesProcessor):
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
    scoring, through the backbone's official processor.

    Layout of one sequence (the tokenizer's own chat template; ChatML without one)::

        <|im_start|>user\\n [media spans] {instruction}\\nSubtitle: ... <|im_end|>\\n<|im_start|>assistant\\n
        {description}<|im_end|>
        '---------------------- prefix (never truncated) ------------------------------'--- suffix ---'

    The sequence ends at the assistant turn's end-of-turn token (where a generated response ends), as for the text
    models (`emoreward.models.text.text_input_ids`). Media spans, as the official processors expand them:

    - Qwen2.5-VL: `<|vision_start|><|video_pad|>*N<|vision_end|>`.
    - Qwen2.5-Omni, audio from a separate file: `<|vision_bos|><|VIDEO|>*N<|vision_eos|>` then
      `<|audio_bos|><|AUDIO|>*K<|audio_eos|>`.
    - Qwen2.5-Omni with `use_audio_in_video` (the video's own track): one span
      `<|vision_bos|><|audio_bos|> V..V A..A V..V A..A ... <|audio_eos|><|vision_eos|>`, video and audio tokens
      interleaved in chunks of `seconds_per_chunk` seconds (TMRoPE, Qwen2.5-Omni report, section 2.2).
    - Qwen2-Audio: `<|audio_bos|><|AUDIO|>*K<|audio_eos|>`.

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
        spec: BackboneSpec,
        tokenizer,
        model_config,
        media_options: MediaOptions,
        *,
        vision: VisionPatching | None = None,
        feature_extractor=None,
        instruction: str = DEFAULT_MEDIA_INSTRUCTION,
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
        return self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"] if text else []  # cut by us

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
            # the sequence ends at the end-of-turn token (the template's newline after it is not read)
            self._templates[context] = (head, middle, tail.rstrip())
        return self._templates[context]

    def context(self, subtitle: str | None) -> str:
        """The text the description is conditioned on: the one layout of text models (`context_text`)."""
        return context_text(self.instruction, subtitle)

    def video_placeholder(self) -> str:
        """The unexpanded video span as the backbone's official chat template writes it (the processor expands the
        video token): Qwen2.5-VL and Qwen3.5 `<|vision_start|><|video_pad|><|vision_end|>` (markers from the model
        config), Qwen2.5-Omni `<|vision_bos|><|VIDEO|><|vision_eos|>`."""
        proc = self.processor
        if self.spec.name in ("qwen2.5-vl", "qwen3.5"):
            start, end = (self.tokenizer.convert_ids_to_tokens(int(getattr(self.config, a)))
                          for a in ("vision_start_token_id", "vision_end_token_id"))  # fmt: skip
        else:
            start, end = proc.vision_bos_token, proc.vision_eos_token
        return start + proc.video_token + end

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
            text += self.video_placeholder()
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
        """Token ids and media tensors of the prefix (layout: `RewardPromptBuilder`).

        Raises:
            ValueError: the backbone needs media that `media` lacks, or the processor rejects the inputs."""
        head, middle, _ = self._template(self.context(subtitle))
        if self.processor is None:
            return EncodedPrefix(self._ids(head) + self._ids(middle), {}, 0)
        placeholders, kwargs = self._placeholders_and_inputs(media)
        # truncation off: a media span is never cut (a tokenizer's own max_length must not apply either)
        text_kwargs = {"add_special_tokens": False, "truncation": False, "verbose": False}
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
        """Token ids of the description and the closing template tokens, and whether the description (only it) was cut
        to fit `max_length` after `prefix_length` tokens.

        Raises:
            ValueError: the prefix and the closing tokens alone leave no room for a description token."""
        tail = self._ids(self._template("")[2])
        body = self._ids(normal_text(description))  # one text, one reward, whatever its Unicode form
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


def load_processor_parts(path: str | Path, spec: BackboneSpec):
    """(tokenizer, image processor or None, feature extractor or None) of a checkpoint, as `official_processor` takes
    them (`AutoProcessor` would load the torchvision video processor); no remote code."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = AutoImageProcessor.from_pretrained(path) if spec.sees_video else None
    feature_extractor = AutoFeatureExtractor.from_pretrained(path) if spec.hears_audio else None
    return tokenizer, image_processor, feature_extractor
