"""Correctness of the fast paths (not their speed): the precision rule, the scoring copy, token-budget batching,
bf16 agreement, the per-run encoding cache and the unknown-token share."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import assert_same_rewards, minilm_dir, synthetic_pairs
from test_reward_model import TEXTS, tiny_config

from emoreward.data import load_pairs
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.models import TextRewardModel
from emoreward.models.coverage import CoverageScoreInfo, coverage_summary, unknown_token_share
from emoreward.models.precision import (
    MIN_BF16_AGREEMENT,
    EmulatedBf16Matmuls,
    cpu_flags,
    cpu_has_bf16_matrix_units,
    has_bf16_matrix_units,
    record_bf16_agreement,
    resolve_dtype,
    reward_tolerance,
    verdict_agreement,
)
from emoreward.training.adapters import adapter_for
from emoreward.training.dataset_cache import clear_encodings, encoded_dataset
from emoreward.training.pipeline import fit_reward_model, stratified_folds


# ---------------------------------------------------------------------------------------------- precision rule
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "fma", "f16c"}, False),  # AVX2 only (e.g. AMD Zen 3): bf16 is emulated, never picked
        ({"avx512f", "avx512bw", "avx512_vnni"}, False),  # AVX-512 without BF16 (Skylake / Ice Lake)
        ({"avx512f", "avx512_bf16"}, True),  # Cooper Lake, Zen 4
        ({"avx512_bf16", "amx_bf16", "amx_tile"}, True),  # Sapphire Rapids
        ({"fp", "asimd", "bf16", "i8mm"}, True),  # Arm with the BF16 extension (Graviton 3)
    ],
)
def test_cpu_bf16_units_from_flags(flags, expected):
    assert cpu_has_bf16_matrix_units(flags) is expected


def test_auto_dtype_rule(monkeypatch):
    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    assert resolve_dtype("auto", bf16_units=False) == torch.float32
    assert resolve_dtype("auto", bf16_units=True) == torch.bfloat16
    # a model whose recorded bf16 verdict agreement is below 99.5% keeps float32
    assert resolve_dtype("auto", bf16_units=True, bf16_agreement=0.99) == torch.float32
    assert resolve_dtype("auto", bf16_units=True, bf16_agreement=MIN_BF16_AGREEMENT) == torch.bfloat16
    # explicit choices are kept whatever the hardware
    assert resolve_dtype("bf16", bf16_units=False) == torch.bfloat16
    assert resolve_dtype(torch.float32, bf16_units=True) == torch.float32
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    assert resolve_dtype("auto", bf16_units=True) == torch.float32
    monkeypatch.setenv("EMOREWARD_DTYPE", "bfloat16")
    assert resolve_dtype("auto", bf16_units=False) == torch.bfloat16
    monkeypatch.setenv("EMOREWARD_DTYPE", "half-ish")
    with pytest.raises(ValueError, match="EMOREWARD_DTYPE"):
        resolve_dtype("auto")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


def test_auto_dtype_on_this_machine(monkeypatch):
    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    units = bool({"amx_bf16", "avx512_bf16", "bf16"} & cpu_flags())
    if has_bf16_matrix_units("cpu"):  # only ever with the flags (and a torch whose oneDNN uses them)
        assert units and resolve_dtype("auto", "cpu") == torch.bfloat16
    if not units:  # e.g. this project's AVX2 machine: auto must never pick emulated bf16
        assert resolve_dtype("auto", "cpu") == torch.float32


def test_verdict_agreement_counts_changed_verdicts():
    ref = (np.array([1.0, 0.0, 2.0, 0.5]), np.array([0.0, 1.0, 2.0, 0.45]))
    other = (np.array([1.0, 0.0, 2.0, 0.44]), np.array([0.0, 1.0, 2.0, 0.45]))  # pair 4: FIRST -> SECOND
    out = verdict_agreement(ref, other, tie_threshold=0.0)
    assert out == {"agreement": 0.75, "n_pairs": 4, "n_changed": 1, "max_abs_reward_diff": pytest.approx(0.06)}
    # with a tie threshold of 0.1, 0.5 - 0.45 and 0.44 - 0.45 are both ties: all agree
    assert verdict_agreement(ref, other, tie_threshold=0.1)["agreement"] == 1.0


# ---------------------------------------------------------------------------------------------- batching
@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_llama_dir"])
def test_token_budget_batching_equals_one_by_one(fixture, request):
    torch.manual_seed(0)
    model = TextRewardModel.from_backbone(str(request.getfixturevalue(fixture)), max_length=64)
    texts = TEXTS + [t * 3 for t in TEXTS] + ["ok"]
    seqs = [model.encode(t).input_ids for t in texts]
    alone = np.array([model.score_ids([s], batch_size=1)[0] for s in seqs])
    for budget, multiple in [(None, None), (64, None), (48, 32), (10_000, 16)]:
        plan = model.plan_batches([len(s) for s in seqs], 8, budget, multiple)
        covered = np.sort(np.concatenate([idx for idx, _ in plan]))
        np.testing.assert_array_equal(covered, np.arange(len(seqs)))  # every sequence exactly once
        for idx, width in plan:
            assert width >= max(len(seqs[i]) for i in idx) and width % (multiple or 1) == 0
            assert len(idx) <= 8 and (len(idx) == 1 or len(idx) * width <= (budget or model.default_batch_tokens()))
        got = model.score_ids(seqs, batch_size=8, max_batch_tokens=budget, pad_to_multiple_of=multiple)
        assert_same_rewards(got, alone, "float32")


def test_plan_sorts_by_length_and_fills_the_budget(tiny_bert_dir):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    lengths = [30, 5, 12, 7, 30, 9]
    plan = model.plan_batches(lengths, batch_size=32, max_batch_tokens=40, pad_to_multiple_of=1)
    # sorted: 5, 7, 9, 12, 30, 30 -> [5, 7, 9] (3 x 9 = 27; adding 12 gives 4 x 12 = 48 > 40), [12], [30], [30]
    assert [(list(map(int, idx)), w) for idx, w in plan] == [([1, 3, 5], 9), ([2], 12), ([0], 30), ([4], 30)]
    plan = model.plan_batches(lengths, batch_size=32, max_batch_tokens=64, pad_to_multiple_of=16)
    assert [(list(map(int, idx)), w) for idx, w in plan] == [([1, 3, 5, 2], 16), ([0, 4], 32)]


# ---------------------------------------------------------------------------------------------- scoring copy
@pytest.mark.precision  # depends on the scoring precision: `make test-precision` runs it in the other one
def test_scoring_copy_follows_the_master_weights(tiny_bert_dir, tmp_path):
    config = tiny_config(tiny_bert_dir, tmp_path, num_train_epochs=1)
    fit = fit_reward_model(config, synthetic_pairs(16), output_dir=tmp_path / "o", run_name="t", save=False)
    model = fit.model
    assert model.scoring_dtype == "auto" and hasattr(model.model, "peft_config")  # master keeps its adapter
    assert not hasattr(model.scoring_network, "peft_config")  # scoring runs merged
    exact = TextRewardModel(model.model, model.tokenizer, model.settings).score(TEXTS)  # the adapter itself
    before = model.score(TEXTS)
    dtype, magnitude = model.scoring_precision, float(np.max(np.abs(exact)))
    cross = reward_tolerance(dtype, torch.float32, magnitude=magnitude)  # 1e-5 when "auto" is float32 here
    np.testing.assert_allclose(before, exact, atol=cross, rtol=0)
    # the same copy: bit-identical in bf16; in float32 the copy scores with the network's own forward and `score`
    # with the packed encoder forward (emoreward.models.packed), equal to float rounding
    same = 0.0 if dtype == torch.bfloat16 else 1e-6
    np.testing.assert_allclose(before, model.inference_copy(dtype).score(TEXTS), atol=same, rtol=0)
    network = model.scoring_network
    assert model.scoring_network is network  # kept while the master weights do not change
    head = [
        p for n, p in model.model.named_parameters() if "classifier" in n and n.endswith("weight") and p.requires_grad
    ]
    with torch.no_grad():
        head[0].mul_(2.0)  # an in-place update, as an optimizer step makes
    assert model.scoring_network is not network
    np.testing.assert_allclose(model.score(TEXTS), 2 * before, atol=reward_tolerance(dtype), rtol=0)

    saved = model.save_pretrained(tmp_path / "saved")
    auto = TextRewardModel.from_pretrained(saved)
    assert hasattr(auto.model, "peft_config") and auto.scoring_dtype == "auto"
    np.testing.assert_array_equal(auto.score(TEXTS), model.score(TEXTS))  # the same path: bit-identical
    reference = TextRewardModel.from_pretrained(saved, dtype=None)
    assert reference.scoring_precision == torch.float32
    cross = reward_tolerance(dtype, torch.float32, magnitude=2 * magnitude)  # the head doubled the rewards
    np.testing.assert_allclose(reference.score(TEXTS), model.score(TEXTS), atol=cross, rtol=0)
    half = TextRewardModel.from_pretrained(saved, dtype="bfloat16")
    assert half.scoring_precision == torch.bfloat16 and half.dtype == torch.float32
    bound = reward_tolerance(torch.bfloat16, torch.float32, magnitude=2 * magnitude)
    np.testing.assert_allclose(half.score(TEXTS), reference.score(TEXTS), atol=bound, rtol=0)


def test_record_bf16_agreement_on_a_tiny_model(tiny_bert_dir, tmp_path):
    pairs = synthetic_pairs(24)
    config = tiny_config(tiny_bert_dir, tmp_path, num_train_epochs=2)
    model = fit_reward_model(config, pairs, output_dir=tmp_path / "o", run_name="t", save=False).model
    check = record_bf16_agreement(model, pairs, max_pairs=16)
    assert check["n_pairs"] == 16 and 0.0 <= check["agreement"] <= 1.0 and check["max_abs_reward_diff"] > 0
    assert model.settings.extra["bf16_agreement"] == check["agreement"]
    # by hand on the same 16 pairs (the seeded sample): bf16 and fp32 verdicts by the sign of r1 - r2
    keep = np.sort(np.random.default_rng(0).choice(len(pairs), 16, replace=False))
    sub = [pairs[i] for i in keep]
    r = {dt: RewardModelJudge(model.inference_copy(dt)).pair_rewards(sub) for dt in (torch.float32, torch.bfloat16)}
    same = np.sign(r[torch.float32][0] - r[torch.float32][1]) == np.sign(r[torch.bfloat16][0] - r[torch.bfloat16][1])
    assert check["agreement"] == pytest.approx(same.mean())


def test_emulated_bf16_matches_real_bf16_arithmetic(tiny_llama_dir):
    """The emulation (float32 products of bf16 numbers, bf16 results) stays as close to real bf16 as bf16 rounding
    allows: its distance to real bf16 is of the size of bf16's own distance to float32."""
    torch.manual_seed(0)
    model = TextRewardModel.from_backbone(str(tiny_llama_dir), max_length=64)
    fp32 = model.score(TEXTS)
    half = model.inference_copy(torch.bfloat16)
    real = half.score(TEXTS)
    with EmulatedBf16Matmuls():
        emulated = half.score(TEXTS)
    bf16_error = np.abs(real - fp32).max()
    assert bf16_error > 0
    assert np.abs(emulated - real).max() <= 4 * bf16_error
    assert np.abs(emulated - fp32).max() <= 4 * bf16_error


