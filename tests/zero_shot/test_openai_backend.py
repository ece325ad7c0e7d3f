import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from zero_shot.backends.base import ChatRequest, SamplingConfig
from zero_shot.backends.openai_compat import OpenAIChatBackend


class FakeServer:
    """A local OpenAI-compatible server on 127.0.0.1 that fails in scripted ways before answering."""

    def __init__(self, script):
        self.script = list(script)  # per request: "ok", "500", "429", "400", "slow", "garbage"
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append((dict(self.headers), body))
                    action = outer.script.pop(0) if outer.script else "ok"
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    if action == "slow":
                        time.sleep(0.6)
                    if action in ("500", "429", "400"):
                        self.send_response(int(action))
                        self.end_headers()
                        self.wfile.write(b'{"error": "scripted"}')
                        return
                    if action == "busy":
                        time.sleep(0.15)
                    payload = (
                        b"not json"
                        if action == "garbage"
                        else json.dumps(
                            {
                                "choices": [
                                    {"message": {"content": f"Answer: {body['messages'][-1]['content'][-1]}"}}
                                ],
                                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                            }
                        ).encode()
                    )
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _backend(url, **kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 2.0)
    return OpenAIChatBackend(url, "judge-model", **kw)


def test_retries_server_errors_with_backoff_and_reads_key_from_env(monkeypatch):
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
    with FakeServer(["500", "429", "garbage", "ok"]) as server:
        backend = _backend(server.url, api_key_env="FAKE_JUDGE_KEY", max_retries=3)
        [gen] = backend.generate([ChatRequest("pick 1", seed=5)], SamplingConfig(max_new_tokens=8))
    assert gen.error is None and gen.text == "Answer: 1"
    assert gen.extra["attempts"] == 4 and len(server.requests) == 4
    headers, body = server.requests[-1]
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["seed"] == 5 and body["max_tokens"] == 8 and body["temperature"] == 0.0


def test_gives_up_after_max_retries_and_does_not_retry_client_errors():
    with FakeServer(["500"] * 3 + ["400"]) as server:
        backend = _backend(server.url, max_retries=2)
        [gave_up] = backend.generate([ChatRequest("x")], SamplingConfig())
        [client_error] = backend.generate([ChatRequest("y")], SamplingConfig())
    assert "gave up after 3 attempts" in gave_up.error and "HTTP 500" in gave_up.error
    assert client_error.error.startswith("HTTP 400") and len(server.requests) == 4


def test_timeout_is_retried():
    with FakeServer(["slow", "ok"]) as server:
        backend = _backend(server.url, timeout_s=0.2, max_retries=1)
        [gen] = backend.generate([ChatRequest("2")], SamplingConfig())
    assert gen.error is None and gen.extra["attempts"] == 2


def test_concurrency_limit_and_order():
    with FakeServer(["busy"] * 8) as server:
        backend = _backend(server.url, concurrency=3)
        gens = backend.generate([ChatRequest(str(i)) for i in range(8)], SamplingConfig())
    assert [g.text for g in gens] == [f"Answer: {i}" for i in range(8)]
    assert 1 < server.max_in_flight <= 3


def test_missing_key_is_an_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
        OpenAIChatBackend("http://127.0.0.1:9/v1", "m", api_key_env="NO_SUCH_JUDGE_KEY")
