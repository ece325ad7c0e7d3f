"""The multimodal worked example of docs/multimodal.md, as written: its code block is read from the page and run line by line
through the real `emoreward` entry point (train, evaluate, rank, export; `serve` is started, asked for one reward
with `media.video` and stopped with SIGTERM). The rewards agree across the routes."""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest


pytest.importorskip("av", reason="the example makes video files with PyAV (media extra)")

ROOT = Path(__file__).resolve().parents[2]


def example_lines() -> list[str]:
    """The commands of the docs/multimodal.md block that follows "Worked example", continuation lines joined."""
    text = (ROOT / "docs" / "multimodal.md").read_text(encoding="utf-8")
    block = re.search(r"^Worked example.*?```bash\n(.*?)```", text, re.S | re.M)
    assert block, "docs/multimodal.md has no worked example block"
    joined = block.group(1).replace("\\\n", " ")
    lines, current = [], ""
    for line in joined.splitlines():  # a quoted python -c program spans lines
        current = f"{current}\n{line}" if current else line
        if current.count('"') % 2 == 0:
            lines.append(current.split("  # ")[0].strip() if not current.startswith("PYTHONPATH") else current)
            current = ""
    return lines


def run_line(line: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    if argv[0].startswith("PYTHONPATH="):  # the input-making line: the repository's test helpers
        env = {**env, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in argv[0].split("=", 1)[1].split(":"))}
        argv = [sys.executable, *argv[2:]]
    else:
        assert argv[0] == "emoreward", line
        argv = [sys.executable, "-m", "emoreward.cli", *argv[1:]]
    argv = [str(ROOT / a) if a.startswith("tests/") else a for a in argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_the_docs_worked_example_runs_as_written(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    lines = example_lines()
    assert [shlex.split(x)[1] for x in lines[1:]] == ["train", "evaluate", "rank", "serve", "export"]
    serve = None
    for line in lines:
        if " serve " in f" {line} ":
            serve = line
            continue
        done = run_line(line + (" --output rank.json" if " rank " in line else ""), tmp_path, env)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"

    ranking = json.loads((tmp_path / "rank.json").read_text())
    assert "cheerful-writer" in json.dumps(ranking) and "gloomy-writer" in json.dumps(ranking)

    from emoreward.models import RewardContext, load_reward_model
    from emoreward.models.precision import reward_tolerance

    media = tmp_path / "media"
    model = load_reward_model(tmp_path / "outputs" / "omni" / "model", media_root=str(media))
    expected = float(model.score(["She is joyful and smiling warmly."], RewardContext(video="video/c0.mp4"))[0])
    merged = load_reward_model(tmp_path / "outputs" / "omni-merged", media_root=str(media))
    merged_reward = float(merged.score(["She is joyful and smiling warmly."], RewardContext(video="video/c0.mp4"))[0])
    # both loaded by "auto" (the same precision); bf16 rounds merged weights and live LoRA differently
    assert merged.dtype == model.dtype
    assert merged_reward == pytest.approx(expected, abs=reward_tolerance(model.dtype, magnitude=abs(expected)))

    argv = [sys.executable, "-m", "emoreward.cli", *shlex.split(serve.split("  # ")[0])[1:], "--port", "0"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "http://127.0.0.1:" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited before serving"
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"descriptions": ["She is joyful and smiling warmly."], "media": {"video": "video/c0.mp4"}}
        conn.request("POST", "/v1/rewards", json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = json.loads(reply.read())
        assert reply.status == 200, data
        assert data["rewards"][0] == pytest.approx(expected, abs=1e-5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
