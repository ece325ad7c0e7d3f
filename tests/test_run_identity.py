"""Run identity through the real `emoreward train` entry point: the same run resumes from its last step checkpoint
(no step redone, the model of an uninterrupted run); changed data, changed labels and a changed recipe field in
a folder holding that run's checkpoints are each refused (exit 2) with a message naming what differs and the
options; `--overwrite_output_dir` starts over."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
from _helpers import synthetic_pairs
from test_training_run import tiny_recipe, write_pairs_csv

from emoreward.cli import main
from emoreward.data import load_pairs
from emoreward.training.config import load_config
from emoreward.training.run_identity import identity_differences, run_identity


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _train(recipe: Path, *extra: str, capsys=None) -> Run:
    """`emoreward train --config RECIPE ...` (the CLI's own `main`, in this process)."""
    code = main(["train", "--config", str(recipe), *extra])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def adapter(out: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.numpy() for k, v in load_file(out / "model" / "adapter_model.safetensors").items()}


def test_identity_parts_name_what_differs(tiny_bert_dir, tmp_path):
    recipe = tiny_recipe(tmp_path, tiny_bert_dir)
    config, pairs = load_config(recipe), load_pairs(tmp_path / "train.csv")
    base = run_identity(config, pairs)
    assert run_identity(config, list(pairs))["fingerprint"] == base["fingerprint"]
    # where a run writes and logs is not part of it
    moved = load_config(recipe, {"logging_steps": 7, "output_dir": str(tmp_path / "x"), "save_steps": 3})
    assert run_identity(moved, pairs)["fingerprint"] == base["fingerprint"]
    # the same pairs in another order, from a byte-identical copy at another path, and the same backbone copied
    # elsewhere are the same run: their content is the identity, not their path or row order
    copy = tmp_path / "copy" / "train.csv"
    copy.parent.mkdir()
    shutil.copy(tmp_path / "train.csv", copy)
    backbone = shutil.copytree(tiny_bert_dir, tmp_path / "backbone-copy")
    elsewhere = load_config(recipe, {"train_file": str(copy), "model_name_or_path": str(backbone)})
    assert run_identity(elsewhere, load_pairs(copy)[::-1])["fingerprint"] == base["fingerprint"]
    flipped = [replace(p, label={"1": "2", "2": "1"}[p.label]) for p in pairs]
    assert identity_differences(base, run_identity(config, flipped)) == [
        "the labels (the same pairs with other preference labels)"
    ]
    edited = [replace(pairs[0], description_1=pairs[0].description_1 + "!"), *pairs[1:]]
    assert identity_differences(base, run_identity(config, edited))[0].startswith("the training data")
    # a subset of the same pairs, labels untouched: other data, and no word about labels
    subset = identity_differences(base, run_identity(config, pairs[:-2]))
    assert len(subset) == 1 and subset[0].startswith("the training data"), subset
    assert identity_differences(base, run_identity(load_config(recipe, {"learning_rate": 0.02}), pairs)) == [
        "recipe field learning_rate (0.01 -> 0.02)"
    ]
    margin = [replace(pairs[0], margin=0.5), *pairs[1:]]
    assert identity_differences(base, run_identity(config, margin))[0].startswith("the training data")


def test_resume_matrix_through_emoreward_train(tiny_bert_dir, tmp_path, capsys):
    train = functools.partial(_train, capsys=capsys)
    settings = {
        "cv_folds": 0,
        "max_steps": 4,
        "per_device_train_batch_size": 4,
        "save_strategy": "steps",
        "save_steps": 2,
        "calibrate_tie_threshold": False,
    }
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, **settings)
    out = tmp_path / "out"
    first = train(recipe)
    assert first.returncode == 0, first.stderr[-4000:]
    reference = adapter(out)
    assert (out / "checkpoints" / "checkpoint-2" / "run_identity.json").exists()
    assert (out / "checkpoints" / "checkpoint-4" / "run_identity.json").exists()

    # same run, interrupted after step 2: resumes there, trains steps 3-4 only, same model
    shutil.rmtree(out / "checkpoints" / "checkpoint-4")
    shutil.rmtree(out / "model")
    resumed = train(recipe)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming the same run from" in resumed.stdout and "checkpoint-2" in resumed.stdout
    state = json.loads((out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4]  # none twice
    for key, value in adapter(out).items():
        np.testing.assert_allclose(value, reference[key], atol=1e-6, rtol=0, err_msg=key)

    # another run in the same folder: refused, naming what differs and the options
    pairs = synthetic_pairs(24)
    cases = {
        "data": (write_pairs_csv(tmp_path / "other.csv", synthetic_pairs(24, seed=9)), "the training data"),
        "labels": (
            write_pairs_csv(
                tmp_path / "flipped.csv", [replace(p, label={"1": "2", "2": "1"}[p.label]) for p in pairs]
            ),
            "the labels",
        ),
    }
    for name, (path, words) in cases.items():
        refused = train(recipe, "--set", f"train_file={path}")
        assert refused.returncode == 2, (name, refused.stderr[-2000:])
        assert words in refused.stderr and "--overwrite_output_dir" in refused.stderr, refused.stderr
        assert "--output-dir" in refused.stderr
    refused = train(recipe, "--set", "learning_rate=0.02")
    assert refused.returncode == 2
    assert "recipe field learning_rate (0.01 -> 0.02)" in refused.stderr and "--overwrite_output_dir" in refused.stderr
    assert adapter(out).keys() == reference.keys()  # nothing was touched

    # where a run writes and logs is not its identity: the same run, finished, is reused
    again = train(recipe, "--set", "logging_steps=3")
    assert again.returncode == 0 and "finished earlier" in again.stdout, again.stderr[-2000:]

    # --overwrite_output_dir starts over with the new recipe
    over = train(recipe, "--set", "learning_rate=0.02", "--overwrite_output_dir")
    assert over.returncode == 0, over.stderr[-4000:]
    assert "resuming" not in over.stdout
    changed = adapter(out)
    assert any(np.abs(changed[k] - reference[k]).max() > 1e-4 for k in reference)


def test_annotator_labels_are_part_of_the_identity(tiny_bert_dir, tmp_path):
    # one row per annotator: another annotator's label changes the run even where the majority label stays
    recipe = tiny_recipe(tmp_path, tiny_bert_dir)
    rows = "sample_id,description_1,description_2,label,annotator\n"
    rows += "v1,x,y,1,a\nv1,x,y,1,b\nv1,x,y,1,c\nv2,p,q,2,a\n"
    path = tmp_path / "annotated.csv"
    path.write_text(rows, encoding="utf-8")
    config, pairs = load_config(recipe), load_pairs(path)
    base = run_identity(config, pairs)
    changed = path.with_name("changed.csv")
    changed.write_text(rows.replace("v1,x,y,1,c", "v1,x,y,2,c"), encoding="utf-8")
    other = run_identity(config, load_pairs(changed))
    assert [p.label for p in load_pairs(changed)] == [p.label for p in pairs] == ["1", "2"]
    assert other["data"] == base["data"] and other["fingerprint"] != base["fingerprint"]
    assert identity_differences(base, other) == ["the labels (the same pairs with other preference labels)"]
    # pairs without annotators keep the identity of earlier versions: their labels alone
    plain = [replace(p, annotations=()) for p in pairs]
    assert run_identity(config, plain)["labels"] != base["labels"]


def test_backbone_replaced_in_place_is_named_by_its_path(tiny_bert_dir, tmp_path):
    # a local backbone's path leaves the recipe (its content is the identity): the message still names it
    from safetensors.torch import load_file, save_file

    backbone = Path(shutil.copytree(tiny_bert_dir, tmp_path / "backbone"))
    recipe = tiny_recipe(tmp_path, backbone)
    config, pairs = load_config(recipe), load_pairs(tmp_path / "train.csv")
    before = run_identity(config, pairs)
    assert "model_name_or_path" not in before["recipe"]
    weights = next(backbone.glob("*.safetensors"))
    save_file({k: v * 1.5 for k, v in load_file(weights).items()}, weights)
    after = run_identity(config, pairs)
    assert identity_differences(before, after) == [
        f"the backbone's weights ({backbone}: other content under that name)"
    ]
