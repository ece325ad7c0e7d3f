"""Every recipe YAML parses with the real parser; unknown keys and bad values are errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emoreward.training.config import RecipeParser, default_recipe_path, load_config, load_recipe


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


def test_unknown_key_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model_name_or_path: minilm\nlearnin_rate: 0.1\n")
    with pytest.raises(ValueError) as err:
        load_config(path)
    assert str(err.value).startswith(
        f"{path}, line 2: unknown key(s) ['learnin_rate'] (did you mean 'learning_rate'?)"
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ({"ties": "ignore"}, "ties: 'ignore' is not one of ['drop', 'rao-kupper', 'davidson']"),
        ({"truncation": "cut"}, "truncation: 'cut' is not one of"),
        ({"ties": "rao-kupper", "tie_parameter": 0.0}, "tie_parameter must be"),
        ({"two_class_tie_policy": "half"}, "two_class_tie_policy: 'half'"),
    ],
)
def test_bad_values(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(overrides=override)


def test_trust_remote_code_is_off_by_default():
    assert load_config().trust_remote_code is False


def test_evaluation_during_training_needs_an_eval_file():
    with pytest.raises(ValueError, match="need eval_file"):
        load_config(overrides={"eval_strategy": "steps", "eval_steps": 5})
    config = load_config(overrides={"eval_strategy": "steps", "eval_steps": 5, "eval_file": "emoprefer"})
    assert config.eval_file == "emoprefer"


def test_value_types_are_checked_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="num_train_epochs must be a number, got 'two'"):
        load_config(overrides={"num_train_epochs": "two"})
    config = load_config(overrides={"learning_rate": "3e-4", "lora_r": "8"})
    assert config.learning_rate == 3e-4 and config.lora_r == 8


def test_invalid_yaml_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: minilm\nlora_r: 4\n  lora_alpha: : 8\n")
    with pytest.raises(ValueError) as err:
        load_config(bad)
    assert str(err.value) == (f"{bad}, line 3, column 13: not valid YAML: mapping values are not allowed here")
    twice = tmp_path / "twice.yaml"
    twice.write_text("lora_r: 4\nseed: 1\nlora_r: 8\n")
    with pytest.raises(ValueError, match=r"twice.yaml, line 3: key 'lora_r' is given twice \(first on line 1\)"):
        load_config(twice)


def test_yaml_values_are_read_by_the_field_type_not_by_yaml(tmp_path):
    """YAML 1.1 reads `no` as False and `3e-4` as a string; the field's type decides instead."""
    path = tmp_path / "r.yaml"
    path.write_text(
        "save_strategy: no\nlearning_rate: 3e-4\nfinal_fit: no\neval_strategy: 'no'\nlora_target_modules: [query, value]\n"
        "run_name: on\nseed: 7\neval_file:\n"
    )
    config = load_config(path)
    assert config.save_strategy.value == "no" and config.eval_strategy.value == "no"
    assert config.learning_rate == 3e-4 and config.final_fit is False and config.seed == 7
    assert config.lora_target_modules == ["query", "value"]
    assert config.run_name == "on"  # a string field keeps the text
    assert config.eval_file is None  # an empty YAML value is null
    path.write_text("seed: 1.5\n")
    with pytest.raises(ValueError, match=r"r.yaml, line 1: seed must be an integer, got '1.5'"):
        load_config(path)


