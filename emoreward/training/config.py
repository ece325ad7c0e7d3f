"""Training configuration: one dataclass for text and multimodal reward models, read from a recipe YAML, shared
by `emoreward train` and `scripts/train_reward.py`.

`EmoRewardConfig` extends TRL's `RewardConfig` (itself `transformers.TrainingArguments`), so every Trainer
option (epochs, learning rate, batch size, `report_to`, DeepSpeed, ...) is available under its usual name.

Whether a recipe trains a text or a multimodal reward model is decided in one place, `EmoRewardConfig.kind`
(the backbone registry's kind of `backbone`, or of `model_name_or_path` when no `backbone` is named). A field the
chosen backbone does not read (`FIELD_SUPPORT`) is an error when set, never silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from transformers import HfArgumentParser
from trl import RewardConfig

from emoreward.models.backbones import BackboneSpec, get_backbone, registered_names


TieMode = Literal["drop", "rao-kupper", "davidson"]
TruncationMode = Literal["drop", "truncate"]
TwoClassTiePolicy = Literal["wrong", "first"]
LengthDebias = Literal["none", "reweight", "penalty", "disentangled"]
MediaErrorPolicy = Literal["raise", "skip"]


@dataclass
class EmoRewardConfig(RewardConfig):
    """Configuration of one reward-model training run (a recipe). Fields beyond `trl.RewardConfig`:"""

    # ------------------------------------------------------------------ model
    model_name_or_path: str | None = field(
        default="minilm",
        metadata={
            "help": "Weights: a registered text backbone (minilm, smollm2), a local path or a hub model id; for a "
            "multimodal `backbone`, its checkpoint (None = the family's 7B hub id)."
        },
    )
    backbone: str | None = field(
        default=None,
        metadata={
            "help": "Multimodal backbone family (qwen2.5-vl, qwen2.5-omni-thinker, qwen2-audio); None = the text "
            "backbone named by model_name_or_path."
        },
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file inside model_name_or_path, if any."})
    train_projector: bool = field(
        default=False, metadata={"help": "Media: also train the encoder-to-LM projector(s); encoders stay frozen."}
    )
    video_min_pixels: int | None = field(default=None, metadata={"help": "Media: min pixels per resized frame."})
    video_max_pixels: int | None = field(default=None, metadata={"help": "Media: max pixels per resized frame."})
    use_peft: bool = field(default=True, metadata={"help": "Train LoRA adapters (True) or all weights (False)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale = alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA path."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Linear layers to adapt; None = the backbone's default from the registry."}
    )
    instruction: str | None = field(
        default=None,
        metadata={"help": "Context prefix (user turn) for the description; None = the backbone's default."},
    )

    # ------------------------------------------------------------------ data
    train_file: str = field(
        default="emoprefer",
        metadata={"help": "Preference pairs: CSV / JSONL path, or the bundled dataset name 'emoprefer'."},
    )
    eval_file: str | None = field(
        default=None, metadata={"help": "Held-out pairs to evaluate after training (None: cross-validation only)."}
    )
    media_root: str | None = field(
        default=None, metadata={"help": "Media: folder in the MER2025 layout (video/<id>.mp4, audio/<id>.wav)."}
    )
    fps: float = field(default=2.0, metadata={"help": "Media: video frames sampled per second."})
    max_frames: int = field(default=16, metadata={"help": "Media: cap on frames per video (evenly spread)."})
    use_audio_in_video: bool = field(
        default=False, metadata={"help": "Media: the audio is the video's own track instead of audio/<id>.wav."}
    )
    media_errors: MediaErrorPolicy = field(
        default="raise",
        metadata={"help": "Media: missing / unreadable media: 'raise' (names sample and file) or 'skip' (counted)."},
    )
    ties: TieMode = field(
        default="drop",
        metadata={
            "help": "Tie pairs: 'drop' (counted in the report), or a tie-aware Bradley-Terry likelihood: "
            "'rao-kupper' (Rao & Kupper 1967) or 'davidson' (Davidson 1970)."
        },
    )
    tie_parameter: float = field(
        default=1.0,
        metadata={"help": "Rao-Kupper log-threshold epsilon (> 0) or Davidson nu (> 0); fixed during training."},
    )
    truncation: TruncationMode = field(
        default="drop",
        metadata={
            "help": "Pairs longer than max_length: 'drop' them (counted), or 'truncate' the description "
            "(pairs whose token ids then become identical are dropped and counted)."
        },
    )

    # ------------------------------------------------------------------ length control
    length_debias: LengthDebias = field(
        default="none",
        metadata={
            "help": "Keep the reward from learning length: 'none'; 'reweight' (length-aligned and length-counter "
            "pairs weigh equally); 'penalty' (reward minus a fitted multiple of standardised length); "
            "'disentangled' (ODIN, Chen et al. 2024: a length head absorbs length, only the quality head is "
            "the reward)."
        },
    )
    odin_length_weight: float = field(
        default=1.0,
        metadata={"help": "ODIN: weight of |corr(quality, length)| - corr(length head, length) in the loss."},
    )
    odin_orthogonal_weight: float = field(
        default=1.0, metadata={"help": "ODIN: weight of |cos(w_quality, w_length)| of the two head vectors."}
    )

    # ------------------------------------------------------------------ evaluation
    cv_folds: int = field(
        default=5, metadata={"help": "Stratified k-fold cross-validation folds before the final fit (0 or 1: none)."}
    )
    final_fit: bool = field(
        default=True, metadata={"help": "After cross-validation, train on all pairs and save the model."}
    )
    two_class_tie_policy: TwoClassTiePolicy = field(
        default="wrong",
        metadata={
            "help": "How a predicted tie / invalid answer counts in two-class scoring: 'wrong' (default), or "
            "'first' (the published EmoPrefer code: counted as description 1)."
        },
    )
    calibrate_tie_threshold: bool = field(
        default=True,
        metadata={"help": "Fit the |reward difference| tie threshold on the training split (three-class WAF)."},
    )
    score_batch_size: int = field(default=32, metadata={"help": "Sequences per forward pass when scoring."})
    wandb_project: str = field(default="emoreward", metadata={"help": "W&B project when report_to has wandb."})

    @property
    def backbone_spec(self) -> BackboneSpec:
        """The registry entry of the backbone this recipe trains (`backbone`, else `model_name_or_path`)."""
        return get_backbone(self.backbone or self.model_name_or_path, gguf_file=self.gguf_file)

    @property
    def kind(self) -> str:
        """`"text"` or `"media"`: the one rule that decides which reward model a recipe trains."""
        return self.backbone_spec.kind

    def media_options(self):
        """The `emoreward.data.media.MediaOptions` of a multimodal recipe."""
        from emoreward.data.media import MediaOptions

        return MediaOptions(self.media_root, self.fps, self.max_frames, self.use_audio_in_video)

    def __post_init__(self):
        for name, literal in (
            ("ties", TieMode),
            ("truncation", TruncationMode),
            ("two_class_tie_policy", TwoClassTiePolicy),
            ("length_debias", LengthDebias),
            ("media_errors", MediaErrorPolicy),
        ):
            allowed = get_args(literal)
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {list(allowed)}")
        if self.ties != "drop" and not (self.tie_parameter > 0 and math.isfinite(self.tie_parameter)):
            raise ValueError(
                f"tie_parameter must be a finite number > 0 for ties={self.ties!r}, got {self.tie_parameter}"
            )
        self._check_backbone()
        if self.cv_folds < 0:
            raise ValueError(f"cv_folds must be >= 0, got {self.cv_folds}")
        if self.lora_r <= 0:
            raise ValueError(f"lora_r must be > 0, got {self.lora_r}")
        if self.max_length is None or self.max_length <= 0:
            raise ValueError(f"max_length must be a positive number of tokens, got {self.max_length}")
        eval_strategy = getattr(self.eval_strategy, "value", self.eval_strategy)
        if self.eval_file is None and (eval_strategy != "no" or self.load_best_model_at_end):
            raise ValueError(
                f"eval_strategy={eval_strategy!r} / load_best_model_at_end={self.load_best_model_at_end} need "
                "eval_file: held-out pairs to evaluate on during training (cross-validation folds never do)"
            )
        if self.bf16 is None and not self.fp16:
            # TRL turns bf16 on when unset, which fails on CPU-only machines: use it where a GPU supports it
            import torch

            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        super().__post_init__()

    def _check_backbone(self) -> None:
        if self.backbone is not None:
            spec = get_backbone(self.backbone)
            if spec.kind != "media":
                raise ValueError(
                    f"backbone={self.backbone!r} names a text backbone; name text backbones with model_name_or_path "
                    f"(backbone is for the multimodal families: {sorted(n for n in registered_names() if get_backbone(n).kind == 'media')})"
                )
            if self.model_name_or_path in (None, "minilm"):  # the field's default: the family's 7B checkpoint
                self.model_name_or_path = spec.default_model
        elif self.model_name_or_path is None:
            raise ValueError("model_name_or_path: give a text backbone (minilm, smollm2, a path or hub id)")
        spec = self.backbone_spec
        for name, kinds in FIELD_SUPPORT.items():
            value = getattr(self, name)
            if spec.kind not in kinds and value != _DEFAULTS[name]:
                reason = FIELD_NOTES.get(name, f"it applies to {' and '.join(sorted(kinds))} backbones only")
                raise ValueError(
                    f"{name}={value!r}: the {spec.kind} backbone {spec.name!r} does not read this field ({reason})"
                )
        if spec.kind == "media":
            self.media_options()  # checks fps and max_frames
            if self.use_audio_in_video and not spec.hears_audio:
                raise ValueError(f"use_audio_in_video=True but backbone {spec.name!r} cannot hear audio")


# Recipe fields beyond transformers.TrainingArguments and the backbone kinds that read them. A field set (to
# anything but its default) for a kind that does not read it is refused by `EmoRewardConfig.__post_init__`.
_BOTH = frozenset({"text", "media"})
_TEXT, _MEDIA, _NONE = frozenset({"text"}), frozenset({"media"}), frozenset()
FIELD_SUPPORT: dict[str, frozenset[str]] = {
    # TRL RewardConfig
    "model_init_kwargs": _BOTH,
    "trust_remote_code": _TEXT,
    "chat_template_path": _NONE,
    "disable_dropout": _BOTH,
    "dataset_num_proc": _NONE,
    "eos_token": _NONE,
    "pad_token": _NONE,
    "max_length": _BOTH,
    "pad_to_multiple_of": _BOTH,
    "center_rewards_coefficient": _BOTH,
    "activation_offloading": _BOTH,
    # model
    "model_name_or_path": _BOTH,
    "backbone": _MEDIA,
    "gguf_file": _TEXT,
    "use_peft": _BOTH,
    "lora_r": _BOTH,
    "lora_alpha": _BOTH,
    "lora_dropout": _BOTH,
    "lora_target_modules": _BOTH,
    "instruction": _BOTH,
    "train_projector": _MEDIA,
    "video_min_pixels": _MEDIA,
    "video_max_pixels": _MEDIA,
    # data
    "train_file": _BOTH,
    "eval_file": _BOTH,
    "media_root": _MEDIA,
    "fps": _MEDIA,
    "max_frames": _MEDIA,
    "use_audio_in_video": _MEDIA,
    "media_errors": _MEDIA,
    "ties": _BOTH,
    "tie_parameter": _BOTH,
    "truncation": _BOTH,
    # objective
    "length_debias": _BOTH,
    "odin_length_weight": _BOTH,
    "odin_orthogonal_weight": _BOTH,
    # evaluation
    "cv_folds": _BOTH,
    "final_fit": _BOTH,
    "two_class_tie_policy": _BOTH,
    "calibrate_tie_threshold": _BOTH,
    "score_batch_size": _BOTH,
    "wandb_project": _BOTH,
}
FIELD_NOTES = {
    "chat_template_path": "the chat template is the backbone tokenizer's own, read before the data are tokenized",
    "dataset_num_proc": "emoreward tokenizes the pairs itself, counting every pair it leaves out",
    "eos_token": "the sequence ends at the chat template's end-of-turn token",
    "pad_token": "emoreward picks a pad token distinct from the end-of-turn token the value head reads",
    "trust_remote_code": "multimodal backbones load with their transformers classes only",
}
_DEFAULTS = {
    f.name: (f.default if f.default is not MISSING else f.default_factory())
    for f in fields(EmoRewardConfig)
    if f.name in FIELD_SUPPORT
}


def default_recipe_path() -> Path:
    """The recipe `emoreward train` uses with no `--config`: MiniLM + LoRA on the bundled EmoPrefer pairs."""
    from importlib import resources

    return Path(str(resources.files("emoreward") / "resources" / "default_recipe.yaml"))


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, config_class: type = EmoRewardConfig
) -> EmoRewardConfig:
    """Parse a recipe YAML (flat keys) into an `EmoRewardConfig` (or `config_class`), with optional overrides.

    Args:
        path: the recipe; None = the bundled default recipe.
        overrides: keys that replace the recipe's (e.g. `{"output_dir": ...}` from the command line).
        config_class: `EmoRewardConfig` or a subclass.

    Raises:
        ValueError: an unknown key (named, with the file), or a value a field rejects.
        FileNotFoundError: if the recipe does not exist.
    """
    path = Path(path) if path is not None else default_recipe_path()
    if not path.exists():
        raise FileNotFoundError(f"recipe not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a mapping of keys to values, got {type(data).__name__}")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    known = {f.name for f in fields(config_class) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"{path} (or --set): unknown key(s) {unknown}; the fields are those of {config_class.__name__} "
            "(emoreward/training/config.py) and transformers.TrainingArguments"
        )
    data = {key: _check_type(config_class, key, value, path) for key, value in data.items()}
    (config,) = HfArgumentParser(config_class).parse_dict(data, allow_extra_keys=False)
    return config


def _check_type(config_class: type, key: str, value: Any, path: Path) -> Any:
    """A recipe value of the field's scalar type: numbers written as strings (YAML reads `3e-4` as a string) are
    converted; anything else that does not fit is a `ValueError` naming the field, before any work starts."""
    import typing

    hint = typing.get_type_hints(config_class).get(key)
    allowed = set(typing.get_args(hint)) or {hint}
    scalar = [t for t in (bool, int, float) if t in allowed]
    if not scalar or value is None or isinstance(value, bool) and bool in scalar:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (float in scalar or isinstance(value, int)):
        return value
    if isinstance(value, str) and str not in allowed:
        for kind in (int, float) if int in scalar else (float,):
            try:
                return kind(value)
            except ValueError:
                continue
    if str in allowed:
        return value
    raise ValueError(f"{path}: {key} must be a {' or '.join(t.__name__ for t in scalar)}, got {value!r}")


def load_recipe(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> EmoRewardConfig:
    """Parse any recipe, text or multimodal (the same `EmoRewardConfig`); see `load_config`."""
    return load_config(path, overrides)
