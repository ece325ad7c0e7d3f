"""Which media a judge gets of a sample: the reward models' rule, applied to every judge backend.

The rule is `emoreward.data.media.resolve_paths` (what `emoreward.models.multimodal.RewardPromptBuilder` is fed):
a model that sees video gets the video's frames; a model that hears gets audio, and ONE flag,
`use_audio_in_video`, says from where: `true` -> the video's own soundtrack, `false` -> the sample's `.wav` file.
A model that needs a file the sample lacks gets a `MediaError` naming the sample and the file, as the reward model
does; nothing is silently dropped. `plan_media` gives the table of what each model gets. Used by the local MLLM
backend (`zero_shot.backends.multimodal`) and the OpenAI-compatible backend alike. See docs/data.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from emoreward.data.context import MediaRef
from emoreward.data.media import MediaError, MediaOptions, resolve_paths
from zero_shot.backends.base import MediaInput


@dataclass(frozen=True)
class MediaPlan:
    """What one call sends of a sample's media.

    Attributes:
        kind: what the prompt tells the model it gets: `video` (frames and sound), `video_frames` or `audio`.
        video: the video file whose frames are shown (None: no frames, or pre-decoded `frames`).
        audio: the file the audio is decoded from (the video itself when `audio_from_video`), or None.
        audio_from_video: the audio is the video's own soundtrack (`use_audio_in_video`).
    """

    kind: str
    video: str | None
    audio: str | None
    audio_from_video: bool


def plan_media(
    media: MediaInput, *, sees_video: bool, hears_audio: bool, use_audio_in_video: bool, check_files: bool = True
) -> MediaPlan:
    """The media one call sends.

    | model takes             | flag  | video part | audio part                      | prompt says    |
    |-------------------------|-------|------------|---------------------------------|----------------|
    | video + audio (Omni)    | true  | the video  | the video's track (interleaved) | `video`        |
    | video + audio (Omni)    | false | the video  | the `.wav` file (its own span)  | `video`        |
    | video only (VL)         | false | the video  | none                            | `video_frames` |
    | audio only (Qwen2-Audio)| true  | none       | the video's track               | `audio`        |
    | audio only (Qwen2-Audio)| false | none       | the `.wav` file                 | `audio`        |

    Pre-decoded arrays stand in for files: `frames` for the video, `waveform` for the audio (the video's track
    when the flag is set and frames are given).

    Args:
        check_files: check that the files exist and are not empty (`emoreward.data.media.resolve_paths`); False
            decides from which paths are given only (prompt planning, before any file is opened).

    Raises:
        MediaError: the model can use none of the sample's media, or a file it needs is missing or empty; the
            message names the sample, the file and the flag.
        ValueError: `use_audio_in_video` for a model that cannot hear.
    """
    if use_audio_in_video and not hears_audio:
        raise ValueError("use_audio_in_video is set for a model that cannot hear")
    sample = media.sample_id or "?"
    has_video = media.video is not None or media.frames is not None
    has_audio = media.audio is not None or media.waveform is not None
    if not sees_video and not hears_audio:
        raise MediaError(sample, media.video or media.audio, "the model reads text only")
    if sees_video and not has_video:
        raise MediaError(sample, media.audio, "this model sees video frames, and the sample has no video")
    audio_file = None
    if hears_audio and use_audio_in_video:
        if media.waveform is None and media.video is None:
            raise MediaError(
                sample, media.audio, "use_audio_in_video=True takes the audio from the video, and the sample has none"
            )
        audio_file = media.video if media.waveform is None else None
    elif hears_audio:
        if not has_audio:
            raise MediaError(
                sample,
                media.video,
                "use_audio_in_video=False takes the audio from the sample's .wav file, and the sample has none",
            )
        audio_file = media.audio if media.waveform is None else None
    video_file = media.video if sees_video and media.frames is None else None
    if check_files and (video_file is not None or audio_file is not None):
        # the reward models' own resolver: same flag, same existence and emptiness checks, same messages
        video_path, audio_path = resolve_paths(
            sample,
            MediaRef(video=media.video, audio=media.audio),
            MediaOptions(use_audio_in_video=use_audio_in_video),
            need_video=video_file is not None,
            need_audio=audio_file is not None,
        )
        video_file = None if video_path is None else str(video_path)
        audio_file = None if audio_path is None else str(audio_path)
    kind = "video" if sees_video and hears_audio else "video_frames" if sees_video else "audio"
    return MediaPlan(kind, video_file, audio_file, audio_from_video=hears_audio and use_audio_in_video)


__all__ = ["MediaError", "MediaPlan", "plan_media"]
