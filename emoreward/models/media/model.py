"""Multimodal emotion reward models (`MediaRewardModel`, kind `"media"`): r(description | video frames, audio,
subtitle) on the registry's media backbones, scoring every description of a sample behind one media prefix.
See docs/multimodal.md.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from emoreward.data.context import subtitle_key
from emoreward.data.media import MediaOptions, SampleMedia, load_sample_media, refuse_unused_media, resolve_paths
from emoreward.models.backbones import BackboneSpec, get_backbone, lora_target_regex
from emoreward.models.base import (
    MediaSettings,
    RewardContext,
    RewardKind,
    RewardModelBase,
    ScoreInfo,
    apply_score_transform,
    check_finite_weights,
    check_model_files,
    load_settings,
)
from emoreward.models.coverage import CoverageScoreInfo, unknown_token_share
from emoreward.models.loading import remember_source
from emoreward.models.media.cache import ENV_VAR as MEDIA_CACHE_ENV
from emoreward.models.media.cache import MediaPrefixCache
from emoreward.models.media.module import ValueHeadModel
from emoreward.models.media.positions import POSITION_RULE
from emoreward.models.media.processing import (
    DEFAULT_MEDIA_INSTRUCTION,
    EncodedPrefix,
    RewardPromptBuilder,
    VisionPatching,
    load_processor_parts,
    pad_sequences,
)
from emoreward.models.precision import dtype_request, resolve_dtype
from emoreward.models.text import save_tokenizer


logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"


class MediaRewardModel(RewardModelBase):
    """A multimodal emotion reward model (`RewardModel`, kind `"media"`).

    Args:
        model: the `ValueHeadModel`, optionally wrapped by peft.
        builder: the prompt builder (official processor, template, length limit).
        settings: the `MediaSettings`.
        media_root: the folder relative media paths (and `video/<sample>.mp4`, `audio/<sample>.wav`) resolve in.
        batch_size: descriptions per forward pass behind a shared prefix.
        media_cache: the processed-prefix cache (`MediaPrefixCache`); default: in memory, plus the folder
            `$EMOREWARD_MEDIA_CACHE` on disk when that is set. None turns caching off."""

    kind: ClassVar[RewardKind] = "media"

    def __init__(
        self,
        model: nn.Module,
        builder: RewardPromptBuilder,
        settings: MediaSettings,
        *,
        media_root: str | None = None,
        batch_size: int = 16,
        media_cache: MediaPrefixCache | None | str = "default",
    ):
        self.model, self.builder, self.settings = model, builder, settings
        self.tokenizer = builder.tokenizer
        self.media_root = media_root
        self.batch_size = batch_size
        if media_cache == "default":
            media_cache = MediaPrefixCache(directory=os.environ.get(MEDIA_CACHE_ENV) or None)
        self.media_cache: MediaPrefixCache | None = media_cache
        self._processing_key: str | None = None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    @property
    def spec(self) -> BackboneSpec:
        return get_backbone(self.settings.backbone)

    @property
    def modalities(self) -> frozenset[str]:
        return self.spec.modalities

    @property
    def options(self) -> MediaOptions:
        """How media is found and decoded (root, fps, frame cap, audio source, sampling rate)."""
        s = self.settings
        return MediaOptions(self.media_root, s.fps, s.max_frames, s.use_audio_in_video, s.sampling_rate)

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
        num_heads: int = 1,
    ) -> MediaRewardModel:
        """A fresh reward model: backbone weights from `model_name_or_path` (default: the family's hub id), encoders
        frozen, value head initialised, LoRA (a `peft.LoraConfig`) on the language model's linear layers when given.

        Raises:
            ValueError: unknown backbone name (lists the available ones) or a text backbone."""
        spec = get_backbone(backbone)
        if spec.kind != "media":
            raise ValueError(f"backbone {spec.name!r} is a text backbone; use TextRewardModel")
        path = model_name_or_path or spec.default_model
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
        settings = MediaSettings(
            backbone=spec.name,
            model_name_or_path=str(path),
            instruction=DEFAULT_MEDIA_INSTRUCTION if instruction is None else instruction,
            max_length=max_length,
            num_heads=num_heads,
            fps=options.fps,
            max_frames=options.max_frames,
            use_audio_in_video=options.use_audio_in_video,
            sampling_rate=options.sampling_rate,
            vision=None if vision is None else asdict(vision),
            train_projector=train_projector,
        )
        model = ValueHeadModel(net, spec, use_audio_in_video=_interleaved(settings), num_heads=num_heads)
        model.requires_grad_(False)
        model.score.requires_grad_(True)
        if lora_config is not None:
            from peft import get_peft_model

            lora_config = copy.deepcopy(lora_config)
            if lora_config.target_modules is None:
                lora_config.target_modules = lora_target_regex(spec)
            extra = ["score"] + ([f"backbone.model.{p}" for p in spec.projectors] if train_projector else [])
            lora_config.modules_to_save = list(dict.fromkeys([*(lora_config.modules_to_save or []), *extra]))
            try:
                model = get_peft_model(model, lora_config)
            except ValueError as err:  # peft: "Target modules ... not found in the base model"
                raise ValueError(f"lora_target_modules={lora_config.target_modules!r}: {err}") from None
        else:
            for name, param in model.named_parameters():  # full fine-tuning of the language model
                in_encoder = any(f"backbone.model.{e}." in name for e in spec.encoders)
                in_projector = any(f"backbone.model.{p}." in name for p in spec.projectors)
                if not in_encoder or (train_projector and in_projector):
                    param.requires_grad_(not name.startswith("backbone.lm_head"))
        builder = _builder(spec, tokenizer, net.config, settings, vision, feature_extractor)
        return cls(model, builder, settings, media_root=options.media_root)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        dtype: str | torch.dtype = "auto",
        media_root: str | None = None,
        batch_size: int = 16,
        media_cache: MediaPrefixCache | None | str = "default",
    ) -> MediaRewardModel:
        """Load a directory written by `save_pretrained` (adapter + head) or `export_merged` (full weights), in `dtype`
        (`"auto"`: `emoreward.models.precision`), relative media paths resolving in `media_root`.

        Raises:
            FileNotFoundError: `directory` is not an emoreward model directory; ValueError: it holds a text model or
            a weights file cut short (`check_model_files`)."""
        from safetensors.torch import load_file
        from transformers import AutoFeatureExtractor, AutoTokenizer

        from emoreward.models.media.export_layout import is_engine_layout, load_engine_layout

        directory = Path(directory)
        pin = dtype_request(dtype)[1]  # what decides the dtype, read with it (`precision_record`)
        dtype = resolve_dtype(dtype, "cpu")
        settings = load_settings(directory)
        if not isinstance(settings, MediaSettings):
            raise ValueError(f"{directory} holds a {settings.kind} reward model; load it with load_reward_model")
        check_model_files(directory, settings)
        spec = get_backbone(settings.backbone)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        feature_extractor = AutoFeatureExtractor.from_pretrained(directory) if spec.hears_audio else None
        vision = VisionPatching(**settings.vision) if settings.vision else None
        interleaved = _interleaved(settings)
        if settings.position_rule != POSITION_RULE:
            raise ValueError(
                f"{directory}: position_rule {settings.position_rule!r} is not the one this version applies "
                f"({POSITION_RULE!r}, emoreward.models.media.positions)"
            )
        if settings.merged and not (directory / VALUE_HEAD_FILE).is_file() and is_engine_layout(directory):
            net, head = load_engine_layout(directory, spec, dtype)  # `emoreward export`'s engine layout
            model = ValueHeadModel(net, spec, use_audio_in_video=interleaved, num_heads=settings.num_heads)
            model.score.load_state_dict({"weight": head})
        elif settings.merged:  # the earlier layout: <model_class> checkpoint + value_head.safetensors
            net = spec.load_class().from_pretrained(directory, dtype=dtype, trust_remote_code=False)
            model = ValueHeadModel(net, spec, use_audio_in_video=interleaved, num_heads=settings.num_heads)
            model.score.load_state_dict(load_file(str(directory / VALUE_HEAD_FILE)))
        else:
            from peft import PeftModel

            net = spec.load_class().from_pretrained(settings.model_name_or_path, dtype=dtype, trust_remote_code=False)
            module = ValueHeadModel(net, spec, use_audio_in_video=interleaved, num_heads=settings.num_heads)
            model = PeftModel.from_pretrained(module, directory)
        model.eval()
        builder = _builder(spec, tokenizer, net.config, settings, vision, feature_extractor)
        loaded = cls(model, builder, settings, media_root=media_root, batch_size=batch_size, media_cache=media_cache)
        loaded.dtype_pin = pin
        check_finite_weights(model, str(directory))  # a diverged or poisoned model is refused at load
        remember_source(loaded, directory)  # its content identity: part of every cache key of its outputs
        return loaded

    # ------------------------------------------------------------------ inputs
    @property
    def module(self) -> ValueHeadModel:
        """The `ValueHeadModel` (inside the peft wrapper when LoRA is on; LoRA layers are live in it)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def device(self) -> torch.device:
        return self.module.score.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.score.weight.dtype

    def context_key(self, context: RewardContext) -> Hashable:
        """Subtitle and media identity. Without a path the media file is `<root>/video/<sample_id>.mp4` (or the
        wav), so the sample id is part of the key; decoded media are keyed by their object identity."""
        if context.decoded is not None:
            return (*subtitle_key(context), "decoded", id(context.decoded))
        return (*subtitle_key(context), context.video, context.audio, context.sample_id)

    def load_media(self, context: RewardContext) -> SampleMedia | None:
        """The decoded media of a context (`context.decoded` when given), or None for a backbone without media.

        Raises:
            MediaError: a needed file is missing, empty or undecodable, or a file the model does not read is named."""
        spec = self.spec
        if not (spec.sees_video or spec.hears_audio):
            return None
        if context.decoded is not None:
            return context.decoded
        sample, ref = context.sample_id or "(no sample id)", context.media_ref()
        refuse_unused_media(sample, ref, self.options, need_video=spec.sees_video, need_audio=spec.hears_audio)
        return load_sample_media(sample, ref, self.options, need_video=spec.sees_video, need_audio=spec.hears_audio)

    def processing_key(self) -> str:
        """Everything besides the media files and the subtitle that a processed prefix depends on (part of the media
        cache key)."""
        if self._processing_key is None:
            import transformers

            s, tok, fe = self.settings, self.tokenizer, self.builder.feature_extractor
            self._processing_key = json.dumps(
                [
                    s.backbone, s.fps, s.max_frames, s.use_audio_in_video, s.sampling_rate, s.vision, s.instruction,
                    tok.name_or_path, len(tok), tok.chat_template, fe.to_json_string() if fe is not None else None,
                    transformers.__version__,
                ],
                sort_keys=True,
                default=str,
            )  # fmt: skip
        return self._processing_key

    def encode_prefix(self, context: RewardContext) -> EncodedPrefix:
        """Token ids and media tensors of a context's prefix, reused from `media_cache` when processed before.

        Raises:
            MediaError: unreadable media; ValueError: the processor rejects the inputs."""
        spec = self.spec
        cache = self.media_cache
        if cache is None or context.decoded is not None or not (spec.sees_video or spec.hears_audio):
            return self.builder.encode_prefix(self.load_media(context), context.subtitle)
        sample, ref = context.sample_id or "(no sample id)", context.media_ref()
        refuse_unused_media(sample, ref, self.options, need_video=spec.sees_video, need_audio=spec.hears_audio)
        video, audio = resolve_paths(
            sample, ref, self.options, need_video=spec.sees_video, need_audio=spec.hears_audio
        )
        key = cache.key([video, audio], self.processing_key(), context.subtitle)
        prefix = cache.get(key)
        if prefix is None:
            prefix = self.builder.encode_prefix(self.load_media(context), context.subtitle)
            cache.put(key, prefix)
        return prefix

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score_prefix(
        self,
        prefix: EncodedPrefix,
        descriptions: Sequence[str],
        *,
        shared_prefix: bool = True,
        batch_size: int | None = None,
    ) -> ScoreInfo:
        """Raw value-head rewards of several descriptions behind one encoded prefix: with `shared_prefix` the prefix runs
        once and every description continues its KV cache, else (and for `BackboneSpec.no_shared_prefix`) every full
        sequence runs on its own. Descriptions are cut to fit `max_length` (the prefix never is) and flagged."""
        self.model.eval()
        n = len(prefix.input_ids)
        encoded = [self.builder.encode_suffix(d, n, truncate=True) for d in descriptions]
        suffixes = [ids for ids, _ in encoded]
        truncated = np.array([cut for _, cut in encoded], dtype=bool)
        n_tokens = np.array([n + len(s) for s in suffixes], dtype=np.int64)
        pad = self.tokenizer.pad_token_id
        if shared_prefix and not self.spec.no_shared_prefix:  # else every full sequence on its own (spec's reason)
            rewards = self.module.score_shared_prefix(
                prefix.input_ids, prefix.media, suffixes, pad_token_id=pad, batch_size=batch_size or self.batch_size
            )
            return ScoreInfo(rewards.float().cpu().numpy().astype(np.float64), truncated, n_tokens)
        out = []
        media = {k: v.to(self.device) for k, v in prefix.media.items()}
        for suffix in suffixes:
            ids, mask = pad_sequences([prefix.input_ids + suffix], pad)
            out.append(float(self.module(ids.to(self.device), mask.to(self.device), **media)[0, 0]))
        return ScoreInfo(np.array(out, dtype=np.float64), truncated, n_tokens)

    def score_contexts(
        self,
        descriptions: list[str],
        contexts: list[RewardContext],
        *,
        batch_size: int | None = None,
        shared_prefix: bool = True,
    ) -> CoverageScoreInfo:
        """Rewards r(description | media, subtitle) (`RewardModelBase.score_info` calls this), with truncation flags
        and token counts; descriptions are grouped by sample and scored behind one prefix per sample (a backbone that
        needs media fails on a context without them).

        Args:
            batch_size: descriptions per forward pass behind a prefix.
            shared_prefix: False runs every full sequence on its own (the reference path; same rewards).

        Returns:
            `CoverageScoreInfo` with rewards of shape `(N,)`, float64 (the settings' `score_transform` applied).

        Raises:
            MediaError: a sample's media cannot be read (names sample and file)."""
        groups: dict[Hashable, list[int]] = {}
        for i, ctx in enumerate(contexts):
            groups.setdefault(self.context_key(ctx), []).append(i)
        rewards = np.empty(len(descriptions), dtype=np.float64)
        truncated = np.zeros(len(descriptions), dtype=bool)
        n_tokens = np.zeros(len(descriptions), dtype=np.int64)
        for idx in groups.values():
            prefix = self.encode_prefix(contexts[idx[0]])
            part = self.score_prefix(
                prefix, [descriptions[i] for i in idx], shared_prefix=shared_prefix, batch_size=batch_size
            )
            rewards[idx], truncated[idx], n_tokens[idx] = part.rewards, part.truncated, part.n_tokens
        rewards = apply_score_transform(rewards, [len(d) for d in descriptions], self.settings.score_transform)
        return CoverageScoreInfo(rewards, truncated, n_tokens, unknown_token_share(self.tokenizer, descriptions))

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Detached copies of every trainable parameter, by name."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ saving
    def _save_processor(self, directory: Path) -> None:
        save_tokenizer(self.tokenizer, directory, max_length=self.settings.max_length)
        if self.builder.feature_extractor is not None:
            self.builder.feature_extractor.save_pretrained(directory)

    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """Write adapter + value head (`adapter_model.safetensors`), tokenizer, feature extractor, settings (`emoreward_config.json`, with the video patching parameters) and the model card (README.md).
        A model trained without LoRA is saved whole (as `export_merged` writes it)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not hasattr(self.model, "peft_config"):  # trained without LoRA: the full backbone + head
            return self._save_full(self.module, directory, model_card)
        self.model.save_pretrained(directory, safe_serialization=True)
        self._save_processor(directory)
        self.settings.save(directory)
        if model_card:
            (directory / "README.md").write_text(model_card, encoding="utf-8")
        return directory

    def _save_full(self, module: ValueHeadModel, directory: Path, model_card: str | None) -> Path:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        module.backbone.save_pretrained(directory, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in module.score.state_dict().items()}, str(directory / VALUE_HEAD_FILE))
        self._save_processor(directory)
        settings = copy.deepcopy(self.settings)
        settings.merged = True
        settings.save(directory)
        if model_card:
            (directory / "README.md").write_text(model_card, encoding="utf-8")
        return directory

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        """LoRA merged into a copy of the backbone, written in the engine layout (`emoreward.models.media.export_layout`);
        `load_reward_model(directory)` loads it back."""
        from emoreward.models.media.export_layout import request_spec, write_media_export

        request = None if self.spec.native_classifier else request_spec(self)  # native: no engine request file
        return write_media_export(self, Path(directory), model_card=model_card, request=request)


def _interleaved(settings: MediaSettings) -> bool:
    """The video's audio is interleaved with its frames (Qwen2.5-Omni with `use_audio_in_video`)."""
    return settings.use_audio_in_video and get_backbone(settings.backbone).interleaves_audio_in_video


def _builder(spec, tokenizer, config, settings: MediaSettings, vision, feature_extractor) -> RewardPromptBuilder:
    return RewardPromptBuilder(
        spec,
        tokenizer,
        config,
        MediaOptions(None, settings.fps, settings.max_frames, settings.use_audio_in_video, settings.sampling_rate),
        vision=vision,
        feature_extractor=feature_extractor,
        instruction=settings.instruction,
        max_length=settings.max_length,
    )


__all__ = ["VALUE_HEAD_FILE", "MediaRewardModel"]
