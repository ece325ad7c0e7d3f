"""Training configuration: `EmoRewardConfig` (a `trl.RewardConfig`) for text and multimodal reward models, read
from a recipe YAML by `RecipeParser` (`--config`, `--field value`, `--set field=value`).

`EmoRewardConfig.kind` (the backbone registry's) decides text or multimodal; a field the chosen backbone does not
read (`FIELD_SUPPORT`) is an error when set. See docs/training.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from trl import RewardConfig, TrlParser

from emoreward.models.backbones import BACKBONES, BackboneSpec, get_backbone, registered_names
from emoreward.training.applicability import REWARD_FIELDS, FieldTable, check_fields_apply, check_recipe_numbers
from emoreward.training.bf16 import apply_training_bf16
from emoreward.training.fit_workers import parse_fit_workers
from emoreward.training.parsing import (
    SECRET_HINT,
    RecipeError,
    is_secret_key,
    parse_value,
    parse_yaml_value,
    read_recipe_file,
    split_override,
    unknown_key_message,
)


def _names(kind: str) -> list[str]:
    """The registered backbones of `kind`, in registry order (help texts and errors)."""
    return [name for name, spec in BACKBONES.items() if spec.kind == kind]


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
            "help": f"Weights: a registered text backbone ({', '.join(_names('text'))}), a local path or a hub model "
            "id; for a multimodal `backbone`, its checkpoint (None = the family's 7B hub id)."
        },
    )
    backbone: str | None = field(
        default=None,
        metadata={
            "help": f"Multimodal backbone family ({', '.join(_names('media'))}); None = the text backbone named by "
            "model_name_or_path."
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

    # ------------------------------------------------------------------ controlled negatives
    controlled_negatives: list[str] | None = field(
        default=None,
        metadata={
            "help": "Train on controlled negatives too: kinds (emotion_flip, intensity_mismatch, "
            "evidence_contradiction, modality_omission; 'all' for the four) written by the rules engine from the "
            "preferred description of each training pair, each a pair 'original over negative' beside the human "
            "pairs (emoreward.data.negatives; docs/training.md). None: human pairs only."
        },
    )
    controlled_negatives_file: str | None = field(
        default=None,
        metadata={
            "help": "Take the negatives from this file (`emoreward augment` output, any engine) instead of writing "
            "them: only those of the fit's own samples train it, so a held-out fold's negatives never do."
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
    # declared `str` for HfArgumentParser (one type per option); recipes read it as `FIT_WORKERS_HINT`
    fit_workers: str = field(
        default="auto",
        metadata={
            "help": "Cross-validation folds trained at once, each in a worker process: 'auto' (default) on a CPU "
            "with 2+ threads, for a text backbone, one single-threaded fold per core (less per-step overhead than "
            "one process on all cores; the final fit runs beside the last folds); 1 elsewhere (GPU, accelerate "
            "launch, multimodal); an integer sets it (CPU only). See emoreward.training.fit_workers."
        },
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
    wandb_project: str = field(
        default="emoreward", metadata={"help": "W&B project when report_to has wandb (WANDB_PROJECT wins)."}
    )
    wandb_log_model: bool = field(
        default=False,
        metadata={
            "help": "With report_to wandb: log the final model directory (adapter, value head, tokenizer, settings) "
            "as a W&B artifact of type 'model' on the final-fit run."
        },
    )

    # declared `str | None` for HfArgumentParser (one type per option); recipes read it as `BF16_HINT`
    bf16: str | None = field(
        default="auto",
        metadata={
            "help": "Train with bf16 autocast: 'auto' (default) where the device has bf16 matrix units (Ampere+ GPUs; "
            "CPUs with AMX-BF16 / AVX512-BF16 / Arm BF16), by the rule scoring uses "
            "(emoreward.models.precision.resolve_dtype); true refuses a device without them (emulated bf16 is "
            "~100x slower); on CPU it sets use_cpu, which transformers needs for CPU bf16."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start over in output_dir even when it holds another run's checkpoints or finished work (other "
            "data, labels or recipe): they are removed. Without it such a folder is refused; the same run resumes."
        },
    )

    @property
    def backbone_spec(self) -> BackboneSpec:
        """The registry entry of the backbone this recipe trains (`backbone`, else `model_name_or_path`)."""
        return get_backbone(self.backbone or self.model_name_or_path, gguf_file=self.gguf_file)

    @property
    def kind(self) -> str:
        """`"text"` or `"media"`: the one rule that decides which reward model a recipe trains."""
        return self.backbone_spec.kind

    def backbone_positions(self) -> int | None:
        """The token positions of the backbone's language model (`max_position_embeddings` of its text config, less
        RoBERTa's padding offset); None when its config cannot be read here (a hub id offline)."""
        from transformers import AutoConfig

        spec = self.backbone_spec
        source = spec.resolve() if spec.kind == "text" else self.model_name_or_path
        kwargs = {"gguf_file": spec.gguf_file} if spec.kind == "text" and spec.gguf_file else {}
        try:
            backbone_config = AutoConfig.from_pretrained(source, trust_remote_code=False, **kwargs)
        except (OSError, ValueError, KeyError, ImportError):
            return None
        text_config = backbone_config.get_text_config()
        positions = getattr(text_config, "max_position_embeddings", None)
        if positions is None:
            return None
        if "roberta" in str(getattr(text_config, "model_type", "")):  # positions start after the padding index
            positions -= int(getattr(text_config, "pad_token_id", 1) or 1) + 1
        return int(positions)

    # where each field was set ("recipe.yaml, line 4", "--max_length 64", "--set ..."), filled by `resolve_config`
    # (not dataclass fields: not part of the recipe, its fingerprint or `to_dict`)
    recipe_path: typing.ClassVar[str | None] = None
    field_origins: typing.ClassVar[dict[str, str]] = {}
    FIELD_APPLIES: typing.ClassVar[FieldTable] = REWARD_FIELDS  # when each field applies (`training.applicability`)

    def origin(self, name: str) -> str:
        """Where field `name` was set, for error messages: the recipe file and line, the command-line option, or
        the recipe file when the field kept its default."""
        where = self.field_origins.get(name)
        if where:
            return where
        return f"{self.recipe_path} ({name} not set: its default)" if self.recipe_path else name

    def check_data_files(self) -> None:
        """Refuse a `train_file` / `eval_file` path that does not exist before anything else runs.

        Raises:
            FileNotFoundError: naming the field, where it was set and the path."""
        from emoreward.data.hub import is_hub_spec
        from emoreward.data.pairs import BUNDLED

        for name in ("train_file", "eval_file"):
            value = getattr(self, name)
            if not isinstance(value, (str, Path)) or is_hub_spec(value) or value in BUNDLED:
                continue
            if not Path(value).exists():
                raise FileNotFoundError(f"{self.origin(name)}: {name}: preference data file not found: {value}")

    def check_max_length(self) -> None:
        """Refuse a `max_length` beyond the backbone's positions before any training.

        Raises:
            ValueError: naming max_length, the backbone and its `max_position_embeddings`."""
        positions = self.backbone_positions()
        if positions is not None and self.max_length > positions:
            default = " (TRL's default when a recipe does not set max_length)" if self.max_length == 1024 else ""
            where = f"{self.origin('max_length')}: " if self.field_origins or self.recipe_path else ""
            raise ValueError(
                f"{where}max_length={self.max_length}{default} exceeds the {positions} token positions of backbone "
                f"{self.backbone or self.model_name_or_path!r} (max_position_embeddings in its config): "
                f"set max_length: {positions} or less"
            )

    def media_files(self, pairs) -> list[tuple[str | None, str | None]] | None:
        """The files this recipe reads of each pair, `[(video file or None, audio file or None), ...]` in pair order,
        as `emoreward.data.media.resolve_paths` finds them under the backbone's senses (None for a file the pair
        lacks or that is missing or empty: the run skips or refuses it by `media_errors`). None for a recipe that
        reads no media; the run identity hashes these files."""
        spec = self.backbone_spec
        if spec.kind != "media" or not (spec.sees_video or spec.hears_audio):
            return None
        from emoreward.data.media import MediaError, resolve_paths

        options, files = self.media_options(), []
        for p in pairs:
            try:
                video, audio = resolve_paths(
                    p.sample_id, p.media, options, need_video=spec.sees_video, need_audio=spec.hears_audio
                )
            except MediaError:
                video = audio = None
            files.append((None if video is None else str(video), None if audio is None else str(audio)))
        return files

    def media_options(self):
        """The `emoreward.data.media.MediaOptions` of a multimodal recipe."""
        from emoreward.data.media import MediaOptions

        return MediaOptions(self.media_root, self.fps, self.max_frames, self.use_audio_in_video)

    def __post_init__(self):
        check_recipe_numbers(self)  # finite numbers, something to train: before any field is read
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
        check_remote_code(self)
        local = self.model_name_or_path and Path(str(self.model_name_or_path)).expanduser()
        if local and local.exists() and str(self.model_name_or_path) not in registered_names():
            # a local checkpoint is recorded by its absolute path: the saved adapter must find its base model from
            # any working directory
            self.model_name_or_path = str(local.resolve())
        if self.cv_folds < 0:
            raise ValueError(f"cv_folds must be >= 0, got {self.cv_folds}")
        self.fit_workers = parse_fit_workers(self.fit_workers)
        self.controlled_negatives = negative_kinds(self.controlled_negatives)
        if self.lora_r <= 0:
            raise ValueError(f"lora_r must be > 0, got {self.lora_r}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "score_batch_size"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.learning_rate >= 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be a finite number >= 0, got {self.learning_rate}")
        if self.output_dir and Path(self.output_dir).exists() and not Path(self.output_dir).is_dir():
            raise ValueError(f"output_dir {self.output_dir} is a file; give a folder")
        if self.max_length is None or self.max_length <= 0:
            raise ValueError(f"max_length must be a positive number of tokens, got {self.max_length}")
        eval_strategy = getattr(self.eval_strategy, "value", self.eval_strategy)
        if self.eval_file is None and (eval_strategy != "no" or self.load_best_model_at_end):
            raise ValueError(
                f"eval_strategy={eval_strategy!r} / load_best_model_at_end={self.load_best_model_at_end} need "
                "eval_file: held-out pairs to evaluate on during training (cross-validation folds never do)"
            )
        if self.disable_tqdm is None:
            # transformers switches the progress bar off whenever its log level is above WARNING (the CLI sets
            # ERROR to keep library noise down): show it on a terminal, as tqdm users expect, and not in logs
            self.disable_tqdm = not sys.stderr.isatty()
        apply_training_bf16(self)  # use_cpu as given kept for the run identity
        super().__post_init__()
        check_fields_apply(self)  # on report_to as TrainingArguments resolved it

    def _check_backbone(self) -> None:
        if self.backbone is not None:
            spec = get_backbone(self.backbone)
            if spec.kind != "media":
                raise ValueError(
                    f"backbone={self.backbone!r} names a text backbone; name text backbones with model_name_or_path "
                    f"(backbone is for the multimodal families: {registered_names('media')})"
                )
            if self.model_name_or_path in (None, "minilm"):  # the field's default: the family's 7B checkpoint
                self.model_name_or_path = spec.default_model
        elif self.model_name_or_path is None:
            raise ValueError(
                f"model_name_or_path: give a text backbone ({', '.join(_names('text'))}, a path or hub id)"
            )
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


