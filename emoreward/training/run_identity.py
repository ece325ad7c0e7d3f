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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emoreward.utils.io import atomic_write_json, read_json_or_none


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.training.config import EmoRewardConfig


IDENTITY_FILE = "run_identity.json"
FIT_PLAN_KEY = "fit_plan"  # in IDENTITY_FILE: how the run's fits spread over threads (`recorded_fit_plan`)

# where a run writes, logs and keeps checkpoints, not what it computes: changing these resumes the same run
NOT_RESULT_FIELDS = frozenset(
    {
        "output_dir",
        "overwrite_output_dir",
        "run_name",
        "logging_dir",
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "logging_nan_inf_filter",
        "report_to",
        "disable_tqdm",
        "wandb_project",
        "wandb_log_model",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "push_to_hub",
        "hub_model_id",
        "hub_strategy",
        "hub_private_repo",
        "resume_from_checkpoint",
        "dataloader_num_workers",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "score_batch_size",
        "fit_workers",
    }
)


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
    pair's annotators' labels and the aggregation rule too), `backbone` (a local backbone's content), `recipe`
    (`public_config` values of the result-changing fields that apply under its settings: `inapplicable_fields`) and
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
    """The labels of the identity: one per pair; where annotators are named, their labels and the rule that made the
    pair's label (`emoreward.data.annotators.AGGREGATION`) as well."""
    if not any(p.annotations for p in pairs):
        return [p.label for p in pairs]
    from emoreward.data.annotators import AGGREGATION

    return [AGGREGATION, *([p.label, [list(a) for a in p.annotations]] for p in pairs)]


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
            out.append(f"recipe field {key} ({old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r})")
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
    "RunIdentityError",
    "check_checkpoint",
    "check_resumable",
    "execution_parameters",
    "identity_differences",
    "media_content",
    "prompt_content",
    "recorded_fit_plan",
    "run_identity",
    "work_fingerprint",
    "write_identity",
]
