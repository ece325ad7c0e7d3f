"""The training fields a multimodal recipe inherits are honoured on the media path: the length-robust objectives
(`length_debias`), TRL's reward centering and padding to a multiple (the ones a media backbone cannot read are
refused: tests/test_architecture.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import write_media_set  # noqa: E402

from emoreward.data import load_pairs  # noqa: E402
from emoreward.models.base import RewardContext  # noqa: E402
from emoreward.training.config import EmoRewardConfig  # noqa: E402
from emoreward.training.pipeline import fit_reward_model  # noqa: E402


def media_config(tmp_path, model_dir, media, **changes) -> EmoRewardConfig:
    base = dict(
        output_dir=str(tmp_path / "out"), backbone="qwen2.5-omni-thinker", model_name_or_path=str(model_dir),
        media_root=str(media), fps=2.0, max_frames=4, use_audio_in_video=True, max_length=256, lora_r=4,
        lora_alpha=8, per_device_train_batch_size=2, learning_rate=5e-3, max_steps=3, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    return EmoRewardConfig(**{**base, **changes})


def test_disentangled_objective_and_centering_on_a_media_backbone(tiny_backbone_dir, tmp_path):
    media = tmp_path / "media"
    pairs = load_pairs(write_media_set(media, 6), media_by_id=True)  # clips read by sample id
    config = media_config(
        tmp_path,
        tiny_backbone_dir("qwen2.5-omni-thinker"),
        media,
        length_debias="disentangled",
        center_rewards_coefficient=0.01,
        pad_to_multiple_of=16,
    )
    fit = fit_reward_model(config, pairs, output_dir=tmp_path / "fit", run_name="t", save=False)
    model = fit.model
    assert model.settings.num_heads == 2 and model.module.score.weight.shape[0] == 2
    logged = [h for h in fit.log_history if "corr_lengthhead_length" in h]
    assert logged, "the ODIN terms must be computed and logged on the media path"
    # the value head's bias-free weight trained for both heads
    assert torch.all(model.module.score.weight.abs().sum(-1) > 0)
    # padding to a multiple of 16 (the collator's) does not change what is read: the reward is head 0
    context = RewardContext("oh", sample_id="c0")
    rewards = model.score(["She is joyful.", "She is gloomy."], context)
    assert rewards.shape == (2,) and np.all(np.isfinite(rewards))


def test_penalty_objective_sets_a_score_transform_on_a_media_backbone(tiny_backbone_dir, tmp_path):
    media = tmp_path / "media"
    pairs = load_pairs(write_media_set(media, 6), media_by_id=True)  # clips read by sample id
    config = media_config(tmp_path, tiny_backbone_dir("qwen2.5-omni-thinker"), media, length_debias="penalty")
    fit = fit_reward_model(config, pairs, output_dir=tmp_path / "fit", run_name="t", save=False)
    transform = fit.model.settings.score_transform
    assert transform["type"] == "length_penalty" and transform["std"] > 0
    # on the training descriptions (each scored with its own clip), reward and length are uncorrelated
    texts, contexts = [], []
    for p in pairs:
        for d in (p.description_1, p.description_2):
            texts.append(d)
            contexts.append(RewardContext.from_pair(p))
    rewards = fit.model.score(texts, contexts)
    raw = rewards + transform["alpha"] * (np.array([len(t) for t in texts]) - transform["mean"]) / transform["std"]
    saved, fit.model.settings.score_transform = fit.model.settings.score_transform, None
    np.testing.assert_allclose(fit.model.score(texts, contexts), raw, atol=1e-9)
    fit.model.settings.score_transform = saved
