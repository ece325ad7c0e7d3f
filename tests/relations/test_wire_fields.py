"""Relation: wire fields. A reward route takes exactly the request fields it declares, under every server setting: an
unknown or misspelt field, a field that a setting reads but the request lacks, and a per-item list of another length
are a 400 naming the field, never a reward computed without it; every reply (and every RL framework's record) has
the same keys for 0, 1 and n items, with null or empty values where a figure is undefined.

Owners: `emoreward.export.serve.fields.RequestFields.body` (checks a body against the route's ``body_fields``, run
by `RewardService.parse` on every engine and by OpenRLHF's reward file) and `fields.check_body_fields` (a route is
registered only with a whole declaration); `emoreward.export.length_monitor.per_sample` / `sample_record` (the fixed
per-sample log keys, `SAMPLE_KEYS`).
"""

from __future__ import annotations

import itertools
import json
import urllib.request

import pytest
from _helpers import assert_same_rewards, post_json

from emoreward.export.length_monitor import SAMPLE_KEYS
from emoreward.export.serve import routes
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.service import RewardService
from emoreward.models import load_reward_model


COVERS: dict[str, tuple[str, ...]] = {
    "serve": ("*", "--openrlhf-labels"),
    "openrlhf_http": ("*",),
    "openrlhf_reward_func": ("*", "labels"),
    "verl": ("*",),
}

# one valid item of each field a route declares, by field name (a new route's fields add theirs): fine under every
# setting of a text model (an empty label names no clip and no subtitle)
EXAMPLES = {
    "descriptions": "She smiles broadly.",
    "media": {"subtitle": "I got the job!"},
    "query": "She smiles broadly.<|im_end|>",
    "prompts": "",
    "labels": "",
}
SUBTITLE = "I got the job!"
DESCRIPTION = "She smiles broadly."


@pytest.fixture(scope="module")
def model(rm_dir):
    return load_reward_model(rm_dir)


def setting_values(route: type[routes.Route]) -> list[dict]:
    """Every combination of the route's options that take a fixed set of values (`RouteOption.choices`) that a text
    model takes (its ``media_only`` choices are refused where the service is built: tests/bad_input/test_bad_serve.py)."""
    options = [o for o in route.options if o.choices is not None]
    takes = [[c for c in o.choices if c not in o.media_only] for o in options]
    return [dict(zip([o.name for o in options], values)) for values in itertools.product(*takes)]


def body_of(route: type[routes.Route], n: int) -> dict:
    """A body with every declared field: ``n`` items of each per-item field."""
    return {f.name: EXAMPLES[f.name] if f.role == "whole" else [EXAMPLES[f.name]] * n for f in route.body_fields}


def misspelt(name: str) -> str:
    return name[0] + name[2] + name[1] + name[3:]


def required(field: routes.BodyField, settings: dict) -> bool:
    return field.required or (
        field.required_when is not None and settings[field.required_when[0]] in field.required_when[1]
    )


def test_every_declared_field_has_an_example():
    declared = {f.name for route in routes.ROUTES.values() for f in route.body_fields}
    assert declared <= set(EXAMPLES), f"add example items of {sorted(declared - set(EXAMPLES))} to EXAMPLES"


@pytest.mark.parametrize("path", list(routes.ROUTES))
def test_a_route_takes_exactly_its_declared_fields_under_every_setting(path, model):
    route = routes.ROUTES[path]
    for settings in setting_values(route):
        with RewardServer(RewardService(model, **settings), port=0) as srv:

            def post(body):
                return post_json(srv.host, srv.port, path, body)

            where = (path, settings)
            status, data = post(body_of(route, 2))
            assert status == 200, (where, data)
            for field in route.body_fields:
                body = body_of(route, 2)
                body[misspelt(field.name)] = body.pop(field.name)  # c02's 'lables'
                status, data = post(body)
                assert status == 400 and data["error"].startswith(f"unknown fields ['{misspelt(field.name)}']"), where
                body.pop(misspelt(field.name))
                status, data = post(body)
                if required(field, settings):  # absent where the server reads it: refused, never scored without it
                    assert status == 400 and data["error"].startswith(f"missing field '{field.name}'"), (where, data)
                else:
                    assert status == 200, (where, field.name, data)
                if field.role.startswith("per_item"):  # a count that does not match: refused whatever the setting
                    body = {**body_of(route, 2), field.name: [EXAMPLES[field.name]] * 3}
                    status, data = post(body)
                    assert status == 400 and f"'{field.name}' has 3 items for 2 " in data["error"], (where, data)


