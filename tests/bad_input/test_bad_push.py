"""Side effects last: a Hub push that cannot succeed (offline, no token) is refused in one line before any work
(nothing scored, judged or exported), and a push that fails at the end (a Hub imitation on loopback answering
HTTP 500) leaves every local output (`--output`, `--dataset`) written. Through the real entry point: in process
under the suite's `HF_HUB_OFFLINE=1`, in a subprocess where the Hub must look reachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from bad_input_helpers import fails

from emoreward.cli.main import COMMANDS


REPO = Path(__file__).resolve().parents[2]


def test_rank_refuses_an_offline_push_before_scoring(rm_dir, good_table, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the suite's setting; huggingface_hub read it at import
    out = tmp_path / "rank.json"
    argv = ["rank", "--judge", rm_dir, "--data", good_table, "--cache-dir", tmp_path / "cache", "--output", out]
    fails([*argv, "--push-to-hub", "me/ranking"], capsys, "cannot push to the Hub dataset 'me/ranking': offline mode")
    assert not (tmp_path / "cache").exists() and not out.exists()  # nothing scored, nothing written


def test_judge_refuses_an_offline_push_before_any_call(judge_yaml, good_pairs, tmp_path, capsys):
    argv = ["judge", "--judge", judge_yaml, "--data", good_pairs, "--output", tmp_path / "out", "--no-progress"]
    fails([*argv, "--push-to-hub", "me/judgements"], capsys, "cannot push to the Hub dataset 'me/judgements'")
    assert not (tmp_path / "out").exists()


def test_export_refuses_an_offline_push_before_exporting(rm_dir, tmp_path, capsys):
    argv = ["export", "--model", rm_dir, "--output", tmp_path / "export", "--push-to-hub", "me/rm"]
    fails(argv, capsys, "cannot push to the Hub model 'me/rm': offline mode is on")
    assert not (tmp_path / "export").exists()


def _rank(rm_dir, table, tmp_path, env, *options, token=None):
    """`python -m emoreward.cli rank ...` in a fresh process (huggingface_hub reads its settings at import)."""
    command = [sys.executable, "-m", "emoreward.cli", "rank", "--judge", str(rm_dir), "--data", str(table),
               "--cache-dir", str(tmp_path / "cache"), "--n-boot", "5", "--quiet", *map(str, options)]  # fmt: skip
    env = {k: v for k, v in env.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env |= {"PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1"}
    env |= {"HF_TOKEN": token} if token else {}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_rank_without_a_token_is_refused_at_once(rm_dir, good_table, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # never reached
    out = tmp_path / "rank.json"
    run = _rank(rm_dir, good_table, tmp_path, env, "--output", out, "--push-to-hub", "me/ranking")
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.splitlines() == [
        "emoreward rank: error: cannot push to the Hub dataset 'me/ranking': no Hub token (set HF_TOKEN or run "
        "`hf auth login`)"
    ]
    assert run.stdout == "" and not out.exists() and not (tmp_path / "cache").exists()  # nothing scored


class FailingHub:
    """A Hub imitation on loopback that answers every request with HTTP 500 (an outage), counting requests."""

    def __init__(self):
        hub = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _fail(self):
                hub.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                body = b'{"error": "internal error"}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_HEAD = _fail

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_push_that_fails_at_the_end_leaves_the_outputs_written(rm_dir, good_table, tmp_path):
    hub = FailingHub()
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url}
    out, table = tmp_path / "rank.json", tmp_path / "ranking.jsonl"
    try:
        options = ["--output", out, "--dataset", table, "--push-to-hub", "me/r"]
        run = _rank(rm_dir, good_table, tmp_path, env, *options, token="hf_test_token")
    finally:
        hub.close()
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    [line] = run.stderr.splitlines()
    assert line.startswith("emoreward rank: error: cannot push to the Hub dataset 'me/r': ") and "500" in line
    assert hub.requests  # the push was tried, after the work
    report = json.loads(out.read_text())
    assert sorted(report["ranking"]) == ["A", "B", "C"] and out.with_suffix(".md").exists()
    rows = [json.loads(row) for row in table.read_text().splitlines()]
    assert sorted(r["model"] for r in rows) == ["A", "B", "C"]
    assert f"report: {out}" in run.stdout and f"ranking dataset: {table}" in run.stdout
    assert "hf_test_token" not in run.stdout + run.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help(command, capsys):
    from emoreward.cli import main

    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0 and f"usage: emoreward {command}" in capsys.readouterr().out
