"""Every field of both recipe classes is classified, result-changing or not (`run_identity.RESULT_FIELDS` /
`NOT_RESULT_FIELDS`), against the installed transformers and TRL, so a new version's field forces a decision; an
unclassified one counts in the run identity. The judge recipe's DPO stage is built from one declared mapping
(`applicability.DPO_FIELDS`, `DPO_SHARED_FIELDS`, `SFT_ONLY_FIELDS`), and every result-changing field of the judge
recipe reaches the stages that read it, with its value."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from emoreward.training.applicability import DPO_FIELDS, DPO_SHARED_FIELDS, SFT_ONLY_FIELDS
from emoreward.training.config import EmoRewardConfig
from emoreward.training.judge_config import JudgeTrainConfig
from emoreward.training.run_identity import NOT_RESULT_FIELDS, RESULT_FIELDS, unclassified_fields


def _names(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class) if f.init}


@pytest.mark.parametrize("config_class", [EmoRewardConfig, JudgeTrainConfig], ids=lambda c: c.__name__)
def test_every_field_of_the_installed_recipe_classes_is_classified(config_class):
    import transformers
    import trl

    missing = unclassified_fields(config_class)
    assert not missing, (
        f"{config_class.__name__} (transformers {transformers.__version__}, TRL {trl.__version__}) has fields in "
        f"neither run_identity.RESULT_FIELDS nor NOT_RESULT_FIELDS: {missing}; decide whether each changes a "
        "run's result"
    )


def test_the_classification_is_one_decision_per_field_and_names_real_fields():
    assert not RESULT_FIELDS & NOT_RESULT_FIELDS
    stale = (RESULT_FIELDS | NOT_RESULT_FIELDS) - _names(EmoRewardConfig) - _names(JudgeTrainConfig)
    assert not stale, f"classified names that are no field of either recipe class: {sorted(stale)}"


def test_an_unclassified_field_counts_in_the_run_identity(tmp_path):
    """A field a new version adds is result-changing until classified: a run that differs in it is refused."""
    from emoreward.data import PreferencePair
    from emoreward.training.config import with_fields
    from emoreward.training.run_identity import identity_differences, run_identity

    @dataclasses.dataclass
    class Newer(JudgeTrainConfig):
        brand_new_knob: int = 0

    assert unclassified_fields(Newer) == ["brand_new_knob"]
    pairs = [PreferencePair("s0", "happy", "calm", "1"), PreferencePair("s1", "sad", "angry", "2")]
    config = Newer(output_dir=str(tmp_path / "out"), model_name_or_path="org/chat", bf16=False, report_to=[])
    base = run_identity(config, pairs)
    assert identity_differences(base, run_identity(with_fields(config, brand_new_knob=3), pairs)) == [
        "recipe field brand_new_knob (0 -> 3)"
    ]
    # a classified non-result field of the same recipe leaves it unchanged
    assert run_identity(with_fields(config, dataset_text_field="other", log_level="info"), pairs) == base


def test_the_sft_fields_beyond_training_arguments_are_each_read_by_a_declared_stage():
    from transformers import TrainingArguments
    from trl import DPOConfig, SFTConfig

    extra = _names(SFTConfig) - _names(TrainingArguments)
    assert not set(DPO_SHARED_FIELDS) & set(SFT_ONLY_FIELDS)
    assert set(DPO_SHARED_FIELDS) | set(SFT_ONLY_FIELDS) == extra, (
        "SFTConfig fields with no stage declared (applicability.DPO_SHARED_FIELDS or SFT_ONLY_FIELDS): "
        f"{sorted(extra - set(DPO_SHARED_FIELDS) - set(SFT_ONLY_FIELDS))}; stale: "
        f"{sorted(set(DPO_SHARED_FIELDS) | set(SFT_ONLY_FIELDS) - extra)}"
    )
    assert set(DPO_SHARED_FIELDS) | set(DPO_FIELDS.values()) <= _names(DPOConfig)
    assert set(DPO_FIELDS) <= _names(JudgeTrainConfig) - _names(SFTConfig)


def _value(value):
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


# a judge recipe whose training fields differ from DPOConfig's defaults: a stage built from its own defaults (or from
# a hand-copied subset of the recipe) shows here
VARIED = {
    "weight_decay": 0.05,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 2,
    "max_grad_norm": 0.5,
    "adam_beta1": 0.8,
    "adam_beta2": 0.99,
    "adam_epsilon": 1e-6,
    "seed": 7,
    "data_seed": 3,
    "gradient_accumulation_steps": 2,
    "per_device_train_batch_size": 3,
    "max_steps": 5,
    "max_length": 512,
    "label_smoothing_factor": 0.1,
    "dataloader_drop_last": True,
    "train_sampling_strategy": "sequential",
    "activation_checkpointing": False,
    "pad_to_multiple_of": 8,
    "logging_steps": 3,
    "dpo_epochs": 2.0,
    "dpo_beta": 0.25,
    "dpo_learning_rate": 1e-5,
    "learning_rate": 3e-4,
    "num_train_epochs": 3.0,
    "packing": True,
    "completion_only_loss": False,
    "orders_together": False,  # TRL's sampler: train_sampling_strategy and packing apply
}


def test_every_result_field_of_the_judge_recipe_reaches_the_stages_that_read_it(tmp_path):
    from transformers import TrainingArguments
    from trl import DPOConfig, SFTConfig

    from emoreward.training.judge import dpo_arguments, sft_arguments

    config = JudgeTrainConfig(
        output_dir=str(tmp_path / "out"), model_name_or_path="org/chat", bf16=False, use_cpu=True, report_to=[],
        **VARIED,
    )  # fmt: skip
    stage = {"output_dir": str(tmp_path / "stage"), "save_strategy": "no"}
    sft, dpo = sft_arguments(config, **stage), dpo_arguments(config, **stage)
    assert isinstance(sft, SFTConfig) and isinstance(dpo, DPOConfig)
    defaults = DPOConfig(output_dir=str(tmp_path / "d"), use_cpu=True, bf16=False)
    both = _names(TrainingArguments) | set(DPO_SHARED_FIELDS)
    by_dpo_name = {dpo_name: own for own, dpo_name in DPO_FIELDS.items()}
    for name, value in VARIED.items():  # the varied values are not DPOConfig's own: a copy is what carries them
        target = DPO_FIELDS.get(name, name)
        if name in both and name not in by_dpo_name or name in DPO_FIELDS:
            assert _value(getattr(defaults, target)) != _value(value), name
    own = _names(JudgeTrainConfig) - _names(SFTConfig)
    checked = 0
    for name in sorted(_names(JudgeTrainConfig) & RESULT_FIELDS):
        recipe = _value(getattr(config, name))
        if name in both:
            assert _value(getattr(sft, name)) == recipe, f"SFT stage: {name}"
            source = by_dpo_name.get(name, name)  # learning_rate / num_train_epochs: the DPO stage's own fields
            assert _value(getattr(dpo, name)) == _value(getattr(config, source)), f"DPO stage: {name} <- {source}"
        elif name in SFT_ONLY_FIELDS:
            assert _value(getattr(sft, name)) == recipe, f"SFT stage: {name}"
        elif name in DPO_FIELDS:
            assert _value(getattr(dpo, DPO_FIELDS[name])) == recipe, f"DPO stage: {DPO_FIELDS[name]} <- {name}"
        else:  # emoreward's own (model, LoRA, media, data, folds): read by fit_judge for both stages
            assert name in own, name
        checked += 1
    assert checked == len(_names(JudgeTrainConfig) & RESULT_FIELDS) > 100
    assert (dpo.beta, dpo.learning_rate, dpo.num_train_epochs) == (0.25, 1e-5, 2.0)
    assert (sft.learning_rate, sft.num_train_epochs, dpo.output_dir) == (3e-4, 3.0, str(tmp_path / "stage"))
