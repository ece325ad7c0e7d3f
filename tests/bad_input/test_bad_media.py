"""Bad media for a multimodal reward model (a tiny Qwen2.5-VL that reads video): a media root that does not exist,
a missing, empty or undecodable file, through `emoreward evaluate`, `emoreward rank` and the reward server. The
commands look every file up before scoring and name the data file, the row (or line) and the field; the server
answers 400 naming the request field and reads no file outside its media root."""

from __future__ import annotations

import http.client
import json

import pytest
from bad_input_helpers import fails, jsonl, run, write


def pairs_file(tmp_path, video: str | None, name: str = "pairs.jsonl"):
    row = {"sample_id": "s0", "description_1": "She smiles.", "description_2": "He frowns.", "label": "1"}
    if video is not None:
        row["video"] = video
    ok = {**row, "sample_id": "ok", "description_2": "He looks away.", "video": "video/s0.mp4"}  # not a repeat
    return write(tmp_path / name, jsonl([ok, row]))


EVALUATE = [
    # (id, video of row 2, fragments after "<pairs>, row 2, field 'video': sample 's0': <root>/")
    ("missing-file", "video/nope.mp4", ["video/nope.mp4: video file not found"]),
    ("empty-file", "video/empty.mp4", ["video/empty.mp4: video file is empty (0 bytes)"]),
    ("undecodable-file", "video/junk.mp4", ["video/junk.mp4: cannot decode video"]),
]


@pytest.mark.parametrize("video, fragments", [c[1:] for c in EVALUATE], ids=[c[0] for c in EVALUATE])
def test_evaluate_names_the_row_and_field_of_bad_media(vl_dir, media_root, tmp_path, capsys, video, fragments):
    data = pairs_file(tmp_path, video)
    argv = ["evaluate", "--model", vl_dir, "--data", data, "--media-root", media_root]
    fails(argv, capsys, f"{data}, row 2, field 'video': sample 's0': {media_root}/{fragments[0]}")


def test_evaluate_without_a_path_names_the_file_the_layout_expects(vl_dir, media_root, tmp_path, capsys):
    data = write(
        tmp_path / "p.jsonl", jsonl([{"sample_id": "zz", "description_1": "a", "description_2": "b", "label": "2"}])
    )
    argv = ["evaluate", "--model", vl_dir, "--data", data, "--media-root", media_root]
    fails(argv, capsys, f"{data}, row 1, field 'video': sample 'zz': {media_root}/video/zz.mp4: video file not found")


def test_evaluate_with_a_media_root_that_does_not_exist(vl_dir, tmp_path, capsys):
    data = pairs_file(tmp_path, "video/s0.mp4")
    argv = ["evaluate", "--model", vl_dir, "--data", data, "--media-root", tmp_path / "media"]
    fails(argv, capsys, f"--media-root {tmp_path / 'media'}: no such folder")


def test_evaluate_with_good_media_runs(vl_dir, media_root, tmp_path, capsys):
    data = pairs_file(tmp_path, "video/s0.mp4")
    code, out, err = run(["evaluate", "--model", vl_dir, "--data", data, "--media-root", media_root], capsys)
    assert code == 0 and "(2 pairs)" in out, err


def test_evaluate_with_a_media_model_whose_weights_were_cut_short(vl_dir, media_root, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(vl_dir, model)
    weights = sorted(model.glob("*.safetensors"))
    assert weights, f"no safetensors file in {vl_dir}"
    data = weights[0].read_bytes()
    weights[0].write_bytes(data[: len(data) - 16])
    argv = ["evaluate", "--model", model, "--data", pairs_file(tmp_path, "video/s0.mp4"), "--media-root", media_root]
    fails(argv, capsys, f"{weights[0]}: not a complete safetensors file")


@pytest.mark.parametrize(
    "video, problem",
    [("video/nope.mp4", "video file not found"), ("video/empty.mp4", "video file is empty (0 bytes)")],
    ids=["missing-file", "empty-file"],
)
def test_rank_names_the_line_and_field_of_bad_media(vl_dir, media_root, tmp_path, capsys, video, problem):
    rows = [{"sample": "s1", "model": m, "description": f"{m}: calm", "video": "video/s0.mp4"} for m in "AB"]
    rows += [{"sample": "s2", "model": m, "description": f"{m}: tense", "video": video} for m in "AB"]
    table = write(tmp_path / "table.jsonl", jsonl(rows))
    argv = ["rank", "--judge", vl_dir, "--data", table, "--media-root", media_root, "--no-cache", "--n-boot", "3"]
    fails(argv, capsys, f"{table}, line 3, field 'video': sample 's2': {media_root}/{video}: {problem}")


# ---------------------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def media_server(vl_dir, media_root):
    from emoreward.export.serve.http import RewardServer
    from emoreward.export.serve.service import RewardService
    from emoreward.models import load_reward_model

    service = RewardService(load_reward_model(vl_dir, media_root=str(media_root)), media_root=media_root)
    with RewardServer(service, port=0) as srv:
        yield srv
    assert service.stats.failures == 0


def post(server, payload):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    body = json.dumps(payload).encode()
    conn.request("POST", "/v1/rewards", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


SERVER = [
    # (id, media, fragments of the 400's error)
    ("absolute-path", {"video": "/etc/passwd"}, ["'media[0].video' must be a relative path inside the media root"]),
    ("dot-dot", {"video": "../outside/secret.mp4"}, ["'media[0].video' must be a relative path", "without '..'"]),
    ("symlink-out-of-the-root", {"video": "video/link.mp4"}, ["'media[0].video' leaves the media root (through a symlink)"]),
    ("nul-byte", {"video": "video/s0.mp4\x00.txt"}, ["'media[0].video' must be a relative path"]),
    ("missing-file", {"video": "video/nope.mp4"}, ["'media[0].video': no such file in the media root: video/nope.mp4"]),
    ("empty-file", {"video": "video/empty.mp4"}, ["'media[0].video' (video/empty.mp4): cannot read media: video file is empty"]),
    ("undecodable-file", {"video": "video/junk.mp4"}, ["'media[0].video' (video/junk.mp4): cannot read media: cannot decode"]),
    ("no-video", {"subtitle": "hi"}, ["'media[0].video' is required: this reward model reads video"]),
    ("video-a-number", {"video": 7}, ["'media[0].video' must be a string"]),
]  # fmt: skip


@pytest.mark.parametrize("media, fragments", [c[1:] for c in SERVER], ids=[c[0] for c in SERVER])
def test_the_server_refuses_bad_media_naming_the_field(media_server, media_root, media, fragments):
    status, reply = post(media_server, {"descriptions": ["She smiles."], "media": media})
    assert status == 400, reply
    for fragment in fragments:
        assert fragment in reply["error"]
    assert str(media_root) not in reply["error"]  # the server's own layout is not disclosed


def test_the_server_scores_good_media(media_server):
    status, reply = post(media_server, {"descriptions": ["She smiles."], "media": {"video": "video/s0.mp4"}})
    assert status == 200 and len(reply["rewards"]) == 1
