"""Helpers of the bad-input catalogue: run a command through the real entry point and check that it failed the way
bad input must fail (exit status 2, ONE line on stderr naming what is wrong, no traceback, no result on stdout)."""

from __future__ import annotations

import json
from pathlib import Path

from emoreward.cli import main


GOOD_PAIRS = "name,a1,a2,preference\nv1,She smiles and laughs: joyful.,Neutral.,a1\nv2,Calm.,He shouts: angry.,a2\n"
TABLE_ROWS = [
    {"sample": f"s{i}", "model": model, "description": f"{model} writes that sample {i} is {mood}"}
    for i, mood in enumerate(["calm", "tense", "joyful"])
    for model in ("A", "B", "C")
]


def write(path: Path, content: str | bytes) -> Path:
    """Write `content` (text as UTF-8, or bytes as given) to `path`, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """`emoreward ARGV` in this process: (exit status, stdout, stderr). argparse's usage errors exit through
    SystemExit; its status is returned like any other."""
    capsys.readouterr()  # drop what earlier steps of the test printed
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def fails(argv: list[str], capsys, *fragments: str) -> str:
    """Run a command that must refuse its input; return its one error line.

    Checks: exit status 2; stderr is exactly one line, `emoreward <command>: error: ...`, holding every fragment
    (file, row or line, field); no traceback; stdout is empty (`emoreward train` prints its first line only once
    its data and output folder are checked).
    """
    code, out, err = run(argv, capsys)
    command = str(argv[0])
    lines = err.splitlines()
    assert code == 2, f"exit status {code}, stderr: {err}"
    assert len(lines) == 1 and err.endswith("\n"), f"expected one line on stderr, got {len(lines)}: {err}"
    line = lines[0]
    assert line.startswith(f"emoreward {command}: error: "), line
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in: {line}"
    assert out == "", f"stdout is not empty: {out!r}"
    return line
