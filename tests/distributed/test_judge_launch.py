"""A judge recipe under `accelerate launch`: two DDP CPU processes (gloo) train a tiny chat-model judge (a 2-layer
Llama on a ChatML byte-level BPE tokenizer, `tests/test_trained_judge.py`'s) through `scripts/train_reward.py`, the
README's launch line, with 2-fold cross-validation; only rank 0 prints and writes, and the saved judge equals the
judge of a one-process run with the same effective batch (all 16 training rows of a fold in one optimizer step,
so both runs take the same steps on the same rows whatever their order).

Tolerance: the two runs differ only in float rounding (gradients all-reduced over two half batches, other padding
widths), so after 3 Adam steps at lr 1e-2 every merged weight agrees within 1e-4 and the judge's verdict
probabilities on the training pairs (both orders) within 1e-4 (bf16 off: float32 throughout). Marked `deepspeed`
(CI's distributed stage, `make test-distributed`) and `slow`, as the other launches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_trained_judge import build_chat_model, gold_probability, recipe, write_pairs


ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4


def train(judge_recipe: Path, out: Path, processes: int, batch: int) -> tuple[dict, str]:
    script = ["scripts/train_reward.py", "--config", str(judge_recipe), "--output-dir", str(out)]
    script += ["--set", f"per_device_train_batch_size={batch}"]
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
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{processes}-process judge training did not finish in 600 s (ranks waiting on each other?)")
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return json.loads((out / "report.json").read_text()), stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_judge_recipe_two_processes_match_one(tmp_path):
    from safetensors.torch import load_file

    from emoreward.data import load_pairs

    base = build_chat_model(tmp_path / "base")
    data = write_pairs(tmp_path)  # 16 pairs: 8 per fold, 16 training rows (both orders) per fold
    judge_recipe = recipe(
        tmp_path, base, cv_folds=2, max_steps=3, learning_rate=1e-2, bf16=False, train_file=str(data)
    )
    two, stdout = train(judge_recipe, tmp_path / "ddp", processes=2, batch=8)
    one, _ = train(judge_recipe, tmp_path / "single", processes=1, batch=16)
    assert stdout.count("emoreward train: judge") == 1  # rank 1 is silent
    assert two["distributed"]["world_size"] == 2 and one["distributed"]["world_size"] == 1
    for report in (two, one):
        assert [e["step"] for e in report["final"]["train_log"] if "loss" in e] == [1, 2, 3]
        assert report["folds_trained"] == 2
    # the run identity records the process count: a 1-process run does not resume the 2-process one's folder
    identity = json.loads((tmp_path / "ddp" / "run_identity.json").read_text())
    assert identity["execution"] == {"world_size": 2}
    cmd = [sys.executable, "scripts/train_reward.py", "--config", str(judge_recipe)]
    cmd += ["--output-dir", str(tmp_path / "ddp"), "--set", "per_device_train_batch_size=8"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "execution parameter world_size (2 -> 1)" in again.stderr, again.stderr[-2000:]

    a = load_file(tmp_path / "ddp" / "model" / "model.safetensors")
    b = load_file(tmp_path / "single" / "model" / "model.safetensors")
    base_weights = load_file(base / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key].numpy(), b[key].numpy(), atol=TOLERANCE, rtol=0, err_msg=key)
    changed = [k for k in a if k in base_weights and not np.allclose(a[k].numpy(), base_weights[k].numpy())]
    assert changed  # trained: the merged LoRA moved the weights
    pairs = load_pairs(data)
    p_two, invalid_two = gold_probability(tmp_path / "ddp" / "model", pairs)
    p_one, invalid_one = gold_probability(tmp_path / "single" / "model", pairs)
    assert invalid_two == invalid_one == 0
    assert abs(p_two - p_one) <= TOLERANCE, (p_two, p_one)
    # the held-out folds were judged alike (the same judges, the same pairs)
    for f2, f1 in zip(two["cross_validation"]["folds"], one["cross_validation"]["folds"]):
        assert f2["judge"]["three_class"]["confusion"] == f1["judge"]["three_class"]["confusion"]
