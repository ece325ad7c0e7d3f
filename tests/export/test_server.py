"""The HTTP reward server on loopback: both endpoints, values, limits and clear 4xx."""

import http.client
import json
import threading

import pytest
from _helpers import StubRewardModel

from emoreward.export.server import RewardServer, RewardService, ServerLimits, add_serve_arguments


class WordsModel(StubRewardModel):
    """Stand-in reward model: words / 10, +1 with a subtitle."""

    def __init__(self, gate=None):
        super().__init__()
        self.gate = gate

    def score_info(self, descriptions, contexts=None, *, batch_size=None):
        if self.gate is not None:
            self.gate.wait(timeout=5)
        return super().score_info(descriptions, contexts, batch_size=batch_size)

    def reward(self, description, subtitle):
        return len(description.split()) / 10 + (1.0 if subtitle else 0.0)


def post(server, path, payload=None, raw=None, headers=None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    body = raw if raw is not None else json.dumps(payload).encode()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, data


@pytest.fixture()
def server():
    limits = ServerLimits(max_body_bytes=2000, max_items=4, max_chars=200, max_concurrent=2)
    with RewardServer(RewardService(WordsModel(), limits, openrlhf_labels="subtitle"), port=0) as srv:
        yield srv


def test_binds_loopback_and_health(server):
    assert server.host == "127.0.0.1" and server.port > 0
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    data = json.loads(resp.read())
    assert resp.status == 200 and data["status"] == "ok" and data["limits"]["max_items"] == 4


def test_rewards_endpoint(server):
    status, data = post(server, "/v1/rewards", {"descriptions": ["a b c", "a"], "media": {"subtitle": "hi"}})
    assert status == 200 and data["rewards"] == pytest.approx([1.3, 1.1])
    status, data = post(server, "/v1/rewards", {"descriptions": ["a b", "a"], "media": [None, {"subtitle": "x"}]})
    assert status == 200 and data["rewards"] == pytest.approx([0.2, 1.1])
    status, data = post(server, "/v1/rewards", {"descriptions": ["a b c d"]})
    assert status == 200 and data["rewards"] == pytest.approx([0.4])


def test_openrlhf_endpoint(server):
    # the request of openrlhf.utils.remote_rm_utils.remote_rm_fn: query = prompt + response
    payload = {
        "query": ["<prompt 1>He smiles widely", "<prompt 2>sad"],
        "prompts": ["<prompt 1>", "<prompt 2>"],
        "labels": ["subtitle one", ""],
    }
    status, data = post(server, "/get_reward", payload)
    assert status == 200
    assert data["rewards"] == pytest.approx([1.3, 0.1]) and data["scores"] == data["rewards"]
    assert "extra_logs" in data
    status, data = post(server, "/get_reward", {"query": ["one two"]})  # no prompts: the whole query
    assert status == 200 and data["rewards"] == pytest.approx([0.2])
    status, data = post(server, "/get_reward", {"query": ["abc"], "prompts": ["zzz"]})
    assert status == 400 and "does not start with" in data["error"]


@pytest.mark.parametrize(
    ("path", "payload", "status", "match"),
    [
        ("/v1/rewards", {"descriptions": "text"}, 400, "must be a list"),
        ("/v1/rewards", {"descriptions": []}, 400, "empty"),
        ("/v1/rewards", {"descriptions": [1]}, 400, "must be a string"),
        ("/v1/rewards", {"texts": ["a"]}, 400, "unknown fields"),
        ("/v1/rewards", {"descriptions": ["a"] * 5}, 413, "limit is 4"),
        ("/v1/rewards", {"descriptions": ["a" * 201]}, 413, "limit is 200"),
        ("/v1/rewards", {"descriptions": ["a"], "media": {"video": "v.mp4"}}, 400, "text-only"),
        ("/v1/rewards", {"descriptions": ["a", "b"], "media": [{}]}, 400, "one object per description"),
        ("/get_reward", {"prompts": ["a"]}, 400, "missing field 'query'"),
        ("/get_reward", {"query": ["a", "b"], "prompts": ["a"]}, 400, "1 prompts for 2 queries"),
        ("/nope", {}, 404, "no POST endpoint"),
        ("/health", {}, 405, "no POST endpoint"),
    ],
)
def test_bad_requests_get_clear_4xx(server, path, payload, status, match):
    got, data = post(server, path, payload)
    assert got == status and match in data["error"]


def test_body_level_errors(server):
    status, data = post(server, "/v1/rewards", raw=b"{not json")
    assert status == 400 and "invalid JSON" in data["error"]
    status, data = post(server, "/v1/rewards", raw=b"x" * 2001)
    assert status == 413 and "limit is 2000" in data["error"]
    status, data = post(server, "/v1/rewards", {"descriptions": ["a"]}, headers={"Content-Type": "text/plain"})
    assert status == 415
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.putrequest("POST", "/v1/rewards")
    conn.putheader("Content-Type", "application/json")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    # the server still answers after all that
    assert post(server, "/v1/rewards", {"descriptions": ["a"]})[0] == 200


def test_busy_server_answers_503():
    gate = threading.Event()
    service = RewardService(WordsModel(gate), ServerLimits(max_concurrent=1))
    with RewardServer(service, port=0) as srv:
        first = threading.Thread(target=post, args=(srv, "/v1/rewards", {"descriptions": ["a"]}))
        first.start()
        for _ in range(100):  # wait until the first request holds the only slot
            if service._slots._value == 0:
                break
            threading.Event().wait(0.02)
        status, data = post(srv, "/v1/rewards", {"descriptions": ["b"]})
        gate.set()
        first.join(timeout=10)
    assert status == 503 and "busy" in data["error"]


def test_serve_arguments_default_to_loopback():
    import argparse

    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    args = p.parse_args(["--model", "m"])
    assert args.host == "127.0.0.1" and args.openrlhf_labels == "ignore"
    with pytest.raises(ValueError):
        ServerLimits(max_items=0)
