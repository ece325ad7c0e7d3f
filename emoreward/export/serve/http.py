"""HTTP/1.1 for a `RewardService`: `RewardServer` (one asyncio event loop for every connection, the `Batcher`'s
scoring thread, bearer authentication, start-up and graceful shutdown) and `_Connection`, the `asyncio.Protocol` of
one client connection (h11 parsing and framing, keep-alive, timeouts, lingering close). No task or coroutine is
made per request: at RL rates the loop's cost per request separates the server's rate from the model's.
See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import logging
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from http import HTTPStatus
from typing import Any

import h11

from emoreward.export.serve import routes
from emoreward.export.serve.batching import Batcher, Job
from emoreward.export.serve.protocol import LOOPBACK, RequestError, parse_json
from emoreward.export.serve.service import RewardService


logger = logging.getLogger(__name__)

# seconds a closing connection keeps reading (and discarding) what its client still sends (see `_Connection.close`)
LINGER_S = 2.0
# seconds the shutdown waits for the kernel's accept queue to be taken (see `RewardServer._stop_listening`)
DRAIN_S = 5.0
# connections the kernel queues for the server (listen backlog), and connections that may wait, unread, for a slot
# (`RewardServer.hold`): waiting is what the accept queue does, with a deadline and a 503 at its end
BACKLOG = 1024
# seconds a connection accepted during the shutdown may take to send its request's first byte; then it is closed
FIRST_BYTE_S = 1.0
# bytes of a next (pipelined) request buffered while the current one is answered; then reading pauses
PIPELINE_BYTES = 64 * 1024
# a body larger than this is parsed off the event loop
LARGE_BODY = 1024 * 1024
# bytes of a request head (request line and header fields) at most: a longer one is a 431
MAX_HEAD_BYTES = 16 * 1024
# seconds a connection must have waited for its client (a request arriving, or idle) before it may be closed to
# make room for a new client (`RewardServer.reclaim_slot`)
RECLAIM_AFTER_S = 1.0
SERVER_HEADER = (b"Server", b"emoreward-serve")
_REASONS = {status: status.phrase.encode("latin-1") for status in HTTPStatus}


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 parsed and framed by h11, keep-alive; pipelined requests are answered in
    order, one at a time. A request goes: its head, the checks that need no body (a refused request's body is never
    waited for), ``100 Continue``, the body, then its job is queued and `_scored` answers it from the batcher's
    wake-up. A client that closes or half-closes its side while its job waits has gone (`Job.gone`).
    """

    def __init__(self, server: RewardServer):
        self.server, self.service = server, server.service
        self.transport: asyncio.Transport | None = None
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.fresh = True  # no byte of the next request received yet (h11 holds none)
        self.held = bytearray()  # bytes received while a request is answered
        self.method = self.path = "-"  # of the request being received or answered (for the log)
        self.route: str | None = None  # its route once its head passed the checks; "health" for GET /health
        self.body: list[bytes] = []
        self.body_bytes = self.body_limit = 0
        self.busy = False  # a complete request is being answered (parsed, queued or scored)
        self.eof = False  # the client closed (or half-closed) its side, or the connection was lost
        self.closed = False  # closing (lingering) or closed: nothing more is read or answered
        self.paused = False
        self.refused = False  # answered 503 on arrival (too many connections, or shutting down)
        self.slot = False  # holds one of the server's `max_connections` slots (released once closing)
        self.waiting = False  # accepted while every slot was taken: not read until a slot frees (`RewardServer.admit`)
        self.unfed = False  # given its slot; what it sent while waiting is fed on the loop's next turn
        self.answered = 0  # replies sent on this connection
        self.timer: asyncio.TimerHandle | None = None
        self.timer_kind: str | None = None  # "idle" (keep-alive) or "request" (the whole-request deadline)
        self.since = server.loop.time()  # when the request being received began (its first byte), or idle began
        self.done = server.loop.create_future()  # set when the connection is gone

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        server = self.server
        server.connections.add(self)
        if server.open_connections >= self.service.limits.max_connections:
            server.reclaim_slot()
        # a connection accepted while shutting down was in the kernel's accept queue: its client has sent its
        # request, which is answered (`RewardServer.shutdown`)
        if server.open_connections >= self.service.limits.max_connections and server.hold(self):
            return
        if server.open_connections >= self.service.limits.max_connections:
            self.refused = True
            self.service.count(busy=1)
            message = "too many open connections; retry later"
            retry = [("Retry-After", str(server.batcher.retry_after()))]
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, _error_body(message), retry, close=True)
            self.close()
            return
        self.take_slot()

    def take_slot(self) -> None:
        """Hold one of the server's connection slots and start reading (a waiting connection: what its client sent
        meanwhile)."""
        self.server.open_connections += 1
        self.slot = True
        self._arm(self.service.limits.keepalive_timeout, self._idle_timeout)
        if self.waiting:
            self.waiting = False
            self.since = self.server.loop.time()
            if not self.transport.is_reading():
                self.transport.resume_reading()
            if self.held:
                self.unfed = True
                self.server.loop.call_soon(self._feed_held)

    def _feed_held(self) -> None:
        """Feed what arrived while the connection waited for its slot (and since), then read as usual."""
        self.unfed = False
        held, self.held = bytes(self.held), bytearray()
        if not self.closed:
            self._feed(held)

    def _waited_too_long(self) -> None:
        """A waiting connection whose slot did not come within ``queue_timeout`` s: 503 + Retry-After, closed."""
        if not self.waiting or self.closed:
            return
        self.waiting, self.refused = False, True
        self.service.count(busy=1)
        retry = [("Retry-After", str(self.server.batcher.retry_after()))]
        limits = self.service.limits
        message = f"waited {limits.queue_timeout:g} s for one of {limits.max_connections} connections; retry later"
        self._send(HTTPStatus.SERVICE_UNAVAILABLE, _error_body(message), retry, close=True)
        self.close()
        if not self.transport.is_closing():
            self.transport.resume_reading()  # lingering: what it sent is read and discarded (no reset)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # lingering: what the client still sends is discarded
        if self.waiting or self.unfed:  # read while waiting for a slot: kept, fed in order (`_feed_held`)
            self.held += data
            if self.waiting and self.transport.is_reading():
                self.transport.pause_reading()
            return
        if self.busy:
            self.held += data
            if len(self.held) > PIPELINE_BYTES and not self.paused:
                self.paused = True
                self.transport.pause_reading()
            return
        self._feed(data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.closed or not self.busy:
            self._shut()  # nothing to answer (a partial request cannot be completed any more)
        return True  # keep the transport: a request being answered still gets its reply (if its job was scored)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self.closed = True
        self._cancel_timer()
        self._release_slot()
        self.server.connections.discard(self)
        if not self.done.done():
            self.done.set_result(None)

    # ------------------------------------------------------------------ receiving a request
    @property
    def idle(self) -> bool:
        """Kept alive after a reply, waiting for the next request with no byte of it yet (the shutdown closes such
        a connection at once; a new connection's first request is still read and answered)."""
        return self.answered > 0 and self.fresh and not self.busy and not self.held and not self.closed

    def _feed(self, data: bytes) -> None:
        if self.fresh:
            data = data.lstrip(b"\r\n")  # blank lines before a request are ignored (RFC 9112, 2.2); h11 refuses them
            if not data:
                return
            self.fresh = False
            self.since = self.server.loop.time()
        self.conn.receive_data(data)
        self._advance()

    def _advance(self) -> None:
        """Take h11's events for the request being received: its head, its body; answer it once complete."""
        conn = self.conn
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as err:
                self._fail(_protocol_error(err))
                return
            if event is h11.NEED_DATA:
                if self.timer_kind != "request":  # one deadline for head and body, from the request's first byte
                    deadline = self.since + self.service.limits.read_timeout
                    self._arm(max(0.0, deadline - self.server.loop.time()), self._read_timeout, "request")
                return
            if isinstance(event, h11.Request):
                if not self._head(event):
                    return
            elif isinstance(event, h11.Data):
                self.body.append(event.data)
                self.body_bytes += len(event.data)
                if self.body_bytes > self.body_limit:  # a chunked body (a Content-Length was checked before)
                    self._fail(RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {self.body_limit} bytes"))
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._cancel_timer()
                self.busy = True
                body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body, self.body_bytes = [], 0
                self._answer(body)
                return
            else:  # PAUSED or ConnectionClosed: h11 is never fed an end of stream (`eof_received` handles it)
                return

    def _head(self, event: h11.Request) -> bool:
        """Check a request head (`_check`) and send ``100 Continue`` when its client waits for it; False when it was
        refused (answered)."""
        headers: dict[str, str] = {}
        size = len(event.method) + len(event.target) + 12  # the request line
        for name, value in event.headers:  # h11 gives lower-case names
            size += len(name) + len(value) + 4
            key, text = name.decode("ascii"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.method = event.method.decode("ascii")
        self.path = event.target.decode("latin-1").split("?", 1)[0]
        try:
            if size > MAX_HEAD_BYTES:  # h11 bounds an incomplete head only; this bounds one received at once
                raise RequestError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
            if event.http_version not in (b"1.1", b"1.0"):
                raise RequestError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.0 and HTTP/1.1 are served")
        except RequestError as err:
            self._fail(err)  # and close
            return False
        try:
            self.route = self._check(headers)
        except RequestError as err:
            if "transfer-encoding" not in headers and headers.get("content-length", "0") == "0":
                self.conn.next_event()  # its empty body's EndOfMessage: the connection stays usable after the reply
            self._fail(err)
            return False
        if self.conn.client_is_waiting_for_100_continue and not self.conn.trailing_data[0]:
            self.transport.write(
                self.conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            )
        return True

    def _check(self, headers: dict[str, str]) -> str:
        """The request's route ("health" for GET /health) after every check that needs no body (the queue check
        too), so a refused request's body is never waited for. Sets the body's limit.

        Raises:
            RequestError: 404, 405, 401, 415, 411 or 413.
        """
        service, server = self.service, self.server
        route = routes.admit(self.method, self.path, headers, server.token, service.limits)
        if route == "health":
            self.body_limit = MAX_HEAD_BYTES
            if int(headers.get("content-length", 0)) > self.body_limit:  # h11 has checked it is a number
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {self.body_limit} bytes")
            return route
        self.body_limit = service.limits.max_body_bytes
        return route  # a full queue holds the request (`Batcher.submit`)

    # ------------------------------------------------------------------ answering it
    def _answer(self, body: bytes) -> None:
        """Answer a complete request: /health at once, a reward request once its job is scored."""
        if self.route == "health":
            health = self.service.health()  # 503 when the model cannot score (a stopped model process)
            status = HTTPStatus.OK if health["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(status, {**health, "queue": self.server.batcher.pending})
            return
        if len(body) > LARGE_BODY:  # parsed off the event loop
            future = self.server.loop.run_in_executor(None, parse_json, body)
            future.add_done_callback(self._parsed)
            return
        try:
            self._queue(parse_json(body))
        except Exception as err:
            self._fail(err)

    def _parsed(self, future: asyncio.Future) -> None:
        if self.closed:
            return
        try:
            self._queue(future.result())
        except Exception as err:
            self._fail(err)

    def _queue(self, body: Any) -> None:
        job = self.service.parse(self.route, body)
        if job.info is not None:  # nothing to score (an empty OpenRLHF query)
            self._reply(HTTPStatus.OK, self.service.reply(job))
            return
        job.gone = self._gone
        job.waiter = (self.server.loop, lambda: self._scored(job))
        self.server.batcher.submit(job)

    def _gone(self) -> bool:
        return self.eof

    def _scored(self, job: Job) -> None:
        """The batcher's wake-up (in the event loop's thread): answer the job, or close when its client has gone."""
        if job.cancelled or self.closed:
            self._shut()
            return
        try:
            result = self.service.reply(job)
        except Exception as err:
            self._fail(err)
            return
        self._reply(HTTPStatus.OK, result)

    def _fail(self, err: Exception) -> None:
        """Answer ``err`` (`RewardService.error_reply`: counted and logged as every engine does)."""
        self._reply(*self.service.error_reply(err, self.method, self.path))

    def _reply(
        self, status: HTTPStatus, payload: dict[str, Any], headers: list[tuple[str, str]] | None = None
    ) -> None:
        if self.closed:
            return
        try:
            data = json.dumps(payload, allow_nan=False).encode("utf-8")
        except ValueError:  # a NaN / inf reward: the model is broken, and JSON cannot carry it
            logger.error("the model returned a non-finite reward")
            self.service.count(failures=1)
            status, data = HTTPStatus.INTERNAL_SERVER_ERROR, _error_body("the model returned a non-finite reward")
        conn = self.conn
        # a request not received in full (refused before its body, malformed, timed out) leaves the connection
        # unusable: close it
        if not self._send(status, data, headers, close=conn.their_state is not h11.DONE or self.server.closing):
            return
        self.answered += 1
        self.route, self.method, self.path = None, "-", "-"
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:  # closing (HTTP/1.0 included)
            self.close()
            return
        self.busy = False
        if self.eof:
            self._shut()
            return
        conn.start_next_cycle()
        trailing = conn.trailing_data[0]  # bytes of the next request that h11 already holds
        if trailing[:1] in (b"\r", b"\n"):  # blank lines before a request are ignored (RFC 9112, 2.2)
            self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
            trailing = trailing.lstrip(b"\r\n")
            self.conn.receive_data(trailing)
        self.fresh = not trailing
        self.since = self.server.loop.time()
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        self._arm(self.service.limits.keepalive_timeout, self._idle_timeout)
        if self.held or trailing:
            self.busy = True  # the next request is taken from a callback: no recursion through pipelined replies
            self.server.loop.call_soon(self._next)

    def _send(self, status: HTTPStatus, data: bytes, headers: list[tuple[str, str]] | None, close: bool) -> bool:
        """Write a response (JSON ``data``, ``headers``: the server's own, e.g. ``Retry-After``) through h11, which
        adds ``Connection: close`` when the connection ends after it; False (and closed) when h11 refuses it."""
        head = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(data)), SERVER_HEADER]
        if headers:
            head += headers
        if close:
            head.append((b"Connection", b"close"))
        try:
            out = self.conn.send(h11.Response(status_code=status.value, headers=head, reason=_REASONS[status]))
            out += self.conn.send(h11.Data(data=data)) + self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # e.g. h11 in an error state: nothing more can be sent
            logger.exception("response not sent")
            self._shut()
            return False
        self.transport.write(out)
        return True

    def _next(self) -> None:
        """Take the next (pipelined) request: what h11 holds, then what arrived while the last one was answered."""
        if self.closed:
            return
        self.busy = False
        if self.eof:
            self._shut()
            return
        held, self.held = bytes(self.held), bytearray()
        if held:
            self._feed(held)
        else:
            self._advance()

    # ------------------------------------------------------------------ timers and closing
    def _arm(self, seconds: float, callback, kind: str = "idle") -> None:
        self._cancel_timer()
        self.timer = self.server.loop.call_later(seconds, callback)
        self.timer_kind = kind

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = self.timer_kind = None

    def _idle_timeout(self) -> None:
        if not self.busy and self.fresh and not self.held:
            self._shut()

    def _read_timeout(self) -> None:
        if not self.busy and not self.closed:
            limit = self.service.limits.read_timeout
            self._fail(RequestError(HTTPStatus.REQUEST_TIMEOUT, f"request not received within {limit:g} s"))

    @property
    def receiving(self) -> bool:
        """A request has begun arriving and is not complete yet (its client is sending it, or is slow to)."""
        return not self.fresh and not self.busy and not self.closed and not self.refused

    def close(self) -> None:
        """Close without resetting the connection (a socket closed with unread bytes sends a TCP RST, which can
        destroy the reply): a FIN after the reply, what the client still sends discarded until it closes its side
        (at most `LINGER_S` s), then the socket closed (HTTP servers' "lingering close")."""
        if self.closed:
            return
        self.closed = True
        self._cancel_timer()
        self._release_slot()  # a lingering connection owes its client nothing more: its slot goes to a new one
        if self.eof or self.transport.is_closing() or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        if self.paused:
            self.transport.resume_reading()
        self.timer = self.server.loop.call_later(LINGER_S, self.transport.close)

    def _release_slot(self) -> None:
        if self.slot:
            self.slot = False
            self.server.open_connections -= 1
            self.server.admit()

    def _shut(self) -> None:
        """Close now (nothing is owed to the client, or it has gone)."""
        self.closed = True
        self._cancel_timer()
        self._release_slot()
        self.transport.close()


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
        self.connections: set[_Connection] = set()
        self.open_connections = 0  # connections being served (not those refused on arrival)
        self.waiting: deque[_Connection] = deque()  # accepted while every slot was taken, oldest first
        self._reclaim_handle: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.closing = False
        self.unanswered = 0  # requests in flight at the shutdown not answered within its drain time
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
        self.loop = asyncio.get_running_loop()
        self.batcher.start()
        self._server = await self.loop.create_server(lambda: _Connection(self), *self._bind, backlog=BACKLOG)
        self._address = self._server.sockets[0].getsockname()[:2]
        self.started_at = time.time()

    async def shutdown(self, grace: float | None = None) -> bool:
        """Drain, then stop (SIGTERM): every request in flight is scored and answered within ``grace`` s (default
        ``ServerLimits.drain_timeout``), each reply with ``Connection: close``. In flight: a request being received,
        queued or scored, and a connection in the kernel's accept queue (its client has sent its request). New
        connection attempts are dropped by the kernel, then refused once the socket closes, which clients retry
        (`_stop_listening`). Idle keep-alive connections are closed at once, a connection that sends nothing within
        `FIRST_BYTE_S` s too. True when every request in flight was answered in time; the count of those that were
        not is ``unanswered``."""
        grace = self.service.limits.drain_timeout if grace is None else grace
        deadline = self.loop.time() + grace
        self.closing = True
        for connection in list(self.connections):
            if connection.idle:
                connection._shut()  # noqa: SLF001 - its client has its replies; it reads end of stream
        await self._stop_listening()
        owed = await self._drained(deadline)
        self.unanswered = len(owed)
        if owed:
            logger.warning("%d request(s) in flight not answered within the drain time (%g s)", len(owed), grace)
            for connection in owed:  # the drain time bounds the shutdown: what is still owed is not answered
                connection._shut()  # noqa: SLF001
        done = await self.loop.run_in_executor(None, self.batcher.close, max(0.0, deadline - self.loop.time()))
        for last_resort in (False, True):
            waiting = [connection.done for connection in self.connections]
            if waiting:
                await asyncio.wait(waiting, timeout=10 if not last_resort else 1)
            for connection in list(self.connections):
                if last_resort:
                    connection.transport.abort()
                else:
                    connection._shut()  # noqa: SLF001 - its client waited past the grace: close
        return done and not owed

    async def _drained(self, deadline: float) -> list[_Connection]:
        """Wait (until ``deadline``, loop time) for every connection to have its replies; the connections still owed
        one then (a request being received, queued or scored)."""
        while True:
            now = self.loop.time()
            for connection in list(self.connections):
                if connection.closed or connection.busy or connection.held or not connection.fresh:
                    continue
                if connection.waiting:
                    continue  # unread until a slot frees: its request is on its way
                if connection.answered or now - connection.since >= FIRST_BYTE_S:  # no request on its way
                    connection._shut()  # noqa: SLF001
            owed = [c for c in self.connections if not c.closed and not c.refused]
            if not owed or now >= deadline:
                return owed
            await asyncio.sleep(0.02)

    def hold(self, connection: _Connection) -> bool:
        """Let a new connection wait, unread, for a slot when every slot is taken (at most `BACKLOG` waiting, each at
        most ``queue_timeout`` s; its client has usually sent its request): a 503 on arrival lost
        the reward of an RL client whose retry (OpenRLHF: 5 tries 1 s apart) does not outlast a busy server. False
        when it cannot wait (it is then answered 503)."""
        limits = self.service.limits
        self.waiting = deque(c for c in self.waiting if c.waiting and not c.closed)
        if len(self.waiting) >= BACKLOG:
            return False
        connection.waiting = True
        connection.transport.pause_reading()
        connection._arm(limits.queue_timeout, connection._waited_too_long, "waiting")  # noqa: SLF001
        self.waiting.append(connection)
        if self._reclaim_handle is None:
            self._reclaim_handle = self.loop.call_later(RECLAIM_AFTER_S, self._reclaim_for_waiting)
        return True

    def _reclaim_for_waiting(self) -> None:
        """Free slots for waiting connections from connections that wait for their own clients (`reclaim_slot`:
        slow or idle ones); checked again every `RECLAIM_AFTER_S` / 4 s while any connection waits."""
        self._reclaim_handle = None
        full = lambda: self.open_connections >= self.service.limits.max_connections  # noqa: E731
        while any(c.waiting and not c.closed for c in self.waiting) and full() and self.reclaim_slot():
            pass  # each freed slot goes to the oldest waiting connection (`admit`)
        if any(c.waiting and not c.closed for c in self.waiting):
            self._reclaim_handle = self.loop.call_later(RECLAIM_AFTER_S / 4, self._reclaim_for_waiting)

    def admit(self) -> None:
        """Give free slots to the connections waiting for one, oldest first."""
        while self.waiting and self.open_connections < self.service.limits.max_connections:
            connection = self.waiting.popleft()
            if connection.waiting and not connection.closed:
                connection.take_slot()

    def reclaim_slot(self) -> bool:
        """Free a connection slot for a new client when every slot is taken: close the connection that has waited
        longest (at least `RECLAIM_AFTER_S` s) for its client: the one whose request has been arriving longest
        (answered 408), else the one idle longest; a request being scored is never closed. True when a slot was
        freed."""
        now = self.loop.time()
        waiting = [c for c in self.connections if c.slot and not c.busy and now - c.since >= RECLAIM_AFTER_S]
        slow = [c for c in waiting if c.receiving]
        if slow:
            victim = min(slow, key=lambda c: c.since)
            victim._fail(RequestError(HTTPStatus.REQUEST_TIMEOUT, "request not received in time (the server is full)"))
            return True
        idle = [c for c in waiting if c.fresh and not c.held]
        if idle:
            min(idle, key=lambda c: c.since)._shut()
            return True
        return False

    async def _stop_listening(self) -> None:
        """Close the listening socket without resetting the connections in its accept queue (closing it would send
        each a TCP RST): the kernel first drops new connection attempts (a socket filter, Linux: the client's kernel
        sends its SYN again, and is refused once the socket is closed), the queued connections are accepted (their
        requests are answered as any other), then the socket is closed."""
        if self._server is None:
            return
        sockets = list(self._server.sockets)
        if all(_refuse_new_connections(sock) for sock in sockets):
            deadline = self.loop.time() + DRAIN_S
            while any(_has_pending_connection(sock) for sock in sockets) and self.loop.time() < deadline:
                await asyncio.sleep(0.005)  # the event loop's accept callback takes them
            await asyncio.sleep(0)  # let the last accepted connections start
        self._server.close()

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
        loop = new_event_loop()

        def run() -> None:
            try:
                loop.run_until_complete(self.open())
            except BaseException as err:  # e.g. the port is taken
                failure.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="emoreward-serve", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            loop.close()
            raise failure[0]
        return self

    def stop(self, grace: float | None = None) -> None:
        """Shut down (see `shutdown`) and end the background thread."""
        if self.loop is None or self._thread is None:
            return
        loop = self.loop
        grace = self.service.limits.drain_timeout if grace is None else grace
        asyncio.run_coroutine_threadsafe(self.shutdown(grace), loop).result(grace + 30)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=30)
        loop.close()
        self.loop = self._thread = None

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def check_bind(host: str, port: int) -> None:
    """Refuse, before any work, an address the server could not listen on: bind a socket there (with
    ``SO_REUSEADDR``, as the server does) and close it again.

    Raises:
        ValueError: one line naming ``--host`` / ``--port`` and why (the port is taken, the address is not this
            machine's).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ValueError(f"--host {host}: not an address of this machine ({err.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"--port {port}: {host}:{port} is already in use (another server?); pick another port"
                ) from None
            raise ValueError(f"--host {host} --port {port}: cannot listen there: {err.strerror}") from None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The server's event loop: uvloop's when it is installed (it comes with the ``ray`` extra), else asyncio's. Both
    serve identically."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Any) -> Any:
    """``asyncio.run(main)`` on `new_event_loop` (Python 3.11+; asyncio's own loop on 3.10)."""
    if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode("utf-8")


def _protocol_error(err: h11.RemoteProtocolError) -> RequestError:
    """h11's refusal of what a client sent -> the error it is answered with (h11's status hint: 400, 431 for a head
    over `MAX_HEAD_BYTES`, 501 for a transfer coding other than chunked), naming the problem."""
    status = HTTPStatus(err.error_status_hint)
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return RequestError(status, "request head too large")
    problem = str(err)[:200]  # h11's message may quote the offending line
    if status == HTTPStatus.BAD_REQUEST:
        return RequestError(status, f"malformed HTTP request: {problem}")
    return RequestError(status, f"HTTP request not served: {problem}")


# one classic-BPF instruction, BPF_RET | BPF_K with k = 0: keep 0 bytes of every packet, i.e. drop it
_DROP_ALL = struct.pack("HBBI", 0x06, 0, 0, 0)
_SO_ATTACH_FILTER = 26  # Linux, <asm-generic/socket.h>


def _refuse_new_connections(sock: Any) -> bool:
    """Make the kernel drop every packet that reaches the listening socket ``sock`` (connection attempts and
    handshakes in progress), leaving the connections already in its accept queue intact: they are sockets of
    their own. Linux only (a socket filter, SO_ATTACH_FILTER); True when done."""
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(_DROP_ALL, len(_DROP_ALL))
    fprog = struct.pack("HP", 1, ctypes.addressof(program))  # struct sock_fprog {len, filter}; the kernel copies it
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except (OSError, AttributeError):
        return False
    return True


def _has_pending_connection(sock: Any) -> bool:
    """Whether the listening socket has an accepted connection waiting in the kernel's queue (it polls readable)."""
    try:
        return bool(select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return False
