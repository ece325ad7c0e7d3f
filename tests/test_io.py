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
