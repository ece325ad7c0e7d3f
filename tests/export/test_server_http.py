"""The reward server's HTTP/1.1 through a real socket (`emoreward.export.serve.http`, parsed and framed by h11):
strict request heads (each malformed form is a 4xx naming the problem), the response's framing, keep-alive,
pipelined requests answered in order, ``Expect: 100-continue``, HTTP/1.0, chunked bodies refused, the read timeout,
the head size limit, and a closing connection that ends with a FIN."""

import json
import socket
import time

import pytest
from _helpers import StubRewardModel

from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits
from emoreward.export.serve.service import RewardService


class Words(StubRewardModel):
    def reward(self, description, subtitle):
        return len(description.split()) / 10


@pytest.fixture(scope="module")
def server():
    with RewardServer(RewardService(Words(), ServerLimits(read_timeout=0.5)), port=0) as srv:
        yield srv


def post(body: bytes, path: str = "/v1/rewards", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def words(*counts: int) -> list[bytes]:
    return [json.dumps({"descriptions": ["a " * k]}).encode() for k in counts]


def replies(sock: socket.socket, n: int) -> list[tuple[int, dict, str]]:
    """Read ``n`` responses from ``sock``: (status, JSON body, head)."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} replies"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(
            next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:]) if k == b"Content-Length")
        )
        while len(data) < length:
            data += sock.recv(65536)
        out.append((int(head.split()[1]), json.loads(data[:length]), head.decode()))
        data = data[length:]
    return out


def exchange(server, raw: bytes, n: int = 1) -> list[tuple[int, dict, str]]:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(raw)
        return replies(sock, n)


def closed_by_server(sock: socket.socket) -> bool:
    """The server ended the connection with a FIN (not a reset)."""
    return sock.recv(10) == b""


def test_a_response_is_framed_by_content_length():
    with RewardServer(RewardService(Words()), port=0) as srv:
        with socket.create_connection((srv.host, srv.port), timeout=10) as sock:
            sock.sendall(b"GET /v1/rewards HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while not data.endswith(b"}"):
                data += sock.recv(4096)
    body = b'{"error": "/v1/rewards takes POST"}'
    assert data == (
        b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nServer: emoreward-serve\r\nAllow: POST\r\n\r\n"
        + body
    )


def test_keep_alive_repeated_fields_query_and_spaces(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        [body] = words(2)
        sock.sendall(post(body, path="/v1/rewards?x=1", extra="X-A: 1\r\nx-a: 2\r\nConnection: keep-alive\r\n"))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost:   spaced   \r\n\r\n")  # the same connection, kept alive
        got = replies(sock, 2)
    assert got[0][:2] == (200, {**got[0][1], "rewards": [pytest.approx(0.2)]}) and got[1][0] == 200
    assert all("Connection: close" not in head for _, _, head in got)


def test_connection_close_and_http10_end_the_connection_with_a_fin(server):
    for raw in (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n", b"GET /health HTTP/1.0\r\n\r\n"):
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(raw)
            [(status, _, head)] = replies(sock, 1)
            assert status == 200 and "Connection: close" in head and closed_by_server(sock)


def test_a_refused_request_without_a_body_keeps_the_connection(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = replies(sock, 2)
    assert [status for status, _, _ in got] == [404, 200] and "Connection: close" not in got[0][2]


@pytest.mark.parametrize(
    "head, status, message",
    [
        (b"GET /health", 400, "malformed HTTP request: illegal request line"),
        (b"GET  /health HTTP/1.1\r\nHost: a", 400, "illegal request line"),
        (b"GET /health HTTP/2.0\r\nHost: a", 505, "only HTTP/1.0 and HTTP/1.1 are served"),
        (b"GET /health HTTP/1.1", 400, "Missing mandatory Host: header"),
        (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b", 400, "multiple Host: headers"),
        (b"GET /health HTTP/1.1\r\nHost : a", 400, "illegal header line"),
        (b"GET /health HTTP/1.1\r\nHost: a\r\nBad\x01: b", 400, "illegal header line"),
        (b"POST /v1/rewards HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4", 400, "conflicting"),
        (b"POST /v1/rewards HTTP/1.1\r\nHost: a\r\nContent-Length: -3", 400, "bad Content-Length"),
        (b"POST /v1/rewards HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked", 411, "chunked bodies are refused"),
        # both framings (the request-smuggling form): refused before any body byte is read, then closed
        (b"POST /v1/rewards HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", 411, "chunked"),
        (b"POST /v1/rewards HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip", 501, "Transfer-Encoding: chunked"),
    ],
)
def test_malformed_heads_are_refused_naming_the_problem_and_closed(server, head, status, message):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n\r\n")
        [(got, data, reply_head)] = replies(sock, 1)
        assert got == status and message in data["error"] and "Connection: close" in reply_head
        assert closed_by_server(sock)


def test_folded_headers_and_blank_lines_before_a_request_are_tolerated(server):
    # RFC 9112: obsolete line folding is replaced by a space (5.2); empty lines before a request are ignored (2.2)
    [(status, _, _)] = exchange(server, b"\r\nGET /health HTTP/1.1\r\nHost: a\r\nX-F: one\r\n two\r\n\r\n")
    assert status == 200
    bodies = words(1, 2)
    got = exchange(server, post(bodies[0]) + b"\r\n" + post(bodies[1]), 2)  # a CRLF between pipelined requests
    assert [data["rewards"] for _, data, _ in got] == [[pytest.approx(0.1)], [pytest.approx(0.2)]]


def test_pipelined_requests_on_one_connection_are_answered_in_order(server):
    bodies = words(1, 2, 3)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"".join(post(b) for b in bodies) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = replies(sock, 4)
        # and a next batch sent in pieces, byte by byte for the first head
        raw = b"".join(post(b) for b in words(4, 5))
        for k in range(60):
            sock.sendall(raw[k : k + 1])
        sock.sendall(raw[60:])
        got += replies(sock, 2)
    assert [g[1]["rewards"] for g in got[:3]] == [[pytest.approx(0.1)], [pytest.approx(0.2)], [pytest.approx(0.3)]]
    assert got[3][0] == 200 and got[3][1]["status"] == "ok"
    assert [g[1]["rewards"] for g in got[4:]] == [[pytest.approx(0.4)], [pytest.approx(0.5)]]
    assert all("Connection: close" not in head for _, _, head in got)


def test_many_pipelined_requests_in_one_packet(server):
    got = exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 1500, 1500)
    assert len(got) == 1500 and {status for status, _, _ in got} == {200}


def test_expect_100_continue_then_the_body(server):
    [body] = words(2)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        head, _, _ = post(body, extra="Expect: 100-Continue\r\n").partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        [(status, data, _)] = replies(sock, 1)
    assert status == 200 and data["rewards"] == [pytest.approx(0.2)]


def test_expect_100_continue_refused_before_the_body(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(post(b"", path="/nowhere", extra="Expect: 100-continue\r\n").replace(b"Length: 0", b"Length: 9"))
        [(status, data, head)] = replies(sock, 1)
        assert status == 404 and "Connection: close" in head and closed_by_server(sock)


def test_errors_before_the_body_close_with_a_fin_not_a_reset(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        # a 404 before the (large) body is read: answered at once, then the server reads the rest and ends cleanly
        sock.sendall(post(b"x" * 200_000, path="/nowhere"))
        [(status, data, head)] = replies(sock, 1)
        assert status == 404 and "no endpoint /nowhere" in data["error"] and "Connection: close" in head
        assert closed_by_server(sock)  # a FIN, not ConnectionResetError


def test_a_request_not_completed_in_time_is_a_408(server):
    for partial in (
        b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{",
        b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\n",  # a head never ended
    ):
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(partial)
            started = time.monotonic()
            [(status, data, head)] = replies(sock, 1)
            assert status == 408 and data["error"] == "request not received within 0.5 s"
            assert time.monotonic() - started < 5 and "Connection: close" in head and closed_by_server(sock)


def test_an_oversized_head_is_a_431(server):
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000
    [(status, data, _)] = exchange(server, big + b"\r\n\r\n")  # received at once (h11 parses it whole)
    assert status == 431 and data["error"] == "request head too large"
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(big)  # never ended: h11's bound on an incomplete head
        [(status, data, _)] = replies(sock, 1)
    assert status == 431 and data["error"] == "request head too large"


def test_a_chunked_body_is_bounded_too(server):
    chunk = b"4000\r\n" + b"a" * 0x4000 + b"\r\n"
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2 + b"0\r\n\r\n"
    [(status, data, _)] = exchange(server, raw)
    assert status == 413 and data["error"] == "body over 16384 bytes"
