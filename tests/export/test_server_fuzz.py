"""Crafted input is a 4xx naming its field, never a 500, and never a line of the server log (issue 34, item 5).

Every field of both endpoints (``/v1/rewards``: descriptions, media and its keys; ``/get_reward``: query, prompts,
labels as subtitles and as clips, and their keys) gets every kind of hostile value: over-long text and file names,
paths longer than the system takes, integers of 5,000 digits, huge and non-finite numbers, wrong types, control
characters (newlines that would forge a log line, terminal escapes, NUL, U+2028), lone surrogates, bytes that are not
UTF-8, deep nesting. The servers are a text model (`StubRewardModel`) and a video model (its `ServedModelFacts` and a
scorer: no weights), through a real socket."""

from __future__ import annotations

import http.client
import json
import logging

import pytest
from _helpers import StubRewardModel

from emoreward.export.serve.facts import ServedModelFacts
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.service import RewardService
from emoreward.models.base import ScoreInfo


FORGED = "ERROR emoreward forged line"

# raw JSON text of each hostile value
VALUES = {
    "a media path": json.dumps("video/s1.mp4"),
    "a sample id": json.dumps("s1"),
    "long text": json.dumps("x" * 100_000),
    "long file name": json.dumps("v" * 300 + ".mp4"),
    "long path": json.dumps("/".join(["d" * 200] * 40) + "/s1.mp4"),
    "long sample id": json.dumps("s" * 300),
    "5000-digit integer": "9" * 5000,
    "negative integer": "-12",
    "huge float": "1e400",
    "NaN": "NaN",
    "true": "true",
    "null": "null",
    "empty": '""',
    "list": '["a"]',
    "object": '{"a": 1}',
    "deep nesting": "[" * 5000 + "]" * 5000,
    "newline": json.dumps(f"video/s1.mp4\n{FORGED}"),
    "carriage return": json.dumps(f"s1\r{FORGED}"),
    "escape": json.dumps("\x1b[2J\x1b[31mred"),
    "NUL": json.dumps("video/s1\x00.mp4"),
    "U+2028": json.dumps(f"s1\u2028{FORGED}"),
    "lone surrogate": '"\\ud800 video/s1.mp4"',
    "non-ASCII": json.dumps("vidéo/s1🙂.mp4", ensure_ascii=False),
    "traversal": json.dumps("../../etc/passwd"),
}
NOT_UTF8 = b'{"descriptions": ["caf\xe9"]}'

# (endpoint, body with @ where the value goes, the field a refusal must name)
FIELDS = [
    ("/v1/rewards", '{"descriptions": @}', "descriptions"),
    ("/v1/rewards", '{"descriptions": [@]}', "descriptions[0]"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": @}', "media"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": [@]}', "media[0]"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": {"subtitle": @}}', "media[0].subtitle"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": {"video": @}}', "media[0].video"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": [{"video": @}]}', "media[0].video"),
    ("/v1/rewards", '{"descriptions": ["a"], "media": [{"audio": @}]}', "media[0]"),
    ("/v1/rewards", '{"descriptions": ["a"], "extra": @}', "extra"),
    ("/get_reward", '{"query": @, "labels": [""]}', "query"),
    ("/get_reward", '{"query": [@], "labels": [""]}', "query[0]"),
    ("/get_reward", '{"query": ["p a"], "prompts": @, "labels": [""]}', "prompts"),
    ("/get_reward", '{"query": ["p a"], "prompts": [@], "labels": [""]}', "prompts[0]"),
    ("/get_reward", '{"query": ["p a"], "prompts": ["p "], "labels": @}', "labels"),
    ("/get_reward", '{"query": ["p a"], "prompts": ["p "], "labels": [@]}', "labels[0]"),
    ("/get_reward", '{"query": ["p a"], "labels": [{"video": @}]}', "labels[0]"),
    ("/get_reward", '{"query": ["p a"], "labels": [{"sample_id": @}]}', "labels[0]"),
    ("/get_reward", '{"query": ["p a"], "labels": [{"subtitle": @}]}', "labels[0]"),
]


