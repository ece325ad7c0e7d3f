"""Bad requests to the reward server (`RewardService` behind `RewardServer`, the tiny text reward model) and bad
options to `emoreward serve`. A bad request gets its 4xx with a one-line JSON error naming the field, never a 500,
and the server keeps serving; a bad option is one line and exit status 2, before the model loads."""

from __future__ import annotations

import http.client
import io
import json
import socket

import pytest
from bad_input_helpers import fails


TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(rm_dir):
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.protocol import ServerLimits
    from emoreward.export.serve.service import RewardService
    from emoreward.models import load_reward_model

    limits = ServerLimits(max_items=4, max_body_bytes=1_000_000)
    service = RewardService(load_reward_model(rm_dir), limits, openrlhf_labels="subtitle")
    with RewardServer(service, port=0, token=TOKEN) as srv:
        yield srv
    assert service.stats.failures == 0  # no 500 for any request of this module


def send(server, method, path, body=None, headers=AUTH):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    if body is None:  # no body and no Content-Length
        conn.putrequest(method, path)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
    else:
        conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, raw


def refused(server, status, body, *fragments, path="/v1/rewards", method="POST", headers=AUTH):
    """Send a request that must be refused: its status, and one JSON error line holding every fragment."""
    got, raw = send(server, method, path, body, headers)
    error = json.loads(raw)["error"]
    assert got == status, (got, error)
    assert "\n" not in error and "Traceback" not in error
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    return error


