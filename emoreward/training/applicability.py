"""Which recipe fields apply under a recipe's own settings (the LoRA fields with `use_peft`, the tie parameter with a
tie likelihood, DPO's fields with DPO epochs, ...): one table per recipe class (`REWARD_FIELDS`, `JUDGE_FIELDS`: its
`FIELD_APPLIES`), read by one check (`check_fields_apply`: a field given where it cannot apply is refused) and by the
run identity (`inapplicable_fields`: such a field is no part of what a run computes). Imports no ML library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, NamedTuple


# where a recipe field's value came from (`field_layer`), from the weakest to the strongest
DEFAULT, RECIPE, COMMAND = 0, 1, 2


class Condition(NamedTuple):
    """Whether a group of fields applies in a recipe: `holds`, the fields that decide it (`settings`) and what those
    settings mean when it does not hold (`why`, the end of the refusal)."""

    holds: bool
    settings: tuple[str, ...]
    why: str


class FieldTable(NamedTuple):
    """A recipe class's applicability table: `fields` (field -> the name of the condition under which it applies) and
    `conditions` (config -> each condition's `Condition` in that recipe)."""

    fields: dict[str, str]
    conditions: Callable[[Any], dict[str, Condition]]


_LORA = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
_PEFT = "all weights train, there are no LoRA adapters"
# the Hub fields of TrainingArguments: read only when a run pushes (`push_to_hub`)
_HUB = ("hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push", "hub_revision")
# a pipeline resumes a run folder by its run identity (`run_identity.check_resumable`, the folder's own newest whole
# checkpoint of the same run), never from a checkpoint named in the recipe
_RESUME = (
    "the run resumes by its own run identity: rerun the same command into the same output_dir and {what} "
    "(another run's work is refused); a named checkpoint is never read"
)
# TrainingArguments' evaluation-during-training fields: a judge recipe has no evaluation set in its stages
_EVALUATION = (
    "eval_strategy", "eval_steps", "eval_delay", "eval_accumulation_steps", "eval_on_start", "include_for_metrics",
    "metric_for_best_model", "greater_is_better", "load_best_model_at_end", "per_device_eval_batch_size",
    "prediction_loss_only", "eval_do_concat_batches", "batch_eval_metrics", "eval_use_gather_object", "eval_packing",
)  # fmt: skip
NEVER = Condition(False, (), "")  # `why` filled per field group: the pipeline overrides the field whatever it says


def logs_to_wandb(config: Any) -> bool:
    """Whether a run logs to W&B (`emoreward.training.tracking.wandb_enabled`): `wandb` in `report_to`, as
    `TrainingArguments.__post_init__` resolved it (a list; `all`: every integration installed)."""
    return "wandb" in (config.report_to or [])


def _wandb(config: Any) -> Condition:
    return Condition(logs_to_wandb(config), ("report_to",), "nothing is logged to W&B (report_to has no wandb)")


def _hub(config: Any) -> Condition:
    return Condition(bool(config.push_to_hub), ("push_to_hub",), "nothing is pushed to the Hub (push_to_hub is off)")


def _reward_conditions(config: Any) -> dict[str, Condition]:
    from emoreward.training.objectives import get_objective  # the objective registry says which has two heads

    return {
        "hub": _hub(config),
        "resume": NEVER._replace(
            why=_RESUME.format(
                what="its finished folds and final model are reused, its newest whole step checkpoint resumed"
            )
        ),
        "peft": Condition(config.use_peft, ("use_peft",), _PEFT),
        "wandb": _wandb(config),
        "tie likelihood": Condition(
            config.ties != "drop", ("ties",), "tie pairs are dropped, no tie likelihood reads the parameter"
        ),
        "negatives": Condition(
            bool(config.controlled_negatives),
            ("controlled_negatives",),
            "no controlled negatives train this run (set controlled_negatives: the kinds to take, or [all])",
        ),
        "two heads": Condition(
            get_objective(config.length_debias).disentangled,
            ("length_debias",),
            "only the disentangled (ODIN) objective has a length head and these loss terms",
        ),
        "cross-validation": Condition(
            config.cv_folds >= 2, ("cv_folds",), "there are no cross-validation folds to train side by side"
        ),
        "evaluation": Condition(
            config.cv_folds >= 2 or config.eval_file is not None,
            ("cv_folds", "eval_file"),
            "no fold and no held-out file is evaluated, so no two-class score is counted",
        ),
    }


# `emoreward.training.config.EmoRewardConfig` (text and multimodal reward models)
REWARD_FIELDS = FieldTable(
    {
        **dict.fromkeys(_LORA, "peft"),
        "tie_parameter": "tie likelihood",
        "controlled_negatives_file": "negatives",
        **dict.fromkeys(("odin_length_weight", "odin_orthogonal_weight"), "two heads"),
        "two_class_tie_policy": "evaluation",
        "fit_workers": "cross-validation",  # folds side by side: none without folds (the final fit is one process)
        **dict.fromkeys(("wandb_project", "wandb_log_model"), "wandb"),
        **dict.fromkeys(_HUB, "hub"),
        "resume_from_checkpoint": "resume",
    },
    _reward_conditions,
)
# The judge recipe's two stages (`emoreward.training.judge`): the SFT stage is the recipe itself (an SFTConfig); the
# DPO stage's DPOConfig takes every TrainingArguments field of the recipe, the SFTConfig fields DPOConfig reads by the
# same name and meaning (`DPO_SHARED_FIELDS`), and its own recipe fields under DPOConfig's names (`DPO_FIELDS`, which
# apply with dpo_epochs > 0). SFTConfig's other fields (`SFT_ONLY_FIELDS`: no DPO counterpart, or another meaning)
# shape the SFT stage only. `tests/test_recipe_fields.py` checks that these cover SFTConfig's fields and that every
# result-changing field reaches the stages that read it.
DPO_FIELDS = {"dpo_epochs": "num_train_epochs", "dpo_learning_rate": "learning_rate", "dpo_beta": "beta"}
DPO_SHARED_FIELDS = (
    "max_length",
    "truncation_mode",
    "padding_free",
    "pad_to_multiple_of",
    "activation_offloading",
    "router_aux_loss_coef",
    "model_init_kwargs",
    "trust_remote_code",
    "dataset_num_proc",
    "pad_token",
)
SFT_ONLY_FIELDS = (
    "dataset_text_field",
    "dataset_kwargs",
    "eos_token",
    "shuffle_dataset",
    "packing",
    "packing_strategy",
    "eval_packing",
    "completion_only_loss",
    "assistant_only_loss",
    "loss_type",  # SFT's nll / dft; DPOConfig's loss_type names DPO losses
    "chat_template_path",
)
# `emoreward.training.judge_config.JudgeTrainConfig` (generative judges)
JUDGE_FIELDS = FieldTable(
    {
        **dict.fromkeys(_LORA, "peft"),
        **dict.fromkeys((f for f in DPO_FIELDS if f != "dpo_epochs"), "dpo"),  # dpo_epochs is the setting
        **dict.fromkeys(
            ("use_audio_in_video", "fps", "max_frames", "min_pixels", "max_pixels", "media_root"), "media"
        ),
        "wandb_project": "wandb",
        **dict.fromkeys(_HUB, "hub"),
        "resume_from_checkpoint": "resume",
        **dict.fromkeys(
            ("save_strategy", "save_steps", "save_total_limit", "save_only_model", "save_on_each_node"), "checkpoints"
        ),
        **dict.fromkeys(_EVALUATION, "evaluation"),
        "chat_template_path": "chat_template",
        **dict.fromkeys(("train_sampling_strategy", "packing"), "sampler"),
    },
    lambda config: {
        "evaluation": NEVER._replace(
            why="a judge is evaluated on its held-out folds by the shared harness after training, never during it "
            "(there is no evaluation set in the SFT or DPO stage)"
        ),
        "chat_template": NEVER._replace(
            why="a judge learns on the text it is scored on: its backbone's own chat template (scoring reads no other)"
        ),
        "hub": _hub(config),
        "resume": NEVER._replace(why=_RESUME.format(what="its finished folds and final judge are reused")),
        "checkpoints": NEVER._replace(
            why="a judge's SFT and DPO stages save no step checkpoint (save_strategy is always 'no'): a stopped run "
            "retrains the unfinished fold or final judge, the finished ones are reused"
        ),
        "peft": Condition(config.use_peft, ("use_peft",), _PEFT),
        "media": Condition(
            config.family is not None, ("family",), "a text chat LM judge reads no video or audio (no MLLM family)"
        ),
        "wandb": _wandb(config),
        "dpo": Condition(config.dpo_epochs > 0, ("dpo_epochs",), "the judge trains by SFT alone, no DPO stage"),
        "sampler": Condition(
            not config.orders_together,
            ("orders_together",),
            "the rows are drawn a pair at a time, both orders together (training.judge.OrdersTogetherSampler)",
        ),
    },
)


def _default(config_class: type, name: str) -> Any:
    for f in fields(config_class):
        if f.name == name:
            return f.default if f.default is not MISSING else f.default_factory()
    raise KeyError(name)


def field_layer(config: Any, name: str) -> int:
    """Where recipe field `name` of `config` was given: `COMMAND` (a command-line option, `--set`, a Python override,
    or, for a config built in Python, any value other than the field's default), `RECIPE` (a recipe-file line with a
    value other than the default) or `DEFAULT` (not given, or given as its default). `resolve_config` records each
    field's origin (`config.field_origins`) before `__post_init__` runs."""
    value, default = getattr(config, name), _default(type(config), name)
    recipe = getattr(config, "recipe_path", None)
    if recipe is None:  # built in Python: what differs from the default was passed
        return COMMAND if value != default else DEFAULT
    origin = config.field_origins.get(name)
    if origin is None:
        return DEFAULT
    if origin.startswith(f"{recipe}, line"):
        return RECIPE if value != default else DEFAULT
    return COMMAND


def check_recipe_numbers(config: Any) -> None:
    """What every recipe kind refuses before any field is read: a non-finite number in any field (NaN compares
    false, so ``lora_dropout: nan`` or ``max_grad_norm: nan`` would switch a feature off and write invalid JSON), a
    recipe that trains nothing (``cv_folds`` <= 1 without ``final_fit``) and one that trains zero steps.

    Raises:
        ValueError: one line naming the field."""
    import math

    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{f.name}={value}: expected a finite number")
    if config.cv_folds <= 1 and not config.final_fit:
        raise ValueError(f"cv_folds={config.cv_folds} and final_fit=false: the recipe trains nothing")
    if config.max_steps <= 0 and not config.num_train_epochs > 0:
        # transformers would run zero optimizer steps and save the untrained model
        raise ValueError(
            f"num_train_epochs={config.num_train_epochs} (with max_steps={config.max_steps}) trains zero steps: "
            "set num_train_epochs > 0 or max_steps > 0"
        )


def inapplicable_fields(config: Any) -> dict[str, str]:
    """Every field of the recipe's table (`type(config).FIELD_APPLIES`) whose condition does not hold under its
    settings -> that condition's name; what the run identity leaves out, whatever their values."""
    table = type(config).FIELD_APPLIES
    conditions = table.conditions(config)
    return {name: cond for name, cond in table.fields.items() if not conditions[cond].holds}


def check_fields_apply(config: Any) -> None:
    """Refuse a recipe field given where it cannot apply (it would be ignored, exit 0), before any work: the one check
    of the recipe classes' tables. A field counts as given where `field_layer` puts it above `DEFAULT` and not below
    the settings that rule it out: a recipe's value for a field that the command line switches off (`ties: davidson`,
    `tie_parameter: 2` in the file, `--ties drop` on the command line) is kept unused, never refused.

    Raises:
        ValueError: one line naming the fields, their values, the settings that rule them out and why."""
    table = type(config).FIELD_APPLIES
    for cond, (holds, settings, why) in table.conditions(config).items():
        if holds:
            continue
        ruling = max((field_layer(config, s) for s in settings), default=DEFAULT)  # NEVER: no setting rules
        given = [n for n, c in table.fields.items() if c == cond and DEFAULT < field_layer(config, n) >= ruling]
        if not given:
            continue
        values = ", ".join(f"{n}={getattr(getattr(config, n), 'value', getattr(config, n))!r}" for n in given)
        verb, them = ("does", "it") if len(given) == 1 else ("do", "them")
        if not settings:
            raise ValueError(f"{values} {verb} not apply to this recipe: {why}; leave {them} out")
        origins = getattr(config, "field_origins", {})
        setting = ", ".join(
            f"{s}={getattr(config, s)!r}" + (f" ({origins[s]})" if s in origins else "") for s in settings
        )
        raise ValueError(f"{values} {verb} not apply with {setting}: {why}; leave {them} out or change the setting")


__all__ = [
    "COMMAND",
    "DEFAULT",
    "DPO_FIELDS",
    "DPO_SHARED_FIELDS",
    "JUDGE_FIELDS",
    "NEVER",
    "check_recipe_numbers",
    "RECIPE",
    "REWARD_FIELDS",
    "SFT_ONLY_FIELDS",
    "Condition",
    "FieldTable",
    "check_fields_apply",
    "field_layer",
    "inapplicable_fields",
    "logs_to_wandb",
]
