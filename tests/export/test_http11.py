"""The reward server's HTTP/1.1 wire format (`emoreward.export.serve.http11`) and the connection protocol around it:
strict request heads (each malformed form is a 4xx naming the problem), keep-alive, pipelined requests answered in
order, ``Expect: 100-continue``, HTTP/1.0, the read timeout, and a closing connection that ends with a FIN."""

import json
import socket
import time
from http import HTTPStatus

import pytest
from _helpers import StubRewardModel

from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.http11 import parse_head, response
from emoreward.export.serve.protocol import RequestError, ServerLimits
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


def test_a_head_is_parsed_strictly():
    request = parse_head(
        b"POST /v1/rewards?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2\r\nConnection: keep-alive"
    )
    assert (request.method, request.path, request.length, request.has_length) == ("POST", "/v1/rewards", 12, True)
    assert request.headers["x-a"] == "1, 2" and request.keep_alive and not request.expect_continue
    assert not parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Close").keep_alive
    assert not parse_head(b"GET / HTTP/1.0").keep_alive  # HTTP/1.0: one request per connection
    assert parse_head(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 3").expect_continue
    assert parse_head(b"GET / HTTP/1.1\r\nHost:   spaced   ").headers["host"] == "spaced"


@pytest.mark.parametrize(
    "head, status, message",
    [
        (b"GET /x", 400, "malformed HTTP request line"),
        (b"GET  /x HTTP/1.1\r\nHost: a", 400, "malformed HTTP request line"),
        (b"GET /x HTTP/2.0\r\nHost: a", 505, "only HTTP/1.0 and HTTP/1.1"),
        (b"GET /x HTTP/1.1", 400, "HTTP/1.1 needs a Host header"),
        (b"GET /x HTTP/1.1\r\nHost: a\r\n folded", 400, "obsolete line folding"),
        (b"GET /x HTTP/1.1\r\nHost : a", 400, "a malformed header field"),
        (b"GET /x HTTP/1.1\r\nHost: a\r\nBad\x01: b", 400, "a malformed header field"),
        (b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4", 400, "conflicting content-length"),
        (b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: -3", 400, "bad Content-Length"),
        (b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked", 411, "chunked bodies are refused"),
    ],
)
def test_malformed_heads_are_refused_naming_the_problem(head, status, message):
    with pytest.raises(RequestError, match=message) as err:
        parse_head(head)
    assert err.value.status == status


def test_a_response_carries_length_and_close():
    out = response(HTTPStatus.OK, b'{"a": 1}', [("Retry-After", "3")], close=True)
    assert out == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\nServer: emoreward-serve\r\n"
        b"Retry-After: 3\r\nConnection: close\r\n\r\n" + b'{"a": 1}'
    )


def test_pipelined_requests_on_one_connection_are_answered_in_order(server):
    bodies = [json.dumps({"descriptions": ["a " * k]}).encode() for k in (1, 2, 3)]
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"".join(post(b) for b in bodies) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = replies(sock, 4)
    assert [g[1]["rewards"] for g in got[:3]] == [[pytest.approx(0.1)], [pytest.approx(0.2)], [pytest.approx(0.3)]]
    assert got[3][0] == 200 and got[3][1]["status"] == "ok"
    assert all("Connection: close" not in head for _, _, head in got)


def test_expect_100_continue_then_the_body(server):
    body = json.dumps({"descriptions": ["one two"]}).encode()
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        head, _, _ = post(body, extra="Expect: 100-continue\r\n").partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        [(status, data, _)] = replies(sock, 1)
    assert status == 200 and data["rewards"] == [pytest.approx(0.2)]


def test_http10_and_errors_before_the_body_close_with_a_fin_not_a_reset(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        [(status, _, head)] = replies(sock, 1)
        assert status == 200 and "Connection: close" in head and sock.recv(10) == b""  # FIN
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        # a 404 before the (large) body is read: answered at once, then the server reads the rest and ends cleanly
        sock.sendall(post(b"x" * 200_000, path="/nowhere"))
        [(status, data, head)] = replies(sock, 1)
        assert status == 404 and "no endpoint /nowhere" in data["error"] and "Connection: close" in head
        assert sock.recv(10) == b""  # a FIN, not ConnectionResetError


def test_a_request_not_completed_in_time_is_a_408(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"
        )
        started = time.monotonic()
        [(status, data, _)] = replies(sock, 1)
    assert status == 408 and data["error"] == "request not received in time" and time.monotonic() - started < 5


def test_an_oversized_head_is_a_431(server):
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        [(status, data, _)] = replies(sock, 1)
    assert status == 431 and "request head too large" in data["error"]