@pytest.mark.slow
def test_bf16_verdicts_agree_with_fp32_on_the_bundled_pairs(tmp_path):
    """The default recipe's model (all 459 EmoPrefer pairs, 2 epochs) judged in bf16 and in float32 with its
    calibrated tie threshold: verdicts agree on >= 99.5% of pairs. Real bf16 where the CPU has bf16 units,
    emulated (`EmulatedBf16Matmuls`) elsewhere."""
    from emoreward.training.config import load_config

    pairs = load_pairs("emoprefer")
    config = load_config(overrides={"cv_folds": 0, "report_to": ["none"], "output_dir": str(tmp_path)})
    fit = fit_reward_model(config, pairs, output_dir=tmp_path, run_name="agreement", save=False)
    rewards = {}
    for dtype in (torch.float32, torch.bfloat16):
        copy = fit.model.inference_copy(dtype)
        emulate = dtype == torch.bfloat16 and not has_bf16_matrix_units("cpu")
        with EmulatedBf16Matmuls() if emulate else torch.no_grad():
            rewards[dtype] = RewardModelJudge(copy).pair_rewards(pairs)
    out = verdict_agreement(rewards[torch.float32], rewards[torch.bfloat16], fit.tie_threshold)
    print(f"bf16 vs fp32 on {out['n_pairs']} pairs: {out}")
    assert out["agreement"] >= MIN_BF16_AGREEMENT


