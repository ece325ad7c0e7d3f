"""Media of a preference pair's sample for the multimodal reward models: where the files are and how they decode.

A media root maps a sample id to `<root>/video/<id>.mp4` and `<root>/audio/<id>.wav`; paths on the pair win. Frames
decode with PyAV; audio comes from the `.wav` or the video's track (`MediaOptions.use_audio_in_video`, the one
place of that flag). Every file is opened in one place (`open_media`), confined to the media root at open time. A
missing, empty, undecodable, unused or escaping file raises `MediaError`; nothing becomes a zero tensor. See
docs/data.md.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emoreward.data.context import MediaRef


# the media root's MER layout: each medium's folder and file suffix (`layout_path`, `layout_sample_id`)
LAYOUT = {"video": ("video", ".mp4"), "audio": ("audio", ".wav")}


def layout_path(sample_id: str, kind: str) -> str:
    """A sample's file of medium `kind` (``"video"`` / ``"audio"``) in the media root's MER layout, relative to the
    root: ``video/<id>.mp4``, ``audio/<id>.wav``. The one spelling of the layout: the reward models' media
    (`resolve_paths`), the zero-shot and trained judges' (`zero_shot.strategies.resolve_media`), the dataset
    cache's file stamps and the OpenRLHF clip labels all use it."""
    folder, suffix = LAYOUT[kind]
    return f"{folder}/{sample_id}{suffix}"


def layout_sample_id(path: str) -> str:
    """The sample id a media path names: ``s1`` for a path of the MER layout (``video/s1.mp4``, ``audio/s1.wav``,
    `layout_path`), so the path and the id name the same clip; any other path is its own name."""
    for folder, suffix in LAYOUT.values():
        head = f"{folder}/"
        if path.startswith(head) and path.endswith(suffix) and len(path) > len(head) + len(suffix):
            inner = path[len(head) : -len(suffix)]
            if "/" not in inner and "\\" not in inner:
                return inner
    return path


class MediaError(ValueError):
    """A sample's media cannot be used; the message names the sample and the file (attributes `sample_id`, `path`
    and `field`, None when unknown)."""

    def __init__(self, sample_id: str, path: str | Path | None, problem: str, *, field: str | None = None):
        self.sample_id, self.path, self.problem = sample_id, None if path is None else str(path), problem
        self.field = field
        super().__init__(f"sample {sample_id!r}: {path if path is not None else '(no file)'}: {problem}")


@dataclass(frozen=True)
class MediaOptions:
    """How media is found and decoded (one instance per run; the recipe fields of the same names fill it).

    Attributes:
        media_root: folder in the MER2025 layout (`video/<id>.mp4`, `audio/<id>.wav`), or None.
        fps: video frames sampled per second of video; the same value reaches the prompt's temporal positions.
        max_frames: cap on frames per video (evenly spread over the clip when the cap binds).
        use_audio_in_video: the one flag: take the audio from the video's own track instead of `audio/<id>.wav`.
        sampling_rate: audio sampling rate in Hz the feature extractor expects."""

    media_root: str | None = None
    fps: float = 2.0
    max_frames: int = 16
    use_audio_in_video: bool = False
    sampling_rate: int = 16000

    def __post_init__(self):
        if not self.fps > 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")
        if self.max_frames < 2:
            raise ValueError(f"max_frames must be >= 2 (Qwen's temporal patch is 2 frames), got {self.max_frames}")


@dataclass
class SampleMedia:
    """Decoded media of one sample.

    Attributes:
        frames: `uint8` array of shape `(T, H, W, 3)` (T even) or None.
        fps: effective frame rate of `frames` (frames per second of video), or None.
        audio: mono `float32` waveform of shape `(samples,)` at `sampling_rate`, or None.
        video_path, audio_path: the files decoded (`audio_path` is the video when its track was used).
    """

    frames: np.ndarray | None = None
    fps: float | None = None
    audio: np.ndarray | None = None
    video_path: str | None = None
    audio_path: str | None = None


def have_pyav() -> bool:
    return importlib.util.find_spec("av") is not None


