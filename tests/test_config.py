"""Every recipe YAML parses with the real parser; unknown keys and bad values are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from emoreward.training.config import default_recipe_path, load_config, load_recipe


ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(ROOT.glob("recipes/**/*.yaml"))


def test_there_are_recipes():
    assert any("minilm" in str(p) for p in RECIPES) and any("smollm2" in str(p) for p in RECIPES)


@pytest.mark.parametrize(
    "path", [p for p in RECIPES if "accelerate_configs" not in str(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_recipe_parses(path):
    config = load_recipe(path)
    assert config.model_name_or_path and config.output_dir


def test_default_recipe_is_the_minilm_recipe():
    assert default_recipe_path().read_text() == (ROOT / "recipes/minilm/rm/config_lora.yaml").read_text()
    config = load_config()
    assert config.model_name_or_path == "minilm" and config.cv_folds == 5 and config.report_to == ["wandb"]


def test_unknown_key_is_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model_name_or_path: minilm\nlearnin_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['learnin_rate'\]"):
        load_config(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"ties": "ignore"}, "ties='ignore' is not one of"),
        ({"truncation": "cut"}, "truncation='cut' is not one of"),
        ({"ties": "rao-kupper", "tie_parameter": 0.0}, "tie_parameter must be"),
        ({"two_class_tie_policy": "half"}, "two_class_tie_policy='half'"),
    ],
)
def test_bad_values(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(overrides=override)


def test_trust_remote_code_is_off_by_default():
    assert load_config().trust_remote_code is False


def test_evaluation_during_training_needs_an_eval_file():
    with pytest.raises(ValueError, match="need eval_file"):
        load_config(overrides={"eval_strategy": "steps", "eval_steps": 5})
    config = load_config(overrides={"eval_strategy": "steps", "eval_steps": 5, "eval_file": "emoprefer"})
    assert config.eval_file == "emoprefer"


def test_value_types_are_checked_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="num_train_epochs must be a float, got 'two'"):
        load_config(overrides={"num_train_epochs": "two"})
    assert load_config(overrides={"learning_rate": "3e-4", "lora_r": "8"}).learning_rate == pytest.approx(3e-4)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: minilm\n  lora_r: : 4\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)
