"""Media decoding for the MLLM judges: video frames and audio tracks through PyAV (the `media` extra), WAV files
through the standard library when PyAV is missing.

Every failure is a `MediaError` naming the file: a missing or zero-length file, a video without a video
stream, a video whose audio track is requested but absent, undecodable data.
"""

from __future__ import annotations

import importlib.util
import wave
from pathlib import Path

import numpy as np


class MediaError(ValueError):
    """A media file cannot give what the judge needs; the message names the file."""


def have_pyav() -> bool:
    return importlib.util.find_spec("av") is not None


def _check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise MediaError(f"{path}: media file not found")
    if path.stat().st_size == 0:
        raise MediaError(f"{path}: media file is empty (0 bytes)")
    return path


def _require_av(path: Path, what: str):
    if not have_pyav():
        raise MediaError(
            f"{path}: decoding {what} needs PyAV; install the media extra (pip install 'emoreward[media]')"
        )
    import av

    return av


def _resample(signal: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target or signal.size == 0:
        return signal.astype(np.float32)
    n_out = int(round(signal.size * target / rate))
    x_old = np.arange(signal.size) / rate
    x_new = np.arange(n_out) / target
    return np.interp(x_new, x_old, signal).astype(np.float32)


def load_audio(path: str | Path, sampling_rate: int = 16000) -> np.ndarray:
    """Mono float32 waveform in [-1, 1] of shape `(samples,)` at `sampling_rate` Hz, from an audio file or the
    audio track of a video.

    Raises:
        MediaError: missing or empty file, no audio stream, no samples, or PyAV missing for a non-WAV file.
    """
    path = _check_file(path)
    if path.suffix.lower() == ".wav" and not have_pyav():
        try:
            with wave.open(str(path), "rb") as fh:
                width, channels, rate = fh.getsampwidth(), fh.getnchannels(), fh.getframerate()
                raw = fh.readframes(fh.getnframes())
        except (wave.Error, EOFError) as err:
            raise MediaError(f"{path}: not a readable WAV file ({err})") from err
        if width != 2:
            raise MediaError(f"{path}: only 16-bit PCM WAV is read without PyAV (got {8 * width}-bit)")
        data = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        data = data.reshape(-1, channels).mean(axis=1)
        if data.size == 0:
            raise MediaError(f"{path}: the audio has no samples")
        return _resample(data, rate, sampling_rate)
    av = _require_av(path, "audio")
    try:
        with av.open(str(path)) as container:
            streams = container.streams.audio
            if not streams:
                raise MediaError(f"{path}: has no audio stream (the judge was asked to use its audio track)")
            resampler = av.AudioResampler(format="fltp", layout="mono", rate=sampling_rate)
            chunks = []
            for frame in container.decode(streams[0]):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except MediaError:
        raise
    except Exception as err:  # PyAV raises its own error hierarchy
        raise MediaError(f"{path}: cannot decode audio ({type(err).__name__}: {err})") from err
    data = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if data.size == 0:
        raise MediaError(f"{path}: the audio track has no samples")
    return data


def has_audio_stream(path: str | Path) -> bool:
    """Whether a media file has an audio stream (PyAV; a `.wav` file always has one)."""
    path = _check_file(path)
    if path.suffix.lower() == ".wav":
        return True
    av = _require_av(path, "streams")
    with av.open(str(path)) as container:
        return bool(container.streams.audio)


def load_video_frames(path: str | Path, fps: float = 2.0, max_frames: int = 16) -> tuple[np.ndarray, float]:
    """Frames sampled at about `fps` frames per second (at most `max_frames`, evenly spread), as a `uint8` array
    of shape `(T, H, W, 3)` with T even (Qwen's temporal patch is 2; the last frame is repeated if needed),
    and the effective sampling rate in frames per second.

    Raises:
        MediaError: missing or empty file, no video stream, no decodable frame, or PyAV missing.
    """
    path = _check_file(path)
    av = _require_av(path, "video")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError(f"{path}: has no video stream")
            stream = container.streams.video[0]
            frames, times = [], []
            for frame in container.decode(stream):
                frames.append(frame.to_ndarray(format="rgb24"))
                times.append(float(frame.time) if frame.time is not None else len(times) / 25.0)
    except MediaError:
        raise
    except Exception as err:
        raise MediaError(f"{path}: cannot decode video ({type(err).__name__}: {err})") from err
    if not frames:
        raise MediaError(f"{path}: the video has no decodable frame")
    duration = max(times[-1] - times[0], 1e-6) if len(times) > 1 else 1.0
    n = int(min(max_frames, max(2, round(duration * fps))))
    idx = np.linspace(0, len(frames) - 1, n).round().astype(int)
    picked = np.stack([frames[i] for i in idx])
    if len(picked) % 2:
        picked = np.concatenate([picked, picked[-1:]])
    return picked, len(picked) / max(duration, 1e-6)