# ---------------------------------------------------------------------------------------------- encoding cache
def test_folds_select_rows_of_one_encoding(tiny_bert_dir, tmp_path):
    pairs = synthetic_pairs(30)
    pairs[3] = type(pairs[3])("dup", "same words", "same words", "1", row=4)  # excluded: identical descriptions
    pairs[5] = type(pairs[5])("tie5", "a b", "c d", "tie", row=6)  # dropped tie
    config = tiny_config(tiny_bert_dir, tmp_path)
    adapter = adapter_for(config)
    model = adapter.build_model(config)
    clear_encodings()
    calls = []
    original = model.encode
    model.encode = lambda *a, **k: calls.append(1) or original(*a, **k)
    for train_idx, _ in stratified_folds(pairs, 3, seed=0):
        fold = [pairs[i] for i in train_idx]
        got, got_report = encoded_dataset(fold, model, config)
        want, want_report = adapter.build_dataset(fold, model, config)
        assert got.to_dict() == want.to_dict() and got_report.to_dict() == want_report.to_dict()
    # each pair encoded once by the cache (2 descriptions per kept or identical pair, none for the dropped tie),
    # and again by the 3 reference builds (each pair is in 2 of the 3 training folds)
    per_pass = 2 * (len(pairs) - 1)
    assert len(calls) == per_pass + 2 * per_pass


