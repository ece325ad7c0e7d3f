"""An OpenAI-compatible chat-completions backend (a local vLLM / SGLang server or a hosted API).

Standard library only (`urllib`): per-request timeout, retries with exponential backoff on timeouts,
connection errors, HTTP 408/429/5xx, a concurrency limit (threads), and the API key read from an
environment variable named in the judge config (never from a file or the command line). HTTP 401/403/404 are
fatal (`Generation.fatal`: the key, permission, model name or URL is wrong, so no call can succeed and the run
stops); the key and any `sk-`/`hf_`-shaped secret are scrubbed from every error the backend returns. An answer
whose token log-probabilities are not finite is a broken model (`Generation.broken_model`: the run stops). Media
(`modalities: [text, video, audio]` or a subset) travel as content parts: `OpenAIChatBackend`. See docs/judges.md.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import mimetypes
import os
import time
import urllib.error
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np

from emoreward.data.media import MediaError
from zero_shot.backends.base import (
    ChatRequest,
    Generation,
    MediaInput,
    SamplingConfig,
    build_messages,
    scrub_secrets,
)
from zero_shot.media import plan_media


logger = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
FATAL_STATUS = frozenset({401, 403, 404})  # wrong key, no permission, unknown model or URL: no call can succeed
AUDIO_SAMPLING_RATE = 16000  # a video's track decoded here for audio-only models (Whisper-style encoders)


def openai_identity(base_url: str, model: str, modalities=("text",), use_audio_in_video: bool = False) -> str:
    """The identity of an OpenAI-compatible backend (part of every cache input hash); a text-only server's is
    `openai:<base_url>:<model>`, a multimodal one adds what it is sent (modalities and the audio flag)."""
    identity = f"openai:{base_url.rstrip('/')}:{model}"
    media = sorted(set(modalities) - {"text"})
    if media:
        identity += f":media={'+'.join(media)}:audio_in_video={use_audio_in_video}"
    return identity


class OpenAIChatBackend:
    """Chat completions over HTTP.

    Media go the way OpenAI-compatible multimodal servers take them (vLLM serving Qwen2.5-Omni / Qwen2.5-VL /
    Qwen2-Audio): a `video_url` content part and an `input_audio` part (`{"data": <base64>, "format": "wav"}`;
    other formats as an `audio_url` data URL), as base64 data URLs (`media_transport: data`) or `file://` URLs
    (`media_transport: file`, a vLLM server started with `--allowed-local-media-path`). Which media go is the
    reward models' rule (`zero_shot.media.plan_media`): with `use_audio_in_video`, a model that sees video gets the
    video alone plus vLLM's `mm_processor_kwargs: {"use_audio_in_video": true}` (the server interleaves the video's
    own track), and an audio-only model gets the video's track decoded here and sent as WAV; without the flag the
    sample's `.wav` is sent.

    Args:
        base_url: server root up to `/v1` (e.g. `http://127.0.0.1:8000/v1`).
        model: the model name the server knows.
        api_key_env: name of the environment variable that holds the key; None for servers without auth.
        timeout_s: seconds per HTTP request.
        max_retries: extra attempts after the first failure of a retryable kind.
        backoff_s: first backoff; attempt `a` waits `backoff_s * 2**a` (capped at `max_backoff_s`).
        concurrency: requests in flight at once.
        modalities: what the served model accepts: `text`, plus `video` and/or `audio`.
        use_audio_in_video: THE flag of the reward models: the audio is the video's own track (above); needs
            `audio` in `modalities`.
        media_transport: `data` (base64 data URLs, default) or `file` (`file://` URLs the server reads itself).
        logprobs: ask for the answer tokens' log-probabilities (`"logprobs": true`, default) so that a served model
            with broken weights is caught (`non_finite_logprobs`); false for an API that refuses the field. Any
            log-probabilities a server returns are checked either way.

    Raises:
        ValueError: `api_key_env` is set but the variable is missing or empty; bad numeric settings; the flag
            without `audio`; an unknown transport.
    """

    precision = None  # the server's own: its calls are keyed by its identity (URL and model) alone

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        concurrency: int = 8,
        modalities: tuple[str, ...] = ("text",),
        use_audio_in_video: bool = False,
        media_transport: Literal["data", "file"] = "data",
        logprobs: bool = True,
    ):
        if media_transport not in ("data", "file"):
            raise ValueError(f"media_transport: unknown {media_transport!r}; available: ['data', 'file']")
        if use_audio_in_video and "audio" not in modalities:
            raise ValueError("use_audio_in_video needs 'audio' in modalities (the served model must hear)")
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError(
                f"need concurrency >= 1, max_retries >= 0, timeout_s > 0, backoff_s >= 0; got {concurrency}, "
                f"{max_retries}, {timeout_s}, {backoff_s}"
            )
        self.api_key = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ValueError(f"environment variable {api_key_env} (the API key) is not set")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.concurrency = concurrency
        self.modalities = frozenset({"text", *modalities})
        self.use_audio_in_video = use_audio_in_video
        self.media_transport = media_transport
        self.logprobs = logprobs
        self.identity = openai_identity(base_url, model, modalities, use_audio_in_video)
        self.n_attempts = 0

    # ------------------------------------------------------------------ media
    def media_kind(self, media: MediaInput) -> str:
        """What the prompt tells the model it gets (`zero_shot.media.plan_media`, no file opened).

        Raises:
            MediaError: the sample lacks media the served model needs under the flag.
        """
        return openai_media_kind(self.modalities, self.use_audio_in_video, media)

    def _file_part(self, kind: str, path: str) -> dict:
        if self.media_transport == "file":
            return {"type": f"{kind}_url", f"{kind}_url": {"url": Path(path).resolve().as_uri()}}
        from emoreward.data.media import open_media

        with open_media(Path(path).stem, path, kind) as fh:  # the one place a media file is opened
            data = base64.b64encode(fh.read()).decode("ascii")
        suffix = Path(path).suffix.lower().lstrip(".")
        if kind == "audio" and suffix in ("wav", "mp3"):
            return {"type": "input_audio", "input_audio": {"data": data, "format": suffix}}
        mime = mimetypes.guess_type(path)[0] or f"{kind}/{suffix or 'octet-stream'}"
        return {"type": f"{kind}_url", f"{kind}_url": {"url": f"data:{mime};base64,{data}"}}

    def _media_parts(self, media: MediaInput) -> tuple[list[dict], dict]:
        """Content parts and extra request fields for one sample's media.

        Raises:
            MediaError: a needed file is missing, empty or (for a decoded track) unreadable.
            ValueError: pre-decoded arrays (only files can be sent).
        """
        if media.frames is not None or media.waveform is not None:
            raise ValueError("the OpenAI-compatible backend sends media files, not decoded arrays")
        plan = plan_media(
            media,
            sees_video="video" in self.modalities,
            hears_audio="audio" in self.modalities,
            use_audio_in_video=self.use_audio_in_video,
        )
        parts, extra = [], {}
        if plan.video is not None:
            parts.append(self._file_part("video", plan.video))
        if plan.audio is not None:
            if plan.audio_from_video and plan.video is not None:
                extra["mm_processor_kwargs"] = {"use_audio_in_video": True}  # the server takes the video's track
            elif plan.audio_from_video:  # an audio-only model hears the video's track: decode it here
                from emoreward.data.media import load_audio

                track = load_audio(media.sample_id or "?", plan.audio, AUDIO_SAMPLING_RATE)
                data = base64.b64encode(wav_bytes(track, AUDIO_SAMPLING_RATE)).decode("ascii")
                parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
            else:
                parts.append(self._file_part("audio", plan.audio))
        return parts, extra

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        if len(requests) <= 1 or self.concurrency == 1:
            return [self._one(r, sampling) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), requests))

    def _payload(self, request: ChatRequest, sampling: SamplingConfig) -> dict:
        if request.score_labels:
            raise ValueError("logit-based verdicts are not supported by the OpenAI-compatible backend")
        parts, extra = [], {}
        if request.media is not None and request.media.kinds():
            parts, extra = self._media_parts(request.media)
        payload = {
            "model": self.model,
            "messages": build_messages(request, parts or None),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature if sampling.do_sample else 0.0,
            "seed": request.seed,
        }
        if sampling.do_sample:
            payload["top_p"] = sampling.top_p
        if self.logprobs:
            payload["logprobs"] = True
        payload.update(extra)
        return payload

    def _one(self, request: ChatRequest, sampling: SamplingConfig) -> Generation:
        try:
            body = json.dumps(self._payload(request, sampling)).encode()
        except (ValueError, OSError) as err:  # MediaError is a ValueError
            prefix = "MediaError: " if isinstance(err, MediaError) else ""
            return Generation(error=self._scrub(f"{prefix}{err}"))
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
            self.n_attempts += 1
            start = time.perf_counter()
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    data = json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as err:
                last_error = self._scrub(
                    f"HTTP {err.code} {err.reason}: {err.read()[:300].decode('utf-8', 'replace')}"
                )
                if err.code in FATAL_STATUS:
                    return Generation(error=last_error, fatal=True)
                if err.code not in RETRY_STATUS:
                    return Generation(error=last_error)
                continue
            except (TimeoutError, urllib.error.URLError, ConnectionError) as err:
                last_error = self._scrub(f"{type(err).__name__}: {getattr(err, 'reason', err)}")
                continue
            except json.JSONDecodeError as err:
                last_error = f"invalid JSON from server: {err}"
                continue
            try:
                text = data["choices"][0]["message"]["content"] or ""
            except (KeyError, IndexError, TypeError):
                return Generation(error=self._scrub(f"unexpected response shape: {str(data)[:200]}"))
            bad = non_finite_logprobs(data["choices"][0])
            if bad:  # the served weights, not the call: every call would answer alike; never cached, never retried
                return Generation(
                    error=f"NonFiniteLogitsError: non-finite answer log-probabilities {bad[:3]} from {self.identity}",
                    broken_model=True,
                )
            usage = data.get("usage") or {}
            return Generation(
                text=text.strip(),
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                extra={"attempts": attempt + 1, "seconds": time.perf_counter() - start},
            )
        return Generation(error=f"gave up after {self.max_retries + 1} attempts: {last_error}")

    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, [self.api_key]) or ""


def non_finite_logprobs(choice: dict) -> list:
    """The non-finite log-probabilities of one answer (a chat-completions ``choice``): every ``logprob`` of its
    ``logprobs.content`` tokens and their ``top_logprobs``, and a completions-style ``logprobs.token_logprobs`` list,
    that is NaN, infinite or null (a server that serialises NaN as JSON null); empty when the answer carries none or
    all are finite. A log-probability of -inf is as broken as NaN: greedy decoding never picks such a token."""
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(logprobs, dict):
        return []
    values = list(logprobs.get("token_logprobs") or [])
    for token in logprobs.get("content") or []:
        if isinstance(token, dict):
            values.append(token.get("logprob"))
            values += [top.get("logprob") for top in token.get("top_logprobs") or [] if isinstance(top, dict)]
    return [v for v in values if not isinstance(v, (int, float)) or not math.isfinite(v)]


def openai_media_kind(modalities, use_audio_in_video: bool, media: MediaInput) -> str:
    """What a served model with `modalities` gets of a sample under the flag (`zero_shot.media.plan_media`).

    Raises:
        MediaError: the model reads text only, or the sample lacks media it needs.
    """
    if "video" not in modalities and "audio" not in modalities:
        raise MediaError(
            media.sample_id or "?",
            media.video or media.audio,
            "the served model reads text only (its judge config lists no video/audio modalities); run with "
            "--ignore-media to judge the descriptions alone",
        )
    return plan_media(
        media,
        sees_video="video" in modalities,
        hears_audio="audio" in modalities,
        use_audio_in_video=use_audio_in_video,
        check_files=False,
    ).kind


def wav_bytes(waveform: np.ndarray, sampling_rate: int) -> bytes:
    """A mono float waveform in [-1, 1] as a 16-bit PCM WAV file's bytes."""
    pcm = (np.clip(np.asarray(waveform, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sampling_rate)
        out.writeframes(pcm.tobytes())
    return buf.getvalue()
