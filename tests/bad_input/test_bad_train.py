"""Bad input to `emoreward train`: recipes (YAML syntax, keys, types, credentials, values the run cannot use),
command-line overrides and training / evaluation data. Each is refused before any training, in one line naming the
recipe file and line (or the option) and the field, or the data file, row and field."""

from __future__ import annotations

import pytest
from bad_input_helpers import GOOD_PAIRS, fails, run, write


BASE = "model_name_or_path: {bert}\ncv_folds: 0\nmax_length: 64\nreport_to: [none]\noutput_dir: {out}\n"
# line numbers below count from the first line of BASE (5 lines): an added key is on line 6


@pytest.fixture()
def recipe(tmp_path, tiny_bert_dir):
    """Write a recipe: BASE (tiny BERT backbone, no folds) followed by `extra` lines; returns its path."""

    def make(extra: str = "", base: str = BASE, name: str = "recipe.yaml"):
        text = base.format(bert=tiny_bert_dir, out=tmp_path / "out") + extra
        return write(tmp_path / name, text.encode("latin-1") if "\xe9" in text else text)

    return make


def train(path, *options):
    return ["train", "--config", path, "--quiet", *options]


RECIPE_CASES = [
    # (id, lines added to BASE, fragments after "<recipe>, line ")
    ("invalid-yaml-flow", "learning_rate: [1e-4\n", ["line 7, column 1: not valid YAML"]),
    ("invalid-yaml-tab", "\tlearning_rate: 1e-4\n", ["line 6, column 1: not valid YAML", "'\\t'"]),
    ("invalid-yaml-indent", "lora_r: 8\n  lora_alpha: 16\n", ["line 7, column 13: not valid YAML"]),
    ("unknown-key", "lerning_rate: 1.0e-4\n", ["line 6: unknown key(s) ['lerning_rate']", "'learning_rate'"]),
    ("duplicate-key", "max_length: 32\n", ["line 6: key 'max_length' is given twice (first on line 3)"]),
    ("wrong-type-number", "learning_rate: fast\n", ["line 6: learning_rate must be a number, got 'fast'"]),
    ("wrong-type-list", "num_train_epochs: [1, 2]\n", ["line 6: num_train_epochs takes float, got a list"]),
    ("wrong-type-bool", "use_peft: maybe\n", ["line 6: use_peft: 'maybe' is not a boolean"]),
    ("empty-value", "learning_rate:\n", ["line 6: learning_rate: null or an empty value", "takes float"]),
    ("unknown-choice", "ties: sometimes\n", ["line 6: ties: 'sometimes' is not one of"]),
    ("zero-steps", "num_train_epochs: 0\n", ["line 6: num_train_epochs=0.0", "trains zero steps"]),
    ("lora-rank-zero", "lora_r: 0\n", ["line 6: lora_r must be > 0, got 0"]),
    ("negative-folds", "", ["line 2: cv_folds must be >= 0, got -2"]),
    ("tie-parameter", "ties: davidson\ntie_parameter: -1\n", ["line 7: tie_parameter must be a finite number > 0"]),
    ("media-field-on-text", "fps: 4\n", ["line 6: fps=4.0: the text backbone", "does not read this field"]),
    ("eval-strategy-without-file", "eval_strategy: steps\n", ["line 6: eval_strategy='steps'", "need eval_file"]),
    ("latin1-bytes", "run_name: caf\xe9\n", ["line 6: run_name: undecodable bytes b'\\xe9'"]),
    ("batch-size-zero", "per_device_train_batch_size: 0\n", ["line 6: per_device_train_batch_size must be >= 1"]),
    ("negative-learning-rate", "learning_rate: -1\n", ["line 6: learning_rate must be a finite number >= 0"]),
]


@pytest.mark.parametrize("extra, fragments", [c[1:] for c in RECIPE_CASES], ids=[c[0] for c in RECIPE_CASES])
def test_recipe_problems_name_file_line_and_field(recipe, capsys, extra, fragments):
    base = BASE if extra else BASE.replace("cv_folds: 0", "cv_folds: -2")  # the one case that changes a BASE line
    path = recipe(extra, base)
    fails(train(path), capsys, *[f"{path}, {fragments[0]}", *fragments[1:]])