def test_trlparser_style_command_line_over_yaml(tmp_path):
    """`--field value` (TRL's option names, underscores or dashes) and `--set field=value` replace the recipe's
    value, each read by the field's type; fields not given keep the recipe's value."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 3.0e-4\nnum_train_epochs: 2\nsave_strategy: steps\nseed: 5\ncv_folds: 3\n")
    parser = RecipeParser(prog="train")
    argv = ["--config", str(recipe), "--learning_rate", "1e-4", "--num-train-epochs", "3", "--set", "save_strategy=no"]
    (config,) = parser.parse_args_and_config([*argv, "--lora_target_modules", "query", "value", "--no_final_fit"])
    assert config.learning_rate == 1e-4 and config.num_train_epochs == 3.0
    assert config.save_strategy.value == "no" and config.seed == 5 and config.cv_folds == 3
    assert config.lora_target_modules == ["query", "value"] and config.final_fit is False
    assert parser.parse_args_and_config([*argv, "--no_use_peft"])[0].use_peft is False
    # --set and --field read values the same way
    (a,) = parser.parse_args_and_config(
        ["--config", str(recipe), "--set", "report_to=[none]", "--set", "lr_scheduler_type=cosine"]
    )
    (b,) = parser.parse_args_and_config(
        ["--config", str(recipe), "--report_to", "none", "--lr_scheduler_type", "cosine"]
    )
    assert a.report_to == b.report_to == [] and a.lr_scheduler_type == b.lr_scheduler_type
    (c,) = parser.parse_args_and_config(["--config", str(recipe), "--no-wandb", "--quiet"])
    assert c.report_to == [] and c.disable_tqdm is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "num_train_epochs="], "--set num_train_epochs=: num_train_epochs: empty value; give a value"),
        (["--set", "eval_file="], "--set eval_file=: eval_file: empty value; give a value or null"),
        (["--set", "learnin_rate=1"], "--set learnin_rate=1: unknown key(s) ['learnin_rate'] (did you mean"),
        (["--set", "seed=x"], "--set seed=x: seed must be an integer, got 'x'"),
        (["--set", "noequals"], "--set expects KEY=VALUE, got 'noequals'"),
    ],
)
def test_bad_overrides_are_errors(argv, message):
    with pytest.raises(ValueError) as err:
        RecipeParser().parse_args_and_config(argv)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_train_epochs", ""], "argument --num_train_epochs/--num-train-epochs: num_train_epochs: empty value"),
        (["--save_strategy", "nope"], "save_strategy: 'nope' is not one of ['no', 'steps', 'epoch', 'best']"),
        (["--learning", "1e-4"], "unrecognized arguments: --learning 1e-4"),  # no abbreviations
        (["--hub_token", "hf_x"], "pass tokens and keys through the environment"),
    ],
)
def test_bad_options_are_one_line_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        RecipeParser(prog="train_reward.py").parse_args_and_config(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_reward.py: error: ") and message in err


def test_secrets_are_refused_in_recipes_as_on_the_command_line(tmp_path):
    from emoreward.training.parsing import SECRET_HINT

    for key in ("hub_token", "wandb_api_key", "my_secret", "token"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(f"seed: 1\n{key}: abc123\n")
        with pytest.raises(ValueError) as err:
            load_config(path)
        assert str(err.value) == f"{path}, line 2: {key}: {SECRET_HINT}"
    with pytest.raises(ValueError) as err:
        RecipeParser().parse_args_and_config(["--set", "hub_token=abc123"])
    assert str(err.value) == f"--set hub_token=...: {SECRET_HINT}"
    # tokenizer special tokens are not credentials (and pad_token is refused for its own reason)
    path = tmp_path / "pad.yaml"
    path.write_text("pad_token: '[PAD]'\n")
    with pytest.raises(ValueError, match="does not read this field"):
        load_config(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"num_train_epochs": 0}, "num_train_epochs=0.0 (with max_steps=-1) trains zero steps"),
        ({"num_train_epochs": -1, "max_steps": 0}, "trains zero steps"),
        ({"cv_folds": 0, "final_fit": False}, "the recipe trains nothing"),
    ],
)
def test_configs_that_train_zero_steps_are_refused(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(overrides=override)
    assert load_config(overrides={"num_train_epochs": 0, "max_steps": 4}).max_steps == 4


def test_max_length_beyond_the_backbone_positions_is_refused(tiny_bert_dir, tmp_path):
    config = load_config(overrides={"model_name_or_path": str(tiny_bert_dir), "max_length": 128})
    config.check_max_length()  # the tiny BERT has 128 positions
    config = load_config(overrides={"model_name_or_path": str(tiny_bert_dir), "max_length": 129})
    with pytest.raises(ValueError) as err:
        config.check_max_length()
    assert str(err.value) == (
        f"override max_length=129: max_length=129 exceeds the 128 token positions of backbone '{tiny_bert_dir}' (max_position_embeddings in "
        "its config): set max_length: 128 or less"
    )


def test_trl_default_max_length_on_minilm_is_refused_with_the_reason(tmp_path):
    from _helpers import minilm_dir

    minilm_dir()  # skips without the weights package
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: minilm\ncv_folds: 2\n")  # no max_length: TRL's 1024
    config = load_config(recipe)
    assert config.max_length == 1024
    with pytest.raises(
        ValueError,
        match=re.escape(
            "max_length=1024 (TRL's default when a recipe does not set max_length) exceeds the 512 token positions of backbone 'minilm'"
        ),
    ):
        config.check_max_length()
    load_config().check_max_length()  # the default recipe: 512


def test_a_local_checkpoint_is_recorded_by_its_absolute_path(tmp_path, tiny_bert_dir, monkeypatch):
    """A saved adapter names its base model: a relative path would only resolve from the training directory."""
    import shutil

    shutil.copytree(tiny_bert_dir, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    config = load_config(overrides={"model_name_or_path": "ckpt", "report_to": ["none"]})
    assert config.model_name_or_path == str((tmp_path / "ckpt").resolve())
    assert load_config(overrides={"report_to": ["none"]}).model_name_or_path == "minilm"  # a registered name stays


def test_every_boolean_field_takes_a_bare_flag():
    """`--field` alone means true for every boolean recipe field, `bool | None` ones (`--bf16`, `--tf32`,
    `--disable_tqdm`) as for plain `bool` ones; `--field false` still reads false."""
    import typing

    from emoreward.training.config import recipe_fields

    parser = RecipeParser(prog="train")
    booleans = [name for name, hint in recipe_fields().items() if bool in (typing.get_args(hint) or (hint,))]
    assert {"bf16", "tf32", "disable_tqdm", "use_cpu", "final_fit", "overwrite_output_dir"} <= set(booleans)
    for name in booleans:
        assert getattr(parser.parse_args([f"--{name}"]), name) is True, name
        assert getattr(parser.parse_args([f"--{name}", "false"]), name) is False, name
    (config,) = parser.parse_args_and_config(["--disable_tqdm", "--overwrite-output-dir"])
    assert config.disable_tqdm is True and config.overwrite_output_dir is True


def test_trust_remote_code_needs_the_command_line(tmp_path):
    """A recipe file cannot turn on remote code for a text backbone (refused, naming file and line and the way to
    ask for it); the command line can; a multimodal recipe refuses it however it is given (one rule:
    `check_remote_code`)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: minilm\ntrust_remote_code: true\n")
    with pytest.raises(ValueError, match=re.escape(f"{recipe}, line 2: trust_remote_code: true would run Python")):
        load_config(recipe)
    with pytest.raises(ValueError, match="--trust_remote_code"):
        RecipeParser(prog="train").parse_args_and_config(["--config", str(recipe)])
    parser = RecipeParser(prog="train")
    (config,) = parser.parse_args_and_config(["--config", str(recipe), "--trust_remote_code"])
    assert config.trust_remote_code is True
    (config,) = parser.parse_args_and_config(["--config", str(recipe), "--set", "trust_remote_code=true"])
    assert config.trust_remote_code is True
    media = ROOT / "recipes" / "qwen2.5-omni-7b" / "rm" / "config_lora.yaml"
    for argv in (["--trust_remote_code"], ["--set", "trust_remote_code=true"]):
        with pytest.raises(ValueError, match="loads with its transformers classes only"):
            parser.parse_args_and_config(["--config", str(media), *argv])


