"""Metric values against hand-computed cases, and the length baseline on the bundled release."""

from __future__ import annotations

import pytest

from emoreward.data import PreferencePair, load_pairs
from emoreward.evaluation import metrics


def test_two_class_waf_hand_computed():
    # gold 1,1,1,2 ; pred 1,2,1,2 -> class 1: P=1, R=2/3, F1=0.8 ; class 2: P=0.5, R=1, F1=2/3
    # WAF = 3/4 * 0.8 + 1/4 * 2/3 = 0.7667
    r = metrics.recognition(["1", "1", "1", "2"], ["1", "2", "1", "2"], "two-class")
    assert r["waf"] == pytest.approx(100 * (0.75 * 0.8 + 0.25 * 2 / 3))
    assert r["acc"] == pytest.approx(75.0)


def test_asymmetric_case_catches_swapped_arguments():
    y_true = ["1", "1", "1", "2"]
    y_pred = ["1", "1", "2", "2"]
    # class 1: P=1, R=2/3, F1=0.8 (support 3); class 2: P=0.5, R=1, F1=2/3 (support 1)
    good = metrics.recognition(y_true, y_pred, "two-class")["waf"]
    swapped = metrics.recognition(y_pred, y_true, "two-class")["waf"]
    assert good == pytest.approx(100 * (0.75 * 0.8 + 0.25 * 2 / 3))
    # with arguments swapped the weights become 2/4, 2/4: (0.8 + 2/3) / 2
    assert swapped == pytest.approx(100 * (0.5 * 0.8 + 0.5 * 2 / 3))
    assert good != pytest.approx(swapped)


def test_label_absent_from_predictions():
    # the judge never says 2: class 2 F1 = 0
    r = metrics.recognition(["1", "2", "2", "1"], ["1", "1", "1", "1"], "two-class")
    assert r["waf"] == pytest.approx(100 * (0.5 * (2 * 0.5 * 1 / 1.5) + 0.5 * 0))
    assert r["acc"] == pytest.approx(50.0)


def test_tie_policy_wrong_vs_published_code():
    y_true = ["1", "2", "1", "2", "tie"]
    y_pred = ["tie", "2", "invalid", "1", "1"]
    wrong = metrics.recognition(y_true, y_pred, "two-class", "wrong")
    first = metrics.recognition(y_true, y_pred, "two-class", "first")
    assert wrong["n"] == 4 and wrong["acc"] == pytest.approx(25.0)  # only the second is right
    assert first["acc"] == pytest.approx(75.0)  # tie -> 1 right, 2 right, invalid -> tie -> 1 right, 1 wrong
    assert wrong["n_pred_tie"] == 1 and wrong["n_invalid"] == 1
    three = metrics.recognition(y_true, y_pred, "three-class", "first")
    assert three["acc"] == pytest.approx(20.0)  # invalid -> tie is wrong for gold 1; only "2" right
    never = metrics.recognition(["1", "2"] * 5, ["invalid"] * 10, "two-class", "wrong")
    assert never["acc"] == 0.0 and never["waf"] == 0.0


def test_three_class_counts_ties():
    r = metrics.recognition(["1", "2", "tie"], ["1", "tie", "tie"], "three-class")
    assert r["acc"] == pytest.approx(100 * 2 / 3)
    assert r["confusion"] == [[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]]


def test_recognition_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown labels"):
        metrics.recognition(["1"], ["first"])
    with pytest.raises(ValueError, match="2 labels"):
        metrics.recognition(["1", "2"], ["1"])


def test_swap_and_multi_run_consistency():
    assert metrics.swap_consistency(["1", "2", "tie", "1"], ["1", "1", "tie", "invalid"]) == pytest.approx(50.0)
    assert metrics.multi_run_consistency([["1", "2", "1"], ["1", "2", "2"], ["1", "2", "1"]]) == pytest.approx(
        100 * 2 / 3
    )


def test_length_baseline_on_bundled_release():
    pairs = load_pairs("emoprefer")
    pred = metrics.length_verdicts(pairs)
    two = metrics.recognition([p.label for p in pairs], pred, "two-class")
    assert two["n"] == 450
    assert round(two["acc"], 2) == 79.56
    lc = metrics.length_control(pairs, pred)
    assert lc["acc_aligned"] == 100.0 and lc["acc_counter"] == 0.0 and lc["length_debiased_acc"] == 50.0
    assert lc["n_aligned"] + lc["n_counter"] == 450
    assert lc["n_aligned"] == 358
    assert lc["prefers_longer_rate"] == 100.0


