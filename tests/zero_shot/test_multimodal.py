"""Tiny random-weight MLLMs built from their transformers config classes, with processors built from local files
(the SmolLM2 GGUF tokenizer plus the family's special tokens), judging media files the tests write: Qwen2.5-Omni
thinker (video frames + the clip's own speech track), Qwen2.5-VL (video frames, torchvision-free video processor)
and Qwen2-Audio (WAV files), through every strategy S1-S4."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from zs_helpers import (  # noqa: F401 - one_torch_thread is an autouse fixture
    CHAT_TEMPLATE,
    PIXELS,
    needs_pyav,
    needs_smollm2,
    one_torch_thread,
    smollm2_tokenizer_dir,
    speech,
    tiny_mllm_checkpoint,
    write_clip,
    write_wav,
)

from emoreward.data import MediaRef, PreferencePair
from emoreward.data.media import MediaError, load_audio, load_frames
from zero_shot.backends.base import ChatRequest, MediaInput, SamplingConfig
from zero_shot.backends.multimodal import MultimodalBackend
from zero_shot.config import judge_config_from_dict, load_judge_config
from zero_shot.runner import CACHE_FILE, run_zero_shot
from zero_shot.testing import ScriptedBackend, demo_pairs


pytestmark = needs_smollm2
HOP = 160  # Whisper feature extractor: one mel frame per 10 ms at 16 kHz


def tiny_judge(name="qwen2-audio-7b"):
    """The YAML judge with a tiny generation budget (random weights never stop on their own)."""
    return dataclasses.replace(load_judge_config(name), sampling=SamplingConfig(max_new_tokens=3))


def mllm_judge(family: str, model_dir, **mllm) -> object:
    """A judge definition for a tiny local checkpoint, through the same YAML parser and loading path as the 7B."""
    raw = {
        "name": f"tiny-{family}",
        "sampling": {"max_new_tokens": 3},
        "mllm": {
            "backend": "transformers-mllm",
            "family": family,
            "model": str(model_dir),
            "dtype": "float32",
            "device": "cpu",
            "batch_size": 2,
            "fps": 2.0,
            "max_frames": 4,
            **PIXELS,
            **mllm,
        },
    }
    return judge_config_from_dict(raw, "<test>")


@pytest.fixture
def fast_random_baseline(monkeypatch):
    """The harness's random baseline averages 200 sklearn scorings; these tests do not read it."""
    from emoreward.evaluation import metrics

    monkeypatch.setattr(metrics, "random_baseline", lambda y_true, setting="two-class", **kw: {"waf": 0.0, "acc": 0.0})


@pytest.fixture
def processed(monkeypatch):
    """Every batch the MLLM processor produced during the test: (requests, processor outputs)."""
    seen = []
    original = MultimodalBackend._inputs

    def spy(self, requests, preps):
        inputs = original(self, requests, preps)
        seen.append((requests, preps, inputs))
        return inputs

    monkeypatch.setattr(MultimodalBackend, "_inputs", spy)
    return seen


