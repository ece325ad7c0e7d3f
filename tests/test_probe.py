"""Value-head probes (frozen backbone, cached features; `scripts/studies/probe.py`, the length study's) and the loss
they share with `EmoRewardTrainer`."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import synthetic_pairs

from emoreward.models import TextRewardModel
from emoreward.training.losses import reward_model_loss


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "studies"))
from probe import FeatureCache, ProbeConfig, fit_probe, probe_cross_validation, value_head_inputs  # noqa: E402


TEXTS = ["short.", "a somewhat longer description of a calm man", "she smiles", "x " * 30]


def test_reward_model_loss_hand_values():
    # two pairs, one head: d = (2 - 0, 1 - 3) = (2, -2); Bradley-Terry nll = softplus(-d)
    logits = torch.tensor([[2.0], [1.0], [0.0], [3.0]])
    plain = reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0).loss
    assert plain.item() == pytest.approx((math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 2)
    weighted = reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0, weights=torch.tensor([3.0, 1.0]))
    assert weighted.loss.item() == pytest.approx((3 * math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 4)


def test_reward_model_loss_odin_terms_hand_values():
    # quality head perfectly anti-correlated with length, length head perfectly correlated; heads orthogonal
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 2.0], [-2.0, 3.0]])
    lengths = torch.tensor([1.0, 2.0, 3.0, 4.0])
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = reward_model_loss(
        logits, tie=None, ties="drop", tie_parameter=1.0, lengths=lengths, head_weight=head, odin_length_weight=0.5
    )
    d = torch.tensor([1.0 - (-1.0 + 2.0), 1.0 - 1.0])  # sums of heads: chosen (1, 1), rejected (1, 1) -> d = (0, 0)
    nll = torch.nn.functional.softplus(-d).mean()
    assert out.corr_quality_length.item() == pytest.approx(-1.0, abs=1e-6)
    assert out.corr_lengthhead_length.item() == pytest.approx(1.0, abs=1e-6)
    assert out.loss.item() == pytest.approx(nll.item() + 0.5 * (1.0 - 1.0) + 1.0 * 0.0, abs=1e-6)
    with pytest.raises(ValueError, match="lengths"):
        reward_model_loss(logits, tie=None, ties="drop", tie_parameter=1.0)


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_llama_dir"])
def test_value_head_inputs_reproduce_the_rewards(fixture, request):
    model = TextRewardModel.from_backbone(str(request.getfixturevalue(fixture)), max_length=64)
    feats = value_head_inputs(model, TEXTS, batch_size=3)  # raises itself if head(features) != score
    assert feats.shape == (len(TEXTS), model.model.config.hidden_size)
    alone = value_head_inputs(model, TEXTS[1:2], batch_size=1)  # independent of batch and padding
    np.testing.assert_allclose(alone[0], feats[1], atol=1e-5)
    head = model.model.score if hasattr(model.model, "score") else model.model.classifier
    np.testing.assert_allclose(
        feats @ head.weight.detach().double().numpy()[0] + (0 if head.bias is None else head.bias.item()),
        model.score(TEXTS),
        atol=1e-4,
    )


def _synthetic_features(n=400, seed=0):
    """Descriptions with a quality feature q and a length feature; the label depends on q and length."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 2))
    length = rng.uniform(100, 500, size=(n, 2))
    x = np.stack([q, (length - 300) / 100, rng.normal(size=(n, 2))], axis=-1)  # (n, 2, 3)
    first_better = (q[:, 0] - q[:, 1]) + 1.5 * (length[:, 0] - length[:, 1]) / 100 > 0
    chosen = np.where(first_better[:, None], x[:, 0], x[:, 1])
    rejected = np.where(first_better[:, None], x[:, 1], x[:, 0])
    lc = np.where(first_better, length[:, 0], length[:, 1])
    lr = np.where(first_better, length[:, 1], length[:, 0])
    return chosen, rejected, np.zeros(n), lc, lr


def test_fit_probe_learns_quality_and_length():
    chosen, rejected, tie, lc, lr = _synthetic_features()
    probe = fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop", weight_decay=0.0))
    w = probe.weight[0] / probe.scale  # in raw feature units
    assert w[0] > 0 and w[1] > 0  # uses quality and length
    assert abs(w[2]) < 0.2 * abs(w[0])  # ignores the noise feature
    acc = np.mean(probe.rewards(chosen, lc) > probe.rewards(rejected, lr))
    assert acc > 0.9


