"""Local MLLM judges through their transformers processors: Qwen2.5-Omni (thinker only), Qwen2.5-VL, Qwen2-Audio.

The audio track of a video is used or not according to ONE flag, `use_audio_in_video` (judge YAML, `mllm`
section). The backend reads it in one place (`MultimodalBackend.__init__`) and derives from it what media
extraction decodes, what the processor is told (`load_audio_from_video`), what the model is told
(`use_audio_in_video`) and what the prompt says the model gets. After processing, the number of audio and
video placeholder tokens is checked against what was extracted: a mismatch between media extraction and
processor is an error, never a silently deaf or blind judge.

| family                 | model class                                    | video frames | audio file | video's audio track |
|------------------------|------------------------------------------------|--------------|------------|---------------------|
| `qwen2.5-omni-thinker` | `Qwen2_5OmniThinkerForConditionalGeneration`   | yes          | yes        | if the flag is set  |
| `qwen2.5-vl`           | `Qwen2_5_VLForConditionalGeneration`           | yes          | no         | never (flag must be false) |
| `qwen2-audio`          | `Qwen2AudioForConditionalGeneration`           | no           | yes        | if the flag is set (its only use of a video) |
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from zero_shot.backends.base import ChatRequest, Generation, MediaInput, SamplingConfig, build_messages
from zero_shot.backends.hf_common import pick_device, pick_dtype, resolve_model_path, timed_generate
from zero_shot.backends.media import MediaError, load_audio, load_video_frames


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    model_class: str
    sees_video: bool
    hears_audio: bool
    audio_in_video: bool  # can interleave a video's audio track with its frames


FAMILIES: dict[str, Family] = {
    "qwen2.5-omni-thinker": Family("Qwen2_5OmniThinkerForConditionalGeneration", True, True, True),
    "qwen2.5-vl": Family("Qwen2_5_VLForConditionalGeneration", True, False, False),
    "qwen2-audio": Family("Qwen2AudioForConditionalGeneration", False, True, False),
}


@dataclass
class _Prepared:
    frames: np.ndarray | None
    fps: float | None
    audio: np.ndarray | None
    audio_from_video: bool


class MultimodalBackend:
    """A local MLLM judge.

    Args:
        family: one of `FAMILIES`.
        model: the loaded model (e.g. from `from_pretrained`, or a tiny random-weight one in tests).
        processor: its processor (tokenizer + image/video processor and/or feature extractor, chat template).
        use_audio_in_video: THE flag (see the module docstring).
        identity: names the weights and settings (cache input hash).
        fps, max_frames: video frame sampling.
        batch_size: requests per `generate` call.

    Raises:
        ValueError: unknown family; the flag set for a family that cannot hear (`qwen2.5-vl`).
    """

    def __init__(
        self,
        family: str,
        model,
        processor,
        *,
        use_audio_in_video: bool,
        identity: str,
        fps: float = 2.0,
        max_frames: int = 16,
        batch_size: int = 1,
    ):
        if family not in FAMILIES:
            raise ValueError(f"unknown MLLM family {family!r}; available: {sorted(FAMILIES)}")
        self.family = family
        self.spec = FAMILIES[family]
        if use_audio_in_video and not self.spec.hears_audio:
            raise ValueError(f"{family} cannot hear: use_audio_in_video must be false for it")
        self.use_audio_in_video = use_audio_in_video
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.identity = f"{identity}:audio_in_video={use_audio_in_video}:fps={fps}:max_frames={max_frames}"
        self.fps = fps
        self.max_frames = max_frames
        self.batch_size = batch_size
        kinds = {"text"} | ({"video"} if self.spec.sees_video or use_audio_in_video else set())
        self.modalities = frozenset(kinds | ({"audio"} if self.spec.hears_audio else set()))
        self.sampling_rate = getattr(getattr(processor, "feature_extractor", None), "sampling_rate", 16000)

    @classmethod
    def from_pretrained(cls, cfg) -> MultimodalBackend:
        """Load model and processor from the hub or a local folder (`cfg`: `zero_shot.config.ModelConfig`)."""
        import transformers
        from transformers import AutoProcessor

        spec = FAMILIES[cfg.family]
        path = resolve_model_path(cfg.model)
        device = pick_device(cfg.device)
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
        model_cls = getattr(transformers, spec.model_class)
        model = model_cls.from_pretrained(
            path, dtype=pick_dtype(cfg.dtype, device), trust_remote_code=cfg.trust_remote_code
        ).to(device)
        return cls(
            cfg.family,
            model,
            processor,
            use_audio_in_video=cfg.use_audio_in_video,
            identity=f"mllm:{cfg.family}:{cfg.model}:{cfg.dtype}",
            fps=cfg.fps,
            max_frames=cfg.max_frames,
            batch_size=cfg.batch_size,
        )

    # ------------------------------------------------------------------ media
    def media_kind(self, media: MediaInput) -> str:
        """What the prompt tells the model it gets (`video`, `video_frames`, `audio`).

        Raises:
            MediaError: the sample has no media this family can use under the flag.
        """
        has_video = media.video is not None or media.frames is not None
        has_audio = media.audio is not None or media.waveform is not None
        if self.spec.sees_video and has_video:
            return "video" if self.use_audio_in_video else "video_frames"
        if self.spec.hears_audio and (has_audio or (has_video and self.use_audio_in_video)):
            return "audio"
        raise MediaError(
            f"{self.family} cannot use the media of this sample (video={has_video}, audio file={has_audio}, "
            f"use_audio_in_video={self.use_audio_in_video})"
        )

    def _prepare(self, media: MediaInput | None) -> _Prepared:
        if media is None or not media.kinds():
            return _Prepared(None, None, None, False)
        kind = self.media_kind(media)
        frames = fps = audio = None
        from_video = False
        if kind in ("video", "video_frames"):
            if media.frames is not None:
                frames, fps = np.asarray(media.frames, dtype=np.uint8), self.fps
            else:
                frames, fps = load_video_frames(media.video, self.fps, self.max_frames)
        if kind == "video":  # the flag is on: the video's audio track is interleaved with its frames
            audio, from_video = self._audio(media, prefer_file=True), True
        elif kind == "audio":
            audio = self._audio(media, prefer_file=True)
        return _Prepared(frames, fps, audio, from_video)

    def _audio(self, media: MediaInput, prefer_file: bool) -> np.ndarray:
        if media.waveform is not None:
            return np.asarray(media.waveform, dtype=np.float32)
        if media.audio is not None and prefer_file:
            return load_audio(media.audio, self.sampling_rate)
        if media.video is not None:
            return load_audio(media.video, self.sampling_rate)  # MediaError if the video has no audio stream
        raise MediaError("no audio for this sample")

    # ------------------------------------------------------------------ processing
    def _messages(self, request: ChatRequest, prep: _Prepared) -> list[dict]:
        parts = []
        if prep.frames is not None:
            parts.append({"type": "video", "video": "<frames>"})
        if prep.audio is not None and not (prep.audio_from_video and self.family == "qwen2.5-omni-thinker"):
            parts.append({"type": "audio", "audio": "<waveform>", "audio_url": "<waveform>"})
        return build_messages(request, parts or None)

    def _inputs(self, requests: list[ChatRequest], preps: list[_Prepared]) -> dict:
        texts = [
            self.processor.apply_chat_template(self._messages(r, p), tokenize=False, add_generation_prompt=True)
            for r, p in zip(requests, preps)
        ]
        videos = [p.frames for p in preps if p.frames is not None]
        audios = [p.audio for p in preps if p.audio is not None]
        kwargs: dict = {"text": texts, "return_tensors": "pt", "padding": True}
        if videos:
            kwargs["videos"] = videos
            kwargs["videos_kwargs"] = {"do_sample_frames": False}
        if audios:
            kwargs["audio"] = audios
            kwargs["sampling_rate"] = self.sampling_rate
        if self.family == "qwen2.5-omni-thinker":
            kwargs["load_audio_from_video"] = self.use_audio_in_video and bool(videos)
            if kwargs["load_audio_from_video"]:
                kwargs["audio_from_video_indices"] = self._audio_slots(preps)
        inputs = self.processor(**kwargs)
        self._check_tokens(inputs["input_ids"], preps)
        return inputs

    @staticmethod
    def _audio_slots(preps: list[_Prepared]) -> list[int | None]:
        slots, video_idx = [], 0
        for p in preps:
            if p.frames is not None:
                if p.audio is not None:
                    slots.append(video_idx)
                video_idx += 1
            elif p.audio is not None:
                slots.append(None)
        return slots

    def _token_id(self, *names: str) -> int | None:
        for name in names:
            value = getattr(self.processor, name, None)
            if isinstance(value, int):
                return value
            if isinstance(value, str):
                tid = self.tokenizer.convert_tokens_to_ids(value)
                if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                    return tid
        return None

    def _check_tokens(self, input_ids: torch.Tensor, preps: list[_Prepared]) -> None:
        """Media extraction and processor must agree: audio / video placeholders present iff extracted."""
        audio_id = self._token_id("audio_token_id", "audio_token")
        video_id = self._token_id("video_token_id", "video_token")
        for row, prep in zip(input_ids, preps):
            if video_id is not None:
                n_video = int((row == video_id).sum())
                if (prep.frames is not None) != (n_video > 0):
                    raise MediaError(
                        f"{self.family}: {len(prep.frames) if prep.frames is not None else 0} frames extracted but "
                        f"{n_video} video tokens after processing (processor and media extraction disagree)"
                    )
            if audio_id is not None:
                n_audio = int((row == audio_id).sum())
                if (prep.audio is not None) != (n_audio > 0):
                    raise MediaError(
                        f"{self.family}: audio {'extracted' if prep.audio is not None else 'not extracted'} "
                        f"(use_audio_in_video={self.use_audio_in_video}) but {n_audio} audio tokens after processing"
                    )

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            out.extend(self._batch(requests[start : start + self.batch_size], sampling))
        return out

    def _batch(self, batch: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        if any(r.score_labels for r in batch):
            return [Generation(error="logit-based verdicts are implemented for text backends only") for _ in batch]
        try:
            preps = [self._prepare(r.media) for r in batch]
            inputs = self._inputs(batch, preps)
        except MediaError as err:
            if len(batch) > 1:  # isolate the sample at fault
                return [g for r in batch for g in self._batch([r], sampling)]
            return [Generation(error=f"MediaError: {err}")]
        inputs = {k: (v.to(self.model.device) if hasattr(v, "to") else v) for k, v in inputs.items()}
        for key in ("pixel_values_videos", "input_features", "pixel_values"):
            if key in inputs and torch.is_floating_point(inputs[key]):
                inputs[key] = inputs[key].to(self.model.dtype)
        if self.family == "qwen2.5-omni-thinker":
            inputs["use_audio_in_video"] = any(p.audio_from_video for p in preps)
        try:
            new, prefill, decode = timed_generate(
                self.model, inputs, sampling, batch[0].seed, self.tokenizer.pad_token_id
            )
        except Exception as err:  # noqa: BLE001 - a failed batch becomes failed calls, counted by the runner
            logger.warning("MLLM generation failed for %d requests: %s", len(batch), err)
            return [Generation(error=f"{type(err).__name__}: {err}") for _ in batch]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return [
            Generation(
                text=t.strip(),
                completion_tokens=int(len(row)),
                prefill_s=prefill / len(batch),
                decode_s=decode / len(batch),
            )
            for t, row in zip(texts, new)
        ]
