"""Correctness of the multimodal fast paths: decoding only the sampled frames, and the processed-media cache
(cached and uncached prefixes and rewards are identical; a changed file is processed again)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch


av = pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from media_files import voiced, write_clip  # noqa: E402
from tiny_media import write_video  # noqa: E402

from emoreward.data.media import MediaError, load_frames, load_frames_reference  # noqa: E402
from emoreward.models.base import RewardContext, load_reward_model  # noqa: E402
from emoreward.models.media import MediaRewardModel  # noqa: E402
from emoreward.models.media.cache import MediaPrefixCache  # noqa: E402


DESCRIPTIONS = ["She is joyful and smiling.", "He is gloomy.", "A calm, neutral voice.", "Tense and angry, shouting."]


@pytest.mark.parametrize(
    ("clip", "fps", "max_frames"),
    [
        ({"seconds": 2.0, "fps": 8, "size": (48, 64)}, 8.0, 32),  # every frame sampled
        ({"seconds": 3.0, "fps": 25, "size": (64, 80), "audio": voiced(3.0)}, 2.0, 16),  # 6 of 75 frames
        ({"seconds": 4.0, "fps": 30, "size": (32, 32)}, 2.0, 5),  # the frame cap binds (5 -> 6, even)
    ],
)
def test_sampled_frame_decoding_equals_full_decoding(tmp_path, clip, fps, max_frames):
    path = write_clip(tmp_path / "clip.mp4", **clip)
    frames, rate = load_frames("s", path, fps, max_frames)
    ref_frames, ref_rate = load_frames_reference("s", path, fps, max_frames)
    assert frames.dtype == np.uint8 and frames.shape == ref_frames.shape and len(frames) % 2 == 0
    np.testing.assert_array_equal(frames, ref_frames)
    assert rate == ref_rate


def test_sampled_frame_decoding_errors(tmp_path):
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(MediaError, match="empty"):
        load_frames("s", tmp_path / "empty.mp4", 2.0, 8)
    (tmp_path / "junk.mp4").write_bytes(b"not a video at all" * 100)
    with pytest.raises(MediaError, match="cannot decode video"):
        load_frames("s", tmp_path / "junk.mp4", 2.0, 8)


def _model(family, tiny_backbone_dir, media_root):
    from emoreward.data.media import MediaOptions

    torch.manual_seed(0)
    options = MediaOptions(str(media_root), fps=2.0, max_frames=4, use_audio_in_video=family == "qwen2.5-omni-thinker")
    return MediaRewardModel.from_backbone(
        family, str(tiny_backbone_dir(family)), media_options=options, max_length=512
    )


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen2.5-omni-thinker"])
def test_media_cache_gives_identical_prefixes_and_rewards(family, tiny_backbone_dir, tmp_path):
    root = tmp_path / "media"
    for i in range(2):
        write_video(root / "video" / f"c{i}.mp4", seconds=1.0, seed=i, freq=160 + 40 * i)
    model = _model(family, tiny_backbone_dir, root)
    contexts = [RewardContext(sample_id=f"c{i % 2}", subtitle="I am fine.") for i in range(len(DESCRIPTIONS))]

    model.media_cache = None
    uncached = model.score(DESCRIPTIONS, contexts)
    reference = model.encode_prefix(contexts[0])

    model.media_cache = MediaPrefixCache(directory=tmp_path / "cache")
    first = model.score(DESCRIPTIONS, contexts)
    assert model.media_cache.stats.misses == 2 and model.media_cache.stats.memory_hits == 0
    again = model.score(DESCRIPTIONS, contexts)
    assert model.media_cache.stats.memory_hits == 2  # the second call processed no media
    np.testing.assert_array_equal(first, uncached)
    np.testing.assert_array_equal(again, uncached)

    # a new model (another run) with the same folder reads the processed prefixes from disk
    model.media_cache = MediaPrefixCache(directory=tmp_path / "cache")
    cached = model.encode_prefix(contexts[0])
    assert model.media_cache.stats.disk_hits == 1 and model.media_cache.stats.misses == 0
    assert cached.input_ids == reference.input_ids and cached.n_media_tokens == reference.n_media_tokens
    assert cached.media.keys() == reference.media.keys()
    for key, value in reference.media.items():
        assert torch.equal(cached.media[key], value), key
    np.testing.assert_array_equal(model.score(DESCRIPTIONS, contexts), uncached)

    # another subtitle is another prefix; a replaced file (new content) is processed again
    model.encode_prefix(RewardContext(sample_id="c0", subtitle="Something else."))
    assert model.media_cache.stats.misses == 1
    write_video(root / "video" / "c0.mp4", seconds=1.0, seed=7, freq=300)
    os.utime(root / "video" / "c0.mp4", ns=(1, 1))  # a new modification time whatever the clock's resolution
    changed = model.encode_prefix(contexts[0])
    assert model.media_cache.stats.misses == 2
    assert not torch.equal(changed.media["pixel_values_videos"], reference.media["pixel_values_videos"])


def test_media_cache_memory_bound_and_damaged_file(tiny_backbone_dir, tmp_path):
    root = tmp_path / "media"
    for i in range(3):
        write_video(root / "video" / f"c{i}.mp4", seconds=1.0, seed=i)
    model = _model("qwen2.5-vl", tiny_backbone_dir, root)
    one = model.encode_prefix(RewardContext(sample_id="c0"))
    size = sum(v.numel() * v.element_size() for v in one.media.values() if torch.is_tensor(v))
    model.media_cache = MediaPrefixCache(max_bytes=2 * size, directory=tmp_path / "cache")
    for i in range(3):
        model.encode_prefix(RewardContext(sample_id=f"c{i}"))
    assert len(model.media_cache) == 2  # the oldest prefix left memory
    files = sorted((tmp_path / "cache").rglob("*.safetensors"))
    assert len(files) == 3
    for f in files:
        f.write_bytes(b"torn")
    model.media_cache.clear()
    again = model.encode_prefix(RewardContext(sample_id="c0"))  # unreadable cache file: processed again
    assert model.media_cache.stats.disk_errors == 1
    assert torch.equal(again.media["pixel_values_videos"], one.media["pixel_values_videos"])


def test_missing_media_still_raises_with_the_cache(tiny_backbone_dir, tmp_path):
    model = _model("qwen2.5-vl", tiny_backbone_dir, tmp_path / "media")
    with pytest.raises(MediaError, match="video file not found"):
        model.score(["x"], RewardContext(sample_id="nope"))


def test_saved_media_model_loads_with_auto_dtype(tiny_backbone_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    root = tmp_path / "media"
    write_video(root / "video" / "c0.mp4", seconds=1.0)
    model = _model("qwen2.5-vl", tiny_backbone_dir, root)
    saved = model.save_pretrained(tmp_path / "saved")
    from emoreward.models.precision import resolve_dtype

    loaded = load_reward_model(saved, media_root=str(root))
    assert loaded.dtype == resolve_dtype("auto", "cpu")
    reference = load_reward_model(saved, media_root=str(root), dtype="float32")
    assert reference.dtype == torch.float32
    if loaded.dtype == torch.float32:
        ctx = RewardContext(sample_id="c0")
        np.testing.assert_array_equal(loaded.score(DESCRIPTIONS, ctx), reference.score(DESCRIPTIONS, ctx))