def test_fit_probe_length_variants():
    chosen, rejected, tie, lc, lr = _synthetic_features()
    feats, lens = np.concatenate([chosen, rejected]), np.concatenate([lc, lr])
    penalty = fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop", length_debias="penalty"))
    assert abs(np.corrcoef(penalty.rewards(feats, lens), lens)[0, 1]) < 1e-6  # uncorrelated on training data
    odin = fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop", length_debias="disentangled"))
    assert odin.weight.shape == (2, 3)
    quality = odin.rewards(feats, lens)
    length_head = ((feats - odin.mean) / odin.scale) @ odin.weight[1]
    plain_corr = np.corrcoef(
        fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop")).rewards(feats, lens), lens
    )
    assert plain_corr[0, 1] > 0.6  # the plain probe's reward tracks length ...
    assert abs(np.corrcoef(quality, lens)[0, 1]) < 0.2  # ... ODIN's quality head much less
    assert np.corrcoef(length_head, lens)[0, 1] > 0.9
    # the quality head still ranks by quality: correlation with q of its descriptions
    assert np.corrcoef(quality, feats[:, 0])[0, 1] > 0.9
    plain = fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop"))
    reweight = fit_probe(chosen, rejected, tie, lc, lr, ProbeConfig(ties="drop", length_debias="reweight"))
    assert not np.allclose(plain.weight, reweight.weight)


def test_feature_cache_resumes_and_refuses_other_texts(tiny_bert_dir, tmp_path, monkeypatch):
    import probe as probe_module

    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    texts = [(t, None) for t in TEXTS] + [("one more", "a subtitle")]
    cache = FeatureCache(tmp_path / "f", chunk_size=2)
    full = cache.features(model, texts, log=lambda *_: None)
    assert full.shape == (5, 32) and len(list((tmp_path / "f").glob("chunk-*.npz"))) == 3
    (tmp_path / "f" / "chunk-00001.npz").unlink()  # as if killed before the second chunk was written
    calls = []
    real = probe_module.value_head_inputs
    monkeypatch.setattr(
        probe_module, "value_head_inputs", lambda m, d, s, batch_size: calls.append(list(d)) or real(m, d, s)
    )
    again = cache.features(model, texts, log=lambda *_: None)
    assert calls == [[TEXTS[2], TEXTS[3]]]  # only the missing chunk is recomputed
    np.testing.assert_allclose(again, full, atol=1e-6)
    with pytest.raises(ValueError, match="chunk-00000.npz: feature chunk of other texts"):
        cache.features(model, list(reversed(texts)), log=lambda *_: None)


def test_probe_cross_validation_on_the_harness(tiny_bert_dir, tmp_path):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    pairs = synthetic_pairs(30)
    out = probe_cross_validation(
        model, pairs, ["none", "penalty"], folds=3, seed=0, cache_dir=tmp_path / "c", log=lambda *_: None
    )
    assert set(out) == {"none", "penalty"}
    for variant in out.values():
        assert len(variant["folds"]) == 3
        summary = variant["summary"]["judge"]
        assert 0 <= summary["two_class_waf"]["mean"] <= 100
        assert summary["swap_consistency"]["mean"] == pytest.approx(100.0)  # a reward model is swap-consistent
    # the same split, the same features: a rerun gives identical numbers
    again = probe_cross_validation(
        model, pairs, ["none"], folds=3, seed=0, cache_dir=tmp_path / "c", log=lambda *_: None
    )
    assert again["none"]["summary"] == out["none"]["summary"]


def test_fit_probe_leaves_tie_pairs_out_under_ties_drop():
    # as the trainer's encoding drops them: Bradley-Terry would read a tie as "the first one wins"
    chosen, rejected, tie, lc, lr = _synthetic_features(200)
    rng = np.random.default_rng(1)
    extra = rng.normal(size=(30, 3)) * 5
    with_ties = [np.concatenate([a, b]) for a, b in [(chosen, extra), (rejected, -extra), (tie, np.ones(30)),
                                                     (lc, np.full(30, 300.0)), (lr, np.full(30, 300.0))]]  # fmt: skip
    config = ProbeConfig(ties="drop", weight_decay=0.0)
    dropped = fit_probe(*with_ties, config)
    plain = fit_probe(chosen, rejected, tie, lc, lr, config)
    np.testing.assert_allclose(dropped.weight, plain.weight)
    kept = fit_probe(*with_ties, ProbeConfig(ties="rao-kupper", weight_decay=0.0))
    assert not np.allclose(kept.weight, plain.weight)


def test_value_head_inputs_under_a_small_token_budget(tiny_llama_dir):
    # the scoring engine splits a batch over its token budget and pads to a multiple of its own: the features are
    # still one row per text, at the last real token (value_head_inputs checks head(features) == the rewards)
    model = TextRewardModel.from_backbone(str(tiny_llama_dir), max_length=64)
    model.max_batch_tokens = 24
    feats = value_head_inputs(model, TEXTS, batch_size=4)
    np.testing.assert_allclose(feats, value_head_inputs(TextRewardModel.from_backbone(str(tiny_llama_dir),
                               max_length=64), TEXTS, batch_size=1), atol=1e-5)  # fmt: skip
