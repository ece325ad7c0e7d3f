"""W&B from the main job, offline (no API key): fold runs and the final fit in one group with job_type fold /
final, run names and tags, the full resolved recipe without secrets, training metrics, the harness metrics as a
table, confusion-matrix and reward-histogram images, the final model as an artifact (`wandb_log_model`), WANDB_*
variables respected, quiet console; and cross-validation folds never pick a checkpoint on their own test fold."""

from __future__ import annotations

import json

import pytest
from _helpers import synthetic_pairs
from test_training_run import read_wandb_records, tiny_recipe, write_pairs_csv

from emoreward.data import load_pairs
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


def test_wandb_offline_run_names_tags_config_table_images(fresh_wandb, tiny_bert_dir, tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B key
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_PROJECT", "my-emo-project")  # the user's WANDB_* win over the recipe
    monkeypatch.setenv("WANDB_TAGS", "my-tag")
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # the job keeps W&B quiet itself
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    monkeypatch.delenv("WANDB_JOB_TYPE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_do_not_log")  # a secret in the environment never reaches W&B
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
        wandb_log_model=True,
        eval_file=str(write_pairs_csv(tmp_path / "eval.csv", synthetic_pairs(12, seed=5))),
        eval_strategy="steps",
        eval_steps=2,
        max_steps=2,
    )
    lines = []
    report = run_training(load_config(recipe), log=lines.append)
    assert report["wandb_mode"] == "offline"
    group = run_module.wandb_group(load_config(recipe), load_pairs(tmp_path / "train.csv"))
    assert group.startswith("emo-run-") and len(group) == len("emo-run-") + 8
    assert lines[0].startswith("emoreward train: text backbone")  # the job's first line, once its inputs are checked
    assert lines[2] == (
        f"W&B (offline): project my-emo-project, group {group}, files under {tmp_path / 'wandb-dir'} "
        "(upload later with `wandb sync`)"
    )
    assert "W&B: model directory logged as artifact emo-run-model:final" in lines
    console = capfd.readouterr()
    assert "wandb:" not in console.out + console.err  # no banner, history or sync hints per run

    # folds train without evaluation during training (their test fold must not pick a checkpoint); the final
    # fit evaluates on the held-out file
    (fold0, _), (fold1, _), (final, final_eval) = seen
    assert fold0 == fold1 == "no" and final == "steps" and len(final_eval) == 12

    # wandb's service process writes the runs' transaction logs on its own: `wandb.finish()` can return before the
    # last records (the final run's model artifact) are on disk. Shutting the service down, as a command's exit
    # does, waits for them
    import wandb

    wandb.teardown()
    run_dirs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 3  # two folds and the final fit
    names, tags, projects, keys, raw, config, groups, job_types, artifacts = [], [], set(), [], b"", {}, [], [], []
    for run_dir in run_dirs:
        (log,) = run_dir.glob("run-*.wandb")
        raw += log.read_bytes()
        run_keys, run_tags, run_names, run_groups, run_job_types = set(), set(), set(), set(), set()
        for record in read_wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_names.add(record.run.display_name)
                run_tags |= set(record.run.tags)
                projects.add(record.run.project)
                run_groups.add(record.run.run_group)
                run_job_types.add(record.run.job_type)
            elif kind == "artifact":
                artifacts.append((run_dir, record.artifact))
            elif kind == "history":
                run_keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
            elif kind == "config":
                config.update({item.key: item.value_json for item in record.config.update})
        tags.append(run_tags)
        names.append(run_names)
        groups.append(run_groups)
        job_types.append(run_job_types)
        keys.append(run_keys)
        assert len(list((run_dir / "files" / "media" / "images").rglob("*.png"))) == 2, run_dir
        assert list((run_dir / "files" / "media" / "table").rglob("*.table.json")), run_dir
    assert names == [{"emo-run-fold0"}, {"emo-run-fold1"}, {"emo-run"}]
    assert projects == {"my-emo-project"}
    assert groups == [{group}] * 3 and job_types == [{"fold"}, {"fold"}, {"final"}]
    # the final model as an artifact of type "model" on the final-fit run, with the adapter and value head
    ((artifact_run, artifact),) = [(r, a) for r, a in artifacts if a.type == "model"]
    assert artifact_run == run_dirs[2] and artifact.name == "emo-run-model"
    assert "final" in artifact.aliases
    manifest = {entry.path for entry in artifact.manifest.contents}
    if not manifest:  # large manifests go to a file beside the run
        manifest = set(json.loads(open(artifact.manifest.manifest_file_path).read())["contents"])
    assert {"adapter_model.safetensors", "adapter_config.json", "emoreward_config.json"} <= manifest
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
    for run_keys in keys:  # TRL's training metrics
        assert {"train/loss", "train/accuracy", "train/margin", "train/mean_reward"} <= run_keys
    # the full resolved recipe, secrets masked
    for field in ("ties", "cv_folds", "model_name_or_path", "lora_r", "max_length", "two_class_tie_policy"):
        assert field in config, field
    assert json.loads(config["lora_r"]) == 4
    assert json.loads(config["hub_token"]) in (None, "<HUB_TOKEN>")
    assert b"hf_SECRET_do_not_log" not in raw
    for path in [*(tmp_path / "wandb-dir").rglob("*"), *(tmp_path / "out").rglob("*")]:
        if path.is_file():
            assert b"hf_SECRET_do_not_log" not in path.read_bytes(), path


