"""The README and docs/ pages against the code: every `emoreward` command and option they show exists (read from the
real entry point's `--help`), every page they link exists, every script, benchmark, recipe and Makefile target they
name exists, and the README stays a short front page (the two set-up commands in its first screen, at most ~12 KB).
The dated logs in benchmarks/results/ link only what exists."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emoreward.cli.main import COMMANDS


ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# an option as the docs write it: lower case (upper-case words such as --FIELD are placeholders)
OPTION = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _command_lines(text: str) -> list[tuple[str, str]]:
    """`(command, rest of the line)` for every `emoreward COMMAND ...` (and `scripts/train_reward.py ...`, which is
    `train`) the text shows, in code blocks and inline code alike; continuation lines joined."""
    text = text.replace("\\\n", " ")
    found = []
    for match in re.finditer(rf"emoreward ({'|'.join(COMMANDS)})\b([^\n`]*)", text):
        found.append((match.group(1), match.group(2)))
    for match in re.finditer(r"scripts/train_reward\.py\b([^\n`]*)", text):
        found.append(("train", match.group(1)))
    return found


@functools.cache
def _help(command: str) -> str:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-m", "emoreward.cli", command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _options(command: str) -> set[str]:
    return {name.replace("-", "_") for name in OPTION.findall(_help(command))}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_option_the_docs_show_exists(page):
    unknown = []
    for command, rest in _command_lines(_text(page)):
        rest = rest.split("  # ")[0].split(" | ")[0]  # a trailing comment or pipe is not the command's
        for name in OPTION.findall(rest):
            if name.replace("-", "_") not in _options(command):
                unknown.append(f"emoreward {command} --{name}")
    assert not unknown, f"{page.name} shows options the commands do not have: {sorted(set(unknown))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_the_docs_name_exists(page):
    text = _text(page)
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # Markdown links to files of the repository
        if "://" not in target and not (page.parent / target).exists():
            missing.append(target)
    for path in re.findall(
        r"(?<![\w/.-])((?:scripts|benchmarks|recipes|configs|tests)/[\w./-]+\.(?:py|yaml|json|md))", text
    ):
        if "<" not in path and not (ROOT / path).exists():
            missing.append(path)
    makefile = _text(ROOT / "Makefile")
    for target in re.findall(r"`make ([a-z0-9-]+)", text):
        if not re.search(rf"(?m)^{re.escape(target)}:", makefile):
            missing.append(f"make {target}")
    assert not missing, f"{page.name} names what does not exist: {sorted(set(missing))}"


def test_the_benchmark_results_link_what_exists():
    """The dated logs in benchmarks/results/ keep the script paths of their day (history), but their links resolve."""
    missing = []
    for page in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _text(page)):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing


def test_the_readme_is_a_short_front_page():
    text = _text(ROOT / "README.md")
    assert len(text.encode()) <= 12 * 1024, f"README.md is {len(text.encode())} bytes (at most ~12 KB)"
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make main" in first_screen and "make test" in first_screen
    for heading in ("## Set up and run", "## Concepts", "## Commands"):
        assert heading in text
    linked = set(re.findall(r"\(docs/([\w-]+\.md)\)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    for command in COMMANDS:
        assert f"emoreward {command}" in text, command


def test_the_option_reader_sees_what_it_should():
    """The checks above can fail: an option no command has is caught, and a real one is not."""
    lines = _command_lines("`emoreward rank --judge X --no-such-option 3` and\n    emoreward evaluate \\\n  --model D")
    assert [(c, rest.split()) for c, rest in lines] == [
        ("rank", ["--judge", "X", "--no-such-option", "3"]),
        ("evaluate", ["--model", "D"]),
    ]
    assert "judge" in _options("rank") and "no_such_option" not in _options("rank")
