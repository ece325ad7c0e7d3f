"""Relation: numeric health. A NaN or an infinity in a loss, a weight or a reward stops the command with one clear
line (exit 2), or is reported as undefined: it is never saved, served, scored or averaged.

Owners: `emoreward.models.base.check_finite_weights` (every loader: `TextRewardModel.from_pretrained`,
`MediaRewardModel.from_pretrained`; the trainer's checkpoints and the fit's last weights) and
`EmoRewardTrainer.compute_loss` (a non-finite training loss; transformers filters it out of its log,
`logging_nan_inf_filter`, so a diverged run would otherwise end with exit 0).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import synthetic_pairs
from _identity_inputs import change_weights, model_copy, table_rows, write_table
from test_training_run import tiny_recipe, write_pairs_csv

from emoreward.cli.main import main


COVERS: dict[str, tuple[str, ...]] = {
    "train": ("*",),
    "evaluate": ("--model",),
    "rank": ("--judge",),
    "export": ("--model",),
    "serve": ("--model",),
    "score": ("*",),
    "grpo": ("model",),
    "verl": ("*",),
}

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=[math.nan, math.inf], ids=["nan", "inf"])
def broken_model(request, lora_dir, tmp_path_factory):
    """A trained LoRA model folder with one adapter value set to NaN / infinity."""
    return change_weights(model_copy(lora_dir, tmp_path_factory.mktemp("broken") / "model"), request.param)


def _refused_line(err: str, model: Path) -> None:
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and "non-finite" in lines[0] and str(model) in lines[0], err
    assert "Traceback" not in err


def _cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_commands_refuse_a_model_with_non_finite_weights(broken_model, tmp_path, capsys):
    pairs = write_pairs_csv(tmp_path / "pairs.csv", synthetic_pairs(4))
    table = write_table(tmp_path / "table.jsonl", table_rows(3))
    commands = {
        "evaluate": ["evaluate", "--model", str(broken_model), "--data", str(pairs), "--output", str(tmp_path / "e.json")],
        "rank": ["rank", "--judge", str(broken_model), "--data", str(table), "--n-boot", "5",
                 "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "r.json")],
        "export": ["export", "--model", str(broken_model), "--output", str(tmp_path / "export")],
    }  # fmt: skip
    for name, argv in commands.items():
        rc, err = _cli(argv, capsys)
        assert rc == 2, (name, err)
        _refused_line(err, broken_model)
    # nothing was saved, scored into a cache, or exported
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "r.json").exists()
    assert not (tmp_path / "export").exists() and not list(tmp_path.glob(".export*"))
    assert not any(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_serve_refuses_a_model_with_non_finite_weights(broken_model):
    run = subprocess.run(
        [sys.executable, "-m", "emoreward.cli", "serve", "--model", str(broken_model), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "non-finite" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("route", ["score", "grpo", "verl"])
def test_python_routes_refuse_a_model_with_non_finite_weights(route, broken_model):
    from emoreward.export.grpo import EmotionReward
    from emoreward.export.verl import compute_score
    from emoreward.models import load_reward_model
    from emoreward.models.base import NonFiniteError

    routes = {
        "score": lambda: load_reward_model(broken_model).score(["calm"]),
        "grpo": lambda: EmotionReward(broken_model),
        "verl": lambda: compute_score(solution_str="calm and smiling", extra_info={}, model=str(broken_model)),
    }
    with pytest.raises(NonFiniteError, match="non-finite"):
        routes[route]()


@pytest.mark.parametrize(
    "how",
    ["learning_rate", "poisoned_backbone"],
)
def test_train_stops_on_a_non_finite_loss(how, tiny_bert_dir, tmp_path, capsys):
    """A diverging run (learning rate 1e38: weights overflow float32) or a backbone with a NaN weight stops with one line, exit 2, and leaves
    no final model, no finished fold and no report."""
    backbone = tiny_bert_dir
    extra = {"learning_rate": 1e38, "num_train_epochs": 4, "per_device_train_batch_size": 4}
    if how == "poisoned_backbone":
        backbone = change_weights(model_copy(tiny_bert_dir, tmp_path / "backbone"), math.nan)
        extra = {}
    recipe = tiny_recipe(tmp_path, backbone, save_strategy="steps", save_steps=1, **extra)
    rc, err = _cli(["train", "--config", str(recipe)], capsys)
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and ("the loss is nan" in lines[0] or "non-finite" in lines[0]), err
    out = tmp_path / "out"
    assert not (out / "model").exists() and not (out / "report.json").exists()
    assert not list(out.glob("cv/fold*/finished.json"))
    for state in out.rglob("trainer_state.json"):  # every step checkpoint kept to resume from is finite
        logged = [e["loss"] for e in json.loads(state.read_text())["log_history"] if "loss" in e]
        assert all(math.isfinite(v) for v in logged)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_grpo_refuses_a_non_finite_scale_before_loading(scale, tmp_path):
    """A NaN or infinite reward weight would make every GRPO reward NaN: refused before the model is read."""
    from emoreward.export.grpo import EmotionReward

    with pytest.raises(ValueError, match="scale must be a finite number"):
        EmotionReward(tmp_path / "no-model-here", scale=scale)
