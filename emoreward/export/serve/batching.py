"""The queue in front of the model: `Job` (one request's descriptions on their way to a model call) and `Batcher`
(a bounded queue and the one scoring thread that merges queued jobs into model calls). Fair slices: a call takes
at most the estimated tokens the measured rate scores in ``ServerLimits.max_call_seconds`` (at most
``max_batch_tokens``); a larger job gets at least half of each call, the jobs behind it the rest; jobs whose
client has gone are dropped before their next call. A job that finds the queue full is held until there is room
(at most ``queue_timeout`` s from its arrival), not refused. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from emoreward.export.reward_client import EngineUnavailable
from emoreward.export.serve.protocol import RequestError, ServerLimits
from emoreward.models.base import NonFiniteError, RewardContext, ScoreInfo


logger = logging.getLogger(__name__)

# tokens of the first model calls, before a scoring rate is measured
FIRST_CALL_TOKENS = 1024


@dataclass
class Job:
    """One request's descriptions on their way through the queue (filled by `RewardService.score_jobs`).

    Attributes:
        route (`str`): the name of the route it came by (`routes`: ``"rewards"``, ``"openrlhf"``, ...).
        descriptions, contexts, fields: one entry per description (``fields``: the request field naming it, for
            error messages, e.g. ``"descriptions[3]"``).
        costs (`list[int]`): estimated tokens of each description with its context.
        offset (`int`): index of ``descriptions[0]`` in its request (a slice of a larger job starts past 0).
        cancelled (`bool`): the client has gone; the job is dropped before its next model call.
        gone (callable, *optional*): True once the client has gone (read by the scoring thread before each model
            call: the HTTP server passes a check of its connection's end-of-stream flag, which the event loop sets).
        waiter: ``(event loop, callback)``: called in the loop's thread when the job is finished (scored, failed
            or dropped; `Batcher.run` and the HTTP server set it); None: ``future`` (which `Batcher.score` makes and
            a thread blocks on) is set instead.
        info, error: the result (`ScoreInfo` for the job's descriptions) or the error its request gets.
    """

    route: str
    descriptions: list[str]
    contexts: list[RewardContext]
    fields: list[str]
    costs: list[int]
    offset: int = 0
    future: concurrent.futures.Future | None = field(default=None, repr=False)
    deadline: float = math.inf
    cancelled: bool = False
    gone: Callable[[], bool] | None = field(default=None, repr=False)
    waiter: tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None = field(default=None, repr=False)
    info: ScoreInfo | None = None
    error: RequestError | None = None
    taken: int = field(default=0, repr=False)  # descriptions handed to model calls so far
    scored: int = field(default=0, repr=False)  # descriptions whose model call has returned
    parts: list[ScoreInfo] = field(default_factory=list, repr=False)

    @property
    def n(self) -> int:
        return len(self.descriptions)

    @property
    def tokens(self) -> int:
        return sum(self.costs)

    def part(self, start: int, stop: int) -> Job:
        """The sub-job of descriptions ``start:stop`` (scored like any job; its fields keep the request's names)."""
        return Job(
            self.route,
            self.descriptions[start:stop],
            self.contexts[start:stop],
            self.fields[start:stop],
            self.costs[start:stop],
            offset=self.offset + start,
        )

    def finish(self) -> None:
        """Wake whoever waits on the job (once; a waiter that has gone is no error)."""
        if self.future is None:
            return
        try:
            self.future.set_result(None)
        except concurrent.futures.InvalidStateError:
            pass


class Scorer(Protocol):
    """What a `Batcher` drives (`RewardService`)."""

    limits: ServerLimits

    def score_jobs(self, jobs: list[Job]) -> None: ...

    def reply(self, job: Job) -> dict[str, Any]: ...

    def count(self, **increments: int) -> None: ...


class Batcher:
    """The bounded queue and the one scoring thread: each model call takes queued jobs in order up to the call's
    token budget (at least one description), so concurrent requests share forward passes, and a job that does
    not fit is cut: its first part is scored now and the rest waits at the back of the queue.

    Use `run` from an event loop or `score` from any thread; `start` first, `close` at the end.
    """

    def __init__(self, service: Scorer):
        self.service = service
        self.limits = service.limits
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._held: deque[Job] = deque()  # jobs that found the queue full, in arrival order (`_admit`)
        self.pending = 0  # descriptions queued or being scored
        self.held = 0  # descriptions of held jobs
        self._rate: float | None = None  # descriptions per second, smoothed
        self._token_rate: float | None = None  # estimated tokens per second, smoothed
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
        """Whether a request would be refused on arrival: only while stopping (a full queue holds a job instead)."""
        return self._stopping

    def call_budget(self) -> int:
        """Estimated tokens one model call may take: ``max_call_seconds`` at the measured rate, at least
        `FIRST_CALL_TOKENS` (also before a rate is known) and at most ``max_batch_tokens``."""
        floor = min(FIRST_CALL_TOKENS, self.limits.max_batch_tokens)
        if self._token_rate is None:
            return floor
        return max(floor, min(self.limits.max_batch_tokens, int(self._token_rate * self.limits.max_call_seconds)))

    def submit(self, job: Job) -> None:
        """Queue a job, or hold it while the queue is full (``max_queue`` descriptions): an RL client's retry (OpenRLHF:
        5 tries 1 s apart, Retry-After ignored) does not outlast a busy queue, so a 503 on arrival lost its reward.
        A held job waits in arrival order and gets 503 + Retry-After only when ``queue_timeout`` s from its arrival
        pass first; memory stays bounded by the connections (``max_connections`` bodies).

        Raises:
            RequestError: 503 when the server is stopping.
        """
        with self._cv:
            if self._stopping:
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down")
            job.deadline = time.monotonic() + self.limits.queue_timeout
            if self._held or (self.pending and self.pending + job.n > self.limits.max_queue):
                self._held.append(job)
                self.held += job.n
                return
            self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        self._queue.append(job)
        self.pending += job.n
        self._cv.notify()

    def _admit(self) -> list[Job]:
        """Move held jobs into the queue while it has room (in arrival order; under the lock); the held jobs dropped
        (their client has gone, or their wait ran out: 503 + Retry-After)."""
        dropped = []
        now = time.monotonic()
        while self._held:
            job = self._held[0]
            gone = job.cancelled or (job.gone is not None and job.gone())
            if gone or now > job.deadline:
                self._held.popleft()
                self.held -= job.n
                if gone:
                    job.cancelled = True
                    self.service.count(abandoned=1)
                else:
                    job.error = self.busy(
                        f"waited {self.limits.queue_timeout:g} s for room in the queue ({self.limits.max_queue} "
                        "descriptions); retry later"
                    )
                dropped.append(job)
                continue
            if self.pending and self.pending + job.n > self.limits.max_queue:
                break
            self._held.popleft()
            self.held -= job.n
            self._enqueue(job)
        return dropped

    async def run(self, job: Job) -> dict[str, Any] | None:
        """Queue a job, wait for its model calls, return its reply (from an event loop); None when the job was
        dropped because its client has gone (`Job.gone`).

        Raises:
            RequestError: 503 (queue full or timed out), or the job's own error.
        """
        if job.info is not None:  # nothing to score (an empty OpenRLHF query)
            return self.service.reply(job)
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        job.waiter = (loop, lambda: finished.done() or finished.set_result(None))
        self.submit(job)
        try:
            await finished
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        return None if job.cancelled else self.service.reply(job)

    def score(self, job: Job) -> dict[str, Any]:
        """Queue a job, block until it is scored, return its reply (from any thread; concurrent callers share
        model calls).

        Raises:
            RequestError: 503 (queue full or timed out), or the job's own error.
        """
        if job.info is None:  # else nothing to score (an empty OpenRLHF query)
            job.future = concurrent.futures.Future()
            self.submit(job)
            job.future.result()
        return self.service.reply(job)

    def _take(self) -> tuple[list[tuple[Job, Job]], list[Job]]:
        """(parent job, the part of it to score) for the next model call, and the jobs dropped from the queue: the
        budget goes to whole jobs in arrival order, but the oldest job larger than the budget gets at least half of
        every call (in slices) and later large jobs wait for it."""
        batch: list[tuple[Job, Job]] = []
        dropped: list[Job] = []
        budget, tokens = self.call_budget(), 0
        now = time.monotonic()
        large: Job | None = None
        for job in list(self._queue):
            if not job.cancelled and job.gone is not None and job.gone():
                job.cancelled = True
                self.service.count(abandoned=1)
            if job.cancelled or (job.taken == 0 and now > job.deadline):
                self._queue.remove(job)
                dropped.append(job)
                continue
            rest = sum(job.costs[job.taken :])
            if rest > budget:
                large = large or job  # the oldest large job is sliced below; later ones wait
                continue
            if tokens + rest > budget - (budget // 2 if large is not None else 0):
                break  # small jobs keep their order too
            self._queue.remove(job)
            batch.append((job, job.part(job.taken, job.n) if job.taken else job))
            job.taken, tokens = job.n, tokens + rest
        if large is not None and large.costs:
            start = stop = large.taken
            size = 0
            while stop < large.n and tokens + size + large.costs[stop] <= budget:
                size += large.costs[stop]
                stop += 1
            if stop == start and not batch:
                stop = start + 1  # at least one description per call
            if stop > start:
                large.taken = stop
                batch.append((large, large.part(start, stop)))
                if stop == large.n:
                    self._queue.remove(large)
        return batch, dropped

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    refused = self._admit()
                    if self._queue or refused or self._stopping:
                        break
                    self._cv.wait()
                if not self._queue and not self._held and not refused:
                    return  # stopping, and nothing is left
                batch, dropped = self._take()
                self.pending -= sum(job.n - job.taken for job in dropped)  # no part of them is in a model call
            for job in dropped:
                if not job.cancelled and job.error is None:
                    job.error = self.busy(
                        f"waited {self.limits.queue_timeout:g} s in the queue without being scored; retry later"
                    )
            _finish(refused + dropped)
            if batch:
                self._score(batch)

    def _score(self, batch: list[tuple[Job, Job]]) -> None:
        parts = [part for _, part in batch]
        start = time.perf_counter()
        try:
            self.service.score_jobs(parts)
        except (EngineUnavailable, NonFiniteError) as err:  # a served engine's failure: its one line, to every job
            logger.error("scoring failed: %s", err)
            status = HTTPStatus.BAD_GATEWAY if isinstance(err, EngineUnavailable) else HTTPStatus.INTERNAL_SERVER_ERROR
            for part in parts:
                part.error = RequestError(status, f"the model engine failed: {err}")
        except Exception:  # e.g. a model returning the wrong number of rewards: never leave a job waiting
            logger.exception("scoring failed")
            for part in parts:
                part.error = RequestError(HTTPStatus.INTERNAL_SERVER_ERROR, "scoring failed; see the server log")
        seconds = max(time.perf_counter() - start, 1e-6)
        rate, token_rate = sum(p.n for p in parts) / seconds, sum(p.tokens for p in parts) / seconds
        self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
        self._token_rate = token_rate if self._token_rate is None else 0.8 * self._token_rate + 0.2 * token_rate
        finished = []
        with self._cv:
            for job, part in batch:
                self.pending -= part.n
                job.scored += part.n
                if part is not job:
                    if part.error is not None:
                        job.error = job.error or part.error
                    elif part.info is not None:
                        job.parts.append(part.info)
                if job.error is not None and job.taken < job.n:  # the rest of a failed job is never scored
                    if job in self._queue:
                        self._queue.remove(job)
                    self.pending -= job.n - job.taken
                    job.taken = job.scored = job.n
                if job.scored == job.n:
                    finished.append(job)
            finished += self._admit()  # room for the held jobs
        for job in finished:
            if job.parts and job.error is None and job.info is None:
                job.info = ScoreInfo(
                    [r for p in job.parts for r in p.rewards],
                    [t for p in job.parts for t in p.truncated],
                    [t for p in job.parts for t in p.n_tokens],
                )
        _finish(finished)

    def close(self, timeout: float) -> bool:
        """Stop taking jobs, score the queued ones, wait for the thread (at most ``timeout`` s); True when done."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()


def _finish(jobs: list[Job]) -> None:
    """Wake whoever waits on ``jobs``: threads through each job's future, event loops with ONE call per loop for
    the whole list (not one wake-up of the loop per job)."""
    waiting: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
    for job in jobs:
        if job.waiter is None:
            job.finish()
        else:
            waiting.setdefault(job.waiter[0], []).append(job.waiter[1])
    for loop, callbacks in waiting.items():
        try:
            loop.call_soon_threadsafe(_wake, callbacks)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass


def _wake(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # one waiter's failure must not leave the others waiting
            logger.exception("waking a finished request failed")
