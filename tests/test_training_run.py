"""The main job end to end on a tiny model: cross-validation report, saved model, W&B offline run, CLI."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from _helpers import synthetic_pairs

from emoreward.cli import main
from emoreward.cli.main import COMMANDS
from emoreward.data import PreferencePair


ROOT = Path(__file__).resolve().parents[1]


def read_wandb_records(path):
    """Records of a W&B `.wandb` transaction log (LevelDB log format: 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf + chunk if kind == 4 else chunk)
            buf = b""
            yield record
        elif kind in (2, 3):
            buf = chunk if kind == 2 else buf + chunk


def write_pairs_csv(path, pairs):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "a1", "a2", "preference"])
        for p in pairs:
            w.writerow([p.sample_id, p.description_1, p.description_2, {"1": "a1", "2": "a2", "tie": "same"}[p.label]])
    return path


def held_out_pairs(n: int) -> list[PreferencePair]:
    """Synthetic pairs that share no description with `synthetic_pairs(...)` of any size (the clip is a scene)."""
    return [
        replace(
            p,
            sample_id=f"held-out-{i}",
            description_1=p.description_1.replace("clip", "scene"),
            description_2=p.description_2.replace("clip", "scene"),
        )
        for i, p in enumerate(synthetic_pairs(n, seed=7))
    ]