@pytest.fixture(scope="module")
def audio_backend():
    from transformers import (
        AutoTokenizer,
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    processor = Qwen2AudioProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    config = Qwen2AudioConfig(
        audio_config=dict(
            d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=128
        ),
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )
    torch.manual_seed(0)
    return MultimodalBackend(
        "qwen2-audio",
        Qwen2AudioForConditionalGeneration(config),
        processor,
        use_audio_in_video=False,
        identity="tiny-qwen2-audio",
        batch_size=2,
    )


# ---------------------------------------------------------------------------------------------- Qwen2-Audio
def test_qwen2_audio_hears_a_wav_file(audio_backend, tmp_path, processed):
    wav = write_wav(tmp_path / "a.wav")
    assert load_audio("a", wav).shape == (24000,)
    gens = audio_backend.generate(
        [ChatRequest("Describe the emotion.", media=MediaInput(audio=str(wav))), ChatRequest("Text only.")],
        SamplingConfig(max_new_tokens=4),
    )
    assert all(g.error is None and g.completion_tokens == 4 for g in gens)
    [(_, _, inputs)] = processed
    audio_id = audio_backend.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    n_audio = (inputs["input_ids"] == audio_id).sum(dim=1).tolist()
    frames = int(inputs["feature_attention_mask"][0].sum())
    assert frames == 24000 // HOP  # 1.5 s of audio reached the feature extractor
    assert n_audio[0] == ((frames - 1) // 2 + 1 - 2) // 2 + 1 and n_audio[1] == 0  # encoder strides; text-only: none


def test_qwen2_audio_through_every_strategy(audio_backend, tmp_path, fast_random_baseline):
    (tmp_path / "audio").mkdir()
    pairs = demo_pairs()[:3]
    for p in pairs:
        write_wav(tmp_path / "audio" / f"{p.sample_id}.wav", seconds=1.0, freq=180 + 40 * int(p.sample_id[1:]))
    llm = ScriptedBackend("external-llm")
    report = run_zero_shot(
        tiny_judge(),
        pairs,
        ["S1", "S2", "S3", "S4"],
        runs=1,
        media_root=tmp_path,
        backends={"mllm": audio_backend, "llm": llm},
        progress=False,
        output_dir=tmp_path / "out",
    )
    assert report["calls"]["failed"] == 0
    assert report["text_only_samples"] == 0
    # S3/S4 compared against the tiny MLLM's own (gibberish) reference: step 1 ran on the audio, once per sample
    rows = [json.loads(line) for line in (tmp_path / "out" / CACHE_FILE).read_text().splitlines()]
    assert sum(r["step"] == "describe" for r in rows) == 3
    assert {r["strategy"] for r in rows} == {"S1", "S2", "S3", "S4", "shared"}


def test_empty_media_file_is_a_clear_error(audio_backend, tmp_path, fast_random_baseline):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match=r"sample 'e1': .*empty\.wav: audio file is empty \(0 bytes\)"):
        load_audio("e1", empty)
    [gen] = audio_backend.generate(
        [ChatRequest("x", media=MediaInput(audio=str(empty), sample_id="e1"))], SamplingConfig(max_new_tokens=2)
    )
    assert "sample 'e1'" in gen.error and str(empty) in gen.error and "empty (0 bytes)" in gen.error
    pair = PreferencePair("e1", "Happy.", "Sad.", "1", media=MediaRef(audio=str(empty)))
    report = run_zero_shot(tiny_judge(), [pair], ["S1"], runs=1, backends={"mllm": audio_backend}, progress=False)
    assert report["calls"]["failed"] == 2
    assert report["strategies"]["S1"]["evaluation"]["judge"]["three_class"]["n_invalid"] == 1


def test_audio_flag_mismatches_are_errors(audio_backend):
    # a video-only sample for an audio model with the flag off: nothing it can hear
    with pytest.raises(MediaError, match=r"sample 'v1': clip\.mp4: .*use_audio_in_video=False"):
        audio_backend.media_kind(MediaInput(video="clip.mp4", sample_id="v1"))
    # Qwen2.5-VL cannot hear: the flag on is a configuration error, in the YAML and in code
    with pytest.raises(ValueError, match="cannot hear"):
        MultimodalBackend(
            "qwen2.5-vl", torch.nn.Linear(1, 1), audio_backend.processor, use_audio_in_video=True, identity="x"
        )
    with pytest.raises(ValueError, match="use_audio_in_video: qwen2.5-vl cannot hear"):
        judge_config_from_dict(
            {"name": "x", "mllm": {"backend": "transformers-mllm", "model": "m", "family": "qwen2.5-vl",
                                   "use_audio_in_video": True}}
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------- Qwen2.5-Omni
@needs_pyav
def test_qwen2_5_omni_thinker_hears_the_clip_track_through_every_strategy(tmp_path, processed, fast_random_baseline):
    pairs = demo_pairs()[:3]
    for i, p in enumerate(pairs):
        voice = speech(f"I got the job, I am so happy, number {i}.", 2.0, tmp_path, freq=160 + 30 * i)
        write_clip(tmp_path / "media" / "video" / f"{p.sample_id}.mp4", audio=voice, seed=i)
    config = mllm_judge("qwen2.5-omni-thinker", tiny_mllm_checkpoint("qwen2.5-omni-thinker"), use_audio_in_video=True)
    report = run_zero_shot(
        config,
        pairs,
        ["S1", "S2", "S3", "S4"],
        runs=1,
        media_root=tmp_path / "media",
        progress=False,
        output_dir=tmp_path / "out",
    )
    assert report["calls"]["failed"] == 0 and report["text_only_samples"] == 0
    assert report["calls"]["models_loaded"] == {"mllm": True}
    assert "the MLLM also performed the S3/S4 text steps" in report["markdown"]
    rows = [json.loads(line) for line in (tmp_path / "out" / CACHE_FILE).read_text().splitlines()]
    assert sum(r["step"] == "describe" for r in rows) == 3  # step 1 once per sample, shared by S2-S4
    assert {r["strategy"] for r in rows} == {"S1", "S2", "S3", "S4", "shared"}
    # S1, S2, S3 one call, S4 its reasoning, per pair and order; + step 1
    assert sum(r["step"] != "extract" for r in rows) == 3 * 2 * (1 + 1 + 1 + 1) + 3
    # S4's extract reads the reasoning alone: one call per distinct reasoning (a call is found by its content)
    assert sum(r["step"] == "extract" for r in rows) == len({r["output"] for r in rows if r["step"] == "reason"})

    tokens = {n: config_token(config.mllm.model, n) for n in ("video", "audio", "bos", "eos")}
    media_batches = [(preps, inputs) for _, preps, inputs in processed if "pixel_values_videos" in inputs]
    assert (
        sum(p.frames is not None for preps, _ in media_batches for p in preps) == 3 * 2 + 3
    )  # S1 both orders, step 1
    for preps, inputs in media_batches:
        for k, (prep, ids) in enumerate(zip(preps, inputs["input_ids"].tolist())):
            track = load_audio(prep.sample, tmp_path / "media" / "video" / f"{prep.sample}.mp4")
            # the clip's own track, whole, reached the feature extractor (one mel frame per 10 ms)
            assert prep.audio_from_video and np.array_equal(prep.audio, track)
            assert abs(int(inputs["feature_attention_mask"][k].sum()) - len(track) / HOP) <= 1
            video_pos = [i for i, t in enumerate(ids) if t == tokens["video"]]
            audio_pos = [i for i, t in enumerate(ids) if t == tokens["audio"]]
            assert len(video_pos) == int(inputs["video_grid_thw"][k].prod()) // 4 and audio_pos
            # TMRoPE interleaving: one span <|audio_bos|> video and audio chunks <|audio_eos|>, no separate audio span
            assert ids.count(tokens["bos"]) == 1
            assert ids.index(tokens["bos"]) < video_pos[0] < audio_pos[0] < audio_pos[-1] < ids.index(tokens["eos"])
            assert float(inputs["video_second_per_grid"][k]) == pytest.approx(2 / prep.fps)


def config_token(model_dir, name: str) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    return {
        "video": cfg.video_token_index,
        "audio": cfg.audio_token_index,
        "bos": cfg.audio_start_token_id,
        "eos": cfg.audio_end_token_id,
    }[name]


@needs_pyav
def test_omni_judge_hears_what_the_reward_model_hears(tmp_path, processed):
    """One flag, the reward models' rule (`emoreward.data.media.load_sample_media`): with both a video and a wav,
    `use_audio_in_video: false` feeds the wav (its own audio span after the video), `true` the video's own track
    (interleaved with the frames); the flag off without a wav is an error, as for the reward model."""
    from emoreward.data.media import MediaOptions, load_sample_media

    model_dir = tiny_mllm_checkpoint("qwen2.5-omni-thinker")
    clip = write_clip(tmp_path / "v" / "c1.mp4", audio=speech("Oh no.", 1.0, tmp_path))
    wav = write_wav(tmp_path / "a" / "c1.wav", seconds=0.8, freq=300.0)
    silent = write_clip(tmp_path / "v" / "c2.mp4", audio=None)
    media = MediaInput(video=str(clip), audio=str(wav), sample_id="c1")
    ref = MediaRef(video=str(clip), audio=str(wav))

    def reward_model_audio(flag):
        return load_sample_media("c1", ref, MediaOptions(use_audio_in_video=flag), need_video=True, need_audio=True)

    off = MultimodalBackend.from_pretrained(mllm_judge("qwen2.5-omni-thinker", model_dir).mllm)
    assert off.media_kind(media) == "video"
    [gen] = off.generate([ChatRequest("Describe.", media=media)], SamplingConfig(max_new_tokens=2))
    assert gen.error is None
    [(_, [prep], inputs)] = processed
    expected = reward_model_audio(False)
    assert expected.audio_path == str(wav) and np.array_equal(prep.audio, expected.audio)
    assert not prep.audio_from_video and prep.audio.shape == (int(0.8 * 16000),)
    ids = inputs["input_ids"][0].tolist()
    tokens = {n: config_token(model_dir, n) for n in ("video", "audio", "bos", "eos")}
    video_pos = [i for i, t in enumerate(ids) if t == tokens["video"]]
    audio_pos = [i for i, t in enumerate(ids) if t == tokens["audio"]]
    # a separate audio span after the whole video span, not interleaved
    assert video_pos and audio_pos and video_pos[-1] < ids.index(tokens["bos"]) < audio_pos[0]

    on = MultimodalBackend.from_pretrained(mllm_judge("qwen2.5-omni-thinker", model_dir, use_audio_in_video=True).mllm)
    assert on.media_kind(media) == "video" and on.identity != off.identity
    prep_on = on._prepare(media)
    expected_on = reward_model_audio(True)
    assert expected_on.audio_path == str(clip) and np.array_equal(prep_on.audio, expected_on.audio)
    assert prep_on.audio_from_video and not np.array_equal(prep_on.audio[: len(prep.audio)], prep.audio)

    # the flag off and no wav: the reward model cannot be fed this sample, and neither is the judge
    with pytest.raises(MediaError, match=r"sample 'c1': .*c1\.mp4: use_audio_in_video=False takes the audio from"):
        off.media_kind(MediaInput(video=str(clip), sample_id="c1"))
    with pytest.raises(MediaError, match="no audio file"):
        load_sample_media("c1", MediaRef(video=str(clip)), MediaOptions(), need_video=True, need_audio=True)
    # the flag asks for the clip's own track, and this clip has none: the error names the sample and the file
    [gen] = on.generate([ChatRequest("x", media=MediaInput(video=str(silent), sample_id="c2"))], SamplingConfig())
    assert "sample 'c2'" in gen.error and str(silent) in gen.error and "no audio stream" in gen.error
    # a processor whose chat template drops the video placeholder disagrees with what was extracted
    on.processor.chat_template = CHAT_TEMPLATE.replace("{{ VIDEO }}", "")
    [gen] = on.generate([ChatRequest("x", media=media)], SamplingConfig(max_new_tokens=2))
    assert gen.error.startswith("MediaError: sample 'c1'") and str(clip) in gen.error
    assert "processor rejected the extracted media" in gen.error
    # extraction and processor token counts are checked even when the processor does not complain
    with pytest.raises(MediaError, match=r"sample 'c1'.*0 video tokens expected but 3 after processing"):
        on._check_tokens({"input_ids": torch.full((1, 3), config_token(model_dir, "video"))}, [dataclasses.replace(
            prep_on, frames=None, audio=None)])  # fmt: skip


def test_zero_length_and_missing_videos_name_sample_and_file(tmp_path):
    empty = tmp_path / "s9.mp4"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match=r"sample 's9': .*s9\.mp4: video file is empty \(0 bytes\)"):
        load_frames("s9", empty, fps=2.0, max_frames=4)
    with pytest.raises(MediaError, match=r"sample 's8': .*nope\.mp4: video file not found"):
        load_frames("s8", tmp_path / "nope.mp4", fps=2.0, max_frames=4)


@needs_pyav
def test_video_without_audio_stream_is_a_clear_error(tmp_path):
    silent = write_clip(tmp_path / "silent.mp4", audio=None)
    with pytest.raises(MediaError, match=r"sample 's7': .*silent\.mp4: has no audio stream"):
        load_audio("s7", silent)


# ---------------------------------------------------------------------------------------------- Qwen2.5-VL
@needs_pyav
def test_qwen2_5_vl_sees_frames_through_every_strategy(tmp_path, processed, fast_random_baseline):
    from transformers import AutoConfig, Qwen2VLImageProcessorPil

    pairs = demo_pairs()[:3]
    for i, p in enumerate(pairs):  # clips of different lengths: different effective frame rates in one batch
        write_clip(tmp_path / "media" / "video" / f"{p.sample_id}.mp4", seconds=1.5 + 0.5 * i, seed=i)
    model_dir = tiny_mllm_checkpoint("qwen2.5-vl")
    report = run_zero_shot(
        mllm_judge("qwen2.5-vl", model_dir),
        pairs,
        ["S1", "S2", "S3", "S4"],
        runs=1,
        media_root=tmp_path / "media",
        progress=False,
        output_dir=tmp_path / "out",
    )
    assert report["calls"]["failed"] == 0 and report["text_only_samples"] == 0
    assert set(report["strategies"]) == {"S1", "S2", "S3", "S4"}
    rows = [json.loads(line) for line in (tmp_path / "out" / CACHE_FILE).read_text().splitlines()]
    assert sum(r["step"] == "describe" for r in rows) == 3
    assert sum(r["step"] != "extract" for r in rows) == 3 * 2 * 4 + 3  # S4's extract: once per distinct reasoning
    assert sum(r["step"] == "extract" for r in rows) == len({r["output"] for r in rows if r["step"] == "reason"})
    media_batches = [(preps, inputs) for _, preps, inputs in processed if "pixel_values_videos" in inputs]
    assert sum(len(preps) for preps, _ in media_batches) == 3 * 2 + 3  # S1 in both orders, step 1 once
    image_processor = Qwen2VLImageProcessorPil(**PIXELS)
    video_id = AutoConfig.from_pretrained(model_dir).video_token_id
    for [prep], inputs in media_batches:
        frames, fps = load_frames(prep.sample, tmp_path / "media" / "video" / f"{prep.sample}.mp4", 2.0, 4)
        assert np.array_equal(prep.frames, frames) and prep.fps == fps
        # each temporal patch holds two consecutive frames exactly as the official image processor makes them
        t, h, w = inputs["video_grid_thw"][0].tolist()
        assert t == len(frames) // 2
        patches = inputs["pixel_values_videos"].reshape(t, h * w, 3, 2, 14, 14)
        for i, frame in enumerate(frames):
            official = image_processor(frame, return_tensors="pt")["pixel_values"].reshape(h * w, 3, 2, 14, 14)
            assert torch.allclose(patches[i // 2, :, :, i % 2], official[:, :, 0], atol=1e-5)
        # the sampled frame rate reaches the temporal positions; placeholders match the grid
        assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(2 / fps)
        assert int((inputs["input_ids"][0] == video_id).sum()) == t * h * w // 4