def test_length_control_hand_case():
    pairs = [
        PreferencePair("a", "long long long", "short", "1"),  # aligned
        PreferencePair("b", "long long long", "short", "2"),  # counter
        PreferencePair("c", "tiny", "much longer text", "1"),  # counter
        PreferencePair("d", "same", "same", "tie"),  # neither
    ]
    lc = metrics.length_control(pairs, ["1", "2", "2", "tie"])
    assert (lc["n_aligned"], lc["n_counter"]) == (1, 2)
    assert lc["acc_aligned"] == 100.0 and lc["acc_counter"] == 50.0 and lc["length_debiased_acc"] == 75.0
    assert lc["prefers_longer_rate"] == pytest.approx(100 * 2 / 3)


def test_calibrated_tie_threshold():
    diffs = [2.0, -1.5, 0.05, -0.02, 1.0, -3.0]
    labels = ["1", "2", "tie", "tie", "1", "2"]
    t = metrics.calibrate_tie_threshold(diffs, labels)
    assert 0.05 < t < 1.0
    assert metrics.calibrate_tie_threshold([1.0, -1.0], ["1", "2"]) == 0.0


def test_random_baseline_is_near_fifty():
    r = metrics.random_baseline(["1", "2"] * 100, "two-class", seed=1)
    assert 45 < r["acc"] < 55


def test_length_controlled_preference_separates_signal_from_length():
    import numpy as np

    pairs = load_pairs("emoprefer")
    rng = np.random.default_rng(0)
    gold = np.array([{"1": 1.0, "2": -1.0, "tie": 0.0}[p.label] for p in pairs])
    noise = metrics.length_controlled_preference(pairs, rng.normal(size=len(pairs)))
    informed = metrics.length_controlled_preference(pairs, gold + rng.normal(scale=1.0, size=len(pairs)))
    assert noise["n"] == informed["n"] == 450
    assert noise["lr_pvalue"] > 0.01 and abs(noise["coef_judge"]) < 3 * noise["se_judge"]
    assert informed["coef_judge"] > 0 and informed["lr_pvalue"] < 1e-6
    assert noise["coef_length"] > 5 * noise["se_length"]  # length predicts the label on EmoPrefer
    assert metrics.length_controlled_preference(pairs[:5], [0.0] * 5) is None


@pytest.mark.parametrize("setting", ["two-class", "three-class"])
def test_random_baseline_equals_sklearn_on_the_same_draws(setting):
    import numpy as np

    y = ["1"] * 7 + ["2"] * 4 + ["tie"] * 2
    labels = ["1", "2"] if setting == "two-class" else ["1", "2", "tie"]
    kept = [t for t in y if setting == "three-class" or t != "tie"]
    draws = np.random.default_rng(3).integers(0, len(labels), size=(50, len(kept)))
    direct = [metrics.recognition(kept, [labels[i] for i in row], setting) for row in draws]
    fast = metrics.random_baseline(y, setting, n_draws=50, seed=3)
    assert fast["waf"] == pytest.approx(np.mean([d["waf"] for d in direct]))
    assert fast["acc"] == pytest.approx(np.mean([d["acc"] for d in direct]))


def test_tie_threshold_predicts_no_more_ties_than_the_gold_labels():
    import numpy as np

    rng = np.random.default_rng(0)
    diffs = rng.normal(scale=2.0, size=200)
    labels = ["1" if d > 0 else "2" for d in diffs]
    for i in range(4):  # four gold ties among the smallest differences, and many near-zero non-ties
        labels[int(np.argsort(np.abs(diffs))[i * 10])] = "tie"
    t = metrics.calibrate_tie_threshold(diffs, labels)
    assert int(np.sum(np.abs(diffs) < t)) <= 4


def test_length_controlled_preference_does_not_depend_on_row_order():
    """The same pairs and signal in another row order give exactly the same fit (the rows are sorted by value)."""
    import numpy as np

    pairs = load_pairs("emoprefer")
    signal = np.random.default_rng(0).normal(size=len(pairs))
    order = np.random.default_rng(1).permutation(len(pairs))
    first = metrics.length_controlled_preference(pairs, signal)
    shuffled = metrics.length_controlled_preference([pairs[i] for i in order], signal[order])
    assert first == shuffled