def tiny_recipe(tmp_path, model_dir, **extra):
    recipe = {
        "model_name_or_path": str(model_dir),
        "lora_target_modules": ["query", "value"],
        "lora_r": 4,
        "lora_alpha": 8,
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", synthetic_pairs(24))),
        "num_train_epochs": 2,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-2,
        "max_length": 64,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "disable_tqdm": True,
        "cv_folds": 2,
        "report_to": ["none"],
        "output_dir": str(tmp_path / "out"),
    }
    recipe.update(extra)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_main_job_report_and_evaluate_cli(tiny_bert_dir, tmp_path, capsys, caplog):
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, save_strategy="steps")
    # TRL-style options beside the recipe: --field value and --set, read by the field's type
    argv = ["train", "--config", str(recipe), "--seed", "3", "--set", "save_strategy=no", "--learning-rate", "0.01"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2-fold cross-validation on 24 pairs" in out and "length baseline" in out and "±" in out
    assert "{'loss'" not in out  # losses go to the report and W&B, not one printed dict per logging step
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    summary = report["cross_validation"]["summary"]
    for key in (
        "two_class_waf",
        "two_class_acc",
        "three_class_waf",
        "three_class_acc",
        "swap_consistency",
        "length_debiased_acc",
    ):
        assert key in summary["judge"]
    assert summary["judge"]["swap_consistency"]["mean"] == 100.0
    assert report["recipe"]["seed"] == 3 and report["recipe"]["save_strategy"] == "no"
    assert not list((tmp_path / "out").rglob("checkpoint-*"))  # save_strategy=no reached the trainer
    assert (tmp_path / "out" / "confusion.png").stat().st_size > 1000
    model_dir = tmp_path / "out" / "model"
    assert "length baseline" in (model_dir / "README.md").read_text()
    assert json.loads((model_dir / "training_data.json").read_text())["n_pairs"] == 24

    unseen = write_pairs_csv(tmp_path / "unseen.csv", held_out_pairs(10))
    assert (
        main(["evaluate", "--model", str(model_dir), "--data", str(unseen), "--output", str(tmp_path / "ev.json")])
        == 0
    )
    captured = capsys.readouterr()
    assert "2-class WAF" in captured.out and "length baseline" in captured.out
    assert "trained on" not in captured.err
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["n_pairs"] == 10 and ev["judge"]["swap_consistency"] == 100.0
    assert ev["n_in_sample_pairs"] == 0 and ev["n_identical_descriptions"] == 0
    assert (tmp_path / "ev.md").exists() and (tmp_path / "ev.png").exists()

    # the model's own training pairs (here 5 of them, one swapped, beside 2 new pairs and one with identical
    # descriptions): flagged as in-sample, and the undecidable pair counted
    train = synthetic_pairs(24)
    swapped = PreferencePair(
        train[0].sample_id, train[0].description_2, train[0].description_1, "2" if train[0].label == "1" else "1"
    )
    same = PreferencePair("same", "She smiles.", "She smiles.", "tie")
    mixed = write_pairs_csv(tmp_path / "mixed.csv", [*train[1:5], swapped, *held_out_pairs(2), same])
    assert main(["evaluate", "--model", str(model_dir), "--data", str(mixed)]) == 0
    captured = capsys.readouterr()
    assert (
        f"emoreward evaluate: warning: 5 of 8 pairs in {mixed} are pairs the model was trained on "
        f"({model_dir / 'training_data.json'}: {tmp_path / 'train.csv'})"
    ) in captured.err
    assert "1 of 8 pairs have two identical descriptions (a reward model always calls them ties): same" in captured.err
    assert "IN-SAMPLE" in captured.out and "pairs with identical descriptions 1" in captured.out

    # exporting into the model's own directory is refused before anything is written
    before = sorted(p.name for p in model_dir.iterdir())
    assert main(["export", "--model", str(model_dir), "--output", str(model_dir)]) == 2
    assert "which this command reads: writing there would change an input" in capsys.readouterr().err
    assert sorted(p.name for p in model_dir.iterdir()) == before
    # ... and so is a folder holding anything but an earlier export (a user's files, the run folder), untouched
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("mine")
    for target, why in ((mine, "is not empty and holds no earlier export"), (tmp_path / "out", "contains --model")):
        listing = sorted(p.name for p in target.iterdir())
        assert main(["export", "--model", str(model_dir), "--output", str(target)]) == 2
        assert why in capsys.readouterr().err
        assert sorted(p.name for p in target.iterdir()) == listing
    assert (mine / "README.md").read_text() == "mine"
    # an export carries the training pairs: evaluating it on them is still flagged in-sample; exporting again into
    # the same folder replaces the earlier export
    export = tmp_path / "export"
    for _ in range(2):
        assert main(["export", "--model", str(model_dir), "--output", str(export)]) == 0
        capsys.readouterr()
    assert (export / "training_data.json").read_bytes() == (model_dir / "training_data.json").read_bytes()
    assert main(["evaluate", "--model", str(export), "--data", str(mixed)]) == 0
    captured = capsys.readouterr()
    assert "5 of 8 pairs" in captured.err and "IN-SAMPLE" in captured.out

    # an interrupted or repeated run reuses finished folds and the finished final model; a torn finished.json
    # (what a kill during a non-atomic write leaves) is named in a warning and its fold is trained again
    (tmp_path / "out" / "cv" / "fold1" / "finished.json").write_text('{"fingerprint": "ab')
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.count("finished earlier") == 2  # fold 0 and the final model; fold 1 is trained again
    torn = tmp_path / "out" / "cv" / "fold1" / "finished.json"
    assert f"finished-work marker {torn} is empty or unreadable" in caplog.text  # a warning (stderr in the CLI)
    again = json.loads((tmp_path / "out" / "report.json").read_text())
    assert again["cross_validation"]["summary"] == summary


def test_cli_refuses_secrets_on_the_command_line_and_in_recipes(tmp_path, capsys):
    from emoreward.training.parsing import SECRET_HINT

    assert main(["train", "--set", "hub_token=hf_abc"]) == 2
    assert capsys.readouterr().err == f"emoreward train: error: --set hub_token=...: {SECRET_HINT}\n"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("seed: 3\nhub_token: hf_abc\n")
    assert main(["train", "--config", str(recipe)]) == 2
    assert capsys.readouterr().err == f"emoreward train: error: {recipe}, line 2: hub_token: {SECRET_HINT}\n"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--hub_token", "hf_abc"])
    assert exit_info.value.code == 2 and SECRET_HINT in capsys.readouterr().err
    assert main(["train", "--set", "noequals"]) == 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_train_epochs": 0}, "num_train_epochs=0.0 (with max_steps=-1) trains zero steps"),
        ("lora_r: 4\n  seed: : 3\n", "recipe.yaml, line 2, column 7: not valid YAML: mapping values are not allowed"),
        ({"max_length": 200}, "max_length=200 exceeds the 128 token positions of backbone"),
        ({"eval_file": "missing.csv"}, "missing.csv"),
    ],
)
def test_bad_recipes_stop_before_any_training_in_one_line(change, message, tiny_bert_dir, tmp_path, capsys):
    """Exit status 2, one line on stderr, nothing trained (no output directory), for: a zero-step recipe, invalid
    YAML, a max_length beyond the backbone's positions, an eval_file that cannot be read."""
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, **(change if isinstance(change, dict) else {}))
    if isinstance(change, str):
        recipe.write_text(change)
    assert main(["train", "--config", str(recipe)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("emoreward train: error: ")
    assert message in captured.err
    assert not (tmp_path / "out").exists()


def test_no_report_md_without_an_evaluation(tiny_bert_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, cv_folds=0, max_steps=1)
    assert main(["train", "--config", str(recipe)]) == 0
    assert "no evaluation was run (cv_folds=0, no eval_file)" in capsys.readouterr().out
    out = tmp_path / "out"
    assert (out / "report.json").exists() and (out / "model" / "finished.json").exists()
    assert not (out / "report.md").exists()


def test_cli_reports_bad_data_with_file_row_field(tiny_bert_dir, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,maybe\n")
    assert main(["evaluate", "--model", str(tmp_path), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, row 2, field 'preference': unknown label 'maybe'" in err


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: emoreward" in out
    if command == ["train"]:  # every recipe field, TRL-style
        assert "--learning_rate" in out and "--cv_folds" in out and "--set KEY=VALUE" in out and "--quiet" in out


def test_train_script_help():
    result = subprocess.run(
        [sys.executable, "scripts/train_reward.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "usage: train_reward.py" in result.stdout and "--learning_rate" in result.stdout


def test_confusion_counts_are_readable_on_dark_cells(tmp_path):
    """The count in the darkest cell is written in white: near-white text pixels inside the dark-blue cell."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.image import imread

    from emoreward.evaluation.report import plot_confusion

    path = plot_confusion([[0, 100]], ["1"], ["1", "2"], tmp_path / "cm.png")
    pixels = imread(path)[..., :3]
    darkest = np.array(colormaps["Blues"](1.0)[:3])
    rows, cols = np.nonzero(np.abs(pixels - darkest).max(axis=-1) < 0.02)
    cell = pixels[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    assert cell.shape[0] > 50 and cell.shape[1] > 50  # the whole dark cell
    text = cell.min(axis=-1) > 0.8  # white glyphs of "100"
    assert text.sum() > 20
    assert (cell.max(axis=-1) < 0.1).sum() == 0  # no black glyphs


def test_evaluate_reports_bad_data_before_loading_torch(tmp_path):
    """`emoreward evaluate` reads the data first: a data error comes before torch (and the model) load."""
    bad = tmp_path / "bad.csv"
    bad.write_text("name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,maybe\n")
    code = (
        "import sys; from emoreward.cli import main; "
        f"status = main(['evaluate', '--model', {str(tmp_path)!r}, '--data', {str(bad)!r}]); "
        "print(status, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["2", "False", "False"], result.stderr
    assert result.stderr.startswith(
        f"emoreward evaluate: error: {bad}, row 2, field 'preference': unknown label 'maybe'"
    )
    assert result.stderr.count("\n") == 1


def test_pair_keys_are_content_and_count_the_sample_only_where_clips_are_read_by_it(tmp_path):
    """A pair is what it holds (`pair_content`): a text model's training pairs are recognised under any id or layout
    (TRL rows without ids, ``row-<n>``), spacing and line endings included; where the model read clips by sample id
    (a media root) the same two texts about another clip are a new pair. Earlier records keep their own keys."""
    from emoreward.training.provenance import in_sample_pairs, pair_key, write_training_data

    a = PreferencePair("clip-1", "She is happy.", "She is sad.", "1")
    swapped = PreferencePair("clip-1", "She is sad.", "She is happy.", "2")
    other_clip = PreferencePair("clip-2", "She is happy.", "She is sad.", "2")
    trl_row = PreferencePair("row-7", "She is happy.  ", "She is sad.\r\n", "1")  # no id, re-encoded cells
    assert pair_key(a) == pair_key(swapped) == pair_key(other_clip) == pair_key(trl_row)
    by_id = [pair_key(p, media_by_id=True) for p in (a, swapped, other_clip)]
    assert by_id[0] == by_id[1] != by_id[2]
    write_training_data(tmp_path, "train.jsonl", [a])
    assert in_sample_pairs(tmp_path, [swapped, other_clip, trl_row]) == (3, "train.jsonl")
    write_training_data(tmp_path, "train.jsonl", [a], media_by_id=True)
    assert in_sample_pairs(tmp_path, [swapped, other_clip]) == (1, "train.jsonl")
    earlier = {"train_file": "old.csv", "n_pairs": 1, "pair_key": "sample+descriptions"}
    (tmp_path / "training_data.json").write_text(
        json.dumps({**earlier, "pair_keys": [pair_key(a, earlier["pair_key"])]})
    )
    assert in_sample_pairs(tmp_path, [swapped, other_clip]) == (1, "old.csv")
    legacy = {"train_file": "old.csv", "n_pairs": 1, "pair_keys": [pair_key(a, "descriptions")]}
    (tmp_path / "training_data.json").write_text(json.dumps(legacy))
    assert in_sample_pairs(tmp_path, [swapped, other_clip]) == (2, "old.csv")


@pytest.mark.parametrize(
    ("command", "required"), [("train", []), ("rank", ["--judge", "m", "--data", "d"]), ("serve", ["--model", "m"])]
)
def test_an_unknown_option_is_reported_by_its_command(command, required, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, *required, "--no-such-option", "3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"emoreward {command}: error: unrecognized arguments: --no-such-option 3 "
        f"(`emoreward {command} --help` lists the options)\n"
    )


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc: a folder no one can create files in")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--output-dir", "/proc/nope"], "emoreward train: error: --output-dir /proc/nope: cannot write in"),
        (
            ["export", "--model", "m", "--output", "/proc/x/y"],
            "emoreward export: error: --output /proc/x/y: cannot write",
        ),
    ],
)
def test_an_output_folder_that_cannot_be_made_is_refused_before_any_work(argv, message, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--model", "README.md"], "emoreward serve: error: README.md is a file, not a model directory\n"),
        (
            ["export", "--model", "README.md", "--output", "x"],
            "emoreward export: error: README.md is a file, not a model directory\n",
        ),
        (
            ["evaluate", "--model", "./nosuchdir", "--data", "emoprefer"],
            "emoreward evaluate: error: model directory not found: nosuchdir\n",
        ),
    ],
)
def test_a_bad_model_path_reads_the_same_in_every_command(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("not a model")
    assert main(argv) == 2
    assert capsys.readouterr().err.endswith(message)
