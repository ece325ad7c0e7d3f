"""Run identity: what makes two training runs the same run (`run_identity`: data, labels, backbone content, the
result-changing recipe fields that apply under the recipe's settings (`applicability`) and execution parameters, and
their digest), so work in an output folder is resumed only by the run that produced it (`check_resumable`). Imports
no ML library. See docs/training.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emoreward.utils.io import atomic_write_json, read_json_or_none


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.training.config import EmoRewardConfig


IDENTITY_FILE = "run_identity.json"
FIT_PLAN_KEY = "fit_plan"  # in IDENTITY_FILE: how the run's fits spread over threads (`recorded_fit_plan`)

# Every field of both recipe classes, result-changing or not: one classification, by field name (a name means the same
# in both classes). `tests/test_recipe_fields.py` fails on a field of the installed transformers / TRL classes that is
# in neither set, so a new version's field is decided here; until then it counts as result-changing (`run_identity`
# keeps every field but NOT_RESULT_FIELDS): a wrong refusal is safe, a wrong reuse is not.
NOT_RESULT_FIELDS = frozenset(
    {
        # where a run writes, logs, reports and keeps checkpoints (transformers.TrainingArguments)
        "output_dir",
        "run_name",
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "log_on_each_node",
        "logging_nan_inf_filter",
        "include_num_input_tokens_seen",
        "log_level",
        "log_level_replica",
        "disable_tqdm",
        "report_to",
        "project",
        "trackio_space_id",
        "trackio_bucket_id",
        "trackio_static_space_id",
        "skip_memory_metrics",
        "debug",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "save_on_each_node",
        "enable_jit_checkpoint",
        "resume_from_checkpoint",
        "push_to_hub",
        "hub_token",
        "hub_model_id",
        "hub_strategy",
        "hub_private_repo",
        "hub_always_push",
        "hub_revision",
        "do_train",
        "do_eval",
        "do_predict",
        # how fast and on which process, not what is computed: data-loading workers (the sampler stays in the main
        # process), memory, the process group's plumbing, evaluation batching
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "dataloader_multiprocessing_context",
        "torch_empty_cache_steps",
        "local_rank",
        "ddp_timeout",
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "ddp_static_graph",
        "per_device_eval_batch_size",
        "eval_accumulation_steps",
        # TRL's SFTConfig: the text column of language-modelling rows (a judge trains on prompt / completion rows),
        # parallel tokenization, the packing of an eval dataset (a judge trains with none)
        "dataset_text_field",
        "dataset_num_proc",
        "eval_packing",
        # emoreward's own
        "overwrite_output_dir",
        "wandb_project",
        "wandb_log_model",
        "score_batch_size",
        "fit_workers",  # the fit plan is recorded at the run's first start (`recorded_fit_plan`)
    }
)
RESULT_FIELDS = frozenset(
    {
        # transformers.TrainingArguments: optimisation, precision, kernels, data order, best-model selection, devices
        "per_device_train_batch_size",
        "num_train_epochs",
        "max_steps",
        "learning_rate",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "warmup_steps",
        "optim",
        "optim_args",
        "optim_target_modules",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "gradient_accumulation_steps",
        "average_tokens_across_devices",
        "max_grad_norm",
        "label_smoothing_factor",
        "neftune_noise_alpha",
        "auto_find_batch_size",
        "bf16",
        "fp16",
        "bf16_full_eval",
        "fp16_full_eval",
        "tf32",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "use_liger_kernel",
        "liger_kernel_config",
        "use_cache",
        "eval_strategy",
        "eval_steps",
        "eval_delay",
        "eval_on_start",
        "prediction_loss_only",
        "eval_do_concat_batches",
        "eval_use_gather_object",
        "include_for_metrics",
        "batch_eval_metrics",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "ignore_data_skip",
        "restore_callback_states_from_checkpoint",
        "full_determinism",
        "seed",
        "data_seed",
        "use_cpu",
        "accelerator_config",
        "parallelism_config",
        "dataloader_drop_last",
        "dataloader_in_order",  # out of order: other batches first
        "remove_unused_columns",
        "label_names",
        "train_sampling_strategy",
        "length_column_name",
        "ddp_backend",
        "ddp_broadcast_buffers",
        "fsdp",
        "fsdp_config",
        "deepspeed",
        # TRL's RewardConfig and SFTConfig
        "model_init_kwargs",
        "trust_remote_code",
        "chat_template_path",
        "disable_dropout",
        "eos_token",
        "pad_token",
        "max_length",
        "pad_to_multiple_of",
        "center_rewards_coefficient",
        "activation_offloading",
        "router_aux_loss_coef",
        "dataset_kwargs",
        "truncation_mode",
        "shuffle_dataset",
        "packing",
        "packing_strategy",
        "padding_free",
        "completion_only_loss",
        "assistant_only_loss",
        "loss_type",
        # emoreward's reward recipe (`training.config.EmoRewardConfig`)
        "model_name_or_path",
        "backbone",
        "gguf_file",
        "train_projector",
        "video_min_pixels",
        "video_max_pixels",
        "use_peft",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "instruction",
        "train_file",
        "eval_file",
        "media_root",
        "fps",
        "max_frames",
        "use_audio_in_video",
        "media_errors",
        "ties",
        "tie_parameter",
        "truncation",
        "controlled_negatives",
        "controlled_negatives_file",
        "length_debias",
        "odin_length_weight",
        "odin_orthogonal_weight",
        "cv_folds",
        "final_fit",
        "two_class_tie_policy",
        "calibrate_tie_threshold",
        # emoreward's judge recipe (`training.judge_config.JudgeTrainConfig`)
        "recipe",
        "family",
        "min_pixels",
        "max_pixels",
        "prompts",
        "dpo_epochs",
        "dpo_beta",
        "dpo_learning_rate",
        "orders_together",
    }
)


def unclassified_fields(config_class: type) -> list[str]:
    """The init fields of a recipe class (`EmoRewardConfig`, `JudgeTrainConfig`) in neither `RESULT_FIELDS` nor
    `NOT_RESULT_FIELDS`, in declaration order: a field a new transformers or TRL version added, counted as
    result-changing by `run_identity` until it is classified."""
    known = RESULT_FIELDS | NOT_RESULT_FIELDS
    return [f.name for f in fields(config_class) if f.init and f.name not in known]


def execution_parameters(config: EmoRewardConfig) -> dict[str, Any]:
    """The parameters of how a run executes that change its numbers and are no recipe field: `world_size`, the
    number of processes of an `accelerate launch` (the effective batch is per-device batch x processes x
    `gradient_accumulation_steps`, and each process sees its share of every batch). 1 outside a launch."""
    return {"world_size": int(getattr(config, "world_size", 1) or 1)}


class RunIdentityError(ValueError):
    """An output folder holds the work of another run (other data, labels or recipe)."""


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def run_identity(config: EmoRewardConfig, pairs: Sequence[PreferencePair]) -> dict:
    """The identity of a training run: `data` (SHA-256 of every pair's sample id, descriptions, writers, media paths
    and margin, in content order), `labels` (SHA-256 of the labels in that order; with per-annotator labels, each
    pair's multiset of its annotators' labels, not their names, and the aggregation rule too), `backbone` (a local backbone's content), `recipe`
    (`public_config` values of every field but `NOT_RESULT_FIELDS`, an unclassified one included, that applies under
    its settings: `inapplicable_fields`) and
    `execution` (`execution_parameters`: the process count). Files named by path count by content, not path: the
    controlled negatives (`negatives`), a judge's prompt set (`prompts`, `prompt_content`) and every media file the
    pairs read (`media`, `media_content`).

    Returns:
        `{"data", "labels", "n_pairs", "train_file", "backbone", "backbone_path", "recipe", "execution",
        "fingerprint"}` (`backbone_path`: the backbone as named, for messages), plus
        `negatives`, `prompts`, `media` where the recipe reads them; `fingerprint` digests data, labels, backbone,
        recipe, execution and those contents (not paths whose content is in it)."""
    from emoreward.models.loading import source_identity
    from emoreward.training.applicability import inapplicable_fields
    from emoreward.training.config import public_config  # the recipe class and its masking of secrets

    backbone = source_identity(config.model_name_or_path)
    # paths are no identity where their content is one: the pairs are `data`, a local backbone is `backbone`
    by_content = {"train_file", "controlled_negatives_file"} | (
        {"model_name_or_path"} if backbone is not None else set()
    )
    # a field that does not apply under the recipe's settings (`lora_r` without LoRA) changes nothing it computes
    unused = set(inapplicable_fields(config))
    from emoreward.data.pairs import canonical_pairs

    pairs = canonical_pairs(pairs)  # the identity of the pairs, not of their order in a file
    prompts = prompt_content(config)
    media = media_content(config, pairs) if "media_root" not in unused else None
    by_content |= ({"prompts"} if prompts else set()) | ({"media_root"} if media else set())
    recipe = {k: v for k, v in public_config(config).items() if k not in NOT_RESULT_FIELDS | by_content | unused}
    if "use_cpu" in recipe:  # as the user gave it: the bf16 rule's own turn-on is the precision, `bf16` here
        from emoreward.training.bf16 import identity_use_cpu

        recipe["use_cpu"] = identity_use_cpu(config)
    recipe = json.loads(json.dumps(recipe, sort_keys=True, default=str))  # as it reads back from the JSON file
    data = [
        (p.sample_id, p.description_1, p.description_2, p.model_1, p.model_2, p.media.video, p.media.audio,
         p.media.subtitle, p.margin)
        for p in pairs
    ]  # fmt: skip
    identity = {
        "data": _digest(data),
        "labels": _digest(_labels(pairs)),
        "n_pairs": len(pairs),
        "train_file": str(config.train_file),
        "backbone": backbone,
        "backbone_path": str(config.model_name_or_path),  # where the content came from: no part of the fingerprint
        "recipe": recipe,
        "execution": execution_parameters(config),
    }
    parts = [identity["data"], identity["labels"], identity["backbone"], recipe, identity["execution"]]
    negatives_file = getattr(config, "controlled_negatives_file", None)  # a judge recipe has none
    if negatives_file and "controlled_negatives_file" not in unused:  # its content, not its path
        with open(negatives_file, "rb") as fh:
            identity["negatives"] = hashlib.file_digest(fh, "sha256").hexdigest()
        parts.append(identity["negatives"])
    for key, content in (("prompts", prompts), ("media", media)):
        if content:
            identity[key] = content
            parts.append([key, content["content"]])
    identity["fingerprint"] = _digest(parts)
    return identity


def prompt_content(config) -> dict | None:
    """A judge recipe's prompt set by content: `{"source": its file, "content": fingerprint}` of the file that
    `zero_shot.prompts.prompt_file` resolves (a bundled set's name included, so a set edited in place counts as
    another); None for a recipe without prompts."""
    name = getattr(config, "prompts", None)
    if not name:
        return None
    from emoreward.utils.cache_key import current_fingerprint
    from zero_shot.prompts import prompt_file

    path = prompt_file(name)
    return {"source": str(path), "content": current_fingerprint(path)}


def media_content(config, pairs: Sequence[PreferencePair]) -> dict | None:
    """Every media file the pairs read, by content: `{"root": media_root, "files": count, "content": digest}` of
    each pair's (video, audio) file fingerprints in pair order (None for a file not read or unreadable), the files
    as the recipe's own resolver finds them (`config.media_files`: a judge's `resolve_media` and `plan_media`; a
    reward model's `emoreward.data.media.resolve_paths` under its backbone's senses). None for a recipe that reads no
    media. Each file is hashed again only when its size or times changed (`current_fingerprint`)."""
    from emoreward.utils.cache_key import current_fingerprint

    files = config.media_files(list(pairs))  # the recipe's own resolver
    if files is None:
        return None
    prints = [[None if f is None else current_fingerprint(f) for f in pair_files] for pair_files in files]
    count = len({f for pair_files in files for f in pair_files if f is not None})
    return {"root": getattr(config, "media_root", None), "files": count, "content": _digest(prints)}


def _labels(pairs: Sequence[PreferencePair]) -> list:
    """The labels of the identity, by what training and its report read from them, never by annotator names: one
    label per pair; where annotators are named, each pair's multiset of their labels (the pair's label comes from it,
    and the agreement figures count it) and the rule that made the pair's label
    (`emoreward.data.annotators.AGGREGATION`). Renaming annotators, or giving one's labels to another, changes
    nothing trained, so it is the same run."""
    if not any(p.annotations for p in pairs):
        return [p.label for p in pairs]
    from emoreward.data.annotators import AGGREGATION

    return [AGGREGATION, *([p.label, sorted((label for _, label in p.annotations), key=str)] for p in pairs)]


def identity_differences(saved: dict, current: dict) -> list[str]:
    """What differs between two identities, in words: `"the training data (pairs)"`, `"the labels"`, and one
    `"recipe field NAME (A -> B)"` per changed field; empty when they are the same run."""
    out = []
    if saved.get("data") != current["data"]:
        out.append(
            f"the training data (pairs of {saved.get('train_file')}, {saved.get('n_pairs')} pairs -> "
            f"{current['train_file']}, {current['n_pairs']} pairs: other content)"
        )
    if saved.get("data") == current["data"] and saved.get("labels") != current["labels"]:
        out.append("the labels (the same pairs with other preference labels)")
    for key, what in (("prompts", "the prompt set"), ("media", "the media files the pairs read")):
        old, new = saved.get(key) or {}, current.get(key) or {}
        if old.get("content") != new.get("content"):
            where = new.get("source") or new.get("root") or old.get("source") or old.get("root")
            out.append(f"{what} ({where}: other content)" if where else f"{what} (other content)")
    if saved.get("negatives") != current.get("negatives"):
        out.append("the controlled negatives file (other content)")
    if saved.get("backbone") != current.get("backbone"):
        where = current.get("backbone_path") or current["recipe"].get("model_name_or_path")
        out.append(f"the backbone's weights ({where}: other content under that name)")
    old, new = saved.get("recipe") or {}, current["recipe"]
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            change = f"recipe field {key} ({old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r})"
            if key == "bf16":  # `bf16: auto` resolves by the scoring precision's rule: the user changed the precision
                change = (
                    f"the training precision ({change}; bf16: auto follows $EMOREWARD_DTYPE and the device's bf16 "
                    "matrix units)"
                )
            out.append(change)
    old, new = saved.get("execution") or {}, current.get("execution") or {}
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"execution parameter {key} ({old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r})")
    if not out and saved.get("fingerprint") != current["fingerprint"]:
        out.append("the run identity (written by another emoreward version)")
    return out


def _kept_work(out: Path) -> list[Path]:
    """What an earlier run left in `out` that a new run could resume: step checkpoints, finished markers."""
    found = sorted((out / "checkpoints").glob("checkpoint-*")) if (out / "checkpoints").is_dir() else []
    found += sorted(out.glob("cv/fold*/finished.json"))
    if (out / "model" / "finished.json").exists():
        found.append(out / "model" / "finished.json")
    return found


def check_resumable(config: EmoRewardConfig, identity: dict, *, is_main: bool = True) -> None:
    """Before a run trains in `config.output_dir`: refuse another run's work kept there (or, with
    `overwrite_output_dir`, remove it), then record this run's identity in `run_identity.json`.

    Raises:
        RunIdentityError: naming the folder, what differs and the options."""
    out = Path(config.output_dir)
    kept = _kept_work(out)
    saved = read_json_or_none(out / IDENTITY_FILE, what="run identity")
    for checkpoint in (p for p in kept if p.name.startswith("checkpoint-")):
        if isinstance(saved, dict):
            break
        saved = read_json_or_none(checkpoint / IDENTITY_FILE, what="run identity")
    if kept and not config.overwrite_output_dir:
        if not isinstance(saved, dict):
            differences = ["the run identity (the folder's work has none: written by an older emoreward)"]
        else:
            differences = identity_differences(saved, identity)
        if differences:
            raise RunIdentityError(
                f"output_dir {out} holds the checkpoints or finished work of another run ({len(kept)} items, e.g. "
                f"{kept[0]}); it differs in: {'; '.join(differences)}. Resuming would continue that run's model. "
                "Pass --overwrite_output_dir (or --set overwrite_output_dir=true) to start over in this folder, or "
                "give a new --output-dir"
            )
    if is_main:
        if kept and config.overwrite_output_dir:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            for marker in kept:
                if marker.name == "finished.json":
                    marker.unlink(missing_ok=True)
        same = isinstance(saved, dict) and saved.get("fingerprint") == identity["fingerprint"]
        plan = saved.get(FIT_PLAN_KEY) if same and not config.overwrite_output_dir else None
        atomic_write_json(out / IDENTITY_FILE, {**identity, FIT_PLAN_KEY: plan} if plan else identity)


def check_checkpoint(checkpoint: str | Path, identity: dict) -> None:
    """Refuse to resume from a step checkpoint whose recorded identity is another run's.

    Raises:
        RunIdentityError: naming the checkpoint, what differs and the options.
    """
    saved = read_json_or_none(Path(checkpoint) / IDENTITY_FILE, what="run identity")
    differences = (
        identity_differences(saved, identity)
        if isinstance(saved, dict)
        else ["the run identity (the checkpoint has none: written by an older emoreward)"]
    )
    if differences:
        raise RunIdentityError(
            f"checkpoint {checkpoint} belongs to another run; it differs in: {'; '.join(differences)}. Pass "
            "--overwrite_output_dir to start over, or give a new --output-dir"
        )


def recorded_fit_plan(output_dir: str | Path, plan: dict, *, is_main: bool = True) -> dict:
    """The run's fit plan (`{"workers", "threads"}`): the one recorded in `run_identity.json` at the run's first start,
    else `plan`, recorded now (main process), so a resumed run trains on the same thread counts."""
    path = Path(output_dir) / IDENTITY_FILE
    saved = read_json_or_none(path, what="run identity")
    if isinstance(saved, dict) and isinstance(saved.get(FIT_PLAN_KEY), dict):
        return saved[FIT_PLAN_KEY]
    if is_main and isinstance(saved, dict):
        atomic_write_json(path, {**saved, FIT_PLAN_KEY: plan})
    return plan


def work_fingerprint(identity: dict, *parts: Any) -> str:
    """The key of one piece of a run's work (a fold: its train / test indices): the run's fingerprint and `parts`."""
    return _digest([identity["fingerprint"], *parts])


def write_identity(folder: str | Path, identity: dict) -> Path:
    """Write `identity` as `<folder>/run_identity.json` (atomic; the folder is created), e.g. into a step
    checkpoint before the trainer writes its weights and state (`EmoRewardTrainer._save_checkpoint`)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return atomic_write_json(Path(folder) / IDENTITY_FILE, identity)


__all__ = [
    "IDENTITY_FILE",
    "NOT_RESULT_FIELDS",
    "RESULT_FIELDS",
    "RunIdentityError",
    "check_checkpoint",
    "check_resumable",
    "execution_parameters",
    "identity_differences",
    "media_content",
    "prompt_content",
    "recorded_fit_plan",
    "run_identity",
    "unclassified_fields",
    "work_fingerprint",
    "write_identity",
]
