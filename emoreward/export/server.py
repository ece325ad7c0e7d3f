"""`emoreward serve`: an HTTP reward server for RL pipelines (OpenRLHF ``--remote_rm_url``, verl, any client).

    emoreward serve --model DIR [--host 127.0.0.1] [--port 8000] [--media-root DIR]

Endpoints (JSON in, JSON out; UTF-8):

``POST /v1/rewards``
    Request: ``{"descriptions": [str, ...], "media": MEDIA}`` where ``MEDIA`` is omitted (no context), one object
    for every description, or a list with one object (or ``null``) per description. A media object has the keys
    ``subtitle`` (the sample's transcript, read by every model), ``video`` and ``audio`` (paths RELATIVE to the
    server's ``--media-root``, read by multimodal models; a text model refuses them unless started with
    ``--allow-unused-media``). A multimodal model needs the media it reads (``video`` for Qwen2.5-VL, ``audio``
    for Qwen2-Audio, both for the Qwen2.5-Omni thinker unless its audio comes from the video).

    Reply: ``{"rewards": [float, ...], "truncated": [bool, ...], "empty": [bool, ...], "n_tokens": [int, ...],
    "model": str}``: one reward per description (the model's r(description | context), unnormalised, what
    `model.score` returns), whether the description was cut to fit the model's ``max_length`` tokens, whether it
    was empty or whitespace only (it is still scored), and the tokens the model read for it.

``POST /get_reward``
    OpenRLHF's remote reward model. Request: ``{"query": [str, ...], "prompts": [str, ...], "labels": [...]}``:
    ``query`` is OpenRLHF's decoded sequence (``tokenizer.decode(prompt_ids + response_ids,
    skip_special_tokens=False)``: current OpenRLHF sends one sample per request; older versions send the whole
    rollout batch, decoded from left- and right-padded rows). The description is recovered exactly (see
    `description_from_query`: pad / EOS markers stripped from both ends, the prompt removed, the trailing
    end-of-turn / EOS / pad markers removed) and scored like ``/v1/rewards`` (the same token layout, so the same
    reward). ``labels`` are the samples' subtitles with ``--openrlhf-labels subtitle`` and are ignored otherwise.

    Reply: ``{"rewards": [...], "scores": [...], "truncated": [...], "empty": [...], "extra_logs":
    {"emotion_reward": [...], "emotion_reward_truncated": [0/1, ...], "emotion_reward_empty": [0/1, ...]}}``
    (the shape of ``openrlhf.cli.serve_rm``; OpenRLHF logs every ``extra_logs`` key). Multimodal models need
    ``/v1/rewards`` (OpenRLHF's request carries no media).

``GET /health``
    ``{"status": "ok", "model", "kind", "max_length_tokens", "limits", "queue", "stats"}``.

Load (RL rollouts send hundreds of samples at once): requests wait in a bounded queue and concurrent requests are
scored together, in one model call of up to ``--max-batch-tokens`` estimated tokens (requests of different samples
too: a multimodal model still groups descriptions by sample behind one media prefix). A request is refused with
503 and a ``Retry-After`` header only when the queue holds ``--max-queue`` descriptions, or when it waited
``--queue-timeout`` seconds without being scored (below OpenRLHF's 180 s client timeout, so its retry applies).
One event-loop thread serves every connection (idle connections hold no thread; at most ``--max-connections``
are open, more get 503) and one thread runs the model.

Limits are in tokens: a description longer than the model's ``max_length`` tokens (with its context) is cut and
flagged (``truncated``), or refused with 413 under ``--overlong refuse``. ``--max-chars`` refuses longer text
fields before tokenizing; its default is derived from ``max_length`` (`max_chars_for`) so that it refuses no text
that could fit in ``max_length`` tokens (runs of whitespace a tokenizer drops aside).

Errors are JSON ``{"error": "..."}`` naming the field: 400 (invalid JSON, JSON nested too deeply, text that is not
valid Unicode such as a lone surrogate, wrong fields, a media path outside the media root: absolute, with ``..``
or through a symlink; no file is read for it), 401 (missing or wrong bearer token), 404, 405, 408 (request not
received in time), 411 (no Content-Length), 413 (body, item count or text over the limits; ``--overlong
refuse``), 415 (not JSON), 503 (busy, see above, or shutting down). 500 only for a failure inside the model.

Security: binds 127.0.0.1 by default. With the environment variable named by ``--token-env`` (default
``EMOREWARD_SERVE_TOKEN``) set, every endpoint needs ``Authorization: Bearer <token>`` (the token is never logged).
A non-loopback ``--host`` without a token asks for confirmation (or needs ``--insecure-no-auth``).
SIGTERM and Ctrl-C stop accepting, finish the queued requests and print a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import hmac
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11

from emoreward.models.base import RewardContext, ScoreInfo
from emoreward.models.precision import precision_record


logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "EMOREWARD_SERVE_TOKEN"
MAX_HEAD_BYTES = 16 * 1024  # request line + headers
READ_CHUNK = 64 * 1024

# End-of-turn, EOS and pad markers of common chat models, as `tokenizer.decode(..., skip_special_tokens=False)`
# writes them into OpenRLHF's queries (Qwen / ChatML, Llama 3, Phi, Gemma, Mistral / Llama 2, GPT-2 style).
DEFAULT_QUERY_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "<pad>",
    "</s>",
)


# ---------------------------------------------------------------------------------------------- limits
@dataclass(frozen=True)
class ServerLimits:
    """Request limits and queueing (defaults sized for RL rollouts: hundreds of samples in flight).

    Attributes:
        max_body_bytes (`int`): largest request body (older OpenRLHF posts a whole rollout batch at once).
        max_items (`int`): most descriptions (or queries) in one request.
        max_chars (`int` or `None`): longest text field (description, subtitle, query) in characters, checked
            before tokenizing; None: derived from the model's ``max_length`` tokens (`max_chars_for`).
        max_queue (`int`): descriptions queued or being scored; a request that would exceed it gets 503.
        queue_timeout (`float`): seconds a request may wait in the queue before it is answered 503.
        max_batch_tokens (`int`): estimated tokens (about 4 characters each) merged into one model call.
        max_connections (`int`): open connections; more are answered 503 and closed.
        keepalive_timeout (`float`): seconds an idle keep-alive connection stays open.
        read_timeout (`float`): seconds to receive one request (headers and body).
    """

    max_body_bytes: int = 64 * 1024 * 1024
    max_items: int = 8192
    max_chars: int | None = None
    max_queue: int = 32768
    queue_timeout: float = 150.0
    max_batch_tokens: int = 16384
    max_connections: int = 1024
    keepalive_timeout: float = 15.0
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "max_chars" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ServerLimits.{name} must be positive, got {value!r}")
        if self.max_items > self.max_queue:
            raise ValueError(f"ServerLimits.max_items ({self.max_items}) exceeds max_queue ({self.max_queue})")


def max_chars_for(model: Any, fallback: int = 32_000) -> int:
    """The longest text (characters) that can still fit in the model's ``max_length`` tokens.

    ``max_length`` times the longest token of the model's vocabulary in characters (a byte-level token, a word
    piece or a sentencepiece never decodes to more characters than its vocabulary entry has), and for WordPiece
    tokenizers at least the longest word that becomes one ``[UNK]``. Whitespace that a tokenizer drops is not
    bounded by this; such text is refused as over-long. Without a tokenizer: ``fallback``.
    """
    tokenizer = getattr(model, "tokenizer", None)
    max_length = int(getattr(getattr(model, "settings", None), "max_length", 0) or 0)
    if tokenizer is None or not max_length or not hasattr(tokenizer, "get_vocab"):
        return fallback
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    backend = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    longest = max(longest, int(getattr(backend, "max_input_chars_per_word", 0) or 0))
    return max_length * max(1, longest)


class RequestError(Exception):
    """A request answered with an error: HTTP status, a message for the client, extra headers."""

    def __init__(self, status: HTTPStatus | int, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status = HTTPStatus(status)
        self.message = message
        self.headers = headers or []


# ---------------------------------------------------------------------------------------------- OpenRLHF queries
def _marker_pattern(markers: list[str], at: str) -> re.Pattern:
    return _compiled_marker_pattern(tuple(markers), at)


@functools.lru_cache(maxsize=64)
def _compiled_marker_pattern(markers: tuple[str, ...], at: str) -> re.Pattern:
    """The regex of a run of `markers` at the start or end of a query (compiled once per marker set: the markers
    are fixed for a server's life, and every OpenRLHF query is matched against them)."""
    alternatives = "|".join(re.escape(m) for m in sorted(set(markers), key=len, reverse=True) if m)
    if at == "start":
        return re.compile(rf"^(?:\s*(?:{alternatives}))+")
    return re.compile(rf"(?:{alternatives})(?:\s*(?:{alternatives}))*\s*$")


def description_from_query(
    query: str, prompt: str | None, pad_markers: list[str], end_markers: list[str]
) -> str | None:
    """The response text of an OpenRLHF query, exactly as the policy wrote it; None if ``query`` does not contain
    ``prompt`` where it should.

    OpenRLHF builds ``query`` as ``tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)``: the
    response ends with the policy's EOS (its end-of-turn token for chat models), and older versions decode
    whole padded rows (pad / EOS tokens on the left of the prompt and after the EOS). So: strip ``pad_markers``
    (and whitespace between them) from the start of the query and of the prompt, remove the prompt, then strip
    ``end_markers`` (and whitespace between and after them) from the end. Whitespace the policy wrote before its
    end-of-turn token stays part of the description (it changes a chat model's tokens).
    """
    text = _marker_pattern(pad_markers, "start").sub("", query, count=1) if pad_markers else query
    if prompt is not None:
        prompt = _marker_pattern(pad_markers, "start").sub("", prompt, count=1) if pad_markers else prompt
        if text.startswith(prompt):
            text = text[len(prompt) :]
        elif text.lstrip().startswith(prompt.lstrip()):  # decoders that write a space after a special token
            text = text.lstrip()[len(prompt.lstrip()) :]
        else:
            return None
    return _marker_pattern(end_markers, "end").sub("", text, count=1) if end_markers else text


def query_markers(model: Any, extra: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(pad markers, end markers) for `description_from_query`: `DEFAULT_QUERY_MARKERS`, the reward model's own
    EOS and pad tokens (end markers also its SEP token, which closes an encoder's input), and ``extra`` (the
    policy's markers when they are not among these)."""
    tokenizer = getattr(model, "tokenizer", None)
    own = [getattr(tokenizer, name, None) for name in ("eos_token", "pad_token")] if tokenizer is not None else []
    own = [t for t in own if isinstance(t, str) and t]
    sep = getattr(tokenizer, "sep_token", None) if tokenizer is not None else None
    pad = [*DEFAULT_QUERY_MARKERS, *own, *extra]
    end = pad + ([sep] if isinstance(sep, str) and sep else [])
    return pad, end


# ---------------------------------------------------------------------------------------------- the service
@dataclass
class Job:
    """One request's descriptions on their way through the queue (filled by `RewardService.score_jobs`)."""

    route: str
    descriptions: list[str]
    contexts: list[RewardContext]
    fields: list[str]
    tokens: int
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future, repr=False)
    deadline: float = math.inf
    cancelled: bool = False
    info: ScoreInfo | None = None
    error: RequestError | None = None

    @property
    def n(self) -> int:
        return len(self.descriptions)


@dataclass
class ServerStats:
    """Counters of a running server (every answered request is in exactly one of the request counters)."""

    requests: int = 0  # answered 200
    descriptions: int = 0
    empty: int = 0
    truncated: int = 0
    refused_overlong: int = 0
    busy: int = 0  # answered 503
    bad_requests: int = 0  # answered 4xx
    failures: int = 0  # answered 500
    batches: int = 0

    def line(self) -> str:
        return (
            f"{self.requests} requests ({self.descriptions} descriptions: {self.empty} empty, {self.truncated} "
            f"truncated) in {self.batches} model calls; {self.busy} answered 503 (busy), {self.bad_requests} bad "
            f"requests ({self.refused_overlong} over-long refused), {self.failures} failures"
        )


class RewardService:
    """What the endpoints do: validate request bodies into `Job`s, score queued jobs together with one reward model,
    and build the replies. No HTTP here (`RewardServer` serves it).

    Args:
        model (`RewardModel`): the reward model, text (reads the subtitle only) or multimodal.
        limits (`ServerLimits`): request limits.
        batch_size (`int`): most sequences per forward pass.
        forward_tokens (`int`, *optional*): text models: about this many tokens per forward pass (estimated, 4
            characters a token): the rows per pass are ``forward_tokens // mean tokens``, at most ``batch_size``, so
            that long descriptions of varied lengths are not all padded to the longest. None: 1024 on CPU (measured
            best there: OV-MERD descriptions score 2x faster in rows of 4-8 than of 64), 16384 on a GPU.
        openrlhf_labels (`"ignore"` or `"subtitle"`): what OpenRLHF ``labels`` are.
        allow_unused_media (`bool`): a text model accepts (and ignores) video / audio paths (otherwise 400).
        name (`str`): the model name returned to clients.
        media_root (`str` or `Path`, *optional*): the only folder media paths may point into (multimodal models);
            without it every media path is refused.
        overlong (`"flag"` or `"refuse"`): a description over ``max_length`` tokens is cut and flagged in the reply,
            or its request is refused with 413.
        extra_query_markers (`list[str]`): more special-token strings to strip from OpenRLHF queries (the
            policy's EOS / pad / end-of-turn text when not in `DEFAULT_QUERY_MARKERS`).

    Raises:
        ValueError: an unknown ``openrlhf_labels`` / ``overlong``, or a ``media_root`` that is not a directory.
    """

    def __init__(
        self,
        model: Any,
        limits: ServerLimits | None = None,
        batch_size: int = 64,
        openrlhf_labels: str = "ignore",
        allow_unused_media: bool = False,
        name: str = "emoreward",
        media_root: str | Path | None = None,
        overlong: str = "flag",
        extra_query_markers: list[str] | tuple[str, ...] = (),
        forward_tokens: int | None = None,
    ):
        if openrlhf_labels not in ("ignore", "subtitle"):
            raise ValueError(f"openrlhf_labels must be 'ignore' or 'subtitle', got {openrlhf_labels!r}")
        if overlong not in ("flag", "refuse"):
            raise ValueError(f"overlong must be 'flag' or 'refuse', got {overlong!r}")
        self.model = model
        self.limits = limits or ServerLimits()
        self.max_chars = self.limits.max_chars or max_chars_for(model)
        self.max_length = int(getattr(model.settings, "max_length", 0) or 0)
        self.batch_size = batch_size
        if forward_tokens is None:
            device = getattr(model, "device", None)
            forward_tokens = 1024 if getattr(device, "type", "cpu") == "cpu" else 16384
        self.forward_tokens = forward_tokens
        self.openrlhf_labels = openrlhf_labels
        self.allow_unused_media = allow_unused_media
        self.name = name
        self.overlong = overlong
        self.media_root = None if media_root is None else Path(media_root).resolve()
        if self.media_root is not None and not self.media_root.is_dir():
            raise ValueError(f"--media-root {media_root} is not a directory")
        self.pad_markers, self.end_markers = query_markers(model, list(extra_query_markers))
        self.stats = ServerStats()
        self._stats_lock = threading.Lock()
        self._warned_truncation = False

    def count(self, **increments: int) -> None:
        with self._stats_lock:
            for key, value in increments.items():
                setattr(self.stats, key, getattr(self.stats, key) + value)

    # ------------------------------------------------------------------ validation helpers
    def _list(self, value: Any, field_name: str) -> list:
        if not isinstance(value, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a list")
        if not value:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' is empty")
        if len(value) > self.limits.max_items:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {len(value)} items; the limit is {self.limits.max_items} per request",
            )
        return value

    def _text(self, item: Any, field_name: str, allow_none: bool = False, cap: bool = True) -> str | None:
        if item is None and allow_none:
            return None
        if not isinstance(item, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a string")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' is not valid Unicode text: a lone surrogate (\\u{ord(item[err.start]):04x}) at "
                f"character {err.start}",
            ) from None
        if cap and len(item) > self.max_chars:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {len(item)} characters; the limit is {self.max_chars} (no text that long fits "
                f"the model's {self.max_length} tokens)",
            )
        return item

    def _estimate_tokens(self, description: str, context: RewardContext) -> int:
        tokens = 2 + (len(description) + len(context.subtitle or "")) // 4
        return min(tokens, self.max_length) if self.max_length else tokens

    def _job(self, route: str, descriptions: list[str], contexts: list[RewardContext], fields: list[str]) -> Job:
        tokens = sum(self._estimate_tokens(d, c) for d, c in zip(descriptions, contexts))
        return Job(route, descriptions, contexts, fields, tokens)

    def _media(self, media: Any, n: int) -> list[RewardContext]:
        """Contexts, one per description, from ``media`` (an object, a list of objects, or None).

        A text model reads the subtitle only (media paths are a 400 unless ``allow_unused_media``). A multimodal
        model reads ``video`` / ``audio`` paths relative to the server's media root: absolute paths, ``..`` parts
        and paths that leave the root through a symlink are a 400 naming the field, and no file is read for them.
        """
        if isinstance(media, dict):  # one object for every description: checked and resolved once
            return [self._context(media, 0)] * n
        if media is None:
            media = [None] * n
        if not isinstance(media, list) or len(media) != n:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "'media' must be an object or a list with one object per description"
            )
        return [self._context(ref, k) for k, ref in enumerate(media)]

    def _context(self, ref: Any, k: int) -> RewardContext:
        """The context of one `media[k]` object (None: no media)."""
        if ref is None:
            ref = {}
        if not isinstance(ref, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'media[{k}]' must be an object")
        unknown = sorted(set(ref) - {"subtitle", "video", "audio"})
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'media[{k}]' has unknown keys {unknown}")
        paths = {key: self._text(ref.get(key), f"media[{k}].{key}", allow_none=True) for key in ("video", "audio")}
        subtitle = self._text(ref.get("subtitle"), f"media[{k}].subtitle", allow_none=True)
        if self.model.kind == "text":
            given = [key for key, value in paths.items() if value]
            if given and not self.allow_unused_media:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"'media[{k}].{given[0]}' given, but this reward model is text-only (it uses the subtitle); "
                    "start the server with --allow-unused-media to accept and ignore media paths",
                )
            return RewardContext(subtitle or None)
        resolved = {key: self._media_path(value, f"media[{k}].{key}") for key, value in paths.items()}
        for needed in sorted(self.model.modalities):
            if resolved[needed] is None and not (needed == "audio" and self._audio_from_video(resolved)):
                raise RequestError(
                    HTTPStatus.BAD_REQUEST, f"'media[{k}].{needed}' is required: this reward model reads {needed}"
                )
        # the sample id names the media as the client wrote it: equal media share one prefix, and errors name the
        # client's path, not the server's file layout
        sample = paths["video"] or paths["audio"]
        return RewardContext(subtitle or None, resolved["video"], resolved["audio"], sample_id=sample)

    def _audio_from_video(self, resolved: dict[str, str | None]) -> bool:
        return bool(getattr(self.model.settings, "use_audio_in_video", False) and resolved["video"])

    def _media_path(self, value: str | None, field_name: str) -> str | None:
        """The absolute path of a media file inside the media root, or a 400 naming `field_name` (no file is read
        for a refused path: only the path is resolved)."""
        if not value:
            return None
        if self.media_root is None:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}': media paths are refused: the server was started without --media-root",
            )
        path = Path(value)
        if path.is_absolute() or ".." in path.parts or "\x00" in value:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a relative path inside the media root, without '..'"
            )
        full = (self.media_root / path).resolve()
        if not full.is_relative_to(self.media_root):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' leaves the media root (through a symlink)")
        if not full.is_file():
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}': no such file in the media root: {value}")
        return str(full)

    # ------------------------------------------------------------------ requests -> jobs
    def parse(self, route: str, body: Any) -> Job:
        """A validated `Job` from a request body (``route``: ``"rewards"`` or ``"openrlhf"``).

        Raises:
            RequestError: 400 / 413 naming the field.
        """
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        if route == "rewards":
            return self._parse_rewards(body)
        if route == "openrlhf":
            return self._parse_openrlhf(body)
        raise ValueError(f"unknown route {route!r}")

    def _parse_rewards(self, body: dict) -> Job:
        unknown = sorted(set(body) - {"descriptions", "media"})
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown fields {unknown}; expected 'descriptions', 'media'")
        if "descriptions" not in body:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing field 'descriptions'")
        items = self._list(body["descriptions"], "descriptions")
        descriptions = [self._text(d, f"descriptions[{k}]") for k, d in enumerate(items)]
        contexts = self._media(body.get("media"), len(descriptions))
        return self._job("rewards", descriptions, contexts, [f"descriptions[{k}]" for k in range(len(items))])

    def _parse_openrlhf(self, body: dict) -> Job:
        if "query" not in body:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing field 'query' (OpenRLHF remote reward model request)")
        queries = [self._text(q, f"query[{k}]", cap=False) for k, q in enumerate(self._list(body["query"], "query"))]
        n = len(queries)
        prompts: list[str | None] = [None] * n
        if body.get("prompts") is not None:
            given = self._list(body["prompts"], "prompts")
            if len(given) != n:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"'prompts' has {len(given)} items for {n} queries")
            prompts = [self._text(p, f"prompts[{k}]", cap=False) for k, p in enumerate(given)]
        descriptions = []
        for k, (query, prompt) in enumerate(zip(queries, prompts)):
            description = description_from_query(query, prompt, self.pad_markers, self.end_markers)
            if description is None:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"query[{k}] does not start with prompts[{k}] (after its left padding); send the decoded "
                    "prompt + response as OpenRLHF does",
                )
            descriptions.append(self._text(description, f"query[{k}] (its response)"))
        subtitles: list[str | None] = [None] * n
        labels = body.get("labels")
        if self.openrlhf_labels == "subtitle" and labels is not None:
            if not isinstance(labels, list) or len(labels) != n:
                count = f"{len(labels)} items" if isinstance(labels, list) else "no list"
                raise RequestError(HTTPStatus.BAD_REQUEST, f"'labels' has {count} for {n} queries")
            subtitles = [self._text(s, f"labels[{k}]", allow_none=True) or None for k, s in enumerate(labels)]
        if self.model.modalities:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                "/get_reward carries no media and this reward model reads "
                f"{' and '.join(sorted(self.model.modalities))}: use /v1/rewards with 'media'",
            )
        contexts = [RewardContext(s) for s in subtitles]
        return self._job("openrlhf", descriptions, contexts, [f"query[{k}]" for k in range(n)])

    # ------------------------------------------------------------------ scoring
    def score_jobs(self, jobs: list[Job]) -> None:
        """Score several jobs in ONE model call (`model.score_info`); fills each job's ``info`` or ``error``.

        A failure is isolated: the jobs are then scored one by one, so only the request that caused it fails
        (unreadable media or a context too long: 400 naming the field; anything else: 500).

        Raises:
            RuntimeError: the model returned a different number of rewards than descriptions (a broken model).
        """
        from emoreward.data.media import MediaError

        descriptions = [d for job in jobs for d in job.descriptions]
        contexts = [c for job in jobs for c in job.contexts]
        batch_size = self.batch_size
        if self.model.kind == "text" and descriptions:
            mean_tokens = sum(job.tokens for job in jobs) / len(descriptions)
            batch_size = max(1, min(batch_size, int(self.forward_tokens // max(mean_tokens, 1.0))))
        try:
            info = self.model.score_info(descriptions, contexts, batch_size=batch_size)
        except Exception as err:
            if len(jobs) > 1:
                for job in jobs:
                    self.score_jobs([job])
                return
            job = jobs[0]
            if isinstance(err, MediaError):
                job.error = RequestError(HTTPStatus.BAD_REQUEST, self._media_error_message(job, err))
            elif isinstance(err, ValueError):
                job.error = RequestError(HTTPStatus.BAD_REQUEST, f"cannot score this request: {err}")
            else:
                logger.exception("scoring failed")
                job.error = RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, "scoring failed; see the server log")
            return
        if not len(info.rewards) == len(info.truncated) == len(descriptions):
            raise RuntimeError(f"the model returned {len(info.rewards)} rewards for {len(descriptions)} descriptions")
        self.count(batches=1)
        start = 0
        for job in jobs:
            stop = start + job.n
            job.info = ScoreInfo(info.rewards[start:stop], info.truncated[start:stop], info.n_tokens[start:stop])
            start = stop

    def _media_error_message(self, job: Job, err: Any) -> str:
        """A `MediaError` as the client sees it: the request field and the path it sent (the server's own paths,
        also inside the decoder's message, replaced by the client's)."""
        where, shown, problem = "media", str(err.sample_id), str(err.problem)
        for k, context in enumerate(job.contexts):
            if context.sample_id == err.sample_id:
                key = "audio" if err.path is not None and err.path == context.audio else "video"
                where = f"media[{k}].{key}"
                break
        if err.path is not None and self.media_root is not None and Path(err.path).is_relative_to(self.media_root):
            shown = str(Path(err.path).relative_to(self.media_root))
            problem = problem.replace(err.path, shown)
        if self.media_root is not None:
            problem = problem.replace(str(self.media_root), "<media root>")
        return f"'{where}' ({shown}): cannot read media: {problem}"

    def reply(self, job: Job) -> dict[str, Any]:
        """The JSON reply of a scored job.

        Raises:
            RequestError: the job failed, or (``overlong="refuse"``) a description did not fit ``max_length``.
        """
        if job.error is not None:
            raise job.error
        info = job.info
        truncated = [bool(t) for t in info.truncated]
        empty = [not d.strip() for d in job.descriptions]
        if any(truncated):
            if self.overlong == "refuse":
                over = [f for f, t in zip(job.fields, truncated) if t]
                self.count(refused_overlong=1)
                raise RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"{', '.join(over[:5])}{' ...' if len(over) > 5 else ''}: over the model's max_length of "
                    f"{self.max_length} tokens (with the context); shorten it, or start the server without "
                    "--overlong refuse to score it cut to fit (flagged in 'truncated')",
                )
            if not self._warned_truncation:
                self._warned_truncation = True
                logger.warning(
                    "descriptions over the model's max_length of %d tokens are cut to fit and flagged "
                    "('truncated' in the reply); --overlong refuse refuses them",
                    self.max_length,
                )
        rewards = [float(r) for r in info.rewards]
        bad = [f for f, r in zip(job.fields, rewards) if not math.isfinite(r)]
        if bad:  # a broken model; JSON could not carry the value anyway
            logger.error("the model returned a non-finite reward for %s", ", ".join(bad[:5]))
            raise RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the model returned a non-finite reward for {bad[0]}"
            )
        self.count(requests=1, descriptions=job.n, empty=sum(empty), truncated=sum(truncated))
        if job.route == "openrlhf":
            return {
                "rewards": rewards,
                "scores": rewards,
                "truncated": truncated,
                "empty": empty,
                "extra_logs": {
                    "emotion_reward": rewards,
                    "emotion_reward_truncated": [float(t) for t in truncated],
                    "emotion_reward_empty": [float(e) for e in empty],
                },
            }
        return {
            "rewards": rewards,
            "truncated": truncated,
            "empty": empty,
            "n_tokens": [int(t) for t in info.n_tokens],
            "model": self.name,
        }

    def health(self) -> dict[str, Any]:
        limits = {**asdict(self.limits), "max_chars": self.max_chars}
        return {
            "status": "ok",
            "model": self.name,
            "kind": self.model.kind,
            "max_length_tokens": self.max_length,
            "precision": precision_record(self.model),  # the dtype every reward of this server is computed in
            "overlong": self.overlong,
            "limits": limits,
            "stats": asdict(self.stats),
        }