def test_bf16_training_follows_the_scoring_rule(monkeypatch):
    """`bf16: auto` (the default) trains in bf16 exactly where scoring picks bf16 (bf16 matrix units), and sets
    `use_cpu` for CPU bf16 (transformers needs it); `bf16: true` works with the units and is refused without them;
    `EMOREWARD_DTYPE=float32` pins float32. The rule's input (`bf16_units`) is given, so the test is the same on
    every machine."""
    import torch

    from emoreward.training.bf16 import resolve_training_bf16

    if torch.cuda.is_available():
        pytest.skip("the CPU cases of the rule (a GPU is visible)")
    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    assert resolve_training_bf16("auto", bf16_units=True) == (True, True)
    assert resolve_training_bf16(None, bf16_units=True) == (True, True)
    assert resolve_training_bf16("auto", bf16_units=False) == (False, False)
    assert resolve_training_bf16("auto", bf16_units=True, fp16=True) == (False, False)
    assert resolve_training_bf16(True, bf16_units=True) == (True, True)
    assert resolve_training_bf16(False, bf16_units=True) == (False, False)
    with pytest.raises(ValueError, match=r"bf16=True: this CPU has no bf16 matrix units \(AMX-BF16, AVX512-BF16"):
        resolve_training_bf16(True, bf16_units=False)
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    assert resolve_training_bf16("auto", bf16_units=True) == (False, False)
    monkeypatch.setenv("EMOREWARD_DTYPE", "bfloat16")  # emulated bf16 scoring never makes training emulate
    assert resolve_training_bf16("auto", bf16_units=False) == (False, False)


