"""`emoreward serve`'s default model process (issue 23, item 4: the per-request overhead): the model loads and scores
in a process of its own and the server process reads its `ServedModelFacts` (no weights); the endpoints, rewards,
error replies, /health and the quiet shutdown are those of the one-process server (`RewardService(model)`)."""

import http.client
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from _helpers import post_json

from emoreward.data.media import MediaError
from emoreward.export.serve.worker import ModelProcess, _pack_error, _unpack_error


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory, tiny_bert_dir):
    from transformers import AutoTokenizer, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    model = TextRewardModel(
        BertForSequenceClassification.from_pretrained(tiny_bert_dir),
        AutoTokenizer.from_pretrained(tiny_bert_dir),
        TextSettings(backbone="tiny-bert", input_format="pair", max_length=64),
    )
    directory = tmp_path_factory.mktemp("mp") / "rm"
    model.save_pretrained(directory)
    return directory


def _serve(model_dir, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    env["EMOREWARD_DTYPE"] = "float32"  # rewards compared at 1e-6 whatever the machine's bf16 units
    code = "import sys; from emoreward.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "serve", "--model", str(model_dir), "--port", "0", *extra]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    line = ""
    while "http://127.0.0.1:" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read()[-2000:]}")
    return proc, int(line.split("http://127.0.0.1:")[1].split()[0])


def _post(port, path, payload):
    return post_json("127.0.0.1", port, path, payload)


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _without_rewards(reply: dict) -> dict:
    return {key: value for key, value in reply.items() if key not in ("rewards", "scores", "extra_logs")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the model process")
@pytest.mark.parametrize(("stop", "flag"), [(signal.SIGTERM, []), (signal.SIGINT, ["--model-process"])])
def test_model_process_serves_the_same_rewards_and_errors_and_stops_with_the_server(tiny_rm, monkeypatch, stop, flag):
    """The default server (and the explicit flag) answers what `RewardService(load_reward_model(p))` answers in one
    process: replies, errors and /health. The signal goes to the whole process group (Ctrl-C in a terminal; a
    service manager stopping every process of the service): the model process must outlive it until the server
    has finished, and stay quiet."""
    from emoreward.export.serve.protocol import RequestError
    from emoreward.export.serve.service import RewardService
    from emoreward.models import load_reward_model

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    descriptions = ["She smiles broadly.", "He frowns and looks away.", "   "]
    model = load_reward_model(tiny_rm)
    expected = model.score(descriptions, ["I got the job!"] * 3)  # the subtitle of docs/serving.md's curl example
    plain = model.score(descriptions[:1], [None])  # OpenRLHF's query alone (labels ignored)
    in_process = RewardService(model, name=str(tiny_rm))  # the one-process route, as a library user builds it
    proc, port = _serve(tiny_rm, *flag, "--threads", "1")
    try:
        children = _children(proc.pid)
        assert len(children) >= 1  # the model process (spawn may add its resource tracker)
        assert "libtorch" not in open(f"/proc/{proc.pid}/maps").read()  # no weights, not even torch, in the server
        body = {"descriptions": descriptions, "media": {"subtitle": "I got the job!"}}
        status, data = _post(port, "/v1/rewards", body)
        assert status == 200
        assert data["rewards"] == pytest.approx([float(r) for r in expected], abs=1e-6)
        assert data["empty"] == [False, False, True]
        assert _without_rewards(data) == _without_rewards(in_process.handle("rewards", body))
        # OpenRLHF's route and its empty share, through the same model process
        status, data = _post(port, "/get_reward", {"query": ["She smiles broadly."]})
        assert status == 200 and data["rewards"] == pytest.approx([float(plain[0])], abs=1e-6)
        assert _without_rewards(data) == _without_rewards(
            in_process.handle("openrlhf", {"query": ["She smiles broadly."]})
        )
        status, data = _post(port, "/get_reward", {"query": []})
        assert status == 200 and data["rewards"] == []
        # errors found before scoring are answered as in one process (the limits derived from the facts too)
        for bad in ({"descriptions": "not a list"}, {"descriptions": ["x" * (in_process.max_chars + 1)]}):
            status, data = _post(port, "/v1/rewards", bad)
            with pytest.raises(RequestError) as err:
                in_process.handle("rewards", bad)
            assert (status, data["error"]) == (err.value.status, err.value.message)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
        local = {**in_process.health(), "queue": 0}
        for key in ("stats", "length_monitor"):  # counters of different requests
            health.pop(key), local.pop(key)
        assert health == local
        os.killpg(proc.pid, stop)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "Traceback" not in err
    assert "Warning" not in err  # the model process keeps the server's quiet warning filters
    assert "served 3 requests (4 descriptions" in out and "2 bad requests" in out
    # the model process ended with the server (joined before it exits); spawn's resource tracker, a child too, ends
    # when its pipe from the server closes, a moment after the server: each gets a bounded wait
    deadline = time.monotonic() + 20
    for child in children:
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), open(f"/proc/{child}/cmdline").read().replace("\0", " ")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


