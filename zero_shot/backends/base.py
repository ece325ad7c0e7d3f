"""What every generation backend takes and returns."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


# secret-shaped strings (OpenAI-style `sk-...` keys, Hugging Face `hf_...` tokens, bearer tokens)
_SECRET_SHAPES = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}|\bhf_[A-Za-z0-9]{8,}|(?i:\bbearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
REDACTED = "[REDACTED]"


def scrub_secrets(text: str | None, secrets: Iterable[str | None] = ()) -> str | None:
    """`text` with every given secret (e.g. the configured API key) and every `sk-`/`hf_`/bearer-shaped token
    replaced by `[REDACTED]`. Applied to every error a backend stores or prints (servers echo keys back in 401
    bodies)."""
    if not text:
        return text
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _SECRET_SHAPES.sub(REDACTED, text)


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings, recorded in every report and in the cache input hash.

    Attributes:
        do_sample: sample (True) or decode greedily (False).
        temperature, top_p: sampling parameters (ignored when `do_sample` is False).
        max_new_tokens: generation budget per call.
        seed: base seed; each call's seed also depends on its run, step and content (prompt, media), never on a name.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MediaInput:
    """Media for one call, already resolved to files (or pre-decoded arrays, for tests and custom loaders).

    Attributes:
        video: path of a video file.
        audio: path of an audio file.
        frames: pre-decoded video frames, `uint8` array of shape `(T, H, W, 3)`; used instead of `video`.
        waveform: pre-decoded mono audio, `float32` array of shape `(S,)` at `sampling_rate`.
        sampling_rate: Hz of `waveform`.
        sample_id: the sample the media belongs to (named in media errors; not part of the cache input hash).
    """

    video: str | None = None
    audio: str | None = None
    frames: Any = None
    waveform: Any = None
    sampling_rate: int = 16000
    sample_id: str | None = None

    def kinds(self) -> set[str]:
        out = set()
        if self.video is not None or self.frames is not None:
            out.add("video")
        if self.audio is not None or self.waveform is not None:
            out.add("audio")
        return out


@dataclass(frozen=True)
class ChatRequest:
    """One call: a user prompt (with optional system prompt and media) and its seed.

    Attributes:
        prompt: the user message text.
        system: the system message ("" for none).
        media: media to show the model (multimodal backends only).
        seed: per-call seed (sampling only).
        score_labels: when set, the backend scores these answer strings after `answer_prefix` instead of
            generating (logit-based verdicts), returning their normalised probabilities.
        answer_prefix: the assistant-turn prefix the label strings continue.
    """

    prompt: str
    system: str = ""
    media: MediaInput | None = None
    seed: int = 0
    score_labels: tuple[str, ...] | None = None
    answer_prefix: str = ""


@dataclass
class Generation:
    """A backend's answer to one request.

    Attributes:
        text: generated text ("" when the call failed).
        probs: label -> probability when the request asked for `score_labels`.
        error: why the call failed (None on success); failed calls are counted and never cached. Secrets are
            scrubbed from it (`scrub_secrets`).
        fatal: the failure is not about this request but about the judge itself (HTTP 401/403/404: wrong key,
            no permission, unknown model or URL): no further call can succeed, so the run stops.
        broken_model: a local model answered non-finite logits (`zero_shot.parsing.NonFiniteLogitsError`): its
            weights are broken, a rerun gives the same, so the run stops naming the pair (never cached).
        prompt_tokens, completion_tokens: token counts where the backend knows them.
        prefill_s, decode_s: seconds spent on the prompt and on generated tokens (local backends).
    """

    text: str = ""
    probs: dict[str, float] | None = None
    error: str | None = None
    fatal: bool = False
    broken_model: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, err: Exception) -> Generation:
        """The failed call of a local backend that raised `err` (its type and message), `broken_model` when the
        model's answer logits were not finite."""
        from zero_shot.parsing import NonFiniteLogitsError

        return cls(error=f"{type(err).__name__}: {err}", broken_model=isinstance(err, NonFiniteLogitsError))


@runtime_checkable
class Backend(Protocol):
    """A model that answers chat requests.

    `modalities` says what it can see (`{"text"}` for a text LLM, `{"text", "video"}`, ...); `identity` is a
    string that changes when the model or its loading settings change (part of the cache input hash); `precision`
    is the precision identity its weights compute with (`emoreward.models.precision.precision_identity`: dtype and
    kernels; None for a server or a stand-in without weights), also part of the cache input hash.
    `generate` answers a batch of requests in order; a failure of one call is reported in its `Generation`
    rather than raised, so one bad sample does not stop a run.
    """

    modalities: frozenset[str]
    identity: str
    precision: dict | None

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]: ...


def build_messages(request: ChatRequest, media_parts: list[dict] | None = None) -> list[dict]:
    """Chat messages in the OpenAI / Qwen layout: optional system message, then the user turn whose content
    is the media parts followed by the prompt text."""
    messages: list[dict] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    if media_parts:
        messages.append({"role": "user", "content": [*media_parts, {"type": "text", "text": request.prompt}]})
    else:
        messages.append({"role": "user", "content": request.prompt})
    return messages