@pytest.mark.parametrize(
    "key, secret",
    [("hub_token", "hf_AbCdEfSECRET123"), ("wandb_api_key", "SECRETSECRETSECRET"), ("db_password", "hunter2xyz")],
)
def test_a_credential_in_a_recipe_is_refused_without_echoing_it(recipe, capsys, key, secret):
    path = recipe(f"{key}: {secret}\n")
    line = fails(train(path), capsys, f"{path}, line 6: {key}: pass tokens and keys through the environment")
    assert secret not in line


def test_a_recipe_that_is_not_a_mapping(tmp_path, capsys):
    path = write(tmp_path / "list.yaml", "- learning_rate: 1\n- lora_r: 8\n")
    fails(train(path), capsys, f"{path}, line 1: a recipe is a mapping of keys to values")


def test_a_missing_recipe(tmp_path, capsys):
    fails(train(tmp_path / "nope.yaml"), capsys, f"recipe not found: {tmp_path / 'nope.yaml'}")


def test_max_length_beyond_the_backbone_positions(recipe, capsys, tmp_path):
    path = recipe(
        f"train_file: {write(tmp_path / 'p.csv', GOOD_PAIRS)}\n", BASE.replace("max_length: 64", "max_length: 4096")
    )
    fails(train(path), capsys, f"{path}, line 3: max_length=4096 exceeds the 128 token positions", "max_length: 128")


def test_max_length_left_at_trls_default_beyond_the_positions(recipe, capsys, tmp_path):
    path = recipe(f"train_file: {write(tmp_path / 'p.csv', GOOD_PAIRS)}\n", BASE.replace("max_length: 64\n", ""))
    fails(
        train(path),
        capsys,
        f"{path} (max_length not set: its default): max_length=1024 (TRL's default",
        "128 token positions",
    )


@pytest.mark.parametrize("key", ["train_file", "eval_file"])
def test_a_data_file_that_does_not_exist(recipe, capsys, tmp_path, key):
    good = write(tmp_path / "p.csv", GOOD_PAIRS)
    extra = f"train_file: {tmp_path / 'missing.csv'}\n" if key == "train_file" else f"train_file: {good}\n"
    extra += f"eval_file: {tmp_path / 'missing.csv'}\n" if key == "eval_file" else ""
    path = recipe(extra)
    line = 6 if key == "train_file" else 7
    fails(
        train(path), capsys, f"{path}, line {line}: {key}: preference data file not found: {tmp_path / 'missing.csv'}"
    )


