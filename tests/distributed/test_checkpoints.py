"""Checkpoints: an interrupted final fit resumes from its last checkpoint to the metrics of an uninterrupted run,
and with held-out pairs the best checkpoint by eval reward accuracy is kept and becomes the saved model."""

from __future__ import annotations

import json

import pytest
from _helpers import synthetic_pairs
from test_training_run import tiny_recipe, write_pairs_csv
from transformers import TrainerCallback

from emoreward.training import pipeline as run_module
from emoreward.training.config import load_config
from emoreward.training.pipeline import run_training


class Interrupted(Exception):
    pass


class InterruptAt(TrainerCallback):
    """Kills the run at the end of optimizer step `step` (a crash between two checkpoints)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Interrupted(f"killed at step {state.global_step}")


def recipe(tmp_path, model_dir, name, **extra):
    (tmp_path / name).mkdir()
    settings = {
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", synthetic_pairs(32))),
        "eval_file": str(write_pairs_csv(tmp_path / "eval.csv", synthetic_pairs(12, seed=5))),
        "cv_folds": 0,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 8,  # 4 steps per epoch, 8 in all
        "save_strategy": "steps",
        "save_steps": 3,
    }
    return tiny_recipe(tmp_path / name, model_dir, **{**settings, **extra})


def losses(report):
    return {e["step"]: e["loss"] for e in report["final"]["train_log"] if "loss" in e}


def test_interrupted_run_resumes_to_the_same_final_metrics(tiny_bert_dir, tmp_path, monkeypatch):
    """With the default recipe's `group_by_length` sampling, a run resumed from a step checkpoint mid-epoch trains
    on the same batches and ends with the same model, bit for bit."""
    sampling = {"train_sampling_strategy": "group_by_length", "per_device_train_batch_size": 4}  # 8 steps per epoch
    uninterrupted = run_training(load_config(recipe(tmp_path, tiny_bert_dir, "a", **sampling)), log=lambda *_: None)

    config = load_config(recipe(tmp_path, tiny_bert_dir, "b", **sampling))
    base = run_module.EmoRewardTrainer

    class KilledTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(InterruptAt(11))  # after checkpoint-9, mid-epoch 2

    monkeypatch.setattr(run_module, "EmoRewardTrainer", KilledTrainer)
    with pytest.raises(Interrupted):
        run_training(config, log=lambda *_: None)
    out = tmp_path / "b" / "out"
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == [f"checkpoint-{i}" for i in (3, 6, 9)]
    assert not (out / "model").exists() and not (out / "report.json").exists()

    steps_run = []

    class StepRecorder(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps_run.append(state.global_step)

    class ResumedTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(StepRecorder())

    monkeypatch.setattr(run_module, "EmoRewardTrainer", ResumedTrainer)
    resumed = run_training(load_config(tmp_path / "b" / "recipe.yaml"), log=lambda *_: None)
    # it resumed from checkpoint-9: only steps 10-16 were trained again (steps 10 and 11 of the killed run are lost)
    assert steps_run == list(range(10, 17))
    assert sorted(losses(resumed)) == sorted(losses(uninterrupted)) == list(range(1, 17))
    assert losses(resumed) == losses(uninterrupted)  # the same batches: the same losses, exactly
    ev_a = uninterrupted["eval_file"]["evaluation"]
    ev_b = resumed["eval_file"]["evaluation"]
    assert ev_b["pair_rewards"] == ev_a["pair_rewards"]
    assert ev_b["judge"]["three_class"]["acc"] == ev_a["judge"]["three_class"]["acc"]
    assert resumed["final"]["tie_threshold"] == uninterrupted["final"]["tie_threshold"]


def test_length_grouped_batches_depend_on_seed_and_epoch_only():
    import torch

    from emoreward.training.trainer import EpochSeededLengthGroupedSampler

    lengths = [5, 40, 7, 33, 12, 28, 9, 50, 21, 17, 3, 44, 26, 11, 38, 30]
    sampler = EpochSeededLengthGroupedSampler(4, lengths, seed=42)
    torch.manual_seed(0)
    first = {epoch: (sampler.set_epoch(epoch), list(sampler))[1] for epoch in (0, 1)}
    torch.manual_seed(123)  # another global RNG state, as in a resumed process
    again = EpochSeededLengthGroupedSampler(4, lengths, seed=42)
    again.set_epoch(1)
    assert list(again) == first[1] and first[0] != first[1]
    assert sorted(first[0]) == list(range(16))
    # the longest example opens the first batch (transformers' grouping: the OOM-prone batch first)
    assert first[0][0] == lengths.index(50) == first[1][0]


def test_best_checkpoint_by_eval_reward_accuracy_is_kept(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file

    path = recipe(
        tmp_path,
        tiny_bert_dir,
        "best",
        num_train_epochs=1,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",  # TRL's eval reward accuracy (eval_accuracy)
        save_total_limit=1,
    )
    report = run_training(load_config(path), log=lambda *_: None)
    evals = {e["step"]: e["eval_accuracy"] for e in report["final"]["train_log"] if "eval_accuracy" in e}
    assert sorted(evals) == [2, 4]
    out = tmp_path / "best" / "out"
    # the best checkpoint: the first evaluation that reached the highest eval reward accuracy
    best_step = min(step for step, acc in evals.items() if acc == max(evals.values()))
    best = out / "checkpoints" / f"checkpoint-{best_step}"
    state = json.loads((best / "trainer_state.json").read_text())
    assert state["best_metric"] == max(evals.values()) and state["best_model_checkpoint"] == str(best)
    # kept despite save_total_limit=1, and it is the model that was saved
    assert best.is_dir()
    saved = load_file(out / "model" / "adapter_model.safetensors")
    best_weights = load_file(f"{best}/adapter_model.safetensors")
    assert saved.keys() == best_weights.keys()
    for key in saved:
        assert saved[key].equal(best_weights[key]), key
