"""kill -9 and resume: `scripts/train_reward.py` killed by SIGKILL during cross-validation and again during the
final fit, then rerun, ends with the report and model of a run that was never interrupted (same cross-validation
summary, same rewards), reusing the finished fold and resuming from the last complete checkpoint; a checkpoint cut
short while saving is skipped with a warning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _helpers import synthetic_pairs
from test_training_run import tiny_recipe, write_pairs_csv

from emoreward.training.config import load_config
from emoreward.training.pipeline import run_training


ROOT = Path(__file__).resolve().parents[1]


def start(recipe: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "scripts/train_reward.py", "--config", str(recipe)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def kill_when(process: subprocess.Popen, ready: Path, timeout: float = 600) -> None:
    """SIGKILL the training process as soon as `ready` exists (checked every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert process.poll() is None, f"the run ended (status {process.returncode}) before {ready} appeared"
        assert time.monotonic() < deadline, f"{ready} did not appear in {timeout} s"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL


def test_sigkill_during_folds_and_final_fit_then_resume(tiny_bert_dir, tmp_path):
    settings = {
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", synthetic_pairs(24))),
        "eval_file": str(write_pairs_csv(tmp_path / "eval.csv", synthetic_pairs(8, seed=5))),
        "cv_folds": 2,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 2,  # folds: 6 steps per epoch; final fit: 12
        "train_sampling_strategy": "group_by_length",  # the default recipe's sampler
        "save_strategy": "steps",
        "save_steps": 4,
    }
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    reference = run_training(load_config(tiny_recipe(tmp_path / "ref", tiny_bert_dir, **settings)), log=lambda *_: 0)
    recipe = tiny_recipe(tmp_path / "run", tiny_bert_dir, **settings)
    out, log = tmp_path / "run" / "out", tmp_path / "run" / "log.txt"

    # 1. killed during fold 2 (fold 1 finished)
    kill_when(start(recipe, log), out / "cv" / "fold0" / "finished.json")
    assert not (out / "cv" / "fold1" / "finished.json").exists() and not (out / "model").exists()
    # 2. killed during the final fit, after its checkpoint at step 8
    kill_when(start(recipe, log), out / "checkpoints" / "checkpoint-8" / "trainer_state.json")
    assert not (out / "model" / "finished.json").exists() and not (out / "report.json").exists()
    # what a kill while saving leaves: a newer checkpoint folder without its trainer state
    torn = out / "checkpoints" / "checkpoint-11"
    torn.mkdir()
    (torn / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    # 3. the same command again: reuses fold 1 and fold 2, resumes the final fit from checkpoint-8
    process = start(recipe, log)
    assert process.wait(timeout=900) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "fold 1/2: finished earlier" in text and "fold 2/2: finished earlier" in text
    assert f"checkpoint {torn} is incomplete (interrupted while saving): resuming from an earlier one" in text
    resumed = json.loads((out / "report.json").read_text())
    steps = [e["step"] for e in resumed["final"]["train_log"] if "loss" in e]
    assert steps == list(range(1, 25))
    assert resumed["cross_validation"]["summary"] == reference["cross_validation"]["summary"]
    ref_rewards = reference["eval_file"]["evaluation"]["pair_rewards"]
    assert resumed["eval_file"]["evaluation"]["pair_rewards"] == ref_rewards
    assert resumed["final"]["tie_threshold"] == reference["final"]["tie_threshold"]


def test_a_truncated_file_in_the_latest_checkpoint_falls_back_to_the_newest_good_one(tiny_bert_dir, tmp_path, capsys):
    """A kill while the trainer wrote a checkpoint's weights can leave its state complete and a weight file cut short:
    the resume skips it (counted and printed, naming the file) and resumes from the newest whole checkpoint, to the
    model an uninterrupted run trains, instead of failing on every resume."""
    from emoreward.cli.main import main

    settings = {"cv_folds": 1, "num_train_epochs": 1, "save_strategy": "steps", "save_steps": 1}
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, **settings)  # 24 pairs, batch 8: checkpoints at steps 1, 2, 3
    out = tmp_path / "out"
    assert main(["train", "--config", str(recipe)]) == 0
    reference = json.loads((out / "report.json").read_text())
    (out / "model" / "finished.json").unlink()  # killed after its last checkpoint, before the model was finished
    (weights,) = (out / "checkpoints" / "checkpoint-3").glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(["train", "--config", str(recipe)]) == 0
    text = capsys.readouterr().out
    assert (
        f"1 newer checkpoint(s) skipped, unusable: {out / 'checkpoints' / 'checkpoint-3'}: {weights.name} is "
        f"truncated ({len(data) // 2} of {len(data)} bytes)"
    ) in text, text
    assert f"resuming the same run from {out / 'checkpoints' / 'checkpoint-2'}" in text
    resumed = json.loads((out / "report.json").read_text())
    assert [e["step"] for e in resumed["final"]["train_log"] if "loss" in e] == [1, 2, 3]
    assert resumed["final"]["tie_threshold"] == reference["final"]["tie_threshold"]


def test_a_judge_recipe_killed_after_a_fold_resumes_there(tmp_path):
    """A judge recipe (`recipe: judge`) through the same entry point, SIGKILLed once its first fold is finished:
    the rerun reuses that fold, trains the other and the final judge, and ends with the cross-validation of a run
    that was never interrupted."""
    from test_trained_judge import build_chat_model, recipe, write_pairs

    from emoreward.training.config import resolve_config
    from emoreward.training.judge import run_judge_training
    from emoreward.training.judge_config import JudgeTrainConfig

    base = build_chat_model(tmp_path / "base")
    data = write_pairs(tmp_path)
    settings = {"cv_folds": 2, "max_steps": 3, "train_file": str(data)}
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    reference = run_judge_training(
        resolve_config(recipe(tmp_path / "ref", base, **settings), config_class=JudgeTrainConfig), log=lambda *_: 0
    )
    path = recipe(tmp_path / "run", base, **settings)
    out, log = tmp_path / "run" / "out", tmp_path / "run" / "log.txt"
    kill_when(start(path, log), out / "cv" / "fold0" / "finished.json")
    assert not (out / "cv" / "fold1" / "finished.json").exists() and not (out / "report.json").exists()
    process = start(path, log)
    assert process.wait(timeout=600) == 0, log.read_text()[-4000:]
    assert "fold 1/2: finished earlier" in log.read_text()
    report = json.loads((out / "report.json").read_text())
    assert (report["folds_trained"], report["folds_reused"]) == (1, 1)
    for got, want in zip(report["cross_validation"]["folds"], reference["cross_validation"]["folds"]):
        assert got["judge"] == want["judge"] and got["controlled_errors"] == want["controlled_errors"]
    assert (out / "model" / "finished.json").exists()
