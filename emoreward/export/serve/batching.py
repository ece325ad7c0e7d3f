"""The queue in front of the model: `Job` (one request's descriptions on their way to a model call) and `Batcher`
(a bounded FIFO queue and the one scoring thread that merges queued jobs into model calls)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from emoreward.export.serve.protocol import RequestError, ServerLimits
from emoreward.models.base import RewardContext, ScoreInfo


logger = logging.getLogger(__name__)


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


class Scorer(Protocol):
    """What a `Batcher` drives (`RewardService`)."""

    limits: ServerLimits

    def score_jobs(self, jobs: list[Job]) -> None: ...

    def reply(self, job: Job) -> dict[str, Any]: ...


class Batcher:
    """The bounded queue and the one scoring thread: jobs wait in FIFO order, and each model call takes the queued
    jobs that fit ``max_batch_tokens`` (at least one), so concurrent requests share forward passes."""

    def __init__(self, service: Scorer):
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
