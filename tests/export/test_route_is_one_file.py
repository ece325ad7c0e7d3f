"""A new client protocol is one file: the route below (path, parsing, reply, an option) is defined and registered
here, and nothing else is edited; the real HTTP server, the in-process scorer, the 404 hint, the banner's endpoint
list and ``emoreward serve``'s options all take it from the registry (`emoreward.export.serve.routes`)."""

from __future__ import annotations

import argparse
import http.client
import json

import pytest
from _helpers import StubRewardModel

from emoreward.export.serve import routes
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.service import RewardService


class Words(StubRewardModel):
    def reward(self, description, subtitle):
        return len(description.split()) / 10 + (1.0 if subtitle else 0.0)


class Toy(routes.Route):
    """``{"texts": [...], "subtitle": str}`` -> ``{"values": [...]}``; ``--toy-suffix`` is appended to every text."""

    path = "/v1/toy"
    name = "toy"
    options = (routes.RouteOption("toy_suffix", "--toy-suffix", "", "text appended to every toy text"),)
    # its request's fields: the service checks a body against them (unknown, missing, counts) before `parse`
    body_fields = (
        routes.BodyField("texts", "the texts", role="items", required=True),
        routes.BodyField("subtitle", "one subtitle for all", role="whole"),
    )

    def parse(self, body):
        fields = self.fields  # the request-field validation every route receives (never the service)
        texts = [fields.text(t, f"texts[{k}]") + self.settings["toy_suffix"] for k, t in enumerate(body["texts"])]
        contexts = fields.contexts({"subtitle": body["subtitle"]}, len(texts))
        return fields.job(self.name, texts, contexts, [f"texts[{k}]" for k in range(len(texts))])

    def reply(self, job, rewards, truncated, empty):
        return {"values": rewards}


@pytest.fixture()
def toy():
    routes.register(Toy)
    yield Toy
    routes.unregister(Toy)


def post(server, path, payload):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=20)
    conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, data


def test_a_route_defined_in_one_file_is_served_over_http(toy):
    model = Words()
    with RewardServer(RewardService(model, toy_suffix=" and more"), port=0) as srv:
        status, data = post(srv, "/v1/toy", {"texts": ["one two", "three"], "subtitle": "hi"})
        assert status == 200 and data == {"values": [1.4, 1.3]}  # words / 10 + 1 (a subtitle), the suffix counted
        status, data = post(srv, "/v1/toy", {"texts": "nope"})
        assert status == 400 and data["error"] == "'texts' must be a list"
        status, data = post(srv, "/v1/toy", {"texts": ["one"], "subtitel": "hi"})  # its declaration, checked
        assert status == 400 and data["error"] == "unknown fields ['subtitel']; expected 'texts', 'subtitle'"
        status, data = post(srv, "/nowhere", {})
        assert status == 404 and "/v1/toy" in data["error"]  # the 404 hint lists it
        status, data = post(srv, "/v1/rewards", {"descriptions": ["one two"]})  # the built-in routes still serve
        assert status == 200 and data["rewards"] == [0.2]
    assert "POST /v1/toy" in routes.endpoints()  # the start-up banners' endpoint list


def test_a_route_that_does_not_declare_its_fields_is_not_registered():
    class Undeclared(Toy):
        path, name, body_fields = "/v1/undeclared", "undeclared", ()

    with pytest.raises(ValueError, match="exactly one with role 'items'"):
        routes.register(Undeclared)
    assert "/v1/undeclared" not in routes.ROUTES


def test_a_route_defined_in_one_file_is_served_in_process_and_has_its_serve_option(toy, tmp_path, monkeypatch):
    import emoreward.export.serve.local
    from emoreward.cli.serve import add_arguments
    from emoreward.export.serve.local import score_request, shared_batcher

    monkeypatch.setattr(emoreward.export.serve.local, "open_reward_model", lambda path, engine, **kw: Words())
    (tmp_path / "weights.bin").write_bytes(b"toy")
    batcher = shared_batcher(tmp_path, toy_suffix=" x")
    assert score_request("toy", {"texts": ["one two"]}, batcher) == {"values": [0.3]}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "m", "--toy-suffix", "!"])
    assert args.toy_suffix == "!" and "--toy-suffix" in parser.format_help()
    with pytest.raises(TypeError, match="unknown route options"):
        RewardService(Words(), toy_sufix="!")