class Words(StubRewardModel):
    def reward(self, description, subtitle):
        return len(description.split()) / 10


def video_scorer(descriptions, contexts=None, *, batch_size=None):
    return ScoreInfo([float(len(d)) for d in descriptions], [False] * len(descriptions), [3] * len(descriptions))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "video").mkdir()
    (root / "video" / "s1.mp4").write_bytes(b"")  # the scorer reads no file
    facts = ServedModelFacts(
        kind="media", max_length=64, max_chars=4096, modalities=frozenset({"video"}), sees_video=True
    )
    text = RewardService(Words(), openrlhf_labels="subtitle", media_root=root, allow_unused_media=True)
    video = RewardService(facts, scorer=video_scorer, openrlhf_labels="clip", media_root=root)
    with RewardServer(text, port=0) as a, RewardServer(video, port=0) as b:
        yield {"text": a, "video": b}


def post(server: RewardServer, path: str, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


@pytest.mark.parametrize("kind", ["text", "video"])
def test_every_field_with_every_hostile_value_is_answered_4xx_naming_it_or_200(servers, kind, caplog):
    server, seen = servers[kind], []
    with caplog.at_level(logging.INFO, logger="emoreward"):
        for path, template, field in FIELDS:
            for name, raw in VALUES.items():
                status, reply = post(server, path, template.replace("@", raw).encode("utf-8"))
                seen.append(status)
                where = f"{path} {template} <- {name}"
                assert status != 500 and (status == 200 or 400 <= status < 500), (where, status, reply)
                if status != 200:
                    message = reply["error"]
                    named = f"'{field}" in message or f"{field} " in message or field.split("[")[0] in message
                    # or the request is fine but lacks the video this model reads (a valid value in a body without it)
                    missing = message.endswith("is required: this reward model reads video")
                    assert named or missing or message.startswith("invalid JSON body"), (where, message)
        status, reply = post(server, "/v1/rewards", NOT_UTF8)
        assert status == 400 and "not UTF-8" in reply["error"]
    assert 200 in seen and 413 in seen  # the values reach the checks (some are fine, the long text is too long)
    lines = [record.getMessage() for record in caplog.records]
    assert lines and all(line.isprintable() for line in lines), [line for line in lines if not line.isprintable()]
    assert not any(line.startswith(FORGED) for text in lines for line in text.splitlines())
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_a_long_file_name_and_a_huge_integer_name_their_field(servers):
    server = servers["video"]
    status, reply = post(
        server, "/v1/rewards", b'{"descriptions": ["a"], "media": {"video": "%s.mp4"}}' % (b"v" * 300)
    )
    assert (
        status == 400
        and reply["error"] == "'media[0].video' has a file or folder name of 304 bytes; names have at most 255"
    )
    status, reply = post(server, "/get_reward", b'{"query": ["a"], "labels": ["%s"]}' % (b"s" * 300))
    assert status == 400 and reply["error"].startswith("'labels[0].video' has a file or folder name of 304 bytes")
    status, reply = post(server, "/v1/rewards", b'{"descriptions": [%s]}' % (b"9" * 5000))
    assert status == 400 and reply["error"] == "'descriptions[0]' must be a string"


@pytest.mark.parametrize(
    "head, status",
    [(b"POST /v1/rewards HTTP/3.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 505),
     (b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501)],
    ids=["http-3", "gzip-transfer-coding"],
)  # fmt: skip
def test_what_the_client_chose_is_a_bad_request_not_a_failure(tmp_path, head, status):
    """A 5xx that answers the client's own choice (an HTTP version, a transfer coding) counts as a bad request:
    `failures` counts the server's failures only (`RewardService.record_error`)."""
    import socket

    service = RewardService(Words())
    with RewardServer(service, port=0) as server:
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            sock.sendall(head)
            assert sock.recv(4096).split(b" ", 2)[1] == str(status).encode()
        conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
    assert health["stats"]["failures"] == 0 and health["stats"]["bad_requests"] == 1, health
