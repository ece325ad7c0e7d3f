"""The 7B multimodal recipes parse through the real parser and build their model class (tiny weights); a tiny
multimodal recipe trains end to end on generated media and is evaluated by the shared harness; prefix-shared
scoring speed (slow)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from conftest import build_tiny, write_video, write_wav  # noqa: E402

from emoreward.training.multimodal import (  # noqa: E402
    MultimodalRewardConfig,
    build_model,
    evaluate_multimodal_model,
    is_multimodal_recipe,
    load_multimodal_config,
    run_multimodal_training,
)


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SEVEN_B = {"qwen2.5-vl-7b": "qwen2.5-vl", "qwen2.5-omni-7b": "qwen2.5-omni-thinker", "qwen2-audio-7b": "qwen2-audio"}


@pytest.mark.parametrize("recipe", sorted(SEVEN_B))
def test_7b_recipe_parses_and_builds_its_model_class(recipe, tiny_backbone_dir, tmp_path):
    path = RECIPES / recipe / "rm" / "config_lora.yaml"
    assert is_multimodal_recipe(path)
    config = load_multimodal_config(path)  # bf16 unset: on where the GPU supports it, off on this CPU
    assert isinstance(config, MultimodalRewardConfig) and config.backbone == SEVEN_B[recipe]
    assert config.use_peft and config.gradient_checkpointing and config.model_name_or_path.startswith("Qwen/")
    assert "bf16" not in yaml.safe_load(path.read_text())
    readme = (RECIPES / recipe / "rm" / "README.md").read_text()
    assert (
        f"accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/train_reward.py --config recipes/{recipe}/rm/config_lora.yaml"
        in readme
    )
    config.model_name_or_path = str(tiny_backbone_dir(config.backbone))
    model = build_model(config)
    import transformers

    expected = {
        "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration",
        "qwen2-audio": "Qwen2AudioForConditionalGeneration",
        "qwen2.5-omni-thinker": "Qwen2_5OmniThinkerForConditionalGeneration",
    }[config.backbone]
    assert isinstance(model.module.backbone, getattr(transformers, expected))


def test_unknown_backbone_in_recipe_is_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("backbone: qwen9-vl\noutput_dir: x\n")
    with pytest.raises(ValueError, match="unknown multimodal backbone 'qwen9-vl'; available"):
        load_multimodal_config(path)
    path.write_text("backbone: qwen2.5-vl\nfpss: 3\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['fpss'\]"):
        load_multimodal_config(path)


def write_media_set(root: Path, n: int) -> Path:
    rows = []
    good = ["joyful and smiling warmly", "cheerful with a bright laugh"]
    bad = ["gloomy and frowning", "sullen with a flat voice"]
    for i in range(n):
        write_wav(root / "audio" / f"c{i}.wav", seconds=1.0, freq=140 + 25 * i)
        d1, d2, label = f"She is {good[i % 2]}.", f"She is {bad[i % 2]}.", "1"
        if i % 2:
            d1, d2, label = d2, d1, "2"
        rows.append({"sample_id": f"c{i}", "description_1": d1, "description_2": d2, "label": label, "subtitle": "oh"})
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "pairs.jsonl"


def test_tiny_recipe_trains_and_evaluates_with_the_harness(tiny_backbone_dir, tmp_path):
    data = write_media_set(tmp_path / "media", 4)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "backbone": "qwen2-audio", "model_name_or_path": str(tiny_backbone_dir("qwen2-audio")),
        "media_root": str(tmp_path / "media"), "train_file": str(data), "eval_file": str(data),
        "lora_r": 4, "lora_alpha": 8, "max_length": 192, "per_device_train_batch_size": 4, "num_train_epochs": 1,
        "learning_rate": 5.0e-3, "logging_steps": 1, "save_strategy": "no", "report_to": [], "use_cpu": True,
        "bf16": False, "disable_tqdm": True, "output_dir": str(tmp_path / "out"),
    }))  # fmt: skip
    config = load_multimodal_config(recipe)
    report = run_multimodal_training(config, log=lambda *_: None)
    assert report["exclusions"]["n_kept"] == 4
    judge = report["eval_file"]["evaluation"]["judge"]
    assert judge["swap_consistency"] == pytest.approx(100.0)  # a reward model is swap-consistent
    saved = Path(report["model_dir"])
    assert (saved / "README.md").exists() and (saved / "adapter_model.safetensors").exists()
    again = evaluate_multimodal_model(
        saved,
        __import__("emoreward.data", fromlist=["load_pairs"]).load_pairs(data),
        media_root=str(tmp_path / "media"),
    )
    assert again["judge"]["two_class"]["acc"] == pytest.approx(judge["two_class"]["acc"])


@pytest.mark.slow
def test_prefix_sharing_is_faster_with_1000_media_tokens(tmp_path):
    """M = 10 descriptions of one video, >= 1,000 media tokens: prefix sharing >= 3x faster than one by one."""
    import torch

    from emoreward.data.media import MediaOptions, load_sample_media
    from emoreward.data.pairs import MediaRef
    from emoreward.models.multimodal import MultimodalEmoRewardModel

    pixels = 224 * 224
    path = build_tiny("qwen2.5-vl", tmp_path / "vl", min_pixels=pixels, max_pixels=pixels)
    write_video(tmp_path / "m" / "video" / "v.mp4", seconds=4.0, fps=8)
    options = MediaOptions(str(tmp_path / "m"), fps=8.0, max_frames=32)
    torch.manual_seed(0)
    model = MultimodalEmoRewardModel.from_backbone("qwen2.5-vl", str(path), media_options=options, max_length=4096)
    media = load_sample_media("v", MediaRef(), options, need_video=True, need_audio=False)
    n_media = model.builder.encode_prefix(media, None).n_media_tokens
    assert n_media >= 1000
    descriptions = [
        f"Description {i}: the man is {'calm' if i % 2 else 'tense'} and speaks slowly." for i in range(10)
    ]
    model.score_descriptions(media, None, descriptions[:2])  # warm-up
    timings = {}
    for shared in (True, False):
        start = time.perf_counter()
        scores = model.score_descriptions(media, None, descriptions, shared_prefix=shared)
        timings[shared] = (time.perf_counter() - start, scores)
    np.testing.assert_allclose(timings[True][1], timings[False][1], atol=1e-4)
    speedup = timings[False][0] / timings[True][0]
    print(f"media tokens {n_media}: shared {timings[True][0]:.3f}s, naive {timings[False][0]:.3f}s, x{speedup:.1f}")
    assert speedup >= 3.0
