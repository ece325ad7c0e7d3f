"""The full-size multimodal recipes (7B; Qwen3.5 9B) parse through the real parser and build their model class (tiny weights); the tiny
multimodal recipe (config_tiny.yaml) trains end to end on generated media through `emoreward train` and is
evaluated by the shared harness through `emoreward evaluate`; stratified k-fold cross-validation with resume;
prefix-shared scoring speed (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import TINY_RECIPE, build_tiny, write_media_set, write_video  # noqa: E402

from emoreward.models.base import RewardContext  # noqa: E402
from emoreward.models.precision import reward_tolerance  # noqa: E402
from emoreward.training.adapters import adapter_for  # noqa: E402
from emoreward.training.config import EmoRewardConfig, load_config  # noqa: E402


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SEVEN_B = {
    "qwen2.5-vl-7b": "qwen2.5-vl",
    "qwen2.5-omni-7b": "qwen2.5-omni-thinker",
    "qwen2-audio-7b": "qwen2-audio",
    "qwen3.5-9b": "qwen3.5",
}


@pytest.mark.parametrize("recipe", sorted(SEVEN_B))
def test_7b_recipe_parses_and_builds_its_model_class(recipe, tiny_backbone_dir, tmp_path):
    path = RECIPES / recipe / "rm" / "config_lora.yaml"
    config = load_config(path)  # bf16 unset: on where the GPU supports it, off on this CPU
    assert isinstance(config, EmoRewardConfig) and config.kind == "media" and config.backbone == SEVEN_B[recipe]
    assert config.use_peft and config.gradient_checkpointing and config.model_name_or_path.startswith("Qwen/")
    assert "bf16" not in yaml.safe_load(path.read_text())
    readme = (RECIPES / recipe / "rm" / "README.md").read_text()
    assert (
        f"accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/train_reward.py --config recipes/{recipe}/rm/config_lora.yaml"
        in readme
    )
    config.model_name_or_path = str(tiny_backbone_dir(config.backbone))
    model = adapter_for(config).build_model(config)
    import transformers

    expected = {
        "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration",
        "qwen2-audio": "Qwen2AudioForConditionalGeneration",
        "qwen2.5-omni-thinker": "Qwen2_5OmniThinkerForConditionalGeneration",
        "qwen3.5": "Qwen3_5ForConditionalGeneration",
    }[config.backbone]
    assert isinstance(model.module.backbone, getattr(transformers, expected))


def test_unknown_backbone_in_recipe_is_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("backbone: qwen9-vl\noutput_dir: x\n")
    with pytest.raises(ValueError, match="unknown backbone 'qwen9-vl'; registered"):
        load_config(path)
    path.write_text("backbone: qwen2.5-vl\nfpss: 3\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['fpss'\]"):
        load_config(path)


def train_tiny(tmp_path: Path, tiny_backbone_dir, *extra: str, n: int = 6, ties: int = 0) -> tuple[Path, Path]:
    """`emoreward train --config tests/multimodal/config_tiny.yaml` on a generated media set (in this process)."""
    from emoreward.cli import main

    pairs = write_media_set(tmp_path / "media", n, ties=ties)
    out = tmp_path / "out"
    argv = ["train", "--config", str(TINY_RECIPE), "--output-dir", str(out)]
    for key, value in {
        "model_name_or_path": tiny_backbone_dir("qwen2.5-omni-thinker"),
        "media_root": tmp_path / "media",
        "train_file": pairs,
    }.items():
        argv += ["--set", f"{key}={value}"]
    assert main([*argv, *extra]) == 0
    return out, pairs


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_tiny_recipe_trains_and_evaluates_with_the_harness(tiny_backbone_dir, tmp_path, capsys):
    """The acceptance lines: `emoreward train --config <tiny recipe>` on generated media, then `emoreward evaluate`
    on the saved model, both reporting through the shared harness."""
    from emoreward.cli import main

    out, pairs = train_tiny(tmp_path, tiny_backbone_dir, "--set", f"eval_file={tmp_path / 'media' / 'pairs.jsonl'}")
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    final = report["final"]
    assert final["exclusions"]["n_kept"] == 6
    losses = [e["loss"] for e in final["train_log"] if "loss" in e]
    assert len(losses) == 2 * 6 // 2  # 2 epochs of 3 steps
    judge = report["eval_file"]["evaluation"]["judge"]
    assert judge["swap_consistency"] == pytest.approx(100.0)  # a reward model is swap-consistent
    assert "length_baseline" in report["eval_file"]["evaluation"] and "| this judge | length baseline" in printed
    saved = Path(final["model_dir"])
    assert (saved / "README.md").exists() and (saved / "adapter_model.safetensors").exists()
    settings = json.loads((saved / "emoreward_config.json").read_text())
    assert settings["kind"] == "media" and settings["use_audio_in_video"] is True
    # `emoreward evaluate` on the saved model: the same rewards the training run reported
    assert main(["evaluate", "--model", str(saved), "--data", str(pairs), "--media-root", str(tmp_path / "media"),
                 "--output", str(tmp_path / "eval.json")]) == 0  # fmt: skip
    again = json.loads((tmp_path / "eval.json").read_text())
    assert again["judge"]["two_class"]["acc"] == pytest.approx(judge["two_class"]["acc"])
    # both reports record the precision they scored in; "the same reward" between them (reward_tolerance)
    trained = report["eval_file"]["evaluation"]
    first, second = trained["precision"]["dtype"], again["precision"]["dtype"]
    magnitude = float(np.max(np.abs(trained["pair_rewards"]["reward_1"])))
    atol = reward_tolerance(second, first, magnitude=magnitude)
    np.testing.assert_allclose(again["pair_rewards"]["reward_1"], trained["pair_rewards"]["reward_1"], atol=atol)


def test_cross_validation_runs_stratified_folds_and_resumes(tiny_backbone_dir, tmp_path, capsys):
    """`cv_folds: 3` on a multimodal recipe: three stratified folds through the text path's fold machinery, each
    judged on its held-out pairs by the shared harness, mean ± std in the report; a rerun reuses finished folds."""
    argv = ("--cv-folds", "3", "--set", "final_fit=false", "--set", "num_train_epochs=1")
    out, _ = train_tiny(tmp_path, tiny_backbone_dir, *argv, n=9, ties=3)
    first = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    cv = report["cross_validation"]
    assert cv["k"] == 3 and len(cv["folds"]) == 3 and "final" not in report
    # stratified: every held-out fold has one pair of each label (3 x "1"/"2"/"tie" split over 3 folds)
    assert [f["n_pairs"] for f in cv["folds"]] == [3, 3, 3]
    assert all(sorted(f["label_counts"].values()) == [1, 1, 1] for f in cv["folds"])
    assert all(f["n_train"] == 6 and f["exclusions"]["excluded"]["tie_dropped"] == 2 for f in cv["folds"])
    accs = [f["judge"]["three_class"]["acc"] for f in cv["folds"]]
    assert cv["summary"]["judge"]["three_class_acc"]["mean"] == pytest.approx(np.mean(accs))
    assert cv["summary"]["judge"]["three_class_acc"]["std"] == pytest.approx(np.std(accs))
    assert "3-fold cross-validation" in report["markdown"] and "±" in report["markdown"]
    assert (out / "confusion.png").exists()
    assert sorted(p.parent.name for p in (out / "cv").glob("fold*/finished.json")) == ["fold0", "fold1", "fold2"]
    assert not (out / "model").exists() and not list((out / "cv").glob("fold*/adapter_model.safetensors"))
    assert first.count("fold") >= 3
    # a rerun of the same recipe and data trains nothing: every fold is reused with its saved evaluation
    out2, _ = train_tiny(tmp_path, tiny_backbone_dir, *argv, n=9, ties=3)
    assert capsys.readouterr().out.count("finished earlier, reusing") == 3
    assert json.loads((out2 / "report.json").read_text())["cross_validation"]["summary"] == cv["summary"]


@pytest.mark.slow
def test_prefix_sharing_equals_naive_with_1000_media_tokens(tmp_path):
    """M = 10 descriptions of one video behind >= 1,000 media tokens: prefix-shared scores equal one-by-one
    scores within 1e-4. (Its speed-up is measured by benchmarks/benchmark_multimodal.py, not asserted here.)"""
    import torch

    from emoreward.data.context import MediaRef
    from emoreward.data.media import MediaOptions, load_sample_media
    from emoreward.models.media import MediaRewardModel

    pixels = 224 * 224
    path = build_tiny("qwen2.5-vl", tmp_path / "vl", min_pixels=pixels, max_pixels=pixels)
    write_video(tmp_path / "m" / "video" / "v.mp4", seconds=4.0, fps=8)
    options = MediaOptions(str(tmp_path / "m"), fps=8.0, max_frames=32)
    torch.manual_seed(0)
    model = MediaRewardModel.from_backbone("qwen2.5-vl", str(path), media_options=options, max_length=4096)
    media = load_sample_media("v", MediaRef(), options, need_video=True, need_audio=False)
    prefix = model.builder.encode_prefix(media, None)
    assert prefix.n_media_tokens >= 1000
    descriptions = [
        f"Description {i}: the man is {'calm' if i % 2 else 'tense'} and speaks slowly." for i in range(10)
    ]
    shared = model.score_prefix(prefix, descriptions, shared_prefix=True).rewards
    naive = model.score_prefix(prefix, descriptions, shared_prefix=False).rewards
    np.testing.assert_allclose(shared, naive, atol=1e-4)
    np.testing.assert_array_equal(shared, model.score_info(descriptions, RewardContext(None, decoded=media)).rewards)
    assert np.ptp(shared) > 0  # the descriptions are told apart


def test_a_media_recipe_counts_its_media_by_content(tiny_backbone_dir, tmp_path, capsys):
    """Relation (content identity, `run_identity.media_content`): a scalar multimodal recipe's clips count by content,
    as `resolve_paths` finds them under its backbone's senses. The media folder copied elsewhere (`media_root`
    changed, same clips) is the same run (the final model reused); one clip's content replaced under its own name is
    another run, refused naming the media, not a path field."""
    import shutil

    from emoreward.cli import main

    out, pairs = train_tiny(tmp_path, tiny_backbone_dir, "--set", "num_train_epochs=1", n=4)
    capsys.readouterr()
    argv = ["train", "--config", str(TINY_RECIPE), "--output-dir", str(out), "--set", "num_train_epochs=1"]
    argv += [
        "--set",
        f"model_name_or_path={tiny_backbone_dir('qwen2.5-omni-thinker')}",
        "--set",
        f"train_file={pairs}",
    ]
    copy = tmp_path / "media-copy"
    shutil.copytree(tmp_path / "media", copy)
    assert main([*argv, "--set", f"media_root={copy}"]) == 0
    assert "final model: finished earlier, reusing" in capsys.readouterr().out

    shutil.copyfile(tmp_path / "media" / "video" / "c1.mp4", tmp_path / "media" / "video" / "c0.mp4")
    assert main([*argv, "--set", f"media_root={tmp_path / 'media'}"]) == 2
    err = capsys.readouterr().err
    assert f"the media files the pairs read ({tmp_path / 'media'}: other content)" in err, err
    assert "recipe field media_root" not in err
