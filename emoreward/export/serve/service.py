"""The serving logic, no HTTP: `RewardService` turns a parsed request body into a `Job` through its route
(`routes`), scores jobs with one reward model (several requests in one model call) and builds the reply:

    service = RewardService(load_reward_model(path), ServerLimits())
    reply = service.handle("rewards", {"descriptions": ["..."]})     # a route's name; raises RequestError

or, to batch requests itself: ``service.parse(route, body)`` per request, ``service.score_jobs(jobs)``, then
``service.reply(job)``. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from emoreward.data.context import MediaRef, RewardContext, reward_context
from emoreward.data.errors import DataError
from emoreward.data.media import unused_media
from emoreward.data.text import normal_text
from emoreward.export.length_monitor import StreamLengthMonitor, defined
from emoreward.export.reward_client import EngineUnavailable
from emoreward.export.serve import routes
from emoreward.export.serve.batching import Job
from emoreward.export.serve.facts import ServedModelFacts, served_model_facts
from emoreward.export.serve.protocol import RequestError, ServerLimits, log_refusal
from emoreward.models.base import NonFiniteError, ScoreInfo


logger = logging.getLogger(__name__)

# bytes of one file or folder name at most (NAME_MAX of Linux, macOS and Windows file systems)
MAX_NAME_BYTES = 255
# 5xx statuses that answer what the client chose (a transfer coding, an HTTP version): counted as bad requests
CLIENT_CHOSE = frozenset({HTTPStatus.NOT_IMPLEMENTED, HTTPStatus.HTTP_VERSION_NOT_SUPPORTED})


@dataclass
class ServerStats:
    """Counters of a running server (every answered request is in exactly one of the request counters)."""

    requests: int = 0  # answered 200
    descriptions: int = 0
    empty: int = 0
    truncated: int = 0
    refused_overlong: int = 0
    busy: int = 0  # answered 503
    abandoned: int = 0  # client gone before the reply (not answered; dropped before scoring)
    bad_requests: int = 0  # answered 4xx
    failures: int = 0  # answered 500
    batches: int = 0

    def line(self) -> str:
        return (
            f"{self.requests} requests ({self.descriptions} descriptions: {self.empty} empty, {self.truncated} "
            f"truncated) in {self.batches} model calls; {self.busy} answered 503 (busy), {self.bad_requests} bad "
            f"requests ({self.refused_overlong} over-long refused), {self.failures} failures, {self.abandoned} "
            "abandoned by their clients"
        )


class RewardService:
    """What the endpoints do: validate request bodies into `Job`s, score queued jobs together with one reward model,
    and build the replies (no HTTP). All it reads about the model is in ``facts`` (`facts.ServedModelFacts`); only
    ``scorer`` touches the model.

    Args:
        model (`RewardModel` or `ServedModelFacts`): the reward model, text (reads the subtitle only) or
            multimodal, scored here with ``model.score_info``; or the facts of a model loaded elsewhere (a model
            process), with the ``scorer`` that scores with it.
        limits (`ServerLimits`): request limits.
        batch_size (`int`): most sequences per forward pass.
        forward_tokens (`int`, *optional*): text models: about this many tokens per forward pass (estimated, 4
            characters a token): the rows per pass are ``forward_tokens // mean tokens``, at most ``batch_size``.
            None: 1024 on CPU, 16384 on a GPU (``facts.device``; docs/speed.md#how-to-choose).
        allow_unused_media (`bool`): a text model accepts (and ignores) video / audio paths (otherwise 400).
        name (`str`): the model name returned to clients.
        media_root (`str` or `Path`, *optional*): the only folder media paths may point into (multimodal models);
            without it every media path is refused.
        overlong (`"flag"` or `"refuse"`): a description over ``max_length`` tokens is cut and flagged in the reply,
            or its request is refused with 413.
        scorer (callable, *optional*): what scores a model call instead of ``model.score_info`` (same signature,
            result and exceptions): `emoreward.export.serve.worker.ModelProcess.score_info`, the model loaded
            in a process of its own (``emoreward serve``'s default); required when ``model`` is facts.
        scorer_alive (callable, *optional*): whether that scorer can still score (``ModelProcess``: its process is
            alive); when it says no, ``GET /health`` answers 503 with ``status: "model process stopped"``.
        **route_options: the registered routes' options (`routes.RouteOption`), e.g. OpenRLHF's
            ``openrlhf_labels`` (``"ignore"``, ``"subtitle"`` or ``"clip"``) and ``extra_query_markers``.

    Raises:
        ValueError: an unknown ``overlong`` or route option value, a ``media_root`` that is not a directory, or
            facts without a ``scorer``; TypeError: an option no route takes.
    """

    def __init__(
        self,
        model: Any,
        limits: ServerLimits | None = None,
        batch_size: int = 64,
        allow_unused_media: bool = False,
        name: str = "emoreward",
        media_root: str | Path | None = None,
        overlong: str = "flag",
        forward_tokens: int | None = None,
        length_window: int = 512,
        length_threshold: float = 0.5,
        scorer: Callable[..., ScoreInfo] | None = None,
        scorer_alive: Callable[[], bool] | None = None,
        **route_options: Any,
    ):
        settings = routes.settings(route_options)
        if overlong not in ("flag", "refuse"):
            raise ValueError(f"overlong must be 'flag' or 'refuse', got {overlong!r}")
        if isinstance(model, ServedModelFacts):
            if scorer is None:
                raise ValueError("RewardService(facts) needs the scorer of the model they describe")
            self.model, self.facts = None, model
        else:
            self.model, self.facts = model, served_model_facts(model)
        facts = self.facts
        self.scorer = scorer or model.score_info
        self.scorer_alive = scorer_alive
        self.limits = limits or ServerLimits()
        self.max_chars = self.limits.max_chars or facts.max_chars
        self.max_length = facts.max_length
        self.batch_size = batch_size
        if forward_tokens is None:
            forward_tokens = 1024 if facts.device == "cpu" else 16384
        self.forward_tokens = forward_tokens
        self.allow_unused_media = allow_unused_media
        self.name = name
        self.overlong = overlong
        self.media_root = None if media_root is None else Path(media_root).resolve()
        if self.media_root is not None and not self.media_root.is_dir():
            raise ValueError(f"--media-root {media_root} is not a directory")
        self.stats = ServerStats()
        self._stats_lock = threading.Lock()
        # the RL length-hacking monitor over the last `length_window` rewarded descriptions (every route)
        self.length_monitor = StreamLengthMonitor(length_window, length_threshold)
        self._warned_truncation = False
        # the routes this service answers, by name, each with its options
        self.routes = {route.name: route(self, **settings[route.name]) for route in routes.ROUTES.values()}

    def count(self, **increments: int) -> None:
        with self._stats_lock:
            for key, value in increments.items():
                setattr(self.stats, key, getattr(self.stats, key) + value)

    def record_error(self, err: RequestError) -> None:
        """Count a request answered with ``err`` (503: busy; 501 and 505, a transfer coding or HTTP version the
        client chose: bad request; any other 5xx: failure; the rest: bad request)."""
        if err.status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.count(busy=1)
        elif err.status >= 500 and err.status not in CLIENT_CHOSE:
            self.count(failures=1)
        else:
            self.count(bad_requests=1)

    def error_reply(self, err: Exception, method: str, path: str) -> tuple[int, dict[str, str], list]:
        """(status, JSON payload, extra headers) of a request that raised ``err``, counted and logged as every engine
        does: a `RequestError` as it says (`protocol.log_refusal`), anything else a 500 with its traceback logged."""
        if isinstance(err, RequestError):
            self.record_error(err)
            log_refusal(logger, method, path, err)
            return err.status, {"error": err.message}, err.headers
        logger.error("request failed", exc_info=err)
        self.count(failures=1)
        return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error; see the server log"}, []

    def handle(self, route: str, body: Any) -> dict[str, Any]:
        """The reply to one parsed request body, scored now in the caller's thread (no queue, no HTTP); call it from
        one thread at a time (the model is not thread-safe).

        Args:
            route (`str`): a route's name (`routes`): ``"rewards"`` (``POST /v1/rewards``), ``"openrlhf"``
                (``POST /get_reward``), ...
            body: the request body as `protocol.parse_json` returns it.

        Returns:
            The reply's JSON object (see `protocol` for its keys).

        Raises:
            RequestError: the HTTP status and message the client gets (400 / 413 for the request, 500 for a
                failure inside the model); counted in ``stats`` like the HTTP server counts it.
        """
        try:
            job = self.parse(route, body)
            if job.info is None:
                self.score_jobs([job])
            return self.reply(job)
        except RequestError as err:
            self.record_error(err)
            raise

    # ------------------------------------------------------------------ validation helpers (what routes call)
    def items(self, value: Any, field_name: str, allow_empty: bool = False) -> list:
        """The list at ``field_name``, or a 400 / 413 naming it (empty, not a list, over ``max_items``)."""
        if not isinstance(value, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a list")
        if not value and not allow_empty:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' is empty")
        if len(value) > self.limits.max_items:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {len(value)} items; the limit is {self.limits.max_items} per request",
            )
        return value

    def text(self, item: Any, field_name: str, allow_none: bool = False, cap: bool = True) -> str | None:
        """The text at ``field_name``, or a 400 / 413 naming it (not a string, a lone surrogate, over ``max_chars``)."""
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
        n_chars = len(normal_text(item)) if cap else 0  # counted as the model reads it: NFC and NFD are one text
        if n_chars > self.max_chars:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {n_chars} characters; the limit is {self.max_chars} (no text that long fits "
                f"the model's {self.max_length} tokens)",
            )
        return item

    def _estimate_tokens(self, description: str, context: RewardContext) -> int:
        tokens = 2 + (len(description) + len(context.subtitle or "")) // 4
        return min(tokens, self.max_length) if self.max_length else tokens

    def job(self, route: str, descriptions: list[str], contexts: list[RewardContext], fields: list[str]) -> Job:
        """The `Job` of a parsed request, its token costs estimated."""
        costs = [self._estimate_tokens(d, c) for d, c in zip(descriptions, contexts)]
        return Job(route, descriptions, contexts, fields, costs)

    def contexts(self, media: Any, n: int) -> list[RewardContext]:
        """Contexts, one per description, from ``media`` (an object, a list of objects, or None).

        A text model reads the subtitle only (media paths are a 400 unless ``allow_unused_media``). A multimodal
        model reads ``video`` / ``audio`` paths relative to the server's media root: absolute paths, ``..`` parts
        and paths that leave the root through a symlink are a 400 naming the field, and no file is read for them.
        """
        if isinstance(media, dict):  # one object for every description: checked and resolved once
            return [self.context(media, "media[0]")] * n
        if media is None:
            media = [None] * n
        if not isinstance(media, list) or len(media) != n:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "'media' must be an object or a list with one object per description"
            )
        return [self.context(ref, f"media[{k}]") for k, ref in enumerate(media)]

    def context(
        self,
        ref: Any,
        where: str,
        keys: tuple[str, ...] = ("subtitle", "video", "audio"),
        prompt: str | None = None,
        end_markers: list[str] | tuple[str, ...] = (),
    ) -> RewardContext:
        """The context of one media object (None: no media) found at ``where`` in the request (``media[3]``, or
        ``labels[3]`` for an OpenRLHF label that names the clip, which may also carry a ``sample_id``; its
        ``prompt`` may name the subtitle on a ``Subtitle:`` line), by the one context rule
        (`emoreward.data.context.reward_context`) and the one media rule (`emoreward.data.media.unused_media`)."""
        if ref is None:
            ref = {}
        if not isinstance(ref, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{where}' must be an object")
        unknown = sorted(set(ref) - set(keys))
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{where}' has unknown keys {unknown}")
        paths = {key: self.text(ref.get(key), f"{where}.{key}", allow_none=True) for key in ("video", "audio")}
        subtitle = self.text(ref.get("subtitle"), f"{where}.subtitle", allow_none=True)
        sample_id = self.text(ref.get("sample_id"), f"{where}.sample_id", allow_none=True)
        facts = self.facts
        if facts.kind == "text":
            given = [key for key, value in paths.items() if value]
            if given and not self.allow_unused_media:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"'{where}.{given[0]}' given, but this reward model is text-only (it uses the subtitle); "
                    "start the server with --allow-unused-media to accept and ignore media paths",
                )
            return self._rule(where, end_markers, subtitle=subtitle, prompt=prompt)
        ref_paths = MediaRef(paths["video"], paths["audio"])
        for key, why in unused_media(ref_paths, need_video=facts.sees_video, need_audio=facts.hears_audio,
                                     use_audio_in_video=facts.use_audio_in_video):  # fmt: skip
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{where}.{key}' given, but {why}: remove it (it would not change the reward)"
            )
        resolved = {key: self._media_path(value, f"{where}.{key}") for key, value in paths.items()}
        for needed in sorted(facts.modalities):
            if resolved[needed] is None and not (needed == "audio" and self._audio_from_video(resolved)):
                raise RequestError(
                    HTTPStatus.BAD_REQUEST, f"'{where}.{needed}' is required: this reward model reads {needed}"
                )
        # the sample id names the media as the client wrote it: equal media share one prefix, and errors name the
        # client's path, not the server's file layout
        sample = sample_id or paths["video"] or paths["audio"]
        return self._rule(
            where,
            end_markers,
            subtitle=subtitle,
            prompt=prompt,
            video=resolved["video"],
            audio=resolved["audio"],
            sample_id=sample,
        )

    def _rule(self, where: str, end_markers, **fields: Any) -> RewardContext:
        """`reward_context` of the request's fields; a conflict (a subtitle field and a prompt's `Subtitle:` line
        that differ) is a 400 naming the field."""
        try:
            return reward_context(**fields, source="request", names={"subtitle": f"{where}.subtitle"},
                                  end_markers=end_markers)  # fmt: skip
        except DataError as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, str(err)) from None

    def _audio_from_video(self, resolved: dict[str, str | None]) -> bool:
        return bool(self.facts.use_audio_in_video and resolved["video"])

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
        longest = max(len(os.fsencode(part)) for part in path.parts)
        if longest > MAX_NAME_BYTES:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' has a file or folder name of {longest} bytes; names have at most {MAX_NAME_BYTES}",
            )
        try:
            full = (self.media_root / path).resolve()
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13, OSError after)
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' cannot be resolved in the media root (a symlink loop?): {value}",
            ) from None
        if not full.is_relative_to(self.media_root):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' leaves the media root (through a symlink)")
        try:
            found = full.is_file()
        except OSError as err:  # e.g. a path longer than the system takes
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field_name}' cannot be a file in the media root: {err.strerror}"
            ) from None
        if not found:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}': no such file in the media root: {value}")
        return str(full)

    # ------------------------------------------------------------------ requests -> jobs
    def parse(self, route: str, body: Any) -> Job:
        """A validated `Job` from a request body, by the route named ``route`` (`routes`).

        Raises:
            RequestError: 400 / 413 naming the field. ValueError: no route of that name.
        """
        handler = self.routes.get(route)
        if handler is None:
            raise ValueError(f"unknown route {route!r}; known: {sorted(self.routes)}")
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return handler.parse(body)

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
        if self.facts.kind == "text" and descriptions:
            mean_tokens = sum(job.tokens for job in jobs) / len(descriptions)
            batch_size = max(1, min(batch_size, int(self.forward_tokens // max(mean_tokens, 1.0))))
        try:
            info = self.scorer(descriptions, contexts, batch_size=batch_size)
        except (EngineUnavailable, NonFiniteError):
            raise  # the engine failed, not one request: no job is scored again alone (`Batcher._score` answers all)
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
        self._monitor(jobs)

    def _media_error_message(self, job: Job, err: Any) -> str:
        """A `MediaError` as the client sees it: the request field and the path it sent (the server's own paths,
        also inside the decoder's message, replaced by the client's)."""
        where, shown, problem = "media", str(err.sample_id), str(err.problem)
        for k, context in enumerate(job.contexts):
            if context.sample_id == err.sample_id:
                key = "audio" if err.path is not None and err.path == context.audio else "video"
                where = f"{self.routes[job.route].media_field}[{job.offset + k}].{key}"
                break
        if err.path is not None and self.media_root is not None and Path(err.path).is_relative_to(self.media_root):
            shown = str(Path(err.path).relative_to(self.media_root))
            problem = problem.replace(err.path, shown)
        if self.media_root is not None:
            problem = problem.replace(str(self.media_root), "<media root>")
        return f"'{where}' ({shown}): cannot read media: {problem}"

    def _refusal(self, job: Job) -> RequestError | None:
        """The error a scored job's request gets although it was scored (``overlong="refuse"`` and a description
        cut to fit, or a non-finite reward: a broken model, and JSON could not carry the value), else None."""
        info = job.info
        if self.overlong == "refuse" and any(info.truncated):
            over = [f for f, t in zip(job.fields, info.truncated) if t]
            return RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{', '.join(over[:5])}{' ...' if len(over) > 5 else ''}: over the model's max_length of "
                f"{self.max_length} tokens (with the context); shorten it, or start the server without "
                "--overlong refuse to score it cut to fit (flagged in 'truncated')",
            )
        bad = [f for f, r in zip(job.fields, info.rewards) if not math.isfinite(r)]
        if bad:
            return RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the model returned a non-finite reward for {bad[0]}"
            )
        return None

    def _monitor(self, jobs: list[Job]) -> None:
        """Add one model call's rewarded descriptions to the length monitor, in ONE update (its figures cost
        O(window), so they are computed once per model call, not once per request; every reply of the call
        carries the window's figures after it)."""
        rewarded = [job for job in jobs if job.info is not None and job.n and self._refusal(job) is None]
        if rewarded:
            self.length_monitor.update(
                [float(r) for job in rewarded for r in job.info.rewards],
                [d for job in rewarded for d in job.descriptions],
            )

    def reply(self, job: Job) -> dict[str, Any]:
        """The JSON reply of a scored job.

        Raises:
            RequestError: the job failed, or (``overlong="refuse"``) a description did not fit ``max_length``.
        """
        if job.error is not None:
            raise job.error
        info = job.info
        refusal = self._refusal(job)
        if refusal is not None:
            if refusal.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
                self.count(refused_overlong=1)
            else:
                logger.error("%s", refusal.message)
            raise refusal
        truncated = [bool(t) for t in info.truncated]
        empty = [not d.strip() for d in job.descriptions]
        if not self._warned_truncation and any(truncated):
            self._warned_truncation = True
            logger.warning(
                "descriptions over the model's max_length of %d tokens are cut to fit and flagged "
                "('truncated' in the reply); --overlong refuse refuses them",
                self.max_length,
            )
        rewards = [float(r) for r in info.rewards]
        self.count(requests=1, descriptions=job.n, empty=sum(empty), truncated=sum(truncated))
        return self.routes[job.route].reply(job, rewards, truncated, empty)

    def health(self) -> dict[str, Any]:
        limits = {**asdict(self.limits), "max_chars": self.max_chars}
        alive = self.scorer_alive is None or self.scorer_alive()
        return {
            "status": "ok" if alive else "model process stopped",
            "model": self.name,
            "kind": self.facts.kind,
            "max_length_tokens": self.max_length,
            "precision": dict(self.facts.precision or {}),  # the dtype every reward of this server is computed in
            "overlong": self.overlong,
            "limits": limits,
            "stats": asdict(self.stats),
            "length_monitor": {
                "window": self.length_monitor.size,
                "threshold": self.length_monitor.threshold,
                "warnings": self.length_monitor.n_warnings,
                **defined(self.length_monitor.figures()),
            },
        }
