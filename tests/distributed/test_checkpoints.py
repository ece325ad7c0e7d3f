"""Checkpoints: an interrupted final fit resumes from its last checkpoint to the metrics of an uninterrupted run,
and with held-out pairs the best checkpoint by eval reward accuracy is kept and becomes the saved model."""

from __future__ import annotations

import json

import numpy as np
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
    uninterrupted = run_training(load_config(recipe(tmp_path, tiny_bert_dir, "a")), log=lambda *_: None)

    config = load_config(recipe(tmp_path, tiny_bert_dir, "b"))
    base = run_module.EmoRewardTrainer

    class KilledTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(InterruptAt(5))  # after checkpoint-3, mid-epoch 2

    monkeypatch.setattr(run_module, "EmoRewardTrainer", KilledTrainer)
    with pytest.raises(Interrupted):
        run_training(config, log=lambda *_: None)
    out = tmp_path / "b" / "out"
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-3"]
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
    # it resumed from checkpoint-3: only steps 4-8 were trained again (steps 4 and 5 of the killed run are lost)
    assert steps_run == [4, 5, 6, 7, 8]
    assert sorted(losses(resumed)) == sorted(losses(uninterrupted)) == list(range(1, 9))
    full = losses(uninterrupted)
    for step, loss in losses(resumed).items():
        assert loss == pytest.approx(full[step], abs=1e-5), step
    ev_a = uninterrupted["eval_file"]["evaluation"]
    ev_b = resumed["eval_file"]["evaluation"]
    np.testing.assert_allclose(ev_b["pair_rewards"]["reward_1"], ev_a["pair_rewards"]["reward_1"], atol=1e-5)
    np.testing.assert_allclose(ev_b["pair_rewards"]["reward_2"], ev_a["pair_rewards"]["reward_2"], atol=1e-5)
    assert ev_b["judge"]["three_class"]["acc"] == ev_a["judge"]["three_class"]["acc"]
    assert resumed["final"]["tie_threshold"] == pytest.approx(uninterrupted["final"]["tie_threshold"], abs=1e-5)


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