# ---------------------------------------------------------------------------------------------- coverage
def test_unknown_token_share_of_minilm():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    texts = ["He is happy 😀", "他看起来很开心，但是声音有点颤抖。", "Er ist glücklich", ""]
    share = unknown_token_share(tok, texts)
    # he / is / happy / [UNK]; 13 of 17 WordPiece tokens of the Chinese sentence are [UNK]; German is all known
    np.testing.assert_allclose(share, [1 / 4, 13 / 17, 0.0, 0.0])
    assert coverage_summary(share, 0.5) == {
        "threshold": 0.5,
        "n_above": 1,
        "n": 4,
        "max_share": pytest.approx(13 / 17),
        "mean_share": pytest.approx((0.25 + 13 / 17) / 4),
    }


def test_score_info_reports_unknown_share(tiny_bert_dir):
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64)
    info = model.score_info(["He is happy 😀", "他很开心"])
    assert isinstance(info, CoverageScoreInfo) and info.unknown_share[0] == 0.25 and info.unknown_share[1] > 0.5


# ---------------------------------------------------------------------------------------------- length groups
def test_split_by_length_is_optimal_on_a_hand_example():
    from emoreward.training.step_plan import split_by_length

    # sorted 5 7 9 12 30 30: {5,7} {9,12} {30,30} pads to 2*7 + 2*12 + 2*30 = 98 tokens, the least with 3 groups
    assert split_by_length([30, 5, 12, 7, 30, 9], max_groups=3, overhead_tokens=0) == [[1, 3], [5, 2], [0, 4]]
    assert split_by_length([10] * 8, max_groups=3) == [list(range(8))]  # equal lengths: one pass
    assert split_by_length([100, 10, 101, 12], max_groups=3, overhead_tokens=64) == [[1, 3], [0, 2]]


def test_length_groups_round_their_widths_to_pad_to_multiple_of():
    """With `pad_to_multiple_of` a group costs its longest rounded up: 5 7 9 12 30 30 in widths of 16 pad
    {5..12} to 16 and {30, 30} to 32 (4 * 16 + 2 * 32 = 128), where a third group saves nothing."""
    from emoreward.training.step_plan import padded_width, split_by_length

    assert [padded_width(n, 16) for n in (1, 16, 17, 30)] == [16, 16, 32, 32] and padded_width(30, None) == 30
    assert split_by_length([30, 5, 12, 7, 30, 9], max_groups=3, overhead_tokens=0, multiple=16) == [
        [1, 3, 5, 2],
        [0, 4],
    ]


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_llama_dir"])
def test_length_split_forward_equals_one_padded_batch(fixture, request, tmp_path):
    from emoreward.training.preprocess import LengthSplitAdapter

    config = tiny_config(request.getfixturevalue(fixture), tmp_path)
    adapter = adapter_for(config)
    torch.manual_seed(0)
    model = adapter.build_model(config)
    dataset, _ = encoded_dataset(
        synthetic_pairs(6) + [type(synthetic_pairs(1)[0])("x", "short", "a much longer " * 8, "1")], model, config
    )
    batch = adapter.collator(model, config)([dataset[i] for i in range(len(dataset))])
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    network = model.model.eval()  # no dropout: both passes see the same network
    whole = adapter.logits(network, dict(batch))
    split = LengthSplitAdapter(adapter).logits(network, dict(batch))
    assert split.shape == whole.shape
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=0)
    grads = []
    for out in (whole, split):
        network.zero_grad()
        out.sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in network.parameters() if p.requires_grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