def negative_kinds(kinds: list[str] | None) -> list[str] | None:
    """The `controlled_negatives` field in its one form: None (none), or kinds of `emoreward.data.negatives.KINDS` in
    that order (``all``: the four).

    Raises:
        ValueError: an unknown kind (the message lists them)."""
    from emoreward.data.negatives import KINDS

    if not kinds:
        return None
    if "all" in kinds:
        return list(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"controlled_negatives: unknown kind {unknown[0]!r}; available: {[*KINDS, 'all']}")
    return [k for k in KINDS if k in kinds]


# Recipe fields beyond transformers.TrainingArguments and the backbone kinds that read them. A field set (to
# anything but its default) for a kind that does not read it is refused by `EmoRewardConfig.__post_init__`.
_BOTH = frozenset({"text", "media"})
_TEXT, _MEDIA, _NONE = frozenset({"text"}), frozenset({"media"}), frozenset()
FIELD_SUPPORT: dict[str, frozenset[str]] = {
    # TRL RewardConfig
    "model_init_kwargs": _BOTH,
    "trust_remote_code": _BOTH,  # checked by check_remote_code (refused for media, asked for on the command line)
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
    "controlled_negatives": _BOTH,
    "controlled_negatives_file": _BOTH,
    # objective
    "length_debias": _BOTH,
    "odin_length_weight": _BOTH,
    "odin_orthogonal_weight": _BOTH,
    # evaluation
    "cv_folds": _BOTH,
    "final_fit": _BOTH,
    "fit_workers": _BOTH,
    "two_class_tie_policy": _BOTH,
    "calibrate_tie_threshold": _BOTH,
    "score_batch_size": _BOTH,
    "wandb_project": _BOTH,
    "wandb_log_model": _BOTH,
    "overwrite_output_dir": _BOTH,
}
FIELD_NOTES = {
    "chat_template_path": "the chat template is the backbone tokenizer's own, read before the data are tokenized",
    "dataset_num_proc": "emoreward tokenizes the pairs itself, counting every pair it leaves out",
    "eos_token": "the sequence ends at the chat template's end-of-turn token",
    "pad_token": "emoreward picks a pad token distinct from the end-of-turn token the value head reads",
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


def public_config(config: EmoRewardConfig) -> dict:
    """The resolved recipe without secrets: what the report, the W&B run config and the run fingerprint record."""
    data = config.to_dict()
    return {k: v for k, v in data.items() if "token" not in k.lower() or k in ("pad_token", "eos_token")}


# how a recipe value of these fields is read, where the dataclass annotation cannot say it (HfArgumentParser takes
# one type per option): `bf16` is true / false / auto
BF16_HINT = bool | Literal["auto"] | None
FIT_WORKERS_HINT = int | Literal["auto"]
RECIPE_TYPES: dict[str, Any] = {"bf16": BF16_HINT, "fit_workers": FIT_WORKERS_HINT}


def recipe_fields(config_class: type = EmoRewardConfig) -> dict[str, Any]:
    """Every field a recipe may set, with the type its values are read as (the annotation, or `RECIPE_TYPES`)."""
    hints = typing.get_type_hints(config_class)
    return {f.name: RECIPE_TYPES.get(f.name, hints[f.name]) for f in fields(config_class) if f.init}


def resolve_config(
    path: str | Path | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    config_class: type = EmoRewardConfig,
) -> EmoRewardConfig:
    """Build a config from a recipe YAML and command-line values; later sources win: the dataclass defaults, the
    recipe, `overrides` (Python), `options` (`--field value`, already typed), `sets` (`--set field=value`). Every text
    value is read by its field's declared type (`emoreward.training.parsing.parse_value`).

    Raises:
        FileNotFoundError: the recipe does not exist.
        ValueError: invalid YAML (file, line, column), an unknown key, a credential, a value its field cannot read,
            or a value `__post_init__` refuses (each naming where it was set)."""
    path = Path(path) if path is not None else default_recipe_path()
    known = recipe_fields(config_class)
    values: dict[str, Any] = {}
    entries = read_recipe_file(path)
    origins = {key: f"{path}, line {entry.line}" for key, entry in entries.items()}
    unknown = [key for key in entries if key not in known]
    if unknown:
        hint = (
            " (emoreward recipes set no environment variables: export them in the shell)" if "env" in unknown else ""
        )
        raise RecipeError(
            f"{path}, line {entries[unknown[0]].line}: {unknown_key_message(unknown, list(known))}{hint}; the fields "
            f"are those of {config_class.__name__} (emoreward/training/config.py) and transformers.TrainingArguments"
        )
    for key, entry in entries.items():
        where = f"{path}, line {entry.line}"
        try:
            values[key] = (
                parse_value(known[key], entry.value, key)
                if entry.scalar
                else parse_yaml_value(known[key], entry.value, key)
            )
        except ValueError as err:
            raise RecipeError(f"{where}: {err}") from None
    for key, value in (overrides or {}).items():
        if key not in known:
            raise RecipeError(f"override {key}: {unknown_key_message(key, list(known))}")
        if is_secret_key(key):
            raise RecipeError(f"{key}: {SECRET_HINT}")
        try:
            values[key] = parse_yaml_value(known[key], value, key)
        except ValueError as err:
            raise RecipeError(str(err)) from None
        origins[key] = f"override {key}={value!r}"
    values.update(options or {})
    origins.update({key: f"--{key} {getattr(value, 'value', value)}" for key, value in (options or {}).items()})
    for item in sets or []:
        key, text = split_override(item)
        if key not in known:
            raise RecipeError(f"--set {item}: {unknown_key_message(key, list(known))}")
        try:
            values[key] = parse_value(known[key], text, key)
        except ValueError as err:
            raise RecipeError(f"--set {item}: {err}") from None
        origins[key] = f"--set {item}"
    config = config_class.__new__(config_class)  # where fields were set, known to __post_init__ (check_fields_apply)
    config.recipe_path, config.field_origins = str(path), origins
    try:
        config.__init__(**values)
    except ValueError as err:  # a value __post_init__ refuses: say where it was set
        raise RecipeError(locate_field_error(str(err), origins, path, known)) from None
    check_remote_code(config)
    return config


def check_remote_code(config: EmoRewardConfig) -> None:
    """`trust_remote_code` in a recipe (the rule: `emoreward.utils.remote_code.check_remote_code`): never for a
    multimodal backbone; for a text backbone only when asked on the command line or in Python, never from a recipe.

    Raises:
        RecipeError: naming where it was set and how to allow it."""
    if not config.trust_remote_code:
        return
    where = config.field_origins.get("trust_remote_code", "")
    if config.kind == "media":
        raise RecipeError(
            f"{where + ': ' if where else ''}trust_remote_code=True: the multimodal backbone "
            f"{config.backbone_spec.name!r} loads with its transformers classes only; remove trust_remote_code"
        )
    from emoreward.utils.remote_code import check_remote_code as remote_code_rule

    from_file = bool(config.recipe_path) and where.startswith(f"{config.recipe_path}, line")
    try:
        remote_code_rule(
            True,
            model=config.model_name_or_path,
            set_at=where if from_file else None,
            ask="--trust_remote_code (or --set trust_remote_code=true)",
        )
    except ValueError as err:
        raise RecipeError(str(err)) from None


def locate_field_error(message: str, origins: dict[str, str], recipe: str | Path, known) -> str:
    """An error about a recipe field (the first recipe field named in the message), prefixed with where that field
    was set: the recipe file and line, the command-line option, or the recipe file for a default."""
    import re

    for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if name in known:
            where = origins.get(name) or f"{recipe} ({name} not set: its default)"
            return f"{where}: {message}"
    return f"{recipe}: {message}"


def with_fields(config, **changes):
    """A copy of a recipe config (any recipe class) with ``changes`` set, ``__post_init__`` not run again."""
    import copy

    new = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(new, key, value)
    return new


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, config_class: type = EmoRewardConfig
) -> EmoRewardConfig:
    """Parse a recipe YAML (flat keys; None: the bundled default recipe) into an `EmoRewardConfig` (or
    `config_class`), `overrides` replacing the recipe's fields (text values read by the field's type).

    Raises:
        ValueError: an unknown key (named, with the file and line), invalid YAML, a credential, or a value a field
            rejects. FileNotFoundError: the recipe does not exist."""
    return resolve_config(path, overrides=overrides, config_class=config_class)


