"""Real media files for tests and benchmarks: a speech-like signal, WAV files and MPEG-4 clips with an AAC track
(PyAV), and the media tokens of the tiny Qwen2.5-Omni tokenizers. No pytest here: benchmarks/benchmark_multimodal.py uses it too."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


# Qwen2.5-Omni's named media tokens, as its tokenizer_config.json declares them (the official processor reads them)
OMNI_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def voiced(seconds: float, rate: int = 16000, freq: float = 180.0) -> np.ndarray:
    """A speech-like mono signal in [-0.3, 0.3]: harmonics of `freq` under a 4 Hz syllable envelope."""
    t = np.arange(int(seconds * rate)) / rate
    signal = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 5)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    return (0.3 * signal / np.abs(signal).max()).astype(np.float32)


def write_wav(path: Path, seconds: float = 1.5, rate: int = 16000, freq: float = 220.0) -> Path:
    """A 16-bit PCM mono WAV file of `voiced` signal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (voiced(seconds, rate, freq) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(data.tobytes())
    return path


def write_clip(
    path: Path,
    *,
    seconds: float = 2.0,
    fps: int = 8,
    size: tuple[int, int] = (48, 64),
    audio: np.ndarray | None = None,
    rate: int = 16000,
    seed: int = 0,
) -> Path:
    """An MPEG-4 clip of a moving face-like blob (`size` = height, width) with, when `audio` is given, that mono
    waveform as its AAC soundtrack (PyAV)."""
    height, width = size
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 80, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    n = int(seconds * fps)
    frames = np.repeat(background[None], n, axis=0)
    for i in range(n):
        cx = width * (0.3 + 0.4 * i / max(1, seconds * fps - 1))
        frames[i][((yy - height / 2) ** 2 + (xx - cx) ** 2) < (height / 4) ** 2] = (220, 180, 150)
    return write_frames(path, frames, fps=fps, audio=audio, rate=rate)


# ---------------------------------------------------------------------------------------------- media-only task
# Colours and tones of the "media matters" task (scripts/studies/media_matters.py): the frames' colour family and the
# tone's direction are the only signals; blanked clips keep the noise and drop both.
WARM_RGB, COLD_RGB, GREY_RGB = (215, 105, 40), (40, 105, 215), (128, 128, 128)


def sweep(seconds: float, rate: int, start_hz: float, end_hz: float, amplitude: float) -> np.ndarray:
    """A pure tone gliding exponentially from `start_hz` to `end_hz` over `seconds` (phase-continuous), peak
    `amplitude`, with 20 ms fades at both ends; `float32` of shape `(round(seconds * rate),)`."""
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    k = np.log(end_hz / start_hz) / seconds
    phase = 2 * np.pi * start_hz * (np.expm1(k * t) / k if k else t)
    fade = np.clip(np.minimum(t, seconds - t) / 0.02, 0.0, 1.0)
    return (amplitude * fade * np.sin(phase)).astype(np.float32)


def write_colour_tone_clip(
    path: Path,
    *,
    warm: bool | None,
    rising: bool | None,
    seconds: float = 1.0,
    fps: int = 8,
    size: int = 56,
    rate: int = 16000,
    seed: int = 0,
) -> Path:
    """An MPEG-4 clip whose frames are warm- (`warm=True`) or cold-coloured (`False`), or grey (`None`), and whose
    AAC soundtrack is a rising (`rising=True`) or falling (`False`) tone sweep, or no tone at all (`None`).

    The nuisance is drawn from `seed` the same way whatever `warm` / `rising` are: a colour jitter of up to 25 per
    channel, per-pixel noise (sd 12), and a tone between a low pitch of 220-360 Hz and a high one 3-4 times it
    (rising: low to high; falling: high to low, so both sweep over the same pitches and only the direction
    differs), peak 0.2-0.35, over white noise (sd 0.005) that blanked clips keep. Frames are `size` x `size`."""
    rng = np.random.default_rng(seed)
    jitter = rng.integers(-25, 26, 3)
    noise = rng.normal(0.0, 12.0, (int(seconds * fps), size, size, 3))
    low = rng.uniform(220.0, 360.0)
    high = low * rng.uniform(3.0, 4.0)
    amplitude = rng.uniform(0.2, 0.35)
    hiss = rng.normal(0.0, 0.005, int(round(seconds * rate))).astype(np.float32)
    base = np.array({True: WARM_RGB, False: COLD_RGB, None: GREY_RGB}[warm]) + (0 if warm is None else jitter)
    frames = np.clip(base + noise, 0, 255).astype(np.uint8)
    audio = hiss
    if rising is not None:
        audio = audio + sweep(seconds, rate, *((low, high) if rising else (high, low)), amplitude)
    return write_frames(path, frames, fps=fps, audio=audio, rate=rate)


def write_frames(path: Path, frames: np.ndarray, *, fps: int, audio: np.ndarray | None, rate: int = 16000) -> Path:
    """An MPEG-4 clip of the given `uint8` RGB frames (shape `(T, H, W, 3)`, H and W even) at `fps`, with `audio`
    (mono waveform at `rate` Hz) as its AAC track when given (PyAV)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    _, height, width, _ = frames.shape
    with av.open(str(path), "w") as container:
        vstream = container.add_stream("mpeg4", rate=fps)
        vstream.width, vstream.height, vstream.pix_fmt = width, height, "yuv420p"
        astream = container.add_stream("aac", rate=rate) if audio is not None else None
        for frame in frames:
            for packet in vstream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        if astream is not None:
            for start in range(0, len(audio), 1024):
                piece = np.ascontiguousarray(audio[start : start + 1024][None, :], dtype=np.float32)
                aframe = av.AudioFrame.from_ndarray(piece, format="flt", layout="mono")
                aframe.sample_rate, aframe.pts = rate, start
                for packet in astream.encode(aframe):
                    container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)
        for packet in vstream.encode():
            container.mux(packet)
    return path
