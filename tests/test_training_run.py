"""The main job end to end on a tiny model: cross-validation report, saved model, W&B offline run, CLI."""

from __future__ import annotations

import json
import struct

import pytest
import yaml
from _helpers import synthetic_pairs

from emoreward.cli import main
from emoreward.training.config import load_config
from emoreward.training.pipeline import run_training


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


def test_offline_wandb_run_holds_training_and_harness_metrics(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B key
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, report_to=["wandb"], hub_token="hf_SECRET_do_not_log")
    report = run_training(load_config(recipe), log=lambda *_: None)
    assert report["wandb_mode"] == "offline"
    runs = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 3  # two folds and the final fit
    keys, raw = set(), b""
    for run in runs:
        raw += run.read_bytes()
        for record in read_wandb_records(run):
            if record.WhichOneof("record_type") == "history":
                keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    assert {"train/loss", "train/accuracy", "train/margin", "train/mean_reward"} <= keys
    assert {"harness/judge/two_class_waf", "harness/length_baseline/two_class_acc"} <= keys
    assert b"hf_SECRET_do_not_log" not in raw


def test_main_job_report_and_evaluate_cli(tiny_bert_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_bert_dir)
    assert main(["train", "--config", str(recipe), "--set", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert "2-fold cross-validation on 24 pairs" in out and "length baseline" in out and "±" in out
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
    assert report["recipe"]["seed"] == 3
    assert (tmp_path / "out" / "confusion.png").stat().st_size > 1000
    model_dir = tmp_path / "out" / "model"
    assert "length baseline" in (model_dir / "README.md").read_text()

    unseen = write_pairs_csv(tmp_path / "unseen.csv", synthetic_pairs(10, seed=7))
    assert (
        main(["evaluate", "--model", str(model_dir), "--data", str(unseen), "--output", str(tmp_path / "ev.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "2-class WAF" in out and "length baseline" in out
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["n_pairs"] == 10 and ev["judge"]["swap_consistency"] == 100.0
    assert (tmp_path / "ev.md").exists() and (tmp_path / "ev.png").exists()

    # exporting into the model's own directory is refused before anything is written
    before = sorted(p.name for p in model_dir.iterdir())
    assert main(["export", "--model", str(model_dir), "--output", str(model_dir)]) == 2
    assert "would overwrite it" in capsys.readouterr().err
    assert sorted(p.name for p in model_dir.iterdir()) == before

    # an interrupted or repeated run reuses finished folds and the finished final model
    (tmp_path / "out" / "cv" / "fold1" / "finished.json").unlink()
    assert main(["train", "--config", str(recipe), "--set", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished earlier") == 2  # fold 0 and the final model; fold 1 is trained again
    again = json.loads((tmp_path / "out" / "report.json").read_text())
    assert again["cross_validation"]["summary"] == summary


def test_cli_refuses_secrets_on_the_command_line(capsys):
    assert main(["train", "--set", "hub_token=hf_abc"]) == 2
    assert "through the environment" in capsys.readouterr().err
    assert main(["train", "--set", "noequals"]) == 2


def test_cli_reports_bad_data_with_file_row_field(tiny_bert_dir, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,maybe\n")
    assert main(["evaluate", "--model", str(tmp_path), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, row 2, field 'preference': unknown label 'maybe'" in err


@pytest.mark.parametrize("command", [[], ["train"], ["evaluate"], ["judge"], ["rank"], ["serve"], ["export"]])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: emoreward" in capsys.readouterr().out