# ---------------------------------------------------------------------------------------------- queue + batching
class Batcher:
    """The bounded queue and the one scoring thread: jobs wait in FIFO order, and each model call takes the queued
    jobs that fit ``max_batch_tokens`` (at least one), so concurrent requests share forward passes."""

    def __init__(self, service: RewardService):
        self.service = service
        self.limits = service.limits
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self.pending = 0  # descriptions queued or being scored
        self._rate: float | None = None  # descriptions per second, smoothed
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="emoreward-scorer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def retry_after(self) -> int:
        """Seconds until the queue has room, estimated from the recent scoring rate (1 to 60)."""
        rate = self._rate or 1.0
        return int(min(60, max(1, math.ceil(self.pending / rate))))

    def busy(self, message: str) -> RequestError:
        return RequestError(HTTPStatus.SERVICE_UNAVAILABLE, message, [("Retry-After", str(self.retry_after()))])

    def full(self) -> bool:
        return self._stopping or self.pending >= self.limits.max_queue

    def submit(self, job: Job) -> None:
        """Queue a job.

        Raises:
            RequestError: 503 with Retry-After when the queue cannot take it, or the server is stopping.
        """
        with self._cv:
            if self._stopping:
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down")
            if self.pending and self.pending + job.n > self.limits.max_queue:
                raise self.busy(
                    f"the queue holds {self.pending} descriptions (limit {self.limits.max_queue}); retry later"
                )
            job.deadline = time.monotonic() + self.limits.queue_timeout
            self._queue.append(job)
            self.pending += job.n
            self._cv.notify()

    async def run(self, job: Job) -> dict[str, Any]:
        """Queue a job, wait for its model call, return its reply.

        Raises:
            RequestError: 503 (queue full or timed out), or the job's own error.
        """
        self.submit(job)
        try:
            await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        return self.service.reply(job)

    def _take(self) -> tuple[list[Job], list[Job]]:
        batch: list[Job] = []
        expired: list[Job] = []
        tokens = 0
        now = time.monotonic()
        while self._queue:
            job = self._queue[0]
            if job.cancelled or now > job.deadline:
                expired.append(self._queue.popleft())
                continue
            if batch and tokens + job.tokens > self.limits.max_batch_tokens:
                break
            batch.append(self._queue.popleft())
            tokens += job.tokens
        return batch, expired

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                batch, expired = self._take()
            for job in expired:
                job.error = self.busy(
                    f"waited {self.limits.queue_timeout:g} s in the queue without being scored; retry later"
                )
            if batch:
                start = time.perf_counter()
                try:
                    self.service.score_jobs(batch)
                except Exception:  # e.g. a model returning the wrong number of rewards: never leave a job waiting
                    logger.exception("scoring failed")
                    for job in batch:
                        job.error = RequestError(
                            HTTPStatus.INTERNAL_SERVER_ERROR, "scoring failed; see the server log"
                        )
                n = sum(job.n for job in batch)
                rate = n / max(time.perf_counter() - start, 1e-6)
                self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
            with self._cv:
                self.pending -= sum(job.n for job in batch) + sum(job.n for job in expired)
            for job in expired + batch:
                job.future.set_result(None)

    def close(self, timeout: float) -> bool:
        """Stop taking jobs, score the queued ones, wait for the thread (at most ``timeout`` s); True when done."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()


# ---------------------------------------------------------------------------------------------- HTTP
ROUTES = {"/v1/rewards": "rewards", "/get_reward": "openrlhf"}


def _raw_response(status: HTTPStatus, message: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"error": message}).encode("utf-8")
    head = [f"HTTP/1.1 {status.value} {status.phrase}", "Content-Type: application/json"]
    head += [f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Connection:
    """One client connection, HTTP/1.1 with keep-alive (parsed by h11)."""

    def __init__(self, server: RewardServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server, self.service = server, server.service
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    async def serve(self) -> None:
        limits = self.service.limits
        while not self.server.closing:
            idle = self.conn.their_state is h11.IDLE
            try:
                event = await self._next_event(limits.keepalive_timeout if idle else limits.read_timeout)
            except asyncio.TimeoutError:
                if not idle:
                    await self._send(HTTPStatus.REQUEST_TIMEOUT, {"error": "request not received in time"})
                return
            except h11.RemoteProtocolError as err:
                status = HTTPStatus(err.error_status_hint)
                await self._send(status, {"error": f"malformed HTTP request: {err}"}, close=True)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed, or a protocol state we do not continue from
            await self._handle(event)
            if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                return
            self.conn.start_next_cycle()

    async def _next_event(self, timeout: float):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError
            data = await asyncio.wait_for(self.reader.read(READ_CHUNK), remaining)
            self.conn.receive_data(data)

    async def _handle(self, request: h11.Request) -> None:
        path = request.target.decode("latin-1").split("?", 1)[0]
        method = request.method.decode("latin-1")
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
        service = self.service
        try:
            if path == "/health":
                if method != "GET":
                    raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "/health takes GET", [("Allow", "GET")])
                self._authorize(headers)
                await self._read_body(MAX_HEAD_BYTES)
                await self._send(HTTPStatus.OK, {**service.health(), "queue": self.server.batcher.pending})
                return
            route = ROUTES.get(path)
            if route is None:
                raise RequestError(HTTPStatus.NOT_FOUND, f"no endpoint {path}; try /v1/rewards or /get_reward")
            if method != "POST":
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes POST", [("Allow", "POST")])
            self._authorize(headers)
            body = await self._receive_json(headers)
            job = service.parse(route, body)
            result = await self.server.batcher.run(job)
        except RequestError as err:
            if err.status == HTTPStatus.SERVICE_UNAVAILABLE:
                service.count(busy=1)
            elif err.status >= 500:
                service.count(failures=1)
            else:
                service.count(bad_requests=1)
            logger.info("%s %s -> %d %s", method, path, err.status.value, err.message)
            await self._send(err.status, {"error": err.message}, err.headers)
            return
        except Exception:
            logger.exception("request failed")
            service.count(failures=1)
            await self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error; see the server log"})
            return
        await self._send(HTTPStatus.OK, result)

    def _authorize(self, headers: dict[str, str]) -> None:
        token = self.server.token
        if token is None:
            return
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise RequestError(
                HTTPStatus.UNAUTHORIZED,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                [("WWW-Authenticate", 'Bearer realm="emoreward"')],
            )

    async def _receive_json(self, headers: dict[str, str]) -> Any:
        """The request body parsed as JSON; every check that needs no body comes first (the queue check too), so
        a refused request's body is never read."""
        limits = self.service.limits
        ctype = headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise RequestError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be application/json, got {ctype}"
            )
        if "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" not in headers:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header (chunked bodies are refused)")
        length = int(headers["content-length"])  # h11 has checked it is a number
        if length > limits.max_body_bytes:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes; the limit is {limits.max_body_bytes}"
            )
        if self.server.batcher.full():
            raise self.server.batcher.busy("the queue is full; retry later")
        raw = await self._read_body(limits.max_body_bytes)
        if len(raw) > 1024 * 1024:  # a large body is parsed off the event loop
            return await asyncio.get_running_loop().run_in_executor(None, parse_json, raw)
        return parse_json(raw)

    async def _read_body(self, max_bytes: int) -> bytes:
        """The request body (h11 enforces its Content-Length framing)."""
        if self.conn.client_is_waiting_for_100_continue:
            self.writer.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        chunks, size = [], 0
        try:
            while True:
                event = await self._next_event(self.service.limits.read_timeout)
                if isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > max_bytes:
                        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {max_bytes} bytes")
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    return b"".join(chunks)
                else:
                    raise RequestError(HTTPStatus.BAD_REQUEST, "the connection ended before the body")
        except asyncio.TimeoutError:
            raise RequestError(HTTPStatus.REQUEST_TIMEOUT, "request body not received in time") from None
        except h11.RemoteProtocolError as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"malformed request body: {err}") from None

    async def _send(
        self,
        status: HTTPStatus,
        payload: dict[str, Any],
        headers: list[tuple[str, str]] | None = None,
        close: bool = False,
    ) -> None:
        try:
            data = json.dumps(payload, allow_nan=False).encode("utf-8")
        except ValueError:  # a NaN / inf reward: the model is broken, and JSON cannot carry it
            logger.error("the model returned a non-finite reward")
            self.service.count(failures=1)
            status, data = HTTPStatus.INTERNAL_SERVER_ERROR, b'{"error": "the model returned a non-finite reward"}'
        # a request whose body was not read leaves the connection unusable: close it
        close = close or self.conn.their_state not in (h11.DONE, h11.IDLE) or self.server.closing
        head = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        head += [("Server", "emoreward-serve"), *(headers or [])]
        if close:
            head.append(("Connection", "close"))
        try:
            out = self.conn.send(h11.Response(status_code=status.value, headers=head, reason=status.phrase.encode()))
            out += self.conn.send(h11.Data(data=data)) + self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # e.g. a response already started: nothing more can be sent
            return
        self.writer.write(out)
        try:
            await self.writer.drain()
        except ConnectionError:
            pass