def test_a_judge_recipe_logs_the_same_run_layout(fresh_wandb, tmp_path, monkeypatch):
    """A judge recipe's TRL trainers report to the runs the reward pipeline opens (`training.tracking`): one per
    fold (job_type fold) and one for the final fit (job_type final) in the run identity's group, TRL's SFT loss and
    the harness metrics (with the controlled errors' table) on each, the resolved recipe as config, no secret."""
    from test_trained_judge import build_chat_model, recipe, write_pairs

    from emoreward.training.config import resolve_config
    from emoreward.training.judge import run_judge_training
    from emoreward.training.judge_config import JudgeTrainConfig

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B key, offline
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    for name in ("WANDB_PROJECT", "WANDB_TAGS", "WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_SILENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_do_not_log")
    base = build_chat_model(tmp_path / "base")
    path = recipe(
        tmp_path, base, cv_folds=2, max_steps=2, train_file=str(write_pairs(tmp_path)), report_to=["wandb"],
        run_name="judge-run", wandb_project="judge-project",
    )  # fmt: skip
    config = resolve_config(path, config_class=JudgeTrainConfig)
    lines = []
    report = run_judge_training(config, log=lines.append)
    assert report["wandb_mode"] == "offline"
    group = run_module.wandb_group(config, load_pairs(tmp_path / "train.jsonl"))
    assert f"W&B (offline): project judge-project, group {group}, files under {tmp_path / 'wandb-dir'}" in lines[2]
    import wandb

    wandb.teardown()  # waits for the service's last records
    run_dirs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 3  # two folds and the final fit
    names, groups, job_types, keys, tags, raw, config_keys = [], [], [], [], [], b"", set()
    for run_dir in run_dirs:
        (log,) = run_dir.glob("run-*.wandb")
        raw += log.read_bytes()
        run_keys, run_tags, run_names, run_groups, run_job_types = set(), set(), set(), set(), set()
        for record in read_wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":  # a run's record, once per update
                run_names.add(record.run.display_name)
                run_groups.add(record.run.run_group)
                run_job_types.add(record.run.job_type)
                run_tags |= set(record.run.tags)
            elif kind == "history":
                run_keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
            elif kind == "config":
                config_keys |= {item.key for item in record.config.update}
        keys.append(run_keys)
        names.append(run_names)
        groups.append(run_groups)
        job_types.append(run_job_types)
        tags.append(run_tags)
    assert names == [{"judge-run-fold0"}, {"judge-run-fold1"}, {"judge-run"}]
    assert groups == [{group}] * 3 and job_types == [{"fold"}, {"fold"}, {"final"}]
    for run_tags, kind in zip(tags, ["cv-fold", "cv-fold", "final-fit"]):
        assert {"emoreward", kind, "ties:train", "world_size:1", "backbone:base"} <= run_tags
    for run_keys in keys:
        assert "train/loss" in run_keys  # TRL's SFT loss
    for run_keys in keys[:2]:
        assert "harness/judge/two_class_waf" in run_keys and "harness/metrics/_type" in run_keys
    assert {"dpo_epochs", "cv_folds", "lora_r", "prompts"} <= config_keys
    assert b"hf_SECRET_do_not_log" not in raw
