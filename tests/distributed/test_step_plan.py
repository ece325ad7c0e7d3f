"""The step plan under `accelerate launch`: two DDP CPU processes (gloo) on batches whose length mixes differ
between the processes (one rank's batch all short, the other's short and long, so each alone would pick a
different number of length-group forward passes) train, and the saved model matches a one-process run with the
same effective batch (8 pairs per optimizer step, the same pairs in the same steps: `train_sampling_strategy:
sequential`).

Tolerance: the two runs differ only in float rounding (gradients all-reduced over two half batches instead of one
batch, other padding widths per forward pass), so after 3 Adam steps at lr 1e-2 every saved adapter and value-head
tensor agrees within 1e-4 and the rewards of the reloaded models (fp32) within 1e-4. Marked `deepspeed` (CI's
distributed stage, `make test-distributed`) and `slow`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_training_run import write_pairs_csv


ROOT = Path(__file__).resolve().parents[2]
CPU_RECIPE = ROOT / "recipes" / "minilm" / "rm" / "config_cpu.yaml"
TOLERANCE = 1e-4


def mixed_length_pairs(n: int = 24):
    """Pairs in blocks of 4 (one process's batch): short/short, short/long, long/long mixes in turn."""
    from emoreward.data import PreferencePair

    rng = random.Random(3)
    words = ["calm", "joyful", "tense", "tearful", "smiling", "angry", "quiet", "warm"]

    def text(i: int, long: bool, good: bool) -> str:
        body = " ".join(rng.choice(words) for _ in range(70 if long else 3))
        return f"Clip {i}: the speaker is {'happy' if good else 'sad'} {body}."

    mixes = [(False, False), (False, True), (True, True), (True, False)]
    pairs = []
    for i in range(n):
        long_1, long_2 = mixes[(i // 4) % len(mixes)] if (i // 4) % 2 == 0 else mixes[(i + i // 4) % len(mixes)]
        label = "1" if rng.random() < 0.5 else "2"
        pairs.append(PreferencePair(f"s{i}", text(i, long_1, label == "1"), text(i, long_2, label == "2"), label))
    return pairs


def train(model_dir: Path, tmp_path: Path, name: str, processes: int, batch: int) -> Path:
    out = tmp_path / name
    overrides = {
        "model_name_or_path": str(model_dir),
        "lora_target_modules": "[query, value]",
        "lora_r": 4,
        "lora_alpha": 8,
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", mixed_length_pairs())),
        "max_length": 128,
        "truncation": "truncate",
        "max_steps": 3,
        "per_device_train_batch_size": batch,
        "train_sampling_strategy": "sequential",
        "learning_rate": 1e-2,
        "save_steps": 100,
        "calibrate_tie_threshold": "false",
    }
    script = ["scripts/train_reward.py", "--config", str(CPU_RECIPE), "--output-dir", str(out)]
    for key, value in overrides.items():
        script += ["--set", f"{key}={value}"]
    if processes > 1:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            "recipes/accelerate_configs/ddp.yaml",
        ]
        cmd += ["--num_processes", str(processes), "--main_process_port", "0", *script]
    else:
        cmd = [sys.executable, *script]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    # a hang (ranks waiting on different collectives; before the step plan this launch hung at step 1) fails
    # here instead of blocking CI, and the whole process group (launcher and ranks) is killed
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{processes}-process training did not finish in 300 s (ranks waiting on each other?)")
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return out / "model"


def test_group_counts_differ_between_the_ranks_batches():
    """The data really gives the two ranks different local choices (else the launch below tests nothing)."""
    from _helpers import minilm_dir
    from transformers import AutoTokenizer

    from emoreward.training.step_plan import split_by_length

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    pairs = mixed_length_pairs()
    counts = set()
    for start in range(0, 24, 4):
        texts = [d for p in pairs[start : start + 4] for d in (p.description_1, p.description_2)]
        counts.add(len(split_by_length([min(128, len(tokenizer(t)["input_ids"])) for t in texts], 3)))
    assert len(counts) > 1


@pytest.mark.slow
@pytest.mark.deepspeed
def test_ddp_mixed_lengths_matches_one_process(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file

    from emoreward.models import TextRewardModel

    two = train(tiny_bert_dir, tmp_path, "ddp", processes=2, batch=4)
    one = train(tiny_bert_dir, tmp_path, "single", processes=1, batch=8)
    a, b = load_file(two / "adapter_model.safetensors"), load_file(one / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key].numpy(), b[key].numpy(), atol=TOLERANCE, rtol=0, err_msg=key)
    lora_b = [t for k, t in a.items() if "lora_B" in k]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # trained: LoRA B starts at zero
    texts = [d for p in mixed_length_pairs()[:8] for d in (p.description_1, p.description_2)]
    r2 = TextRewardModel.from_pretrained(two, dtype="float32").score(texts)
    r1 = TextRewardModel.from_pretrained(one, dtype="float32").score(texts)
    np.testing.assert_allclose(r2, r1, atol=TOLERANCE, rtol=0)
