"""Local MLLM judges through their transformers processors: Qwen2.5-Omni (thinker only), Qwen2.5-VL, Qwen2-Audio,
Qwen3.5 (the backbone registry's classes); answers generated, or logit verdicts (`verdict_sequences`: also the text
a trained judge learns on, `emoreward.training.judge`).

Which media a judge gets is the reward models' rule (`emoreward.data.media.resolve_paths`, `RewardPromptBuilder`),
applied through `zero_shot.media.plan_media` and ONE flag, `use_audio_in_video` (judge YAML, `mllm` section);
`MultimodalBackend` says what each family reads. A sample without the file the flag asks for is a `MediaError`,
not a deaf judge. Processors (`load_processor`): `AutoProcessor` where torchvision is installed; without it the
video families get their official processor classes with the reward models' torchvision-free video processor
(`emoreward.models.media.SampledFramesVideoProcessor`). See docs/judges.md and docs/multimodal.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from emoreward.data.media import MediaError, MediaOptions, load_audio, load_frames
from zero_shot.backends.base import ChatRequest, Generation, MediaInput, SamplingConfig, build_messages
from zero_shot.backends.hf_common import (
    label_continuations,
    pick_device,
    pick_dtype,
    resolve_model_path,
    shared_reads,
    timed_generate,
    weights_precision,
)
from zero_shot.media import plan_media
from zero_shot.parsing import verdict_from_logits


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    model_class: str
    sees_video: bool
    hears_audio: bool
    audio_in_video: bool  # interleaves a video's audio track with its frames (one video span)


def _families() -> dict[str, Family]:
    """Every media backbone of the reward-model registry as a judge family (one source for classes and modalities)."""
    from emoreward.models.backbones import BACKBONES

    return {
        name: Family(spec.model_class, spec.sees_video, spec.hears_audio, spec.interleaves_audio_in_video)
        for name, spec in BACKBONES.items()
        if spec.kind == "media"
    }


FAMILIES: dict[str, Family] = _families()


def check_family(family: str, use_audio_in_video: bool) -> Family:
    """The family's entry.

    Raises:
        ValueError: unknown family (lists the available ones); the flag set for a family that cannot hear.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown MLLM family {family!r}; available: {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    if use_audio_in_video and not spec.hears_audio:
        raise ValueError(f"{family} cannot hear: use_audio_in_video must be false for it")
    return spec


def mllm_identity(
    base: str,
    *,
    use_audio_in_video: bool,
    fps: float,
    max_frames: int,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> str:
    """The backend identity (part of every cache input hash): weights plus the media settings that change inputs.

    Computed without loading anything, so a fully cached run can check its cache before a model is loaded.
    """
    identity = f"{base}:audio_in_video={use_audio_in_video}:fps={fps}:max_frames={max_frames}"
    if min_pixels is not None or max_pixels is not None:
        identity += f":pixels={min_pixels}-{max_pixels}"
    return identity


def family_modalities(family: str, use_audio_in_video: bool) -> frozenset[str]:
    """What a family's judge takes: text, plus `video` (frames, or the video's track for an audio model with the
    flag) and `audio`."""
    spec = check_family(family, use_audio_in_video)
    kinds = {"text"} | ({"video"} if spec.sees_video or use_audio_in_video else set())
    return frozenset(kinds | ({"audio"} if spec.hears_audio else set()))


def select_media_kind(family: str, use_audio_in_video: bool, media: MediaInput) -> str:
    """What a `family` model gets of a sample's media under the flag, as the prompt names it: `video` (frames and
    sound: the video's own track with the flag, else the `.wav`), `video_frames` (frames only) or `audio`
    (`zero_shot.media.plan_media`, the reward models' rule; no file is opened here).

    Raises:
        MediaError: the sample lacks media this family needs under the flag (names the sample and the files).
    """
    spec = check_family(family, use_audio_in_video)
    return plan_media(
        media,
        sees_video=spec.sees_video,
        hears_audio=spec.hears_audio,
        use_audio_in_video=use_audio_in_video,
        check_files=False,
    ).kind


def load_processor(path: str, family: str, *, trust_remote_code: bool = False):
    """The processor of a checkpoint folder or hub id.

    `AutoProcessor` where torchvision is installed or the family takes no video. Otherwise the family's official
    processor class (`emoreward.models.media.official_processor`) with the checkpoint's own tokenizer,
    `Qwen2VLImageProcessorPil`, Whisper feature extractor and chat template, and the torchvision-free
    `SampledFramesVideoProcessor` (official PIL image-processor code on each sampled frame) as video processor.
    """
    from transformers import AutoProcessor, AutoTokenizer, Qwen2VLImageProcessorPil, WhisperFeatureExtractor
    from transformers.processing_utils import ProcessorMixin
    from transformers.utils import is_torchvision_available

    spec = FAMILIES[family]
    if not spec.sees_video or is_torchvision_available():
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    from emoreward.models.backbones import get_backbone
    from emoreward.models.media import official_processor

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    processor = official_processor(
        get_backbone(family),
        tokenizer,
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(path),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(path) if spec.hears_audio else None,
    )
    processor_dict, _ = ProcessorMixin.get_processor_dict(path)  # chat_template.jinja / .json, as from_pretrained
    processor.chat_template = processor_dict.get("chat_template") or tokenizer.chat_template
    return processor


def save_processor(processor, directory) -> None:
    """Write `processor` where `load_processor(directory, family)` reads it back (a trained judge's folder):
    `save_pretrained` where torchvision is installed; without it (the torchvision-free video processor has no file
    form) the parts `load_processor` reads: the tokenizer, one `preprocessor_config.json` holding the image
    processor and the Whisper feature extractor, as the releases ship it, and the processor's chat template."""
    import json
    from pathlib import Path

    from transformers.utils import is_torchvision_available

    directory = Path(directory)
    if is_torchvision_available():
        processor.save_pretrained(directory)
        return
    processor.tokenizer.save_pretrained(directory)
    data: dict = {}
    for part in (getattr(processor, "image_processor", None), getattr(processor, "feature_extractor", None)):
        if part is not None:
            part.save_pretrained(directory)
            data.update(json.loads((directory / "preprocessor_config.json").read_text(encoding="utf-8")))
    if data:
        (directory / "preprocessor_config.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if processor.chat_template:
        (directory / "chat_template.jinja").write_text(processor.chat_template, encoding="utf-8")


@dataclass
class _Prepared:
    sample: str
    frames: np.ndarray | None
    fps: float | None
    audio: np.ndarray | None
    audio_from_video: bool  # Omni with the flag: the audio is the video's track, interleaved with its frames
    files: str | None  # the media files, for error messages


class MultimodalBackend:
    """A local MLLM judge.

    The audio track of a video is used or not according to ONE flag, `use_audio_in_video`, held in
    `self.media` (an `emoreward.data.media.MediaOptions`, the options object the reward models use). Everything
    else is derived from it: what media extraction decodes (`emoreward.data.media.load_frames` / `load_audio`),
    what the processor is told (`load_audio_from_video`), what the model is told and what the prompt says the model
    gets (`select_media_kind`). After processing, the audio and video placeholder tokens are checked against what
    was extracted: a mismatch is a `MediaError` naming the sample and the file, never a silently deaf or blind judge.

    | family                 | video frames | audio file              | video's audio track                           |
    |------------------------|--------------|-------------------------|-----------------------------------------------|
    | `qwen2.5-omni-thinker` | yes          | flag off (its own span) | flag on (interleaved with the frames, TMRoPE) |
    | `qwen2.5-vl`           | yes          | no                      | never (flag must be false)                    |
    | `qwen2-audio`          | no           | flag off                | flag on (instead of the audio file)           |
    | `qwen3.5`              | yes          | no                      | never (flag must be false)                    |

    Frames come sampled by `load_frames`; their effective rate reaches the processor as `fps` and
    `video_metadata`, from which Qwen2.5-VL derives `second_per_grid_ts` and Qwen2.5-Omni `video_second_per_grid`
    (temporal positions). A processor call takes one rate, so a batch whose clips were sampled at different rates
    is processed clip by clip.

    Args:
        family: one of `FAMILIES`.
        model: the loaded model (e.g. from `from_pretrained`, or a tiny random-weight one in tests).
        processor: its processor (tokenizer + image/video processor and/or feature extractor, chat template).
        use_audio_in_video: THE flag (above).
        identity: names the weights (cache input hash); the media settings are appended (`mllm_identity`).
        fps, max_frames: video frame sampling (`emoreward.data.media.load_frames`).
        min_pixels, max_pixels: resized frame area bounds passed to the video processor (`size`); None keeps the
            processor's defaults. Give both or neither.
        batch_size: requests per `generate` call.

    Raises:
        ValueError: unknown family; the flag set for a family that cannot hear (`qwen2.5-vl`); one pixel bound only.
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
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        batch_size: int = 1,
    ):
        self.spec = check_family(family, use_audio_in_video)
        self.family = family
        if (min_pixels is None) != (max_pixels is None):
            raise ValueError(f"give both min_pixels and max_pixels or neither, got {min_pixels}, {max_pixels}")
        sampling_rate = getattr(getattr(processor, "feature_extractor", None), "sampling_rate", 16000)
        self.media = MediaOptions(
            fps=fps, max_frames=max_frames, use_audio_in_video=use_audio_in_video, sampling_rate=sampling_rate
        )
        self.pixels = None if min_pixels is None else {"shortest_edge": min_pixels, "longest_edge": max_pixels}
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.identity = mllm_identity(
            identity,
            use_audio_in_video=use_audio_in_video,
            fps=fps,
            max_frames=max_frames,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
        )
        self.batch_size = batch_size
        self.modalities = family_modalities(family, use_audio_in_video)

    @property
    def precision(self) -> dict:
        """The precision identity its weights compute with (`weights_precision`; part of every call's input hash)."""
        return weights_precision(self.model)

    @property
    def use_audio_in_video(self) -> bool:
        return self.media.use_audio_in_video

    @classmethod
    def from_pretrained(cls, cfg) -> MultimodalBackend:
        """Load model and processor from the hub or a local folder (`cfg`: `zero_shot.config.ModelConfig`)."""
        import transformers

        spec = check_family(cfg.family, cfg.use_audio_in_video)
        path = resolve_model_path(cfg.model)
        device = pick_device(cfg.device)
        processor = load_processor(path, cfg.family, trust_remote_code=cfg.trust_remote_code)
        model_cls = getattr(transformers, spec.model_class)
        model = model_cls.from_pretrained(
            path, dtype=pick_dtype(cfg.dtype, device), trust_remote_code=cfg.trust_remote_code
        ).to(device)
        return cls(
            cfg.family,
            model,
            processor,
            use_audio_in_video=cfg.use_audio_in_video,
            identity=identity_base(cfg),
            fps=cfg.fps,
            max_frames=cfg.max_frames,
            min_pixels=cfg.min_pixels,
            max_pixels=cfg.max_pixels,
            batch_size=cfg.batch_size,
        )

    # ------------------------------------------------------------------ media
    def media_kind(self, media: MediaInput) -> str:
        """What the prompt tells the model it gets (see `select_media_kind`)."""
        return select_media_kind(self.family, self.use_audio_in_video, media)

    def _prepare(self, media: MediaInput | None) -> _Prepared:
        """Decode what the plan says (`zero_shot.media.plan_media`): frames of the video; audio from the video's
        own track when the flag is set, else from the `.wav` file (the reward models' `RewardPromptBuilder`
        gets the same). For Qwen2.5-Omni the video's track is interleaved with its frames; a `.wav` gets its own
        audio span after the video."""
        if media is None or not media.kinds():
            return _Prepared("?", None, None, None, False, None)
        sample = media.sample_id or "?"
        plan = plan_media(
            media,
            sees_video=self.spec.sees_video,
            hears_audio=self.spec.hears_audio,
            use_audio_in_video=self.use_audio_in_video,
        )
        files = ", ".join(p for p in (media.video, media.audio) if p) or None
        frames = fps = None
        if self.spec.sees_video:
            if media.frames is not None:
                frames, fps = np.asarray(media.frames, dtype=np.uint8), self.media.fps
            else:
                frames, fps = load_frames(sample, plan.video, self.media.fps, self.media.max_frames)
        audio = None
        if self.spec.hears_audio:
            if media.waveform is not None:
                audio = np.asarray(media.waveform, dtype=np.float32)
            else:
                audio = load_audio(sample, plan.audio, self.media.sampling_rate)
        interleaved = plan.audio_from_video and frames is not None and self.spec.audio_in_video
        return _Prepared(sample, frames, fps, audio, interleaved, files)

    # ------------------------------------------------------------------ processing
    def _messages(self, request: ChatRequest, prep: _Prepared) -> list[dict]:
        parts = []
        if prep.frames is not None:
            parts.append({"type": "video", "video": "<frames>"})
        if prep.audio is not None and not prep.audio_from_video:  # Omni's audio-in-video shares the video span
            parts.append({"type": "audio", "audio": "<waveform>", "audio_url": "<waveform>"})
        return build_messages(request, parts or None)

    def chat_text(self, request: ChatRequest, prep: _Prepared) -> str:
        """The text the processor gets for `request` up to the answer: the processor's chat template over the system
        and user turns (media parts first, as placeholders the processor expands) with the assistant turn opened."""
        return self.processor.apply_chat_template(
            self._messages(request, prep), tokenize=False, add_generation_prompt=True
        )

    def _inputs(self, requests: list[ChatRequest], preps: list[_Prepared], *, suffix: str = "") -> dict:
        texts = [self.chat_text(r, p) + suffix for r, p in zip(requests, preps)]
        with_video = [p for p in preps if p.frames is not None]
        audios = [p.audio for p in preps if p.audio is not None]
        kwargs: dict = {"text": texts, "return_tensors": "pt", "padding": True}
        if with_video:
            from transformers.video_utils import VideoMetadata

            videos_kwargs: dict = {
                "do_sample_frames": False,  # frames come sampled by load_frames
                "video_metadata": [
                    VideoMetadata(total_num_frames=len(p.frames), fps=p.fps, frames_indices=list(range(len(p.frames))))
                    for p in with_video
                ],
                "fps": with_video[0].fps,  # one rate per call: `_batch` splits batches of clips with different rates
            }
            if self.pixels is not None:
                videos_kwargs["size"] = dict(self.pixels)
            kwargs["videos"] = [p.frames for p in with_video]
            kwargs["videos_kwargs"] = videos_kwargs
        if audios:
            kwargs["audio"] = audios
            kwargs["sampling_rate"] = self.media.sampling_rate
        if self.spec.audio_in_video:
            kwargs["load_audio_from_video"] = any(p.audio_from_video for p in preps)
            if kwargs["load_audio_from_video"]:
                kwargs["audio_from_video_indices"] = self._audio_slots(preps)
        try:
            inputs = self.processor(**kwargs)
        except (ValueError, TypeError, IndexError) as err:
            p = preps[0]
            raise MediaError(
                p.sample, p.files, f"the {self.family} processor rejected the extracted media ({err})"
            ) from err
        self._check_tokens(inputs, preps)
        return inputs

    @staticmethod
    def _audio_slots(preps: list[_Prepared]) -> list[int | None]:
        """Source of each audio the processor gets: the index of the video it belongs to, or None (standalone)."""
        slots, video_idx = [], 0
        for p in preps:
            if p.frames is not None:
                if p.audio is not None:
                    slots.append(video_idx if p.audio_from_video else None)
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

    def _check_tokens(self, inputs, preps: list[_Prepared]) -> None:
        """Media extraction and processor must agree, per request: video placeholders iff frames were extracted, and
        exactly `grid_t * grid_h * grid_w / merge_size**2` of them; audio placeholders iff audio was extracted.

        Raises:
            MediaError: naming the sample, its files, what was extracted and what the processor produced.
        """
        audio_id = self._token_id("audio_token_id", "audio_token")
        video_id = self._token_id("video_token_id", "video_token")
        grids = inputs.get("video_grid_thw")
        merge = getattr(getattr(self.processor, "video_processor", None), "merge_size", 1)
        video_idx = 0
        for row, prep in zip(inputs["input_ids"], preps):
            if video_id is not None:
                n_video = int((row == video_id).sum())
                expected = 0
                if prep.frames is not None and grids is not None:
                    expected = int(grids[video_idx].prod()) // merge**2
                    video_idx += 1
                if n_video != expected or (prep.frames is not None) != (n_video > 0):
                    raise MediaError(
                        prep.sample,
                        prep.files,
                        f"{self.family}: {len(prep.frames) if prep.frames is not None else 0} frames extracted, "
                        f"{expected} video tokens expected but {n_video} after processing (the processor and media "
                        "extraction disagree)",
                    )
            if audio_id is not None or prep.audio is not None:
                n_audio = int((row == audio_id).sum()) if audio_id is not None else 0
                if (prep.audio is not None) != (n_audio > 0):
                    raise MediaError(
                        prep.sample,
                        prep.files,
                        f"{self.family}: audio {'extracted' if prep.audio is not None else 'not extracted'} "
                        f"(use_audio_in_video={self.use_audio_in_video}) but {n_audio} audio tokens after processing "
                        "(the processor and media extraction disagree)",
                    )

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            out.extend(self._batch(requests[start : start + self.batch_size], sampling))
        return out

    # ------------------------------------------------------------------ logit verdicts
    def verdict_sequences(self, request: ChatRequest, labels) -> tuple[dict, list[list[int]]]:
        """What logit scoring reads for `request`, and what a trained judge learns on
        (`emoreward.training.judge`): the processor's output for the chat text plus `request.answer_prefix` with the
        request's media (one row, as generation gets it: media placeholders expanded and checked), and each
        label's token ids after it (`hf_common.label_continuations`: the text backend's rule). The sequence of a
        label is the prompt's `input_ids` followed by its ids (`with_continuation`).

        Raises:
            MediaError: the media cannot be read or the processor disagrees with what was extracted."""
        from zero_shot.backends.transformers_text import answer_separator

        prep = self._prepare(request.media)
        inputs = self._inputs([request], [prep], suffix=request.answer_prefix)
        if self.spec.audio_in_video:
            inputs["use_audio_in_video"] = prep.audio_from_video
        prompt = self.chat_text(request, prep) + request.answer_prefix
        _, conts = label_continuations(self.tokenizer, prompt, answer_separator(request.answer_prefix), labels)
        return dict(inputs), conts

    def _score(self, request: ChatRequest) -> Generation:
        """p(label) over `request.score_labels` from the labels' token log-probabilities after the prompt: one forward
        of the prompt with its media and the labels' shared stem (`hf_common.shared_reads`; the LM head reads only
        the label positions)."""
        labels = request.score_labels or ()
        try:
            inputs, conts = self.verdict_sequences(request, labels)
        except MediaError as err:
            return Generation(error=f"MediaError: {err}")
        n_prompt = int(inputs["input_ids"].shape[1])
        try:
            logps = shared_reads(
                lambda stem: _head_logprobs(self.model, with_continuation(inputs, stem), slice(n_prompt - 1, None))[0],
                conts,
            )
            verdict, probs = verdict_from_logits(logps, labels)
        except Exception as err:  # noqa: BLE001 - a failed call is counted by the runner
            return Generation.failed(err)
        return Generation(text=f"{request.answer_prefix} {verdict.value}".strip(), probs=probs, prompt_tokens=n_prompt)

    def _batch(self, batch: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        if any(r.score_labels for r in batch):
            return [self._score(r) if r.score_labels else self._batch([r], sampling)[0] for r in batch]
        try:
            preps = [self._prepare(r.media) for r in batch]
            if len(batch) > 1 and len({p.fps for p in preps if p.frames is not None}) > 1:  # one rate per call
                return [g for r in batch for g in self._batch([r], sampling)]
            inputs = self._inputs(batch, preps)
        except MediaError as err:
            if len(batch) > 1:  # isolate the sample at fault
                return [g for r in batch for g in self._batch([r], sampling)]
            return [Generation(error=f"MediaError: {err}")]
        inputs = {k: (v.to(self.model.device) if hasattr(v, "to") else v) for k, v in inputs.items()}
        for key in ("pixel_values_videos", "input_features", "pixel_values"):
            if key in inputs and torch.is_floating_point(inputs[key]):
                inputs[key] = inputs[key].to(self.model.dtype)
        if self.spec.audio_in_video:
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
                prompt_tokens=int(mask.sum()),
                completion_tokens=int((row != self.tokenizer.pad_token_id).sum()),
                prefill_s=prefill / len(batch),
                decode_s=decode / len(batch),
            )
            for t, row, mask in zip(texts, new, inputs["attention_mask"])
        ]


def with_continuation(inputs: dict, continuation: list[int]) -> dict:
    """One row's processor output (`input_ids` of shape `(1, P)`) with `continuation` appended to its text: the
    media tensors unchanged, `attention_mask` ones over the new tokens (Qwen2.5-VL / Qwen3.5 token types: 0, text)."""
    out = dict(inputs)
    tail = torch.tensor([continuation], dtype=inputs["input_ids"].dtype)
    out["input_ids"] = torch.cat([inputs["input_ids"], tail], dim=1)
    out["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(tail)], dim=1)
    for key in ("mm_token_type_ids", "token_type_ids"):
        if key in inputs:
            out[key] = torch.cat([inputs[key], torch.zeros_like(tail)], dim=1)
    return out


def label_logprobs(model, inputs: dict, n_prompt: int) -> torch.Tensor:
    """Sum of the log-probabilities of the tokens after position `n_prompt` of each row (the verdict label), from the
    language backbone's last hidden states (`model.base_model`: media merged) through the LM head at those positions
    only, in float32; as TRL's fused LM head reads a training sequence.

    Args:
        inputs: processor output with the continuation appended (`with_continuation`), `input_ids` of shape `(B, L)`,
            no padding after a row's label.
    Returns:
        `torch.Tensor` of shape `(B,)`, nats."""
    logp, targets = _head_logprobs(model, inputs, slice(n_prompt - 1, -1)), inputs["input_ids"][:, n_prompt:]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(dim=1)


def _head_logprobs(model, inputs: dict, positions: slice) -> torch.Tensor:
    """Log-softmax (float32, on the CPU) of the LM head at `positions` of the language backbone's last hidden states
    (`model.base_model` with the media merged), shape `(B, len(positions), V)`."""
    device = model.device
    kwargs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
    for key in ("pixel_values_videos", "input_features", "pixel_values"):
        if key in kwargs and torch.is_floating_point(kwargs[key]):
            kwargs[key] = kwargs[key].to(model.dtype)
    with torch.inference_mode():
        hidden = model.base_model(**kwargs, use_cache=False).last_hidden_state[:, positions]
        logits = model.get_output_embeddings()(hidden).float()
    return torch.log_softmax(logits, dim=-1).cpu()


def identity_base(cfg) -> str:
    """The weights part of an MLLM backend's identity (`cfg`: `zero_shot.config.ModelConfig`): family, the weights
    (`emoreward.models.loading.weights_identity`: a local model's content, never its path) and dtype."""
    from emoreward.models.loading import weights_identity

    return f"mllm:{cfg.family}:{weights_identity(cfg.model, cfg.gguf_file)}:{cfg.dtype}"