REQUESTS = [
    # (id, status, body, fragments)
    ("invalid-json", 400, b'{"descriptions": [', ["invalid JSON body: Expecting value: line 1 column 19"]),
    ("deep-nesting", 400, b'{"descriptions": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ["nested too deeply"]),
    ("lone-surrogate", 400, b'{"descriptions": ["ok", "\\ud800x"]}', ["'descriptions[1]' is not valid Unicode text", "\\ud800"]),
    ("not-utf8", 400, '{"descriptions": ["café"]}'.encode("latin-1"), ["the body is not UTF-8"]),
    ("body-not-an-object", 400, b'["calm"]', ["the body must be a JSON object"]),
    ("descriptions-a-string", 400, b'{"descriptions": "calm"}', ["'descriptions' must be a list"]),
    ("descriptions-null", 400, b'{"descriptions": null}', ["'descriptions' must be a list"]),
    ("description-a-number", 400, b'{"descriptions": ["calm", 5]}', ["'descriptions[1]' must be a string"]),
    ("description-nan", 400, b'{"descriptions": [NaN]}', ["'descriptions[0]' must be a string"]),
    ("no-descriptions", 400, b'{"descriptions": []}', ["'descriptions' is empty"]),
    ("missing-field", 400, b'{"media": {"subtitle": "hi"}}', ["missing field 'descriptions'"]),
    ("too-many-items", 413, json.dumps({"descriptions": ["a"] * 5}).encode(), ["'descriptions' has 5 items; the limit is 4"]),
    ("text-too-long", 413, json.dumps({"descriptions": ["a" * 50_000]}).encode(), ["'descriptions[0]' has 50000 characters"]),
    ("unknown-field", 400, b'{"descriptions": ["a"], "prompt": "x"}', ["unknown fields ['prompt']"]),
    ("duplicate-key", 400, b'{"descriptions": ["a"], "descriptions": ["b", "c"]}', ["'descriptions' appears twice"]),
    ("media-a-string", 400, b'{"descriptions": ["a"], "media": "s0.mp4"}', ["'media' must be an object or a list"]),
    ("media-count", 400, b'{"descriptions": ["a", "b"], "media": [{}]}', ["'media' has 1 items for 2 descriptions"]),
    ("media-unknown-key", 400, b'{"descriptions": ["a"], "media": {"sub": "x"}}', ["'media[0]' has unknown keys ['sub']"]),
    ("subtitle-a-number", 400, b'{"descriptions": ["a"], "media": {"subtitle": 3}}', ["'media[0].subtitle' must be a string"]),
    ("media-path-for-a-text-model", 400, b'{"descriptions": ["a"], "media": [{"video": "../../etc/passwd"}]}',
     ["'media[0].video' given, but this reward model is text-only"]),
]  # fmt: skip


@pytest.mark.parametrize("status, body, fragments", [c[1:] for c in REQUESTS], ids=[c[0] for c in REQUESTS])
def test_bad_reward_requests_get_a_4xx_naming_the_field(server, status, body, fragments):
    refused(server, status, body, *fragments)


OPENRLHF = [
    ("no-query", b'{"prompts": ["p"]}', ["missing field 'query'"]),
    ("query-a-number", b'{"query": [1], "labels": [""]}', ["'query[0]' must be a string"]),
    ("prompt-count", b'{"query": ["pa", "pb"], "prompts": ["p"], "labels": ["", ""]}', ["'prompts' has 1 items for 2 queries"]),
    ("label-count", b'{"query": ["a"], "labels": ["x", "y"]}', ["'labels' has 2 items for 1 queries"]),
    ("query-without-its-prompt", b'{"query": ["hello world"], "prompts": ["bye"], "labels": [""]}', ["query[0] does not start with prompts[0]"]),
]  # fmt: skip


@pytest.mark.parametrize("body, fragments", [c[1:] for c in OPENRLHF], ids=[c[0] for c in OPENRLHF])
def test_bad_openrlhf_requests_get_a_400_naming_the_field(server, body, fragments):
    refused(server, 400, body, *fragments, path="/get_reward")


def test_a_wrong_token_is_a_401_that_does_not_echo_it(server):
    error = refused(server, 401, b'{"descriptions": ["a"]}', "missing or wrong bearer token", headers={
        "Authorization": "Bearer guess-123", "Content-Type": "application/json"})  # fmt: skip
    assert "guess-123" not in error and TOKEN not in error


def test_no_token_is_a_401(server):
    refused(server, 401, b'{"descriptions": ["a"]}', "missing or wrong bearer token", headers={})


def test_no_content_length_is_a_411(server):
    refused(server, 411, None, "send a Content-Length header")


def test_not_json_is_a_415(server):
    refused(server, 415, b"descriptions=a", "Content-Type must be application/json, got text/plain",
            headers={**AUTH, "Content-Type": "text/plain"})  # fmt: skip


def test_a_malformed_content_length_is_a_400(server):
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n")
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 400 ") and '"malformed HTTP request: bad Content-Length"' in reply


def test_the_server_still_answers_a_good_request(server):
    status, raw = send(
        server, "POST", "/v1/rewards", b'{"descriptions": ["calm", "tense"], "media": {"subtitle": "hi"}}'
    )
    reply = json.loads(raw)
    assert status == 200 and len(reply["rewards"]) == 2 and reply["truncated"] == [False, False]


# ---------------------------------------------------------------------------------------------- emoreward serve
@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--batch-size", "0"], ["argument --batch-size: expected an integer >= 1, got 0"]),
        (["--max-items", "0"], ["argument --max-items: expected an integer >= 1, got 0"]),
        # options that allocate or start what their value says are bounded (a window's buffers, torch's threads)
        (["--length-window", "1"], ["argument --length-window: expected an integer in [3, 1,000,000], got 1"]),
        (["--length-window", str(10**13)], ["argument --length-window: expected an integer in [3, 1,000,000]"]),
        (["--threads", str(10**20)], ["argument --threads: expected an integer in [1, 1,024]"]),
        (["--batch-size", str(10**14)], ["argument --batch-size: expected an integer in [1, 2,147,483,647]"]),
        (["--queue-timeout", "-1"], ["argument --queue-timeout: expected a number > 0, got '-1'"]),
        (["--port", "70000"], ["argument --port: expected a port number (0-65535), got 70000"]),
        (["--max-items", "100", "--max-queue", "10"], ["--max-items 100 exceeds --max-queue 10"]),
        (["--overlong", "cut"], ["argument --overlong: invalid choice: 'cut'"]),
        (["--host", "0.0.0.0"], ["refusing to serve on 0.0.0.0 without authentication", "--insecure-no-auth"]),
    ],
    ids=["batch-size-zero", "max-items-zero", "window-too-small", "window-too-large", "threads-too-many",
         "batch-size-too-large", "negative-queue-timeout", "port-out-of-range", "items-beyond-queue",
         "unknown-overlong-policy", "open-host-without-token"],
)  # fmt: skip
def test_bad_serve_options(rm_dir, capsys, monkeypatch, options, fragments):
    monkeypatch.delenv("EMOREWARD_SERVE_TOKEN", raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO())  # no terminal to confirm an open host on
    fails(["serve", "--model", rm_dir, "--port", "0", *options], capsys, *fragments)


