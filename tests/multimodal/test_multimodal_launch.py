"""`accelerate launch` of the tiny multimodal recipe: two CPU processes over gloo (DDP), a tiny Qwen2.5-Omni
thinker hearing each video's own audio, a generated media set.

The launch line is the 7B READMEs' (`--config_file recipes/accelerate_configs/ddp.yaml ... scripts/train_reward.py
--config RECIPE`), with `--num_processes 2` and the tiny recipe. (`accelerate launch --cpu --num_processes 2` starts
ONE process: accelerate's simple launcher needs mpirun for several CPU processes; the DDP config goes through
torchrun and the recipe's `use_cpu: true` picks gloo.) About 30 s on 2 shared cores: marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import assert_same_rewards


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import TINY_RECIPE, write_media_set  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
N_PAIRS, BATCH, EPOCHS, PROCESSES = 8, 2, 2, 2


@pytest.mark.slow
def test_ddp_two_cpu_processes_train_save_once_and_reload(tiny_backbone_dir, tmp_path):
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from emoreward.data import load_pairs
    from emoreward.evaluation.judge import RewardModelJudge
    from emoreward.models import load_reward_model
    from emoreward.models.precision import model_precision

    pairs_file = write_media_set(tmp_path / "media", N_PAIRS)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate_configs/ddp.yaml"]
    cmd += ["--num_processes", str(PROCESSES), "--main_process_port", "0", "scripts/train_reward.py"]
    cmd += ["--config", str(TINY_RECIPE), "--output-dir", str(out)]
    overrides = {
        "model_name_or_path": tiny_backbone_dir("qwen2.5-omni-thinker"),
        "media_root": tmp_path / "media",
        "train_file": pairs_file,
        "eval_file": pairs_file,
        "num_train_epochs": EPOCHS,
        "per_device_train_batch_size": BATCH,
    }
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]

    # one copy of the report and one save, both by rank 0
    assert result.stdout.count("emoreward train: media backbone") == 1
    assert result.stdout.count(f"final model (all {N_PAIRS} pairs) saved to {out / 'model'}") == 1
    report = json.loads((out / "report.json").read_text())
    steps = [e["step"] for e in report["final"]["train_log"] if "loss" in e]
    # 8 pairs, 2 per process and step: 2 optimizer steps per epoch with 2 processes (4 with one)
    assert max(steps) == EPOCHS * N_PAIRS // (BATCH * PROCESSES)

    # the saved adapter and value head are whole and trained; the model reloads in this single process and gives
    # the rewards the training processes computed
    model_dir = out / "model"
    model = load_reward_model(model_dir, media_root=str(tmp_path / "media"))
    saved = load_file(model_dir / "adapter_model.safetensors")
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model.model).items()}
    assert {k: tuple(v.shape) for k, v in saved.items()} == expected
    lora_b = [t for k, t in saved.items() if "lora_B" in k]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # LoRA B starts at zero
    assert model.settings.use_audio_in_video and model.module.use_audio_in_video
    pairs = load_pairs(pairs_file, media_by_id=True)
    r1, r2 = RewardModelJudge(model).pair_rewards(pairs)
    reported = report["eval_file"]["evaluation"]["pair_rewards"]
    assert_same_rewards(r1, reported["reward_1"], model_precision(model))  # other batches than training's
    assert_same_rewards(r2, reported["reward_2"], model_precision(model))
    assert report["final"]["tie_threshold"] == model.settings.tie_threshold