def test_a_label_the_server_reads_changes_the_reward_and_is_never_dropped(model, rm_dir, monkeypatch):
    """The same number on both OpenRLHF routes: under ``subtitle`` the label is the subtitle (the reward of
    /v1/rewards with that subtitle, unlike the reward without one); a request without it is refused, on the server
    and in OpenRLHF's reward file. Under ``ignore`` the label is not read, and its count is still checked."""
    from emoreward.export.serve import reward_func

    with_subtitle, without = (float(r) for r in model.score([DESCRIPTION] * 2, [SUBTITLE, None]))
    assert abs(with_subtitle - without) > 1e-4  # the subtitle matters to this model: a dropped one would show
    query = {"query": [DESCRIPTION + "<|im_end|>"], "prompts": [""]}
    media = {"descriptions": [DESCRIPTION], "media": {"subtitle": SUBTITLE}}
    with RewardServer(RewardService(model, openrlhf_labels="subtitle"), port=0) as srv:
        status, data = post_json(srv.host, srv.port, "/get_reward", {**query, "labels": [SUBTITLE]})
        assert status == 200
        assert_same_rewards(data["rewards"], [with_subtitle])  # a batch of 1 against one of 2: the one rule
        assert post_json(srv.host, srv.port, "/v1/rewards", media)[1]["rewards"] == data["rewards"]
        for body, named in ((query, "'labels'"), ({**query, "lables": [SUBTITLE]}, "'lables'"),
                            ({**query, "labels": None}, "'labels'")):  # fmt: skip
            status, data = post_json(srv.host, srv.port, "/get_reward", body)
            assert status == 400 and named in data["error"], body
    with RewardServer(RewardService(model), port=0) as srv:  # --openrlhf-labels ignore
        status, data = post_json(srv.host, srv.port, "/get_reward", {**query, "labels": [SUBTITLE]})
        assert status == 200
        assert_same_rewards(data["rewards"], [without])
        status, data = post_json(srv.host, srv.port, "/get_reward", {**query, "labels": [SUBTITLE, "x"]})
        assert status == 400 and data["error"] == "'labels' has 2 items for 1 queries"
    # OpenRLHF's reward file: a fork that passes no labels (None) is refused as the server refuses it
    monkeypatch.setenv(reward_func.ENV_MODEL, str(rm_dir))
    monkeypatch.setenv(reward_func.ENV_LABELS, "subtitle")
    got = reward_func.reward_func(query["query"], [""], [SUBTITLE])
    assert_same_rewards(got["rewards"].tolist(), [with_subtitle])
    with pytest.raises(ValueError, match="missing field 'labels': EMOREWARD_RM_LABELS=subtitle reads it") as refused:
        reward_func.reward_func(query["query"], [""], None)
    assert "--openrlhf-labels" not in str(refused.value)  # the reward file's setting, not the server's option


def get_json(srv: RewardServer, path: str) -> dict:
    with urllib.request.urlopen(f"http://{srv.host}:{srv.port}{path}", timeout=60) as reply:
        return json.loads(reply.read())


def shape(reply, n: int):
    """The keys of a reply, nested; every list is checked to hold ``n`` items (one per item of the request)."""
    if isinstance(reply, dict):
        return {key: shape(value, n) for key, value in reply.items()}
    if isinstance(reply, list):
        assert len(reply) == n, (len(reply), n)
        return "list"
    return type(reply).__name__


@pytest.mark.parametrize("path", list(routes.ROUTES))
def test_every_reply_has_the_same_keys_for_0_1_and_n_items(path, model):
    """OpenRLHF concatenates ``extra_logs`` key by key over the shares of several servers (an empty share
    included): a key missing from one reply breaks the column. A route that takes no empty request says so with a
    400 naming its items field."""
    route = routes.ROUTES[path]
    items = next(f for f in route.body_fields if f.role == "items")
    shapes = {}
    with RewardServer(RewardService(model), port=0) as srv:
        health = get_json(srv, "/health")["length_monitor"]  # the monitor's record before any reward, and after
        assert set(health) == {"window", "threshold", "warnings", *SAMPLE_KEYS}
        for n in (1, 3, 0):
            status, data = post_json(srv.host, srv.port, path, body_of(route, n))
            if n == 0 and not items.allow_empty:
                assert status == 400 and data["error"] == f"'{items.name}' is empty"
                continue
            assert status == 200, data
            shapes[n] = shape(data, n)
        assert set(get_json(srv, "/health")["length_monitor"]) == set(health)
    assert all(s == shapes[1] for s in shapes.values()), shapes
    if path == "/get_reward":
        assert set(SAMPLE_KEYS) <= set(shapes[0]["extra_logs"])  # the length monitor's figures, an empty share too


def test_the_reward_file_and_verl_give_every_sample_the_same_keys(rm_dir, monkeypatch):
    """OpenRLHF's reward file (its ``extra_logs``, tensors of the call's length) and verl's functions (one dict per
    response: verl builds its ``reward_extra_info`` columns from the first), for 0, 1 and n items."""
    from emoreward.export import verl
    from emoreward.export.serve import reward_func

    monkeypatch.setenv(reward_func.ENV_MODEL, str(rm_dir))
    logs = {}
    for n in (0, 1, 3):
        out = reward_func.reward_func([DESCRIPTION] * n, [""] * n, [""] * n)
        assert all(len(v) == n for v in out["extra_logs"].values())
        logs[n] = set(out["extra_logs"])
    assert logs[0] == logs[1] == logs[3] and set(SAMPLE_KEYS) <= logs[0]
    records = verl.compute_score_batch(solution_strs=[DESCRIPTION] * 3, extra_infos=[{}] * 3, model=str(rm_dir))
    one = verl.compute_score("emotion", DESCRIPTION, "", {}, model=str(rm_dir))
    assert verl.compute_score_batch(solution_strs=[], model=str(rm_dir)) == []
    assert all(set(r) == set(one) for r in records) and set(SAMPLE_KEYS) <= set(one)