class RecipeParser(TrlParser):
    """TRL's `TrlParser` for emoreward recipes: `--config RECIPE.yaml`, `--field value` for any field and
    `--set field=value`, the command line over the YAML over the defaults (TRL's precedence).

    Unlike `TrlParser`, every value (in the YAML too) is read by its field's declared type, an unknown key or invalid
    YAML names file and line, credentials are refused and abbreviated options are not accepted.
    `parse_args_and_config` returns a one-element tuple, like TrlParser."""

    def __init__(self, config_class: type = EmoRewardConfig, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.HelpFormatter)
        super().__init__(dataclass_types=[config_class], **kwargs)
        self.config_class = config_class
        type_recipe_options(self, config_class)
        add_recipe_file_options(self)

    def parse_args_and_config(self, args: list[str] | None = None) -> tuple[EmoRewardConfig]:
        """Parse `args` (default `sys.argv[1:]`) into `(config,)`.

        Raises:
            SystemExit(2): a malformed command line. ValueError / FileNotFoundError: see `resolve_config`."""
        return (config_from_arguments(self.parse_args(args), self.config_class),)

    def error(self, message: str):
        # one line: the usage of ~150 options would bury the message
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def add_recipe_file_options(parser: argparse.ArgumentParser) -> None:
    """`--config`, `--set`, `--no-wandb` and `--quiet`: the options `RecipeParser` adds beside the fields'."""
    parser.add_argument(
        "--config",
        metavar="RECIPE.yaml",
        help="recipe YAML (flat keys; default: the bundled MiniLM + LoRA recipe on EmoPrefer-Data)",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field, read by the field's type (repeatable; the same as --KEY VALUE)",
    )
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B (the same as --report_to none)")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (the same as --disable_tqdm true, unless that is given)"
    )


