"""HTTP client of running engines (`emoreward serve`, vLLM) for every client route: keep-alive pools shared by every
thread (one per process) and every task (one per event loop), servers used round-robin, each retry on the next URL,
all within one `RetryPolicy` (a request's whole time, attempts included): a 503 after its ``Retry-After``; a refused,
reset or timed-out connection, a 502 / 504 or a proxy's 500 after 1 s. An engine that gave no answer is failed at
once for the next ``timeout`` s (`EngineUnavailable`). A 4xx or the server's own 500 raises; a reply holding a
non-finite number raises `NonFiniteError`. See docs/serving.md#verl.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import math
import os
import queue
import ssl
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any

import h11

from emoreward.models.base import NonFiniteError


MAX_WAIT = 60.0  # seconds: the longest Retry-After honoured
TIMEOUT_ENV = "EMOREWARD_ENGINE_TIMEOUT"  # seconds one request to an engine may take, attempts included
DEFAULT_TIMEOUT = 180.0  # OpenRLHF's own per-attempt timeout: a hung engine took 5 x 180 s before
DEFAULT_ATTEMPTS = 5
POOL_CONNECTIONS = 64  # idle keep-alive connections kept per server (per process, and per event loop)
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, h11.ProtocolError, asyncio.TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """How long a client route waits for an engine, one object for every route (`VllmRewardModel`, verl's
    functions, `VllmServer`): one request, with every attempt and every wait between them, takes at most
    ``timeout`` s; ``attempts`` at most. A hung or dead engine is then one `EngineUnavailable` per request, and the
    requests after it fail at once for ``timeout`` s (a batch gets one error, not one wait per slice).

    Attributes:
        timeout (`float`): seconds; default ``$EMOREWARD_ENGINE_TIMEOUT`` or `DEFAULT_TIMEOUT` (`resolve`).
        attempts (`int`): attempts per request (default 5, OpenRLHF's).
    """

    timeout: float = DEFAULT_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS

    def __post_init__(self) -> None:
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ValueError(f"the engine timeout must be a positive number of seconds, got {self.timeout!r}")
        if not math.isfinite(self.timeout):
            raise ValueError(f"the engine timeout must be finite, got {self.timeout!r}")
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"the engine's attempts per request must be a positive integer, got {self.attempts!r}")

    @classmethod
    def resolve(cls, timeout: float | None = None, attempts: int | None = None) -> RetryPolicy:
        """The policy of a route: ``timeout`` where given (an option, a reward_kwargs field), else
        ``$EMOREWARD_ENGINE_TIMEOUT``, else `DEFAULT_TIMEOUT`.

        Raises:
            ValueError: a timeout or attempts that is not positive (the environment variable named)."""
        if timeout is None and os.environ.get(TIMEOUT_ENV):
            try:
                timeout = float(os.environ[TIMEOUT_ENV])
            except ValueError:
                raise ValueError(f"${TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]!r} is not a number of seconds") from None
        return cls(
            float(DEFAULT_TIMEOUT if timeout is None else timeout), DEFAULT_ATTEMPTS if attempts is None else attempts
        )


class EngineUnavailable(RuntimeError):
    """An engine gave no answer within the `RetryPolicy` (hung, dead, unreachable): one line naming it, the time
    and the last failure."""


class ServerError(RuntimeError):
    """An answer a retry cannot mend (a 4xx, or the server's own 500); ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class RewardClient:
    """A client of one or more emoreward servers, thread-safe and usable from any event loop.

    Args:
        urls (`tuple[str]`): base URLs (``http://host:port``), used round-robin.
        token (`str`, *optional*): bearer token sent with every request.
        policy (`RetryPolicy`): a request's whole time and attempts.
    """

    def __init__(self, urls: tuple[str, ...], token: str | None, policy: RetryPolicy):
        self.urls, self.policy = tuple(urls), policy
        self._down: tuple[float, str] | None = None  # (monotonic time until which requests fail at once, why)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._turn = itertools.count()  # next() on a count is atomic: threads share the round-robin
        self._idle = {url: queue.LifoQueue(POOL_CONNECTIONS) for url in self.urls}
        self._async_idle: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {url: [streams]}
        self._limits: dict | None = None
        self._lock = threading.Lock()

    def _next_url(self) -> str:
        return self.urls[next(self._turn) % len(self.urls)]

    # ------------------------------------------------------------------ sync (threads)
    def limits(self) -> dict:
        """The servers' request limits (``GET /health`` of one of them, read once)."""
        if self._limits is None:
            self._limits = dict(self.request("GET", "/health").get("limits") or {})
        return self._limits

    def post(self, path: str, payload: dict) -> dict:
        """The JSON reply of a POST of ``payload`` to ``path``, retried as the module docstring says.

        Raises:
            RuntimeError: an error status, or no answer after ``retries`` attempts.
        """
        return self.request("POST", path, json.dumps(payload).encode("utf-8"))

    def request(self, method: str, path: str, body: bytes | None = None) -> dict:
        deadline = self._start()
        last, silent = "no attempt", False
        for attempt in range(self.policy.attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            url = self._next_url()
            try:
                answer = self._send(url, method, path, body, left)
            except TRANSPORT_ERRORS as err:
                answer = err
            done, last, wait = _judged(url, path, answer)
            if done:
                self._down = None
                return last
            silent = isinstance(answer, BaseException)
            if attempt + 1 < self.policy.attempts:
                if time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
        raise self._gave_up(path, last, silent)

    def _start(self) -> float:
        """The deadline of a new request; `EngineUnavailable` at once while the engine is marked as not answering."""
        down = self._down
        if down is not None and time.monotonic() < down[0]:
            raise EngineUnavailable(f"{down[1]}; failing at once for {down[0] - time.monotonic():.0f} s more")
        return time.monotonic() + self.policy.timeout

    def _gave_up(self, path: str, last: str, silent: bool) -> RuntimeError:
        """The error of a request that ran out of time or attempts: `EngineUnavailable` when the engine gave no
        answer (then requests fail at once for ``timeout`` s), else a RuntimeError naming its last answer."""
        p = self.policy
        if not silent:
            return RuntimeError(f"{path} did not answer after {p.attempts} attempts (last: {last})")
        message = (
            f"the engine at {', '.join(self.urls)} gave no answer to {path} within {p.timeout:g} s ({last}); the "
            f"limit: --engine-timeout, verl's reward_kwargs 'timeout', or ${TIMEOUT_ENV}"
        )
        self._down = (time.monotonic() + p.timeout, message)
        return EngineUnavailable(message)

    def _send(self, url: str, method: str, path: str, body: bytes | None, timeout: float):
        parts = urllib.parse.urlsplit(url)
        idle = self._idle[url]
        for reuse in (True, False):
            conn = None
            if reuse:
                try:
                    conn = idle.get_nowait()
                except queue.Empty:
                    continue
            if conn is None:
                kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
                conn = kind(parts.hostname, parts.port, timeout=timeout)
            conn.timeout = timeout  # what is left of the request's time (a pooled connection's socket too)
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, parts.path + path, body=body, headers=self.headers)
                response = conn.getresponse()
                content = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                if reuse:  # the server closed it while it was idle: once more on a new connection
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if response.will_close:
                conn.close()
            else:
                try:
                    idle.put_nowait(conn)
                except queue.Full:
                    conn.close()
            return response.status, response.headers, content
        raise ConnectionError(f"{url}: no connection")  # not reached

    def close(self) -> None:
        """Close the idle connections of this process's pool (event-loop pools end with their loops)."""
        for idle in self._idle.values():
            while True:
                try:
                    idle.get_nowait().close()
                except queue.Empty:
                    break

    # ------------------------------------------------------------------ async (one pool per event loop)
    async def apost(self, path: str, payload: dict) -> dict:
        """`post` on this event loop's connection pool (waits with ``asyncio.sleep``)."""
        body = json.dumps(payload).encode("utf-8")
        deadline = self._start()
        last, silent = "no attempt", False
        for attempt in range(self.policy.attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            url = self._next_url()
            try:
                answer = await asyncio.wait_for(self._asend(url, path, body), left)
            except TRANSPORT_ERRORS as err:
                answer = err
            done, last, wait = _judged(url, path, answer)
            if done:
                self._down = None
                return last
            silent = isinstance(answer, BaseException)
            if attempt + 1 < self.policy.attempts:
                if time.monotonic() + wait >= deadline:
                    break
                await asyncio.sleep(wait)
        raise self._gave_up(path, last, silent)

    async def _asend(self, url: str, path: str, body: bytes):
        loop = asyncio.get_running_loop()
        with self._lock:
            idle = self._async_idle.setdefault(loop, {}).setdefault(url, [])
        parts = urllib.parse.urlsplit(url)
        target = (parts.path + path).encode("ascii")
        head = [("Host", parts.netloc), ("Content-Length", str(len(body))), *self.headers.items()]
        for reuse in (True, False):
            if reuse and not idle:
                continue
            if reuse:
                reader, writer = idle.pop()
            else:
                context = ssl.create_default_context() if parts.scheme == "https" else None
                port = parts.port or (443 if context else 80)
                reader, writer = await asyncio.open_connection(parts.hostname, port, ssl=context)
            conn = h11.Connection(h11.CLIENT)
            status, headers, chunks = None, {}, []
            try:
                writer.write(
                    conn.send(h11.Request(method="POST", target=target, headers=head))
                    + conn.send(h11.Data(data=body))
                    + conn.send(h11.EndOfMessage())
                )
                await writer.drain()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(64 * 1024))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                    elif isinstance(event, h11.Data):
                        chunks.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        raise ConnectionResetError("the server closed the connection")
            except BaseException as err:
                writer.close()
                if reuse and status is None and isinstance(err, TRANSPORT_ERRORS):
                    continue  # closed by the server while idle: once more on a new connection
                raise
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE and len(idle) < POOL_CONNECTIONS:
                idle.append((reader, writer))
            else:
                writer.close()
            return status, headers, b"".join(chunks)
        raise ConnectionError(f"{url}: no connection")  # not reached


def outcome(url: str, status: int, headers: Any, content: bytes) -> tuple[bool, Any, float]:
    """(done, reply or reason, seconds to wait before the retry) of one HTTP answer (``headers``: a mapping whose
    ``get`` finds lower-case names).

    Raises:
        ServerError: an error that a retry cannot mend (4xx, the server's own 500).
    """
    text = content.decode("utf-8", "replace")
    if status == 200:
        return True, finite_json(text, url), 0.0
    if status == 503:
        try:
            wait = float(headers.get("retry-after") or 1.0)
        except ValueError:  # an HTTP date: emoreward never sends one
            wait = 1.0
        return False, f"{url}: 503: {text[:200]}", min(max(wait, 0.0), MAX_WAIT)
    if status in (502, 504) or (status == 500 and not _own_error(text)):
        return False, f"{url}: {status}: {text[:200]}", 1.0
    raise ServerError(f"{url} answered {status}: {text[:1000]}", status)


def finite_json(text: str, url: str) -> Any:
    """An engine's JSON reply, every number in it finite: the one numeric-health check of every reward an engine
    (vLLM's ``/classify``, an emoreward server) sends a client route (`VllmRewardModel`, verl, the servers' own
    vLLM-backed scorers), before any of it is used or cached.

    Raises:
        NonFiniteError: a ``NaN`` / ``Infinity`` in the reply, or a number too large for a float, naming ``url``.
    """

    def refuse(token: str) -> float:
        raise NonFiniteError(
            f"{url} answered a non-finite number ({token}) where a reward must be finite: the model engine is "
            "broken (its weights or its precision); nothing of this reply was used or cached"
        )

    def number(token: str) -> float:
        value = float(token)
        return value if math.isfinite(value) else refuse(token[:40])

    return json.loads(text, parse_constant=refuse, parse_float=number)


def _judged(url: str, path: str, answer: tuple | BaseException) -> tuple[bool, Any, float]:
    """`outcome` of one attempt's ``(status, headers, content)``, or of its transport error (retried after 1 s)."""
    if isinstance(answer, BaseException):
        what = "timed out" if isinstance(answer, (TimeoutError, asyncio.TimeoutError)) else str(answer)
        return False, f"last: {url}: {type(answer).__name__}: {what}", 1.0
    return outcome(url + path, *answer)


def _own_error(text: str) -> bool:
    """Whether a body is an emoreward server's JSON error (not a proxy's page)."""
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and "error" in body


__all__ = [
    "MAX_WAIT",
    "POOL_CONNECTIONS",
    "TIMEOUT_ENV",
    "EngineUnavailable",
    "RetryPolicy",
    "RewardClient",
    "ServerError",
    "finite_json",
    "outcome",
]
