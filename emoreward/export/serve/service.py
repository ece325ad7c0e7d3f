"""The serving logic, no HTTP: `RewardService` turns a parsed request body into a `Job` through its route
(`routes`), scores jobs with one reward model (several requests in one model call) and builds the reply:

    service = RewardService(load_reward_model(path), ServerLimits())
    reply = service.handle("rewards", {"descriptions": ["..."]})     # a route's name; raises RequestError

or, to batch requests itself: ``service.parse(route, body)`` per request, ``service.score_jobs(jobs)``, then
``service.reply(job)``. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from emoreward.export.length_monitor import StreamLengthMonitor, sample_record
from emoreward.export.reward_client import EngineUnavailable
from emoreward.export.serve import routes
from emoreward.export.serve.batching import Job
from emoreward.export.serve.facts import ServedModelFacts, served_model_facts
from emoreward.export.serve.fields import RequestFields
from emoreward.export.serve.protocol import RequestError, ServerLimits, log_refusal, loggable
from emoreward.export.serve.worker import ModelProcessError
from emoreward.models.base import NonFiniteError, NonFiniteRewardError, ScoreInfo


logger = logging.getLogger(__name__)

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
        settings_in (`str`): where an error says a route setting is set (`RequestFields`: ``"server"`` or
            ``"environment"``, OpenRLHF's reward file).
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
        settings_in: str = "server",
        **route_options: Any,
    ):
        routes.settings(route_options)  # names and values, before the model's facts are read
        if overlong not in ("flag", "refuse"):
            raise ValueError(f"overlong must be 'flag' or 'refuse', got {overlong!r}")
        if isinstance(model, ServedModelFacts):
            if scorer is None:
                raise ValueError("RewardService(facts) needs the scorer of the model they describe")
            self.model, self.facts = None, model
        else:
            self.model, self.facts = model, served_model_facts(model)
        facts = self.facts
        settings = routes.settings(route_options, reads_media=bool(facts.modalities), settings_in=settings_in)
        self.scorer = scorer or model.score_info
        self.scorer_alive = scorer_alive
        self.limits = limits or ServerLimits()
        # what every route validates its request fields with (routes never call back into the service)
        self.fields = RequestFields(
            facts, self.limits, media_root=media_root, allow_unused_media=allow_unused_media, settings_in=settings_in
        )
        self.max_chars, self.max_length = self.fields.max_chars, self.fields.max_length
        self.batch_size = batch_size
        if forward_tokens is None:
            forward_tokens = 1024 if facts.device == "cpu" else 16384
        self.forward_tokens = forward_tokens
        self.allow_unused_media = allow_unused_media
        self.name = name
        self.overlong = overlong
        self.media_root = self.fields.media_root
        self.stats = ServerStats()
        self._stats_lock = threading.Lock()
        # the RL length-hacking monitor over the last `length_window` rewarded descriptions (every route)
        self.length_monitor = StreamLengthMonitor(length_window, length_threshold)
        self._warned_truncation = False
        # the routes this service answers, by name, each with its options
        self.routes = {
            route.name: route(self.fields, model_name=name, length_monitor=self.length_monitor, **settings[route.name])
            for route in routes.ROUTES.values()
        }

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
        return handler.parse(self.fields.body(body, handler))

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
        except NonFiniteRewardError as err:  # the model's answer to one request's description
            self._refuse_non_finite(jobs, err)
            return
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
            elif isinstance(err, ModelProcessError):  # known and said once per job: no traceback of our own code
                logger.error("scoring failed: %s", err)
                job.error = RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, "scoring failed; see the server log")
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

    def _refuse_non_finite(self, jobs: list[Job], err: NonFiniteRewardError) -> None:
        """The request holding the description the model gave a non-finite reward (``err.index`` in the call) gets a
        500 naming its field; the other jobs of the call are scored again without it."""
        start = 0
        for k, job in enumerate(jobs):
            if start <= err.index < start + job.n:
                logger.error("%s", loggable(err, 1000))
                field = job.fields[err.index - start]
                job.error = RequestError(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"the model returned a non-finite reward for {field}"
                )
                rest = jobs[:k] + jobs[k + 1 :]
                if rest:
                    self.score_jobs(rest)
                return
            start += job.n
        raise err  # a position outside this call: not an answer to these jobs

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
        cut to fit), else None. A non-finite reward never gets here: the model's scoring refuses it
        (`emoreward.models.base.check_finite_rewards`; `_refuse_non_finite`)."""
        info = job.info
        if self.overlong == "refuse" and any(info.truncated):
            over = [f for f, t in zip(job.fields, info.truncated) if t]
            return RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{', '.join(over[:5])}{' ...' if len(over) > 5 else ''}: over the model's max_length of "
                f"{self.max_length} tokens (with the context); shorten it, or start the server without "
                "--overlong refuse to score it cut to fit (flagged in 'truncated')",
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
            self.count(refused_overlong=1)
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
            "identity": self.facts.identity,  # the served model's content (`model_identity`): clients check it
            "max_length_tokens": self.max_length,
            "precision": dict(self.facts.precision or {}),  # the dtype every reward of this server is computed in
            "overlong": self.overlong,
            "limits": limits,
            "stats": asdict(self.stats),
            "length_monitor": {
                "window": self.length_monitor.size,
                "threshold": self.length_monitor.threshold,
                "warnings": self.length_monitor.n_warnings,
                **sample_record(self.length_monitor.figures()),  # fixed keys: `SAMPLE_KEYS`, before any reward too
            },
        }