def test_a_model_that_cannot_load_fails_the_start_with_the_loader_error(tiny_rm, tmp_path, capsys):
    """A directory with settings but no weights passes the server's own check and fails in the model process: the
    loader's error, one line, exit 2, before anything is served (and no model process is left)."""
    import shutil

    from emoreward.cli import main

    broken = tmp_path / "rm"
    shutil.copytree(tiny_rm, broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    assert main(["serve", "--model", str(broken), "--port", "0"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("emoreward serve: error: ") and "is missing" in err and err.count("\n") == 1, err
    assert "http://" not in out


def test_the_facts_built_in_the_model_process_equal_those_built_in_process(tiny_rm, monkeypatch):
    from emoreward.export.serve.facts import served_model_facts
    from emoreward.export.serve.service import RewardService
    from emoreward.models import load_reward_model

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")  # the child inherits the environment, so the same precision
    process = ModelProcess(tiny_rm, threads=1)
    try:
        facts = process.facts
    finally:
        process.close()
    assert facts == served_model_facts(load_reward_model(tiny_rm))
    assert (facts.kind, facts.max_length, facts.device, facts.modalities) == ("text", 64, "cpu", frozenset())
    assert (facts.sep_token, facts.pad_token) == ("[SEP]", "[PAD]") and facts.precision["dtype"] == "float32"
    assert pickle.loads(pickle.dumps(facts)) == facts
    with pytest.raises(ValueError, match="needs the scorer"):  # facts alone cannot score
        RewardService(facts)


def test_model_errors_come_back_with_their_class_and_fields():
    """`score_jobs` answers a `MediaError` 400 naming the request field from its ``sample_id`` / ``path``: it must
    cross the pipe whole (plain pickling of it fails: its __init__ takes other arguments than its message)."""
    err = MediaError("s1", "/root/video/s1.mp4", "no video stream", field="video")
    back = _unpack_error(pickle.loads(pickle.dumps(_pack_error(err))))
    assert type(back) is MediaError
    assert (back.sample_id, back.path, back.problem, back.field) == (
        "s1",
        "/root/video/s1.mp4",
        "no video stream",
        "video",
    )
    assert str(back) == str(err)
    plain = _unpack_error(pickle.loads(pickle.dumps(_pack_error(ValueError("context too long")))))
    assert type(plain) is ValueError and str(plain) == "context too long"


def test_model_process_is_refused_with_the_ray_engine(tiny_rm, capsys):
    from emoreward.cli import main

    assert main(["serve", "--model", str(tiny_rm), "--engine", "ray", "--port", "8123", "--model-process"]) == 2
    assert "--model-process is for --engine single" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the model process")
def test_a_dead_model_process_makes_health_fail_and_rewards_answer_500(tiny_rm):
    proc, port = _serve(tiny_rm, "--model-process", "--threads", "1")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"
        model_process = [c for c in _children(proc.pid) if "emoreward" in _cmdline(c) or "spawn_main" in _cmdline(c)]
        for child in model_process:
            if "resource_tracker" not in _cmdline(child):
                os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            health = json.loads(resp.read())
            if resp.status != 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert resp.status == 503 and health["status"] == "model process stopped"
        status, data = _post(port, "/v1/rewards", {"descriptions": ["She smiles."], "media": {"subtitle": None}})
        assert status == 500 and data["error"] == "scoring failed; see the server log"
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # a server that could not score is not a clean stop: exit 1 (a service manager sees it), the exit code named
    assert proc.returncode == 1
    text = out if isinstance(out, str) else out.decode()
    assert "error: the model process had stopped while serving (exit code -9)" in text


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except FileNotFoundError:
        return ""


def test_ctrl_c_outside_the_shutdown_says_interrupted_without_a_resume_hint(capsys):
    """A second Ctrl-C while the server stops reaches the CLI's guard: a server has nothing to resume, so its line
    is not the train / judge / rank one ("run the same command again to resume")."""
    from emoreward.cli.main import command_module, guarded
    from emoreward.cli.options import EXIT_INTERRUPTED, INTERRUPTED

    def interrupted() -> int:
        raise KeyboardInterrupt

    message = getattr(command_module("serve"), "INTERRUPTED", INTERRUPTED)
    assert guarded("emoreward serve", interrupted, message) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "emoreward serve: interrupted\n"
    assert getattr(command_module("train"), "INTERRUPTED", INTERRUPTED) == INTERRUPTED  # resumable commands
    assert guarded("emoreward train", interrupted) == EXIT_INTERRUPTED
    assert "run the same command again to resume" in capsys.readouterr().err
