"""HTTP/1.1 for a `RewardService`: `RewardServer` (one asyncio event loop for every connection, the `Batcher`'s
scoring thread, bearer authentication, start-up and graceful shutdown) and the h11 connection handling."""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import select
import socket
import struct
import sys
import threading
import time
from http import HTTPStatus
from typing import Any

import h11

from emoreward.export.serve.batching import Batcher, Job
from emoreward.export.serve.protocol import LOOPBACK, ROUTES, RequestError, check_bearer, parse_json
from emoreward.export.serve.service import RewardService


logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # request line + headers
READ_CHUNK = 64 * 1024
# seconds a closing connection keeps reading (and discarding) what its client still sends (see `_close`)
LINGER_S = 2.0
# seconds the shutdown waits for the kernel's accept queue to be taken (see `RewardServer._stop_listening`)
DRAIN_S = 5.0


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
        self.idle = False  # waiting for a request on a kept-alive connection (the shutdown closes it at once)

    async def serve(self) -> None:
        limits = self.service.limits
        first = True  # an accepted connection's first request is read and answered, also during the shutdown
        while first or not self.server.closing:
            idle = self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]  # no byte of a request yet
            self.idle = idle and not first  # kept alive after a reply: the shutdown closes it at once
            first = False
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
            finally:
                self.idle = False
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
            self.conn.receive_data(await _read(self.reader, remaining))

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
            result = await self._scored(job)
            if result is None:
                return  # the client has gone: no reply to send
        except RequestError as err:
            service.record_error(err)
            logger.info("%s %s -> %d %s", method, path, err.status.value, err.message)
            await self._send(err.status, {"error": err.message}, err.headers)
            return
        except Exception:
            logger.exception("request failed")
            service.count(failures=1)
            await self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error; see the server log"})
            return
        await self._send(HTTPStatus.OK, result)

    async def _scored(self, job: Job) -> dict[str, Any] | None:
        """The reply to a job once it is scored, or None when the client has closed the connection meanwhile: the
        batcher drops such a job before its next model call (`Job.gone` reads the connection's end of stream; a
        client that half-closes its side after the request counts as gone)."""
        job.gone = self.reader.at_eof
        return await self.server.batcher.run(job)

    def _authorize(self, headers: dict[str, str]) -> None:
        check_bearer(headers, self.server.token)

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
        if self.server.closing:
            raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down")
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
        self._connections: dict[asyncio.Task, _Connection] = {}
        self._refusing: set[asyncio.Task] = set()  # connections answered 503 at once (full, or shutting down)
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
        """Stop accepting, score what is queued (at most ``grace`` s), answer it and close every connection, quietly:
        idle keep-alive connections are closed at once, the others after their reply, and no connection task is
        cancelled while it has work (a cancelled stream handler is logged by asyncio as an error).
        True when every queued request was scored in time."""
        self.closing = True
        for connection in list(self._connections.values()):
            if connection.idle:
                connection.writer.close()  # its read ends with EOF
        await self._stop_listening()
        done = await asyncio.get_running_loop().run_in_executor(None, self.batcher.close, grace)
        for last_resort in (False, True):
            tasks = [*self._connections, *self._refusing]
            if tasks:
                await asyncio.wait(tasks, timeout=10)
            for task, connection in list(self._connections.items()):
                if last_resort:
                    task.cancel()
                else:
                    connection.writer.close()
        return done

    async def _stop_listening(self) -> None:
        """Close the listening socket without resetting the connections the kernel has already accepted for it.

        Closing a listening socket resets (TCP RST) every connection still in its accept queue: their clients had
        connected and sent a request, and read "connection reset" instead of a reply (under load the queue holds
        dozens). So first the kernel is told to drop new connection attempts (a socket filter, Linux; their
        clients retry the handshake and are refused once the socket is closed: nothing was sent), then the queued
        connections are accepted (each answered 503 "shutting down"), then the socket is closed."""
        if self._server is None:
            return
        sockets = list(self._server.sockets)
        if all(_refuse_new_connections(sock) for sock in sockets):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DRAIN_S
            while any(_has_pending_connection(sock) for sock in sockets) and loop.time() < deadline:
                await asyncio.sleep(0.005)  # the event loop's accept callback takes them
            await asyncio.sleep(0)  # let the last accepted connections start
        self._server.close()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.closing or len(self._connections) >= self.service.limits.max_connections:
            self.service.count(busy=1)
            message = "shutting down" if self.closing else "too many open connections; retry later"
            self._refusing.add(task)
            try:
                writer.write(_raw_response(HTTPStatus.SERVICE_UNAVAILABLE, message, self.batcher.retry_after()))
                await _close(reader, writer)
            finally:
                self._refusing.discard(task)
            return
        connection = _Connection(self, reader, writer)
        self._connections[task] = connection
        try:
            await connection.serve()
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client has gone, or the shutdown closed the connection: end quietly
        finally:
            self._connections.pop(task, None)
            await _close(reader, writer)

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


if sys.version_info >= (3, 11):

    async def _read(reader: asyncio.StreamReader, timeout: float) -> bytes:
        """Up to `READ_CHUNK` bytes (b"" at the end of the stream) within ``timeout`` s, else TimeoutError (no task
        is created per read, unlike `asyncio.wait_for` before Python 3.12)."""
        async with asyncio.timeout(timeout):
            return await reader.read(READ_CHUNK)

else:  # pragma: no cover - Python 3.10

    async def _read(reader: asyncio.StreamReader, timeout: float) -> bytes:
        return await asyncio.wait_for(reader.read(READ_CHUNK), timeout)


async def _close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close a connection without resetting it: a socket closed while the client's bytes are still unread (a
    request refused before its body was read, a 503 sent without reading the request) makes the kernel send a
    TCP RST, which can destroy the reply before the client reads it. So the reply is followed by a FIN
    (half-close), what the client still sends is read and discarded until it closes its side (at most
    `LINGER_S` s), and only then is the socket closed (the "lingering close" of HTTP servers)."""
    try:
        if not reader.at_eof() and not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()
            deadline = time.monotonic() + LINGER_S
            while (remaining := deadline - time.monotonic()) > 0 and await _read(reader, remaining):
                pass
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        pass
    except asyncio.CancelledError:  # the shutdown's last resort: close now
        pass
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, asyncio.CancelledError):  # a connection handler ends quietly, also when cancelled
        pass


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
    except OSError:
        return False
    return True


def _has_pending_connection(sock: Any) -> bool:
    """Whether the listening socket has an accepted connection waiting in the kernel's queue (it polls readable)."""
    try:
        return bool(select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return False