def type_recipe_options(parser: argparse.ArgumentParser, config_class: type = EmoRewardConfig) -> None:
    """Make the field options `HfArgumentParser` added read values with `parse_value` and leave unset fields out of
    the namespace, so a recipe value is replaced only by an option actually given."""
    known = recipe_fields(config_class)
    defaults = {f.name: f for f in fields(config_class)}
    for action in parser._actions:
        if action.dest not in known:
            continue
        hint = known[action.dest]
        if is_secret_key(action.dest):
            action.type = functools.partial(_refuse_secret, action.dest)
            action.default = argparse.SUPPRESS
            continue
        if action.nargs == 0:  # `--no_<field>` of a boolean that defaults to True
            action.default = argparse.SUPPRESS
            continue
        if action.choices is not None:
            action.metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
            action.choices = None
        if action.nargs == "+":
            element = next(
                (typing.get_args(m) or (str,) for m in _union_members(hint) if typing.get_origin(m) is list), (str,)
            )[0]
            action.type = functools.partial(_argparse_value, element, action.dest)
        else:
            action.type = functools.partial(_argparse_value, hint, action.dest)
            if action.nargs is None and bool in _union_members(hint):
                # `--bf16` alone means true for every boolean field, `bool | None` ones too (HfArgumentParser
                # gives the bare flag to plain `bool` fields only)
                action.nargs, action.const = "?", True
        f = defaults[action.dest]
        default = f.default if f.default is not MISSING else None
        if action.help and default not in (None, "") and "(default" not in action.help:
            action.help = f"{action.help} (default: {getattr(default, 'value', default)})".replace("%", "%%")
        action.default = argparse.SUPPRESS


