"""Atomic writes (`emoreward.utils.io`): the content lands whole, and the file gets the mode an ordinary write
gives (reports must be as readable as the plots beside them, not owner-only like a temporary file)."""

from __future__ import annotations

import os

from emoreward.utils.io import atomic_write_json, atomic_write_text, read_json_or_none


def test_atomic_writes_keep_the_ordinary_file_mode(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")  # what an ordinary write gives, under this process's umask
    report = atomic_write_json(tmp_path / "sub" / "report.json", {"a": 1})
    assert read_json_or_none(report) == {"a": 1}
    assert oct(report.stat().st_mode & 0o777) == oct(plain.stat().st_mode & 0o777) != oct(0o600)
    os.chmod(report, 0o640)  # an existing file keeps its mode when it is replaced
    atomic_write_text(report, "{}")
    assert report.read_text() == "{}" and oct(report.stat().st_mode & 0o777) == oct(0o640)
    assert [p.name for p in report.parent.iterdir()] == ["report.json"]  # no temporary file left


def test_saved_and_exported_weights_have_the_ordinary_file_mode(lora_dir, tmp_path, capsys):
    """A saved model's and an export's safetensors are as readable as the files beside them (safetensors writes
    owner-only through a temporary file; a vLLM server or Ray worker running as another user must read them)."""
    from emoreward.cli import main
    from emoreward.models import load_reward_model

    plain = tmp_path / "plain"
    plain.write_text("")
    ordinary = plain.stat().st_mode & 0o777
    saved = load_reward_model(lora_dir).save_pretrained(tmp_path / "saved")
    assert main(["export", "--model", str(lora_dir), "--output", str(tmp_path / "export")]) == 0
    capsys.readouterr()
    weights = [*saved.glob("*.safetensors"), *(tmp_path / "export").glob("*.safetensors")]
    assert len(weights) >= 2
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in weights} == {p.name: oct(ordinary) for p in weights}


def test_a_full_disk_while_saving_weights_is_one_line(lora_dir, tmp_path):
    """Writing weights past what the file system takes (here a file-size limit: the same I/O error as a full disk,
    raised by safetensors as its own error type) is one line and exit 2, never a traceback; nothing is left at the
    output."""
    import resource
    import signal
    import subprocess
    import sys
    from pathlib import Path

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "export"
    exe = Path(sys.executable).with_name("emoreward")
    done = subprocess.run(
        [str(exe), "export", "--model", str(lora_dir), "--output", str(out)],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"},  # no .pyc cut short by the limit
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    assert "emoreward export: error:" in done.stderr and not out.exists()