@pytest.mark.parametrize(
    "token, host, fragments",
    [
        ("sekret", "127.0.0.1", ["--insecure-no-auth waives the token", "EMOREWARD_SERVE_TOKEN is set"]),
        ("sekret", "0.0.0.0", ["--insecure-no-auth waives the token", "EMOREWARD_SERVE_TOKEN is set"]),
        (None, "127.0.0.1", ["--insecure-no-auth waives the token", "127.0.0.1 is a loopback address"]),
    ],
    ids=["token-set-loopback", "token-set-open-host", "loopback-without-token"],
)
def test_insecure_no_auth_where_there_is_no_token_to_waive(rm_dir, capsys, monkeypatch, token, host, fragments):
    """With a token set the server demands it whatever --insecure-no-auth says, and a loopback host never asks for
    one: the option would be ignored, so it is refused (one line, exit 2) before the server starts."""
    if token is None:
        monkeypatch.delenv("EMOREWARD_SERVE_TOKEN", raising=False)
    else:
        monkeypatch.setenv("EMOREWARD_SERVE_TOKEN", token)
    fails(["serve", "--model", rm_dir, "--port", "0", "--host", host, "--insecure-no-auth"], capsys, *fragments)


def test_clip_labels_for_a_text_model_are_refused_at_start_up(rm_dir, capsys):
    """A text model reads no clip: `--openrlhf-labels clip` is one line, exit 2, before the model loads."""
    fails(
        ["serve", "--model", rm_dir, "--port", "0", "--openrlhf-labels", "clip"],
        capsys,
        "--openrlhf-labels clip applies to reward models that read media; this one is a text model",
        "['ignore', 'subtitle']",
    )


def test_serve_a_folder_that_is_not_a_model(tmp_path, capsys):
    fails(["serve", "--model", tmp_path, "--port", "0"], capsys, f"{tmp_path} is not an emoreward model directory")


def test_serve_with_a_media_root_that_does_not_exist(rm_dir, tmp_path, capsys):
    argv = ["serve", "--model", rm_dir, "--port", "0", "--media-root", tmp_path / "media"]
    fails(argv, capsys, f"--media-root {tmp_path / 'media'}: no such folder")


def test_serve_a_text_model_with_a_media_root(rm_dir, tmp_path, capsys):
    # a text model reads no media (emoreward.judges.reads_media): the option would be ignored, so it is refused
    (tmp_path / "media").mkdir()
    argv = ["serve", "--model", rm_dir, "--port", "0", "--media-root", tmp_path / "media"]
    fails(argv, capsys, f"--media-root applies to multimodal models; {rm_dir} is a text model")


# ------------------------------------------------------------------- every engine: one line, before any work
@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("engine", ["single", "ray"])
def test_a_busy_port_is_one_line_before_the_model_or_ray_starts(rm_dir, capsys, busy_port, engine):
    argv = ["serve", "--model", rm_dir, "--port", busy_port, "--engine", engine]
    fails(argv, capsys, f"--port {busy_port}: 127.0.0.1:{busy_port} is already in use")


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--model", "MISSING"], ["model directory not found"]),
        (["--ray-address", "127.0.0.1:1"], ["--ray-address 127.0.0.1:1: no Ray cluster answers there"]),
        (["--num-gpus", "-1"], ["argument --num-gpus: expected a number >= 0, got '-1'"]),
        (["--num-cpus", "0"], ["argument --num-cpus: expected a number > 0, got '0'"]),
        (["--replicas", "0"], ["argument --replicas: expected an integer >= 1, got 0"]),
        (["--min-replicas", "-1"], ["argument --min-replicas: expected an integer >= 0, got -1"]),
        (["--min-replicas", "3", "--max-replicas", "2"], ["--min-replicas 3 must be between 0 and --max-replicas 2"]),
        (["--port", "0"], ["--engine ray needs a fixed --port"]),
    ],
    ids=["missing-model", "no-cluster-there", "negative-gpus", "zero-cpus", "zero-replicas", "negative-min-replicas",
         "min-above-max", "port-zero"],
)  # fmt: skip
def test_bad_ray_options_are_one_line_before_ray_starts(rm_dir, tmp_path, capsys, options, fragments):
    options = [str(tmp_path / "missing") if o == "MISSING" else o for o in options]
    port = ["--port", "18799"] if "--port" not in options else []
    model = ["--model", rm_dir] if "--model" not in options else []
    fails(["serve", *model, "--engine", "ray", *port, *options], capsys, *fragments)
