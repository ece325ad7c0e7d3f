"""An OpenAI-compatible chat-completions backend (a local vLLM / SGLang server or a hosted API).

Standard library only (`urllib`): per-request timeout, retries with exponential backoff on timeouts,
connection errors, HTTP 408/429/5xx, a concurrency limit (threads), and the API key read from an
environment variable named in the judge config (never from a file or the command line).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zero_shot.backends.base import ChatRequest, Generation, SamplingConfig, build_messages


logger = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def openai_identity(base_url: str, model: str) -> str:
    """The identity of an OpenAI-compatible backend (part of every cache input hash)."""
    return f"openai:{base_url.rstrip('/')}:{model}"


class OpenAIChatBackend:
    """Chat completions over HTTP.

    Args:
        base_url: server root up to `/v1` (e.g. `http://127.0.0.1:8000/v1`).
        model: the model name the server knows.
        api_key_env: name of the environment variable that holds the key; None for servers without auth.
        timeout_s: seconds per HTTP request.
        max_retries: extra attempts after the first failure of a retryable kind.
        backoff_s: first backoff; attempt `a` waits `backoff_s * 2**a` (capped at `max_backoff_s`).
        concurrency: requests in flight at once.
        modalities: what the served model accepts (`text`, plus `video` / `audio` sent as `file://` URLs,
            which a vLLM server started with `--allowed-local-media-path` reads).

    Raises:
        ValueError: `api_key_env` is set but the variable is missing or empty; bad numeric settings.
    """

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
    ):
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
        self.identity = openai_identity(base_url, model)
        self.n_attempts = 0

    def generate(self, requests: list[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        if len(requests) <= 1 or self.concurrency == 1:
            return [self._one(r, sampling) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), requests))

    def _payload(self, request: ChatRequest, sampling: SamplingConfig) -> dict:
        if request.score_labels:
            raise ValueError("logit-based verdicts are not supported by the OpenAI-compatible backend")
        parts = []
        if request.media is not None:
            missing = request.media.kinds() - self.modalities
            if missing:
                raise ValueError(f"{self.identity} does not accept {sorted(missing)}")
            if request.media.frames is not None or request.media.waveform is not None:
                raise ValueError("the OpenAI-compatible backend sends media files, not decoded arrays")
            if request.media.video:
                parts.append({"type": "video_url", "video_url": {"url": Path(request.media.video).resolve().as_uri()}})
            if request.media.audio:
                parts.append({"type": "audio_url", "audio_url": {"url": Path(request.media.audio).resolve().as_uri()}})
        payload = {
            "model": self.model,
            "messages": build_messages(request, parts or None),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature if sampling.do_sample else 0.0,
            "seed": request.seed,
        }
        if sampling.do_sample:
            payload["top_p"] = sampling.top_p
        return payload

    def _one(self, request: ChatRequest, sampling: SamplingConfig) -> Generation:
        try:
            body = json.dumps(self._payload(request, sampling)).encode()
        except ValueError as err:
            return Generation(error=str(err))
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
                last_error = f"HTTP {err.code}: {err.read()[:200].decode('utf-8', 'replace')}"
                if err.code not in RETRY_STATUS:
                    return Generation(error=last_error)
                continue
            except (TimeoutError, urllib.error.URLError, ConnectionError) as err:
                last_error = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
                continue
            except json.JSONDecodeError as err:
                last_error = f"invalid JSON from server: {err}"
                continue
            try:
                text = data["choices"][0]["message"]["content"] or ""
            except (KeyError, IndexError, TypeError):
                return Generation(error=f"unexpected response shape: {str(data)[:200]}")
            usage = data.get("usage") or {}
            return Generation(
                text=text.strip(),
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                extra={"attempts": attempt + 1, "seconds": time.perf_counter() - start},
            )
        return Generation(error=f"gave up after {self.max_retries + 1} attempts: {last_error}")