def _refuse_secret(name: str, _text: str) -> Any:
    raise argparse.ArgumentTypeError(SECRET_HINT)


def _argparse_value(hint: Any, name: str, text: str) -> Any:
    try:
        return parse_value(hint, text, name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _union_members(hint: Any) -> tuple:
    import types

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def config_from_arguments(namespace: argparse.Namespace, config_class: type = EmoRewardConfig) -> EmoRewardConfig:
    """The config a parsed command line describes (`--no-wandb`: `report_to: [none]`; `--quiet`:
    `disable_tqdm: true`); see `resolve_config`."""
    known = recipe_fields(config_class)
    options = {k: v for k, v in vars(namespace).items() if k in known}
    if getattr(namespace, "no_wandb", False):
        options["report_to"] = ["none"]
    if getattr(namespace, "quiet", False):
        options.setdefault("disable_tqdm", True)
    return resolve_config(namespace.config, options=options, sets=list(namespace.set or []), config_class=config_class)


def load_recipe(path: str | Path | None = None, overrides: dict[str, Any] | None = None):
    """Any recipe by its kind: a reward model's (text or multimodal: `EmoRewardConfig`) or a generative judge's
    (``recipe: judge``: `emoreward.training.judge.JudgeTrainConfig`); as `load_config` otherwise."""
    from emoreward.training.judge_config import JudgeTrainConfig, is_judge_recipe

    judge = path is not None and is_judge_recipe(path)
    return load_config(path, overrides, JudgeTrainConfig if judge else EmoRewardConfig)
