"""Multimodal reward models on tiny random-weight Qwen2.5-VL / Qwen2.5-Omni thinker / Qwen2-Audio backbones:
value head, rewards, prefix-shared scoring, training, save / load in a fresh process, merged export, bad media,
truncation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from emoreward.data import PreferencePair
from emoreward.data.context import MediaRef
from emoreward.data.media import MediaError, MediaOptions, load_sample_media


av = pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import write_video, write_wav  # noqa: E402

from emoreward.models.backbones import get_backbone, lora_target_regex  # noqa: E402
from emoreward.models.base import RewardContext, load_reward_model  # noqa: E402
from emoreward.models.media import MediaRewardModel  # noqa: E402
from emoreward.models.precision import dtype_name  # noqa: E402


FAMILIES = ["qwen2.5-vl", "qwen2.5-omni-thinker", "qwen2-audio"]
GOOD = ["joyful and smiling warmly", "cheerful with a bright laugh", "delighted, eyes shining"]
BAD = ["gloomy and frowning", "sullen with a flat voice", "miserable, eyes downcast"]


@pytest.fixture(scope="module")
def media_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mer2025")
    for i in range(4):
        write_video(root / "video" / f"s{i}.mp4", seconds=1.0, seed=i, freq=150 + 30 * i)
        write_wav(root / "audio" / f"s{i}.wav", seconds=1.0, freq=150 + 30 * i)
    return root


def lora(r=4):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, init_lora_weights=False)


def make(family, tiny_backbone_dir, media_root, **kw):
    torch.manual_seed(0)
    options = MediaOptions(str(media_root), fps=2.0, max_frames=4, use_audio_in_video=family == "qwen2.5-omni-thinker")
    return MediaRewardModel.from_backbone(
        family, str(tiny_backbone_dir(family)), lora_config=kw.pop("lora_config", lora()), media_options=options,
        max_length=kw.pop("max_length", 256), **kw,
    )  # fmt: skip


def sample_media(model, sample_id, media_root):
    b = model.builder
    return load_sample_media(sample_id, MediaRef(), model.options, need_video=b.needs_video, need_audio=b.needs_audio)


def pairs(n=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        good, bad = f"The woman is {GOOD[i % 3]}.", f"The woman is {BAD[(i + 1) % 3]}."
        first_good = rng.random() < 0.5
        d1, d2 = (good, bad) if first_good else (bad, good)
        out.append(PreferencePair(f"s{i % 4}", d1, d2, "1" if first_good else "2", media=MediaRef(subtitle="hi")))
    return out


def test_unknown_backbone_lists_available():
    with pytest.raises(ValueError, match=r"qwen2\.5-vl.*") as err:
        get_backbone("qwen3-vl")
    assert "qwen2-audio" in str(err.value) and "qwen2.5-omni-thinker" in str(err.value)
    assert get_backbone("qwen2.5-omni").name == "qwen2.5-omni-thinker"


@pytest.mark.parametrize("family", FAMILIES)
def test_value_head_rewards_and_prefix_sharing(family, tiny_backbone_dir, media_root):
    model = make(family, tiny_backbone_dir, media_root)
    module = model.module
    hidden = module.backbone.config.get_text_config().hidden_size
    assert module.score.weight.shape == (1, hidden) and module.score.bias is None
    # LoRA only on the language model; encoders frozen, value head trainable
    trainable = [n for n, p in model.model.named_parameters() if p.requires_grad]
    assert trainable and all("language_model" in n or "score" in n for n in trainable)
    assert not any(".visual." in n or "audio_tower" in n for n in trainable)
    media = sample_media(model, "s1", media_root)
    descriptions = ["She is happy and smiling.", "He looks angry, shouting loudly at someone nearby.", "Sad."]
    prefix = model.builder.encode_prefix(media, "hello")
    assert prefix.n_media_tokens > 2
    # forward on a batch: value-head outputs of shape (batch, num_heads), read at the last non-pad token
    from emoreward.models.media import collate_media, pad_sequences

    seqs = [
        prefix.input_ids + model.builder.encode_suffix(d, len(prefix.input_ids), truncate=True)[0]
        for d in descriptions
    ]
    ids, mask = pad_sequences(seqs, model.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model.model(ids, mask, **collate_media([prefix.media] * 3))
    assert logits.shape == (3, 1)
    rewards = logits[:, 0]
    naive = model.score_info(descriptions, RewardContext("hello", decoded=media), shared_prefix=False).rewards
    shared = model.score_info(
        descriptions, RewardContext("hello", decoded=media), shared_prefix=True, batch_size=2
    ).rewards
    np.testing.assert_allclose(shared, naive, atol=1e-4, rtol=0)
    np.testing.assert_allclose(rewards.numpy(), naive, atol=1e-4, rtol=0)  # batched + padded == one by one
    assert len(set(np.round(naive, 6))) == 3


def test_lora_regex_excludes_encoders():
    import re

    regex = lora_target_regex(get_backbone("qwen2.5-omni-thinker"))
    assert re.fullmatch(regex, "backbone.model.language_model.layers.0.self_attn.q_proj")
    assert not re.fullmatch(regex, "backbone.model.audio_tower.layers.0.self_attn.q_proj")
    assert not re.fullmatch(regex, "backbone.model.visual.blocks.0.mlp.gate_proj")


def test_media_errors_name_sample_and_file(tmp_path, media_root):
    options = MediaOptions(str(tmp_path))
    with pytest.raises(MediaError, match=r"sample 'x1'.*video/x1\.mp4.*not found"):
        load_sample_media("x1", MediaRef(), options, need_video=True, need_audio=False)
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "x2.wav").write_bytes(b"")
    with pytest.raises(MediaError, match=r"sample 'x2'.*x2\.wav.*empty"):
        load_sample_media("x2", MediaRef(), options, need_video=False, need_audio=True)
    (tmp_path / "audio" / "x3.wav").write_bytes(b"not a wav file at all")
    with pytest.raises(MediaError, match=r"sample 'x3'.*x3\.wav.*(decode|readable)"):
        load_sample_media("x3", MediaRef(), options, need_video=False, need_audio=True)
    silent = write_video(tmp_path / "video" / "x4.mp4", audio=False)
    with pytest.raises(MediaError, match=r"sample 'x4'.*x4\.mp4.*no audio stream"):
        load_sample_media(
            "x4", MediaRef(), MediaOptions(str(tmp_path), use_audio_in_video=True), need_video=False, need_audio=True
        )
    assert silent.exists()
    with pytest.raises(MediaError, match="no media_root"):
        load_sample_media("x5", MediaRef(), MediaOptions(), need_video=True, need_audio=False)


def test_frame_sampling_follows_fps_and_cap(tmp_path):
    from emoreward.data.media import load_frames

    video = write_video(tmp_path / "v.mp4", seconds=2.0, fps=8)
    frames, fps = load_frames("v", video, fps=2.0, max_frames=16)
    assert frames.shape == (4, 64, 64, 3) and fps == pytest.approx(2.0)
    frames, _ = load_frames("v", video, fps=8.0, max_frames=6)
    assert frames.shape[0] == 6


def test_dataset_drops_and_counts_bad_media_and_long_prefixes(tiny_backbone_dir, media_root, tmp_path):
    from emoreward.training.preprocess import build_media_dataset

    model = make("qwen2-audio", tiny_backbone_dir, media_root)
    data = pairs(4)
    broken = PreferencePair("missing", "Happy.", "Sad.", "1")
    with pytest.raises(MediaError, match="sample 'missing'.*audio/missing.wav"):
        build_media_dataset([*data, broken], model)
    dataset, report = build_media_dataset([*data, broken], model, media_errors="skip")
    assert report.counts["media_error"] == 1 and len(dataset) == 4 and "missing" in report.errors
    # every row: chosen and rejected share the same media prefix
    for row in dataset:
        n = row["prefix_length"]
        assert row["chosen_ids"][:n] == row["rejected_ids"][:n]
    # a max_length that only the media prefix fills: pairs dropped and counted, never cut inside the media span
    n_prefix = dataset[0]["prefix_length"]
    model.builder.max_length = n_prefix
    with pytest.raises(ValueError, match="no pair is left"):
        build_media_dataset(data, model, truncation="truncate")
    model.builder.max_length = n_prefix + 6
    dataset, report = build_media_dataset(data, model, truncation="truncate")
    assert all(len(r["chosen_ids"]) <= n_prefix + 6 for r in dataset)
    audio_id = model.module.config.audio_token_id
    for row in dataset:  # the whole audio span survives truncation
        full = model.builder.encode_prefix(sample_media(model, row["sample_id"], media_root), "hi").input_ids
        assert row["chosen_ids"][: row["prefix_length"]] == full
        assert row["chosen_ids"].count(audio_id) == full.count(audio_id)


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_train_save_reload_fresh_process_and_merge(tiny_backbone_dir, media_root, tmp_path):
    from tiny_media import media_trainer

    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.preprocess import build_media_dataset

    family = "qwen2.5-vl"
    model = make(family, tiny_backbone_dir, media_root)
    data = pairs(8)
    config = EmoRewardConfig(
        output_dir=str(tmp_path / "out"), backbone=family, model_name_or_path=str(tiny_backbone_dir(family)),
        media_root=str(media_root), fps=2.0, max_frames=4, max_length=256, per_device_train_batch_size=4,
        learning_rate=5e-3, num_train_epochs=6, logging_steps=1, save_strategy="no", report_to=[],
        gradient_checkpointing=True, ties="rao-kupper", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    dataset, _ = build_media_dataset(data, model, ties="rao-kupper")
    before = model.trainable_parameters()
    frozen = {n: p.detach().clone() for n, p in model.module.backbone.model.visual.named_parameters()}
    trainer = media_trainer(model, config, dataset)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert {"accuracy", "margin", "mean_reward"} <= set(logs[-1])
    after = model.trainable_parameters()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("lora" in n for n in changed) and any("score" in n for n in changed)
    assert all(torch.equal(p, frozen[n]) for n, p in model.module.backbone.model.visual.named_parameters())
    model.model.eval()
    descriptions = ["The woman is joyful and smiling warmly.", "The woman is gloomy and frowning."]
    context = RewardContext("hi", sample_id="s2")  # media read from <media_root>/video/s2.mp4
    scores = model.score(descriptions, context)
    decoded = RewardContext("hi", sample_id="s2", decoded=sample_media(model, "s2", media_root))
    np.testing.assert_array_equal(model.score(descriptions, decoded), scores)
    saved = model.save_pretrained(tmp_path / "model")
    assert {"adapter_model.safetensors", "emoreward_config.json", "README.md"} <= {p.name for p in saved.iterdir()}
    assert "qwen2.5-vl" in (saved / "README.md").read_text()
    assert json.loads((saved / "emoreward_config.json").read_text())["kind"] == "media"
    script = (
        "import json\n"
        "from emoreward.models import RewardContext, load_reward_model\n"
        f"m = load_reward_model({str(saved)!r}, media_root={str(media_root)!r}, dtype={dtype_name(model.dtype)!r})\n"
        f"print(json.dumps(m.score({descriptions!r}, RewardContext('hi', sample_id='s2')).tolist()))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a shared 2-core machine: see conftest.one_torch_thread
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    reloaded = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_array_equal(np.array(reloaded), scores)
    # like with like: the reloads score in the trained model's precision (float32), not what "auto" picks here
    merged = load_reward_model(model.export_merged(tmp_path / "merged"), media_root=str(media_root), dtype=model.dtype)
    assert isinstance(merged, MediaRewardModel)
    assert merged.settings.merged and not hasattr(merged.model, "peft_config")
    np.testing.assert_allclose(merged.score(descriptions, context), scores, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2.5-omni-thinker", "qwen2-audio"])
def test_training_changes_lora_and_head_every_family(family, tiny_backbone_dir, media_root, tmp_path):
    from tiny_media import media_trainer

    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.preprocess import build_media_dataset

    model = make(family, tiny_backbone_dir, media_root, train_projector=True)
    config = EmoRewardConfig(
        output_dir=str(tmp_path), backbone=family, model_name_or_path=str(tiny_backbone_dir(family)),
        media_root=str(media_root), max_frames=4, max_length=256, per_device_train_batch_size=4, learning_rate=5e-3,
        num_train_epochs=4, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        use_audio_in_video=family == "qwen2.5-omni-thinker",
    )  # fmt: skip
    dataset, _ = build_media_dataset(pairs(8), model)
    before = model.trainable_parameters()
    encoder = "audio_tower"
    frozen = {n: p.detach().clone() for n, p in model.module.named_parameters() if encoder in n and ".proj." not in n}
    trainer = media_trainer(model, config, dataset)
    trainer.train()
    after = model.trainable_parameters()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("lora" in n for n in changed) and any("score" in n for n in changed)
    assert any(("projector" in n or "merger" in n or "audio_tower.proj" in n) for n in changed)
    params = dict(model.module.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in frozen.items())