@pytest.mark.parametrize(
    "key, name, content, fragments",
    [
        (
            "train_file",
            "labels.csv",
            "name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,first\n",
            ["row 2, field 'preference'"],
        ),
        (
            "train_file",
            "glued.csv",
            'name,a1,a2,preference\nv1,x,"sad,a1\nv2,x,y",a2\n',
            ["row 1, line 2, field 'a2'"],
        ),
        (
            "eval_file",
            "eval.jsonl",
            '{"name": "v1", "a1": "x", "a2": "y", "preference": "a1"}\n{bad json}\n',
            ["row 2"],
        ),
        ("eval_file", "trl.jsonl", '{"chosen": "calm", "rejected": ""}\n', ["row 1, field 'rejected': empty"]),
        # a NaN in a numeric field is a number that is not finite, never a missing value (red team F7: margin 0)
        (
            "train_file",
            "nan-margin.jsonl",
            '{"chosen": "x y", "rejected": "z", "margin": NaN}\n{"chosen": "x", "rejected": "z w", "margin": 1.0}\n',
            ["row 1, field 'margin': expected a finite number, got nan"],
        ),
        (
            "train_file",
            "nan-tie.jsonl",
            '{"chosen": "x", "rejected": "z w", "tie": false}\n{"chosen": "x y", "rejected": "z", "tie": NaN}\n',
            ["row 2, field 'tie': expected true or false, got nan"],
        ),
        (
            "train_file",
            "nan-label.jsonl",
            '{"name": "v1", "a1": "x", "a2": "y", "preference": NaN}\n',
            ["row 1, field 'preference': unknown label nan"],
        ),
    ],
    ids=[
        "train-bad-label",
        "train-unclosed-quote",
        "eval-bad-json",
        "eval-trl-empty-rejected",
        "train-nan-margin",
        "train-nan-tie",
        "train-nan-label",
    ],
)
def test_bad_rows_in_training_or_evaluation_data(recipe, capsys, tmp_path, key, name, content, fragments):
    data = write(tmp_path / name, content)
    good = write(tmp_path / "p.csv", GOOD_PAIRS)
    extra = f"train_file: {data}\n" if key == "train_file" else f"train_file: {good}\neval_file: {data}\n"
    path = recipe(extra)
    fails(train(path), capsys, *[f"{data}, {fragments[0]}", *fragments[1:]])  # nothing on stdout
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--set", "learning_rate=fast"], ["--set learning_rate=fast: learning_rate must be a number"]),
        (["--set", "lerning_rate=1"], ["--set lerning_rate=1: unknown key(s) ['lerning_rate']", "'learning_rate'"]),
        (["--set", "learning_rate"], ["--set expects KEY=VALUE, got 'learning_rate'"]),
        (["--learning_rate", "fast"], ["argument --learning_rate/--learning-rate: learning_rate must be a number"]),
        (["--num_train_epochs", "0"], ["--num_train_epochs 0.0: num_train_epochs=0.0", "trains zero steps"]),
        (["--set", "lora_r=-4"], ["--set lora_r=-4: lora_r must be > 0, got -4"]),
        (["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size 0: per_device_train_batch_size must"]),
        (["--learning_rate", "-1"], ["--learning_rate -1.0: learning_rate must be a finite number >= 0"]),
    ],
    ids=["set-wrong-type", "set-unknown-key", "set-without-value", "option-wrong-type", "option-zero-steps",
         "set-negative-rank", "option-batch-size-zero", "option-negative-learning-rate"],
)  # fmt: skip
def test_command_line_overrides_name_the_option(recipe, capsys, options, fragments):
    fails(train(recipe(), *options), capsys, *fragments)


@pytest.mark.parametrize("options", [["--set", "hub_token=hf_SECRETxyz"], ["--hub_token", "hf_SECRETxyz"]])
def test_a_credential_on_the_command_line_is_refused_without_echoing_it(recipe, capsys, options):
    line = fails(train(recipe(), *options), capsys, "hub_token", "pass tokens and keys through the environment")
    assert "hf_SECRETxyz" not in line


def test_more_folds_than_pairs(recipe, capsys, tmp_path):
    data = write(tmp_path / "pairs.csv", GOOD_PAIRS)
    # found once the data are read (the run's first lines are out by then), before any fold trains
    code, _, err = run(train(recipe(), "--train_file", data, "--cv_folds", "50"), capsys)
    assert code == 2 and "emoreward train: error: cv_folds=50 is more folds than the 2 pairs to split" in err
    assert not (tmp_path / "out" / "cv").exists()


def test_lora_target_modules_that_match_nothing(recipe, capsys, tmp_path):
    data = write(tmp_path / "pairs.csv", GOOD_PAIRS)
    # found when the model is built (the run's first lines are out by then), before any step
    code, _, err = run(train(recipe(), "--train_file", data, "--lora_target_modules", "nonexistent_mod"), capsys)
    assert code == 2 and "error: lora_target_modules={'nonexistent_mod'}: No modules were targeted" in err


def test_an_output_dir_that_is_a_file(recipe, capsys, tmp_path):
    data = write(tmp_path / "pairs.csv", GOOD_PAIRS)
    fails(train(recipe(), "--train_file", data, "--output_dir", data), capsys, f"output_dir {data} is a file")
