"""Inputs come from the official transformers processing code, checked against it exactly:

- video: `SampledFramesVideoProcessor` (the torchvision-free stand-in for `Qwen2VLVideoProcessor`) equals the
  official `Qwen2VLImageProcessorPil` on a still two-frame clip, and the official `Qwen2VLVideoProcessor.patchify`
  (run from the transformers source file, which cannot be imported without torchvision) on any clip;
- audio: Whisper features and token counts are the official processor's;
- Qwen2.5-Omni with `use_audio_in_video`: the prompt holds the official time-interleaved audio-in-video layout
  (checked against the TMRoPE rule written out here), the thinker gets `use_audio_in_video=True` and assigns every
  video and audio token its time position; scoring and training work on that layout.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch


pytest.importorskip("av", reason="multimodal tests make and decode video files with PyAV (media extra)")

from tiny_media import write_video  # noqa: E402

from emoreward.data import PreferencePair  # noqa: E402
from emoreward.data.context import MediaRef  # noqa: E402
from emoreward.data.media import MediaOptions, load_sample_media  # noqa: E402
from emoreward.models.base import RewardContext
from emoreward.models.media import (  # noqa: E402
    MediaRewardModel,
    SampledFramesVideoProcessor,
    collate_media,
    pad_sequences,
)


def official_video_patchify():
    """`Qwen2VLVideoProcessor.patchify` from the installed transformers source (its module imports torchvision,
    the method itself is plain torch)."""
    spec = importlib.util.find_spec("transformers.models.qwen2_vl.video_processing_qwen2_vl")
    tree = ast.parse(Path(spec.origin).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "patchify")
    namespace = {"torch": torch}
    exec(compile(ast.Module([fn], type_ignores=[]), spec.origin, "exec"), namespace)
    return namespace["patchify"]


@pytest.mark.parametrize("n_frames", [4, 5])  # 5: the last frame is repeated to fill the temporal patch
def test_video_patches_equal_the_official_patchify(n_frames):
    from transformers import Qwen2VLImageProcessorPil
    from transformers.image_utils import SizeDict

    frames = np.random.default_rng(n_frames).integers(0, 256, (n_frames, 50, 90, 3), dtype=np.uint8)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112)
    ours = SampledFramesVideoProcessor(image_processor)(frames, fps=2.0, return_metadata=True)
    # the official per-frame steps (the image processor's own resize / rescale / normalize), then its patchify
    size = SizeDict(shortest_edge=56 * 56, longest_edge=112 * 112)
    normalised = []
    for frame in frames:
        x = image_processor.resize(frame.transpose(2, 0, 1), size=size, resample=image_processor.resample, factor=28)
        x = image_processor.rescale(x, image_processor.rescale_factor)
        normalised.append(image_processor.normalize(x, image_processor.image_mean, image_processor.image_std))
    patches, grid_t, grid_h, grid_w = official_video_patchify()(
        None, torch.from_numpy(np.stack(normalised))[None], patch_size=14, merge_size=2, temporal_patch_size=2
    )
    assert ours["video_grid_thw"].tolist() == [[grid_t, grid_h, grid_w]] == [[(n_frames + 1) // 2, 4, 6]]
    assert torch.equal(ours["pixel_values_videos"], patches[0].float())
    assert ours["video_metadata"][0].sampled_fps == 2.0


def test_still_clip_equals_the_official_image_processor():
    from transformers import Qwen2VLImageProcessorPil

    frame = np.random.default_rng(1).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=84 * 84)
    image = image_processor(images=frame, return_tensors="pt")
    video = SampledFramesVideoProcessor(image_processor)(np.stack([frame, frame]), fps=1.0)
    assert torch.equal(video["pixel_values_videos"], image["pixel_values"])
    assert torch.equal(video["video_grid_thw"], image["image_grid_thw"])


def test_video_processor_rejects_what_it_does_not_implement():
    from transformers import Qwen2VLImageProcessorPil

    processor = SampledFramesVideoProcessor(Qwen2VLImageProcessorPil())
    frames = np.zeros((2, 28, 28, 3), np.uint8)
    with pytest.raises(ValueError, match=r"fps > 0"):
        processor(frames)
    with pytest.raises(ValueError, match=r"num_frames"):
        processor(frames, fps=2.0, num_frames=8)
    with pytest.raises(ValueError, match=r"uint8 array of shape \(T, H, W, 3\)"):
        processor(frames.astype(np.float32), fps=2.0)


# ---------------------------------------------------------------------------------------------- Qwen2.5-Omni
@pytest.fixture(scope="module")
def omni(tiny_backbone_dir, tmp_path_factory):
    """The tiny Omni thinker with the video's own audio, and a 4 s clip: 2 chunks of 2 s each."""
    root = tmp_path_factory.mktemp("omni-media")
    write_video(root / "video" / "v0.mp4", seconds=4.0, fps=8, seed=3, freq=160)
    write_video(root / "video" / "v1.mp4", seconds=4.0, fps=8, seed=4, freq=230)
    options = MediaOptions(str(root), fps=2.0, max_frames=8, use_audio_in_video=True)
    torch.manual_seed(0)
    from peft import LoraConfig

    model = MediaRewardModel.from_backbone(
        "qwen2.5-omni-thinker", str(tiny_backbone_dir("qwen2.5-omni-thinker")), media_options=options,
        max_length=512, lora_config=LoraConfig(r=4, lora_alpha=8, init_lora_weights=False),
    )  # fmt: skip
    media = load_sample_media("v0", MediaRef(), options, need_video=True, need_audio=True)
    return model, options, media