def parse_json(raw: bytes) -> Any:
    """A request body as JSON.

    Raises:
        RequestError: 400 for a body that is not UTF-8, not JSON, or nested too deeply to parse.
    """
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not UTF-8: {err}") from None
    except json.JSONDecodeError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {err}") from None
    except RecursionError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "invalid JSON body: nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (JSON leaves duplicates undefined; Python keeps the last one,
    so `{"descriptions": [...], "descriptions": [...]}` would silently score only the second list)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{key}' appears twice in one JSON object")
        out[key] = value
    return out


class RewardServer:
    """The HTTP server around a `RewardService`: one asyncio event loop for all connections, one scoring thread.

    Use as a context manager (serves from a background thread; tests, notebooks) or call `serve` in an event loop
    (the CLI).

    Args:
        service (`RewardService`): what the endpoints call.
        host (`str`): address to bind (default loopback).
        port (`int`): TCP port; 0 picks a free one (read it back from ``.port``).
        token (`str`, *optional*): bearer token every request must carry (``Authorization: Bearer <token>``).
    """

    def __init__(self, service: RewardService, host: str = "127.0.0.1", port: int = 8000, token: str | None = None):
        if host not in LOOPBACK and not token:
            logger.warning("serving on %s without authentication: anyone who reaches it can use it", host)
        self.service = service
        self.batcher = Batcher(service)
        self.token = token or None
        self._bind = (host, port)
        self._address: tuple[str, int] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.closing = False
        self.started_at = time.time()

    @property
    def host(self) -> str:
        return self._address[0] if self._address else self._bind[0]

    @property
    def port(self) -> int:
        return self._address[1] if self._address else self._bind[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ------------------------------------------------------------------ in an event loop
    async def open(self) -> None:
        """Bind the socket and start the scoring thread."""
        self.batcher.start()
        self._server = await asyncio.start_server(self._on_connection, *self._bind, backlog=1024)
        self._address = self._server.sockets[0].getsockname()[:2]
        self.started_at = time.time()

    async def shutdown(self, grace: float = 60.0) -> bool:
        """Stop accepting, score what is queued (at most ``grace`` s), answer it and close every connection.
        True when every queued request was scored in time."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        done = await asyncio.get_running_loop().run_in_executor(None, self.batcher.close, grace)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        return done

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.closing or len(self._tasks) >= self.service.limits.max_connections:
            self.service.count(busy=1)
            message = "shutting down" if self.closing else "too many open connections; retry later"
            writer.write(_raw_response(HTTPStatus.SERVICE_UNAVAILABLE, message, self.batcher.retry_after()))
            await _close(writer)
            return
        self._tasks.add(task)
        try:
            await _Connection(self, reader, writer).serve()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # shutdown closes the connections still open; end quietly
            pass
        finally:
            self._tasks.discard(task)
            await _close(writer)

    async def log_stats(self, every: float) -> None:
        """Log the counters every ``every`` seconds while they change."""
        last = None
        while True:
            await asyncio.sleep(every)
            line = self.service.stats.line()
            if line != last:
                logger.info("%s; queue %d", line, self.batcher.pending)
                last = line

    # ------------------------------------------------------------------ from a background thread
    def start(self) -> RewardServer:
        """Serve from a background thread (returns once the socket is bound)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.open())
            except BaseException as err:  # e.g. the port is taken
                failure.append(err)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="emoreward-serve", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self, grace: float = 60.0) -> None:
        """Shut down (see `shutdown`) and end the background thread."""
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.shutdown(grace), self._loop).result(grace + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


# ---------------------------------------------------------------------------------------------------- CLI


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number (0-65535), got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0-65535), got {value}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward serve`."""
    from emoreward.cli import positive_float, positive_int

    d = ServerLimits()
    p.add_argument("--model", required=True, help="a reward-model directory (emoreward train, or a merged export)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help=f"environment variable holding the bearer token clients must send (default {TOKEN_ENV}; unset: none)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve on a non-loopback --host without a token and without asking",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="most sequences per forward pass (default 64)")
    p.add_argument(
        "--forward-tokens",
        type=positive_int,
        help="text models: about this many tokens per forward pass (default: 1024 on CPU, 16384 on a GPU)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=d.max_batch_tokens,
        help=f"estimated tokens of queued requests scored in one model call (default {d.max_batch_tokens})",
    )
    p.add_argument(
        "--max-queue",
        type=positive_int,
        default=d.max_queue,
        help=f"descriptions queued or being scored; beyond it requests get 503 + Retry-After (default {d.max_queue})",
    )
    p.add_argument(
        "--queue-timeout",
        type=positive_float,
        default=d.queue_timeout,
        help=f"seconds a request may wait to be scored before a 503 + Retry-After (default {d.queue_timeout:g})",
    )
    p.add_argument("--max-connections", type=positive_int, default=d.max_connections, help="open connections at most")
    p.add_argument("--max-body-bytes", type=positive_int, default=d.max_body_bytes, help="largest request body")
    p.add_argument("--max-items", type=positive_int, default=d.max_items, help="most descriptions per request")
    p.add_argument(
        "--max-chars",
        type=positive_int,
        help="longest text field in characters (default: derived from the model's max_length tokens, so that "
        "no text that fits is refused)",
    )
    p.add_argument(
        "--overlong",
        choices=["flag", "refuse"],
        default="flag",
        help="a description over the model's max_length tokens: cut to fit and flagged in 'truncated' (default), "
        "or refused with 413",
    )
    p.add_argument(
        "--openrlhf-labels",
        choices=["ignore", "subtitle"],
        default="ignore",
        help="what the 'labels' of OpenRLHF requests are (--label_key): ignored, or the sample's subtitle",
    )
    p.add_argument(
        "--query-marker",
        action="append",
        default=[],
        help="a special-token string of the policy to strip from OpenRLHF queries (its EOS / pad / end-of-turn "
        "text) when it is not one of: " + " ".join(DEFAULT_QUERY_MARKERS) + " (repeatable)",
    )
    p.add_argument("--allow-unused-media", action="store_true", help="text models: accept (and ignore) media paths")
    p.add_argument(
        "--media-root",
        help="multimodal models: the only folder request media paths may point into (relative paths); without it "
        "media paths are refused",
    )
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--log-every", type=positive_float, default=60.0, help="seconds between counter lines in the log")


def _confirm_no_auth(args: argparse.Namespace) -> bool:
    if args.host in LOOPBACK or args.insecure_no_auth:
        return True
    if not sys.stdin.isatty():
        return False
    answer = input(f"Serve on {args.host} WITHOUT authentication (anyone who reaches it can use it)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def run_serve(args: argparse.Namespace) -> int:
    """Load the model and serve until SIGTERM or Ctrl-C; then finish the queued requests and print a summary."""
    token = os.environ.get(args.token_env) or None
    if token is None and not _confirm_no_auth(args):
        raise ValueError(
            f"refusing to serve on {args.host} without authentication: set the environment variable "
            f"{args.token_env} to a token (clients send 'Authorization: Bearer <token>'), bind 127.0.0.1, or pass "
            "--insecure-no-auth"
        )
    if args.media_root:
        from emoreward.cli import check_media_root

        check_media_root(args.media_root)  # before the model loads
    if args.max_items > args.max_queue:
        raise ValueError(
            f"--max-items {args.max_items} exceeds --max-queue {args.max_queue}: no request that large fits"
        )
    limits = ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_items=args.max_items,
        max_chars=args.max_chars,
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout,
        max_batch_tokens=args.max_batch_tokens,
        max_connections=args.max_connections,
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from emoreward.models import load_reward_model

    model = load_reward_model(args.model, media_root=args.media_root)
    service = RewardService(
        model,
        limits,
        batch_size=args.batch_size,
        openrlhf_labels=args.openrlhf_labels,
        allow_unused_media=args.allow_unused_media,
        name=str(args.model),
        media_root=args.media_root,
        overlong=args.overlong,
        extra_query_markers=args.query_marker,
        forward_tokens=args.forward_tokens,
    )
    logger.setLevel(logging.INFO)  # counters and refused requests; never bodies or the token
    server = RewardServer(service, args.host, args.port, token=token)
    start = time.time()
    finished = asyncio.run(_serve_until_signal(server, args, token is not None))
    stats = service.stats
    _echo(f"served {stats.line()} in {time.time() - start:.0f} s")
    if not finished:
        _echo("warning: the shutdown grace period ended before every queued request was scored")
    return 0


async def _serve_until_signal(server: RewardServer, args: argparse.Namespace, auth: bool) -> bool:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.open()
    s = server.service
    _echo(
        f"emoreward serve: {args.model} on {server.url}  (POST /v1/rewards, POST /get_reward, GET /health; "
        f"{'bearer token required' if auth else 'no authentication'}; max_length {s.max_length} tokens, "
        f"queue {s.limits.max_queue} descriptions)"
    )
    stats_task = asyncio.create_task(server.log_stats(args.log_every))
    await stop.wait()
    _echo(f"shutting down: finishing {server.batcher.pending} queued descriptions")
    stats_task.cancel()
    return await server.shutdown()


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = [
    "DEFAULT_QUERY_MARKERS",
    "Batcher",
    "Job",
    "RequestError",
    "RewardServer",
    "RewardService",
    "ServerLimits",
    "ServerStats",
    "add_serve_arguments",
    "description_from_query",
    "max_chars_for",
    "parse_json",
    "query_markers",
    "run_serve",
]
