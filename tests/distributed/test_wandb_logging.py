"""W&B from the main job, offline (no API key): run names and tags, the full resolved recipe without secrets,
the harness metrics as a table, confusion-matrix and reward-histogram images, WANDB_* variables respected; and
cross-validation folds never pick a checkpoint on their own test fold."""

from __future__ import annotations

import json

import pytest
from _helpers import synthetic_pairs
from test_training_run import read_wandb_records, tiny_recipe, write_pairs_csv

from emoreward.training import pipeline as run_module
from emoreward.training.config import load_config
from emoreward.training.pipeline import run_training


@pytest.fixture
def fresh_wandb():
    """wandb reads WANDB_* once per process (its `wandb.setup` singleton): start and leave it fresh, so this
    test's variables neither come from nor leak into other tests."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def test_wandb_offline_run_names_tags_config_table_images(fresh_wandb, tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B key
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_PROJECT", "my-emo-project")  # the user's WANDB_* win over the recipe
    monkeypatch.setenv("WANDB_TAGS", "my-tag")
    monkeypatch.setenv("WANDB_SILENT", "true")
    seen = []
    base = run_module.EmoRewardTrainer

    class Spy(base):
        def __init__(self, *args, **kwargs):
            seen.append((kwargs["args"].eval_strategy, kwargs["eval_dataset"]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(run_module, "EmoRewardTrainer", Spy)
    recipe = tiny_recipe(
        tmp_path,
        tiny_bert_dir,
        report_to=["wandb"],
        run_name="emo-run",
        wandb_project="recipe-project",
        hub_token="hf_SECRET_do_not_log",
        eval_file=str(write_pairs_csv(tmp_path / "eval.csv", synthetic_pairs(12, seed=5))),
        eval_strategy="steps",
        eval_steps=2,
        max_steps=2,
    )
    report = run_training(load_config(recipe), log=lambda *_: None)
    assert report["wandb_mode"] == "offline"

    # folds train without evaluation during training (their test fold must not pick a checkpoint); the final
    # fit evaluates on the held-out file
    (fold0, _), (fold1, _), (final, final_eval) = seen
    assert fold0 == fold1 == "no" and final == "steps" and len(final_eval) == 12

    run_dirs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 3  # two folds and the final fit
    names, tags, projects, keys, raw, config = [], [], set(), [], b"", {}
    for run_dir in run_dirs:
        (log,) = run_dir.glob("run-*.wandb")
        raw += log.read_bytes()
        run_keys, run_tags, run_names = set(), set(), set()
        for record in read_wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_names.add(record.run.display_name)
                run_tags |= set(record.run.tags)
                projects.add(record.run.project)
            elif kind == "history":
                run_keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
            elif kind == "config":
                config.update({item.key: item.value_json for item in record.config.update})
        tags.append(run_tags)
        names.append(run_names)
        keys.append(run_keys)
        assert len(list((run_dir / "files" / "media" / "images").rglob("*.png"))) == 2, run_dir
        assert list((run_dir / "files" / "media" / "table").rglob("*.table.json")), run_dir
    assert names == [{"emo-run-fold0"}, {"emo-run-fold1"}, {"emo-run"}]
    assert projects == {"my-emo-project"}
    for run_tags, kind in zip(tags, ["cv-fold", "cv-fold", "final-fit"]):
        assert {"my-tag", "emoreward", kind, "ties:drop", "world_size:1"} <= run_tags
        assert any(t.startswith("backbone:") for t in run_tags)
    # the harness metrics: scalars, a table, and the two plots, per fold and for the held-out file
    for run_keys, prefix in zip(keys, ["harness", "harness", "eval_file"]):
        for media_key in ("metrics", "confusion_matrix", "reward_histogram"):
            # media are logged as nested values: `<key>/_type`, `<key>/path`, ...
            assert f"{prefix}/{media_key}/_type" in run_keys, (prefix, media_key)
        assert f"{prefix}/judge/two_class_waf" in run_keys
    assert "eval/accuracy" in keys[2]  # eval reward accuracy during the final fit
    # the full resolved recipe, secrets masked
    for field in ("ties", "cv_folds", "model_name_or_path", "lora_r", "max_length", "two_class_tie_policy"):
        assert field in config, field
    assert json.loads(config["lora_r"]) == 4
    assert b"hf_SECRET_do_not_log" not in raw
    for run_dir in run_dirs:
        for path in run_dir.rglob("*"):
            if path.is_file():
                assert b"hf_SECRET_do_not_log" not in path.read_bytes(), path
