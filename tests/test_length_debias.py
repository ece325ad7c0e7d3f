"""Length-robust training options: reweighting, the length penalty and the disentangled (ODIN) reward."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_same_rewards, synthetic_pairs
from test_reward_model import TEXTS, tiny_config
from transformers import AutoModelForSequenceClassification

from emoreward.models import TextRewardModel
from emoreward.training.pipeline import fit_reward_model
from emoreward.training.preprocess import length_balance_weights


def test_length_balance_weights_hand_case():
    # 3 aligned (chosen longer), 1 counter, 1 tie, 1 equal length
    w = length_balance_weights([10, 9, 8, 2, 5, 4], [1, 1, 1, 7, 1, 4], [0, 0, 0, 0, 1, 0])
    assert w == pytest.approx([4 / 6, 4 / 6, 4 / 6, 2.0, 1.0, 1.0])
    assert sum(w[:3]) == pytest.approx(w[3])  # the two subsets weigh the same
    assert length_balance_weights([3, 4], [1, 1], [0, 0]) == [1.0, 1.0]  # no counter pair: unweighted


def test_reweight_training_runs_and_uses_weights(tiny_bert_dir, tmp_path):
    config = tiny_config(tiny_bert_dir, tmp_path, length_debias="reweight", num_train_epochs=2)
    fit = fit_reward_model(config, synthetic_pairs(16), output_dir=tmp_path / "o", run_name="t", save=False)
    assert any("accuracy" in h for h in fit.log_history)


def test_length_penalty_removes_length_correlation_on_training_data(tiny_bert_dir, tmp_path):
    pairs = synthetic_pairs(24)
    config = tiny_config(tiny_bert_dir, tmp_path, length_debias="penalty", num_train_epochs=2)
    fit = fit_reward_model(config, pairs, output_dir=tmp_path / "o", run_name="t", save=False)
    penalty = fit.model.settings.score_transform
    assert set(penalty) == {"type", "alpha", "mean", "std"} and penalty["type"] == "length_penalty"
    assert penalty["std"] > 0 and fit.model.settings.objective == "penalty"
    texts = sorted({p.description_1 for p in pairs} | {p.description_2 for p in pairs})
    rewards = fit.model.score(texts)
    lengths = np.array([len(t) for t in texts], dtype=float)
    assert abs(np.corrcoef(rewards, lengths)[0, 1]) < 1e-6
    saved = fit.model.save_pretrained(tmp_path / "saved")
    again = TextRewardModel.from_pretrained(saved)
    assert again.settings.score_transform == penalty
    np.testing.assert_array_equal(again.score(texts), rewards)


def test_disentangled_reward_trains_two_heads_and_exports_the_quality_head(tiny_llama_dir, tmp_path):
    config = tiny_config(tiny_llama_dir, tmp_path, length_debias="disentangled", num_train_epochs=3)
    fit = fit_reward_model(config, synthetic_pairs(24), output_dir=tmp_path / "o", run_name="t", save=False)
    model = fit.model
    assert model.settings.num_heads == 2
    logged = [h for h in fit.log_history if "corr_lengthhead_length" in h]
    assert logged, "ODIN correlation terms must be logged"
    quality = model.score(TEXTS)
    saved = model.save_pretrained(tmp_path / "saved")
    np.testing.assert_array_equal(TextRewardModel.from_pretrained(saved).score(TEXTS), quality)
    merged = model.export_merged(tmp_path / "merged")
    plain = AutoModelForSequenceClassification.from_pretrained(merged)
    assert plain.config.num_labels == 1 and plain.score.weight.shape[0] == 1
    assert_same_rewards(TextRewardModel.from_pretrained(merged).score(TEXTS), quality, "float32")
