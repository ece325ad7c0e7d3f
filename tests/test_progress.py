"""What a person sees: `scripts/train_reward.py` on a terminal shows a tqdm bar per fit (named after the run) and
a few lines, not a dict per logging step, W&B's banner and sync hints, or transformers' load report of the new
value head; `--quiet` (and a non-terminal stdout, as in every other subprocess test) shows no bar."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from test_training_run import tiny_recipe


ROOT = Path(__file__).resolve().parents[1]


def run_on_a_terminal(argv: list[str], env: dict) -> tuple[int, str]:
    """Run a command with stdout and stderr on a pseudo-terminal; its exit status and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return process.wait(timeout=600), b"".join(chunks).decode("utf-8", "replace")


def test_progress_bar_on_a_terminal_and_quiet_libraries(tiny_llama_dir, tmp_path):
    # a causal LM: loading it as a sequence classifier adds a new value head `score` (transformers reports it
    # MISSING unless silenced)
    recipe = tiny_recipe(
        tmp_path,
        tiny_llama_dir,
        lora_target_modules=["q_proj", "v_proj"],
        cv_folds=2,
        logging_steps=1,
        report_to=["wandb"],
        run_name="tty-run",
    )
    recipe.write_text("\n".join(line for line in recipe.read_text().splitlines() if "disable_tqdm" not in line))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), HF_HUB_OFFLINE="1", WANDB_DIR=str(tmp_path / "wandb"))  # no W&B key: offline
    status, text = run_on_a_terminal(
        [sys.executable, "scripts/train_reward.py", "--config", str(recipe), "--learning_rate", "1e-3"], env
    )
    assert status == 0, text[-3000:]
    # one bar per fit, named after the run, that reached its total (2 folds: 12 pairs, 2 epochs of 2 steps)
    for name, steps in (("tty-run-fold0", 4), ("tty-run-fold1", 4), ("tty-run", 6)):
        assert re.search(rf"{name}: 100%\|[^\n]*\| {steps}/{steps} ", text), name
    assert "loss=" in text  # the latest loss in the bar's postfix
    assert "{'loss'" not in text and "MISSING" not in text and "Loading weights" not in text
    wandb_lines = [line for line in text.splitlines() if "wandb" in line.lower()]
    assert len(wandb_lines) == 1 and wandb_lines[0].startswith("W&B (offline): project emoreward, group tty-run-")
    lines = [line for line in re.split(r"[\r\n]+", text) if line.strip() and "%|" not in line]
    assert len(lines) < 60, lines  # header, one line per fold, the report and controlled-error tables, the files

    status, text = run_on_a_terminal(
        [
            sys.executable,
            "scripts/train_reward.py",
            "--config",
            str(recipe),
            "--quiet",
            "--no-wandb",
            "--cv_folds",
            "0",
            "--output-dir",  # another run (other cv_folds and learning rate): its own folder (run identity)
            str(tmp_path / "quiet-run"),
        ],
        {**env, "WANDB_MODE": "disabled"},
    )
    assert status == 0, text[-3000:]
    assert "%|" not in text and "it/s" not in text and "final model (all 24 pairs) saved" in text