def check_file(sample_id: str, path: str | Path, what: str = "media") -> Path:
    """`path` as a `Path` if it is an existing, non-empty file.

    Raises:
        MediaError: the file does not exist or has zero bytes (`what` names it: video, audio)."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(sample_id, path, f"{what} file not found")
    if path.stat().st_size == 0:
        raise MediaError(sample_id, path, f"{what} file is empty (0 bytes)")
    return path


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _opened_path(fd: int, path: Path) -> str:
    """The real path of the file open on ``fd`` (Linux: the kernel's own record; elsewhere the path's real path)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def open_media(sample_id: str, path: str | Path, what: str = "media", root: str | Path | None = None):
    """``path`` opened for binary reading, the one place a media file is opened: a regular, non-empty file, and,
    when ``path`` lies inside the media root ``root``, a file whose real path (that of the opened descriptor, so a
    file swapped for a symbolic link after the path was checked is caught) lies inside the root's real path too.

    Returns:
        a binary file object (close it; PyAV and `wave` read from it).

    Raises:
        MediaError: the file does not exist, is not a regular file, has zero bytes, or leaves the media root.
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise MediaError(sample_id, path, f"{what} file not found") from None
    except OSError as err:
        raise MediaError(sample_id, path, f"cannot open the {what} file ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(sample_id, path, f"{what} file not found (not a regular file)")
        if root is not None:
            given, real_root = os.path.abspath(path), os.path.realpath(root)
            if _inside(given, os.path.abspath(root)) or _inside(given, real_root):
                if not _inside(_opened_path(fd, path), real_root):
                    raise MediaError(sample_id, path, f"the {what} file leaves the media root (a symbolic link)")
        if info.st_size == 0:
            raise MediaError(sample_id, path, f"{what} file is empty (0 bytes)")
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def resolve_paths(
    sample_id: str, ref: MediaRef, options: MediaOptions, *, need_video: bool, need_audio: bool
) -> tuple[Path | None, Path | None]:
    """(video path or None, audio path or None) a sample needs; with `use_audio_in_video` the audio is the video.

    Raises:
        MediaError: a needed file is not given, not found or empty."""

    def locate(given: str | None, what: str) -> Path:
        if given:
            path = Path(given)
            if not path.is_absolute() and options.media_root:
                path = Path(options.media_root) / path
        elif options.media_root:
            path = Path(options.media_root) / layout_path(sample_id, what)
        else:
            raise MediaError(sample_id, None, f"no {what} file: the pair gives none and no media_root is set")
        return check_file(sample_id, path, what)

    video = locate(ref.video, "video") if need_video or (need_audio and options.use_audio_in_video) else None
    audio = None
    if need_audio:
        audio = video if options.use_audio_in_video else locate(ref.audio, "audio")
    return (video if need_video else None), audio


def unused_media(
    ref: MediaRef, *, need_video: bool, need_audio: bool, use_audio_in_video: bool = False
) -> list[tuple[str, str]]:
    """The media fields a sample names that a model does not read, each with the reason: `[(field, why), ...]`.

    The one rule of what a model reads: video if it sees video; audio if it hears audio, or with
    `use_audio_in_video` the video's own track (then not `audio`); a text model neither. Every route refuses the others
    (`refuse_unused_media`): they would change nothing."""
    reads_video = need_video or (need_audio and use_audio_in_video)
    reads_audio = need_audio and not use_audio_in_video
    out = []
    if ref.video and not reads_video:
        why = "this reward model is text-only (it reads the subtitle)" if not need_audio else "it reads no video"
        out.append(("video", why))
    if ref.audio and not reads_audio:
        if not need_video and not need_audio:
            why = "this reward model is text-only (it reads the subtitle)"
        elif need_audio:
            why = "it hears the video's own audio track (use_audio_in_video), not a separate audio file"
        else:
            why = "it reads no audio (it sees the video frames only)"
        out.append(("audio", why))
    return out


def refuse_unused_media(
    sample_id: str, ref: MediaRef, options: MediaOptions, *, need_video: bool, need_audio: bool
) -> None:
    """Raise for the first media field a sample names that the model does not read (`unused_media`).

    Raises:
        MediaError: naming the sample, the file and the field (its `field` attribute)."""
    for key, why in unused_media(
        ref, need_video=need_video, need_audio=need_audio, use_audio_in_video=options.use_audio_in_video
    ):
        raise MediaError(
            sample_id,
            getattr(ref, key),
            f"{key} file given, but {why}: it would not change the reward; remove the {key!r} field",
            field=key,
        )


def load_sample_media(
    sample_id: str, ref: MediaRef, options: MediaOptions, *, need_video: bool, need_audio: bool
) -> SampleMedia:
    """Resolve and decode what a backbone needs of one sample (see `resolve_paths`, `load_frames`, `load_audio`).

    Raises:
        MediaError: naming the sample and the file.
    """
    video, audio = resolve_paths(sample_id, ref, options, need_video=need_video, need_audio=need_audio)
    out = SampleMedia(
        video_path=None if video is None else str(video), audio_path=None if audio is None else str(audio)
    )
    if video is not None:
        out.frames, out.fps = load_frames(sample_id, video, options.fps, options.max_frames, root=options.media_root)
    if audio is not None:
        out.audio = load_audio(sample_id, audio, options.sampling_rate, root=options.media_root)
    return out


def _require_av(sample_id: str, path: Path, what: str):
    if not have_pyav():
        raise MediaError(sample_id, path, f"decoding {what} needs PyAV: pip install 'emoreward[media]'")
    import av

    return av


def load_frames(
    sample_id: str, path: str | Path, fps: float, max_frames: int, *, root: str | Path | None = None
) -> tuple[np.ndarray, float]:
    """Frames of a video sampled at `fps` per second (at most `max_frames`, evenly spread), decoded with PyAV,
    converting only the sampled frames to RGB (packet times give the indices first); equal to
    `load_frames_reference` (tested), which it falls back to when frames and packets do not match.

    Returns:
        (`uint8` array of shape `(T, H, W, 3)` with T even and >= 2 (the last frame repeats to make T even),
        effective sampling rate in frames per second of video).

    The file is opened once (`open_media`, confined to the media root ``root``) and both passes read it.

    Raises:
        MediaError: missing or empty file, no video stream, no decodable frame, undecodable data, PyAV missing, a
            file that leaves the media root."""
    path = check_file(sample_id, path, "video")
    av = _require_av(sample_id, path, "video")
    with open_media(sample_id, path, "video", root) as fh:
        return _load_frames(av, fh, sample_id, path, fps, max_frames)


def _load_frames(av, fh, sample_id: str, path: Path, fps: float, max_frames: int) -> tuple[np.ndarray, float]:
    try:
        with av.open(fh) as container:
            if not container.streams.video:
                raise MediaError(sample_id, path, "has no video stream")
            stream = container.streams.video[0]
            # pass 1: the packets' presentation times, no decoding
            stamps = [p.pts for p in container.demux(stream) if p.size]
            valid = sorted(float(t * stream.time_base) for t in stamps if t is not None)
        if not stamps:
            raise MediaError(sample_id, path, "the video has no decodable frame")
        wanted, _ = _sampled_indices(
            len(stamps), valid[0] if valid else None, valid[-1] if valid else None, fps, max_frames
        )
        keep = set(wanted.tolist())
        # pass 2: decode every frame, convert the sampled ones
        converted: dict[int, np.ndarray] = {}
        times = []
        fh.seek(0)
        with av.open(fh) as container:
            stream = container.streams.video[0]
            for k, frame in enumerate(container.decode(stream)):
                if k in keep:
                    converted[k] = frame.to_ndarray(format="rgb24")
                times.append(float(frame.time) if frame.time is not None else float("nan"))
    except MediaError:
        raise
    except Exception as err:  # PyAV has its own error hierarchy
        raise MediaError(sample_id, path, f"cannot decode video ({type(err).__name__}: {err})") from err
    decoded_valid = [t for t in times if np.isfinite(t)]
    idx, duration = _sampled_indices(
        len(times),
        decoded_valid[0] if decoded_valid else None,
        decoded_valid[-1] if decoded_valid else None,
        fps,
        max_frames,
    )
    if len(times) != len(stamps) or not np.array_equal(idx, wanted) or not set(idx.tolist()) <= converted.keys():
        fh.seek(0)
        return _load_frames_reference(av, fh, sample_id, path, fps, max_frames)  # packets and frames differ
    return _finish_frames([converted[i] for i in idx], duration)


def _sampled_indices(n_frames: int, first: float | None, last: float | None, fps: float, max_frames: int):
    """(indices of the sampled frames, clip duration in seconds) from the decoded frame count and the first and
    last valid presentation times (None when the stream has none): the rule of `load_frames`."""
    duration = (last - first) if (first is not None and last is not None and n_frames > 1) else 0.0
    rate = (n_frames - 1) / duration if duration > 0 else 25.0  # the stream's frame rate
    duration = n_frames / rate
    n = int(min(max_frames, max(2, round(duration * fps))))
    return np.linspace(0, n_frames - 1, n).round().astype(int), duration


def _finish_frames(frames: list[np.ndarray], duration: float) -> tuple[np.ndarray, float]:
    picked = np.stack(frames)
    if len(picked) % 2:
        picked = np.concatenate([picked, picked[-1:]])
    return picked, len(picked) / duration


def load_frames_reference(
    sample_id: str, path: str | Path, fps: float, max_frames: int, *, root: str | Path | None = None
) -> tuple[np.ndarray, float]:
    """`load_frames` converting every decoded frame to RGB, then picking the sampled ones (the reference and fallback).

    Raises:
        MediaError: as `load_frames`."""
    path = check_file(sample_id, path, "video")
    av = _require_av(sample_id, path, "video")
    with open_media(sample_id, path, "video", root) as fh:
        return _load_frames_reference(av, fh, sample_id, path, fps, max_frames)


def _load_frames_reference(av, fh, sample_id: str, path: Path, fps: float, max_frames: int):
    frames, times = [], []
    try:
        with av.open(fh) as container:
            if not container.streams.video:
                raise MediaError(sample_id, path, "has no video stream")
            for frame in container.decode(container.streams.video[0]):
                frames.append(frame.to_ndarray(format="rgb24"))
                times.append(float(frame.time) if frame.time is not None else float("nan"))
    except MediaError:
        raise
    except Exception as err:  # PyAV has its own error hierarchy
        raise MediaError(sample_id, path, f"cannot decode video ({type(err).__name__}: {err})") from err
    if not frames:
        raise MediaError(sample_id, path, "the video has no decodable frame")
    valid = [t for t in times if np.isfinite(t)]
    idx, duration = _sampled_indices(
        len(frames), valid[0] if valid else None, valid[-1] if valid else None, fps, max_frames
    )
    return _finish_frames([frames[i] for i in idx], duration)


def load_audio(
    sample_id: str, path: str | Path, sampling_rate: int = 16000, *, root: str | Path | None = None
) -> np.ndarray:
    """Mono `float32` waveform in [-1, 1] of shape `(samples,)` at `sampling_rate` Hz from a WAV file or the audio
    track of a video (PyAV; 16-bit PCM WAV is read with the standard library when PyAV is absent).

    Raises:
        MediaError: missing or empty file, no audio stream (a video without a soundtrack), no samples, undecodable
            data, PyAV missing for a non-WAV file, a file that leaves the media root ``root`` (`open_media`).
    """
    path = check_file(sample_id, path, "audio")
    with open_media(sample_id, path, "audio", root) as fh:
        return _load_audio(fh, sample_id, path, sampling_rate)


def _load_audio(fh, sample_id: str, path: Path, sampling_rate: int) -> np.ndarray:
    if path.suffix.lower() == ".wav" and not have_pyav():
        try:
            with wave.open(fh, "rb") as wav:
                width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
                raw = wav.readframes(wav.getnframes())
        except (wave.Error, EOFError) as err:
            raise MediaError(sample_id, path, f"not a readable WAV file ({err})") from err
        if width != 2:
            raise MediaError(sample_id, path, f"only 16-bit PCM WAV is read without PyAV (got {8 * width}-bit)")
        data = np.frombuffer(raw, dtype="<i2").astype(np.float32).reshape(-1, channels).mean(axis=1) / 32768.0
        if rate != sampling_rate and data.size:
            n_out = int(round(data.size * sampling_rate / rate))
            data = np.interp(np.arange(n_out) / sampling_rate, np.arange(data.size) / rate, data).astype(np.float32)
    else:
        av = _require_av(sample_id, path, "audio")
        chunks = []
        try:
            with av.open(fh) as container:
                if not container.streams.audio:
                    raise MediaError(
                        sample_id, path, "has no audio stream (use_audio_in_video asks for the video's own track)"
                    )
                resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
                for frame in container.decode(container.streams.audio[0]):
                    chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(frame))
                chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
        except MediaError:
            raise
        except Exception as err:
            raise MediaError(sample_id, path, f"cannot decode audio ({type(err).__name__}: {err})") from err
        data = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if data.size == 0:
        raise MediaError(sample_id, path, "the audio has no samples")
    return data