def test_bf16_values_read_from_recipes_and_the_command_line(monkeypatch):
    from emoreward.models.precision import has_bf16_matrix_units

    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    units = has_bf16_matrix_units("cpu")
    parser = RecipeParser(prog="train")
    for argv in (["--set", "bf16=auto"], ["--bf16", "auto"]):
        (config,) = parser.parse_args_and_config(argv)
        assert config.bf16 is units and config.use_cpu is units
    assert load_config(overrides={"bf16": None}).bf16 is units  # unset: the rule, as TRL's None
    (config,) = parser.parse_args_and_config([])  # the default recipe: `auto`
    assert config.bf16 is units and config.use_cpu is units
    (config,) = parser.parse_args_and_config(["--bf16", "false"])
    assert config.bf16 is False
    if units:
        (config,) = parser.parse_args_and_config(["--set", "bf16=true"])
        assert config.bf16 is True and config.use_cpu is True
    else:
        with pytest.raises(ValueError, match="no bf16 matrix units"):
            parser.parse_args_and_config(["--set", "bf16=true"])
    with pytest.raises(ValueError, match="bf16"):
        parser.parse_args_and_config(["--set", "bf16=maybe"])


def test_the_omni_judge_recipe_is_a_multimodal_judge_with_its_memory_stated():
    """`recipes/qwen2.5-omni-7b/judge/`: the real 7B id, the Omni thinker hearing the clip's track, LoRA on the language
    model (the default targets), SFT then DPO, and the per-GPU memory stated as an estimate; parsed without a
    download (the model is read only when training starts)."""
    from emoreward.training.judge import _default_targets
    from emoreward.training.judge_config import JudgeTrainConfig

    path = ROOT / "recipes/qwen2.5-omni-7b/judge/config_sft_dpo.yaml"
    config = load_recipe(path)
    assert isinstance(config, JudgeTrainConfig) and config.kind == "judge"
    assert config.model_name_or_path == "Qwen/Qwen2.5-Omni-7B" and config.family == "qwen2.5-omni-thinker"
    assert config.use_audio_in_video and config.lora_r == 16 and config.dpo_epochs == 1
    assert config.lora_target_modules is None and "audio_tower" in _default_targets(config)  # encoders excluded
    text = path.read_text()
    assert "Memory per GPU (an ESTIMATE" in text and "not measured" in text