def test_omni_audio_in_video_prompt_is_the_official_interleaved_layout(omni):
    from transformers import WhisperFeatureExtractor

    model, _, media = omni
    tok, config = model.tokenizer, model.module.config
    prefix = model.builder.encode_prefix(media, "oh no")
    ids = prefix.input_ids
    # features: the official Whisper extractor, padded to 30 s, and the token count the audio encoder yields
    reference = WhisperFeatureExtractor(feature_size=80)(
        media.audio, sampling_rate=16000, padding="max_length", return_attention_mask=True, return_tensors="pt"
    )
    assert torch.equal(prefix.media["input_features"], reference["input_features"])
    n_frames = int(reference["attention_mask"].sum())
    n_audio = ((n_frames - 1) // 2 + 1 - 2) // 2 + 1
    # video: 8 frames at 2 fps -> 4 temporal patches of 1 s; 64x64 frames -> 2x2 merged tokens per patch
    grid_t, grid_h, grid_w = prefix.media["video_grid_thw"][0].tolist()
    assert (grid_t, grid_h, grid_w) == (4, 4, 4) and float(prefix.media["video_second_per_grid"][0]) == 1.0
    per_t = grid_h * grid_w // 4
    # TMRoPE (Qwen2.5-Omni report, sec. 2.2): 25 positions per second, chunks of 2 s = 50 positions; a video token
    # of temporal patch t sits at t * 1.0 s * 25, audio token k at k (one per 40 ms)
    chunk = 50
    video_chunks = np.bincount([int(t * 1.0 * 25) // chunk for t in range(grid_t)], minlength=1) * per_t
    audio_chunks = np.bincount(np.arange(n_audio) // chunk)
    body = []
    for j in range(max(len(video_chunks), len(audio_chunks))):
        body += [config.video_token_id] * int(video_chunks[j] if j < len(video_chunks) else 0)
        body += [config.audio_token_id] * int(audio_chunks[j] if j < len(audio_chunks) else 0)
    expected = (
        [config.vision_start_token_id, config.audio_start_token_id]
        + body
        + [config.audio_end_token_id, config.vision_end_token_id]
    )
    start = ids.index(config.vision_start_token_id)
    assert ids[start : start + len(expected)] == expected
    assert len(video_chunks) == 2 and len(audio_chunks) >= 2  # the clip really interleaves: V A V A
    assert prefix.n_media_tokens == len(expected)
    assert ids.count(config.audio_start_token_id) == 1  # no second, separate audio span
    # the text around the span is the chat template's
    assert tok.decode(ids[:start]).strip().endswith("user")
    # the builder pickles (DataLoader workers under the spawn start method) and lays out the same prefix
    import pickle

    assert pickle.loads(pickle.dumps(model.builder)).encode_prefix(media, "oh no").input_ids == ids


def test_omni_thinker_positions_follow_the_interleaved_layout(omni):
    model, _, media = omni
    module, config = model.module, model.module.config
    prefix = model.builder.encode_prefix(media, None)
    ids = torch.tensor([prefix.input_ids])
    mask = torch.ones_like(ids)
    lengths = prefix.media["feature_attention_mask"].sum(-1)
    grid, seconds = prefix.media["video_grid_thw"], prefix.media["video_second_per_grid"]
    positions, _ = module.inner.get_rope_index(ids, None, grid, mask, True, lengths, seconds)
    temporal = positions[0, 0]
    video_at, audio_at = ids[0] == config.video_token_id, ids[0] == config.audio_token_id
    first = int(torch.nonzero(video_at | audio_at)[0])
    origin = int(temporal[first - 1]) + 1  # both start markers share one position
    per_t = int(grid[0, 1] * grid[0, 2]) // 4
    t_of_token = torch.arange(int(grid[0, 0])).repeat_interleave(per_t)
    assert torch.equal(temporal[video_at], origin + t_of_token * 25)  # 1 s per temporal patch, 25 positions/s
    assert torch.equal(temporal[audio_at], origin + torch.arange(int(audio_at.sum())))  # 40 ms per audio token
    assert torch.equal(positions[0, 0, audio_at], positions[2, 0, audio_at])  # audio: 1-D positions
    # the reward model runs the thinker with use_audio_in_video=True: same reward as an explicit call with it,
    # a different one when the thinker is told the layout is not interleaved
    media_t = {k: v for k, v in prefix.media.items()}
    seq, _ = model.builder.encode_suffix("She is furious.", len(prefix.input_ids), truncate=True)
    full_ids, full_mask = pad_sequences([prefix.input_ids + seq], model.tokenizer.pad_token_id)
    with torch.no_grad():
        reward = module(full_ids, full_mask, **media_t)[:, 0]
        rewards = {}
        for flag in (True, False):
            module.inner.rope_deltas = None
            hidden = module.inner(
                input_ids=full_ids, attention_mask=full_mask, use_audio_in_video=flag, use_cache=False, **media_t
            ).last_hidden_state
            rewards[flag] = module.score(hidden[:, -1]).squeeze(-1)
    torch.testing.assert_close(reward, rewards[True], rtol=0, atol=1e-6)
    assert not torch.allclose(rewards[True], rewards[False], atol=1e-6)


def test_omni_interleaved_scoring_and_training(omni, tmp_path):
    from tiny_media import media_trainer

    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.preprocess import build_media_dataset

    model, options, media = omni
    descriptions = ["She is calm.", "He shouts angrily, red in the face.", "A sad, quiet voice."]
    naive = model.score_info(descriptions, RewardContext("hi", decoded=media), shared_prefix=False).rewards
    shared = model.score_info(
        descriptions, RewardContext("hi", decoded=media), shared_prefix=True, batch_size=2
    ).rewards
    np.testing.assert_allclose(shared, naive, atol=1e-4, rtol=0)
    # a batch of two samples with different audio lengths pads and still scores each sequence as alone
    other = load_sample_media("v1", MediaRef(), options, need_video=True, need_audio=True)
    prefixes = [model.builder.encode_prefix(m, "hi") for m in (media, other)]
    seqs = [p.input_ids + model.builder.encode_suffix(descriptions[0], 0, truncate=True)[0] for p in prefixes]
    ids, mask = pad_sequences(seqs, model.tokenizer.pad_token_id)
    with torch.no_grad():
        batched = model.model(ids, mask, **collate_media([p.media for p in prefixes]))
    alone = model.score_info(descriptions[:1], RewardContext("hi", decoded=other), shared_prefix=False).rewards
    np.testing.assert_allclose(batched[1, 0].item(), alone[0], atol=1e-5)

    pairs = [
        PreferencePair(f"v{i % 2}", "The man is furious, shouting.", "The man is calm and relaxed.", "1")
        for i in range(4)
    ]
    config = EmoRewardConfig(
        output_dir=str(tmp_path), backbone="qwen2.5-omni-thinker", model_name_or_path="unused",
        media_root=options.media_root, fps=2.0, max_frames=8, use_audio_in_video=True, max_length=512,
        per_device_train_batch_size=2, learning_rate=1e-2, num_train_epochs=2, logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    dataset, report = build_media_dataset(pairs, model)
    assert report.n_kept == 4
    before = model.trainable_parameters()
    trainer = media_trainer(model, config, dataset)
    trainer.train()
    after = model.trainable_parameters()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("lora" in n for n in changed) and any("score" in n for n in changed)
    model.model.eval()
    r = model.score_info(
        ["The man is furious, shouting.", "The man is calm and relaxed."], RewardContext(None, decoded=media)
    ).rewards
    assert r[0] > r[1]


def test_qwen2_audio_hears_the_video_track_as_one_audio_span(tiny_backbone_dir, omni):
    """`use_audio_in_video` for Qwen2-Audio only changes where the audio comes from: no video, no interleaving."""
    _, options, media = omni
    model = MediaRewardModel.from_backbone(
        "qwen2-audio", str(tiny_backbone_dir("qwen2-audio")), media_options=options, max_length=512
    )
    assert not model.module.use_audio_in_video and model.builder.needs_video is False
    audio_only = load_sample_media("v0", MediaRef(), options, need_video=False, need_audio=True)
    assert audio_only.audio_path.endswith("v0.mp4") and np.array_equal(audio_only.audio, media.audio)
    prefix = model.builder.encode_prefix(audio_only, None)
    config = model.module.config
    n_frames = int(prefix.media["feature_attention_mask"].sum())
    n_audio = ((n_frames - 1) // 2 + 1 - 2) // 2 + 1
    assert prefix.input_ids.count(config.audio_token_index) == n_audio == prefix.n_media_tokens - 2
    assert set(prefix.media) == {"input_features", "feature_attention_mask"}


def test_a_prompt_the_processor_rejects_names_the_sample(omni):
    from emoreward.training.preprocess import build_media_dataset

    model, options, media = omni
    with pytest.raises(ValueError, match=r"v0\.mp4: Qwen2_5OmniFramesProcessor rejected the prompt"):
        model.builder.encode_prefix(media, "he says <|VIDEO|> twice")  # a second video placeholder, one video
    bad = PreferencePair("v0", "Calm.", "Angry.", "1", media=MediaRef(subtitle="<|VIDEO|>"), row=7)
    with pytest.raises(ValueError, match=r"pair 'v0' \(row 7\): .*v0\.mp4"):
        build_media_dataset([bad], model)
