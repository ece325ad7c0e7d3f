"""BPA global MAP model: Rao-Kupper + Crowd-BT likelihood, anchors, adaptive prior, empirical-Fisher uncertainty."""

import math

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from emoreward.ranking.bpa import (
    BPAConfig,
    BPAObjective,
    CommitteeConfig,
    SchedulerConfig,
    SimulatedCrowd,
    encode_records,
    fit_bpa,
    rao_kupper_probabilities,
    smooth_uncertainty,
)
from emoreward.ranking.records import PairwiseRecord


def _records(pairs, annotator="judge"):
    return [PairwiseRecord(a, b, o, annotator) for a, b, o in pairs]


def _crowd_records(truth, anchors, reliabilities, n, seed=0, delta=0.6):
    """``n`` judgements of random pairs (at least one candidate) by a simulated crowd."""
    rng = np.random.default_rng(seed)
    crowd = SimulatedCrowd({**truth, **anchors}, reliabilities, delta=delta, seed=seed)
    items = list(truth) + list(anchors)
    out = []
    while len(out) < n:
        a, b = rng.choice(len(items), size=2, replace=False)
        if a >= len(truth) and b >= len(truth):
            continue
        out.append(crowd(items[a], items[b]))
    return out


def test_rao_kupper_matches_original_parametrisation():
    # Rao & Kupper (1967): P(i>j) = pi_i / (pi_i + theta pi_j), P(tie) = (theta^2 - 1) pi_i pi_j / (...)(...)
    mu_i, mu_j, delta = 6.3, 5.1, 0.7
    pi_i, pi_j, theta = math.exp(mu_i), math.exp(mu_j), math.exp(delta)
    expected = [
        pi_i / (pi_i + theta * pi_j),
        pi_j / (pi_j + theta * pi_i),
        (theta**2 - 1) * pi_i * pi_j / ((pi_i + theta * pi_j) * (theta * pi_i + pi_j)),
    ]
    got = rao_kupper_probabilities(np.array([mu_i - mu_j]), delta)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="delta"):
        rao_kupper_probabilities(np.array([0.0]), 0.0)


def test_tie_probability_peaks_at_equal_scores():
    diffs = np.array([-3.0, -1.0, -0.2, 0.0, 0.2, 1.0, 3.0])
    p = rao_kupper_probabilities(diffs, 0.8)
    assert np.argmax(p[:, 2]) == 3
    assert p[3, 2] > p[3, 0] and p[3, 2] > p[3, 1]  # with delta = 0.8 a tie is the likeliest answer at Delta = 0
    assert p[4, 2] > p[5, 2] > p[6, 2] and p[6, 2] < 0.25 * p[3, 2]


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    cands = ["x", "y", "z", "w"]
    anchors = {"lo": 2.0, "hi": 8.0}
    items = cands + list(anchors)
    recs = []
    for k in range(60):
        a, b = rng.choice(len(items), size=2, replace=False)
        recs.append(PairwiseRecord(items[a], items[b], ["a", "b", "tie"][k % 3], f"ann{k % 3}"))
    config = BPAConfig(lambda0=0.7, gamma=0.4, reliability_prior=0.3, slope=1.3)
    obj = BPAObjective(encode_records(recs, cands, anchors), np.array([3.0, 4.0, 6.0, 5.5]), config)
    for trial in range(3):
        theta = obj.pack(rng.uniform(1.5, 8.5, 4), rng.normal(0, 1.5, 3), rng.uniform(0.1, 2.0))
        value, grad = obj(theta)
        numeric = approx_fprime(theta, lambda t: obj(t)[0], 1e-7)
        np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-5, err_msg=f"trial {trial}")
        assert np.isfinite(value)


def test_prior_precision_decays_with_comparisons():
    recs = _records([("x", "y", "a")] * 3 + [("x", "z", "b")])
    obj = BPAObjective(encode_records(recs, ["x", "y", "z"], {}), np.full(3, 5.0), BPAConfig(lambda0=2.0, gamma=0.5))
    np.testing.assert_allclose(obj.prior_precision, [2.0 / math.sqrt(5), 2.0 / 2.0, 2.0 / math.sqrt(2)])


def test_no_data_returns_prior_means():
    fit = fit_bpa([], ["x", "y"], init_scores={"x": 3.0, "y": 7.5})
    assert fit.scores == pytest.approx({"x": 3.0, "y": 7.5})


def test_anchors_stay_fixed_even_against_contradicting_data():
    anchors = {"lo": 2.0, "mid": 5.0, "hi": 8.0}
    # the data say "lo" beats "hi"; anchors must not move, and the candidate is placed by the data
    pairs = [("lo", "hi", "a")] * 20 + [("x", "mid", "a")] * 6 + [("x", "hi", "b")] * 6 + [("x", "y", "a")] * 4
    fit = fit_bpa(_records(pairs), ["x", "y"], anchors)
    for name, value in anchors.items():
        assert fit.scores[name] == value
    assert 5.0 < fit.scores["x"] < 8.0
    assert fit.scores["y"] < fit.scores["x"]


def test_scores_stay_in_bounds():
    anchors = {"lo": 2.0, "hi": 8.0}
    pairs = [("top", "hi", "a")] * 40 + [("top", "lo", "a")] * 40 + [("bottom", "lo", "b")] * 40
    pairs += [("bottom", "hi", "b")] * 40 + [("top", "bottom", "a")] * 40
    fit = fit_bpa(_records(pairs), ["top", "bottom"], anchors, config=BPAConfig(lambda0=0.01))
    assert fit.scores["top"] <= 9.0 and fit.scores["top"] > 8.9  # pushed against the upper bound
    assert fit.scores["bottom"] >= 1.0 and fit.scores["bottom"] < 1.1
    narrow = fit_bpa(_records(pairs), ["top", "bottom"], anchors, config=BPAConfig(lambda0=0.01, score_max=8.5))
    assert narrow.scores["top"] == pytest.approx(8.5)


def test_ties_are_predicted_near_equal_scores():
    anchors = {"lo": 2.0, "mid": 5.0, "hi": 8.0}
    pairs = [("x", "y", "tie")] * 15 + [("x", "mid", "tie")] * 8 + [("y", "mid", "tie")] * 8
    pairs += [("x", "lo", "a")] * 5 + [("y", "hi", "b")] * 5 + [("z", "x", "a")] * 6 + [("z", "hi", "b")] * 6
    fit = fit_bpa(_records(pairs), ["x", "y", "z"], anchors)
    assert abs(fit.scores["x"] - fit.scores["y"]) < 0.2
    assert abs(fit.scores["x"] - 5.0) < 0.8  # tied with the mid anchor: within about one tie margin of it
    p_xy = fit.predict("x", "y")
    assert np.argmax(p_xy) == 2
    assert fit.predict("z", "x")[2] < p_xy[2]
    # many ties -> wide tie margin; no ties -> narrow margin
    decisive = [(a, b, "a") for a, b, _ in pairs]
    assert fit_bpa(_records(decisive), ["x", "y", "z"], anchors).delta < 0.5 * fit.delta


def test_random_annotator_reliability_falls_below_faithful():
    rng = np.random.default_rng(0)
    truth = {f"c{i}": float(v) for i, v in enumerate(rng.uniform(2, 8, 15))}
    anchors = {"lo": 2.0, "hi": 8.0}
    recs = _crowd_records(truth, anchors, {"faithful": 1.0, "random": 0.0}, 600, seed=1)
    fit = fit_bpa(recs, list(truth), anchors)
    assert fit.reliabilities["faithful"] > 0.85
    assert fit.reliabilities["random"] < 0.25
    from scipy.stats import spearmanr

    assert spearmanr([truth[c] for c in truth], [fit.scores[c] for c in truth])[0] > 0.85


def test_uncertainty_shrinks_as_comparisons_accumulate():
    rng = np.random.default_rng(2)
    truth = {f"c{i}": float(v) for i, v in enumerate(rng.uniform(2, 8, 12))}
    anchors = {"lo": 2.0, "hi": 8.0}
    recs = _crowd_records(truth, anchors, {"r1": 0.95, "r2": 0.8}, 1200, seed=4)
    fit, sigmas = None, []
    for n in (30, 150, 600, 1200):
        fit = fit_bpa(recs[:n], list(truth), anchors, previous=fit)
        sigmas.append(fit.mean_sigma)
    assert all(later < earlier for earlier, later in zip(sigmas, sigmas[1:])), sigmas
    assert sigmas[-1] < 0.5 * BPAConfig().sigma_init
    assert all(BPAConfig().sigma_min <= s <= BPAConfig().sigma_init for s in fit.sigma.values())


def test_smooth_uncertainty_hand_values():
    config = BPAConfig(rho=0.25, sigma_min=0.1, sigma_init=2.0)
    got = smooth_uncertainty(np.array([4.0, 1e6, 0.01]), np.array([1.0, 0.05, 2.0]), config)
    # 0.75 * 1 + 0.25 * 0.5 = 0.875; 0.75 * 0.05 + 0.25 * 0.001 -> floor 0.1; 0.75 * 2 + 0.25 * 10 -> cap 2.0
    np.testing.assert_allclose(got, [0.875, 0.1, 2.0])


def test_tnc_agrees_with_lbfgsb():
    rng = np.random.default_rng(5)
    truth = {f"c{i}": float(v) for i, v in enumerate(rng.uniform(2, 8, 8))}
    anchors = {"lo": 2.0, "hi": 8.0}
    recs = _crowd_records(truth, anchors, {"r": 0.9}, 300, seed=6)
    a = fit_bpa(recs, list(truth), anchors, config=BPAConfig(optimizer="L-BFGS-B"))
    b = fit_bpa(recs, list(truth), anchors, config=BPAConfig(optimizer="TNC", max_iter=2000))
    assert a.neg_log_posterior == pytest.approx(b.neg_log_posterior, abs=1e-3)
    for c in truth:
        assert a.scores[c] == pytest.approx(b.scores[c], abs=0.05)


def test_unknown_item_in_records_is_rejected():
    with pytest.raises(ValueError, match="'ghost'"):
        fit_bpa(_records([("x", "ghost", "a")]), ["x", "y"])
    with pytest.raises(ValueError, match="both candidates and anchors"):
        fit_bpa([], ["x", "y"], {"x": 3.0})
    with pytest.raises(ValueError, match="anchor 'lo'"):
        fit_bpa([], ["x"], {"lo": 0.0})


@pytest.mark.parametrize(
    ("cls", "kwargs", "choices"),
    [
        (BPAConfig, {"optimizer": "adam"}, ["L-BFGS-B", "TNC"]),
        (SchedulerConfig, {"policy": "greedy"}, ["bpa", "random", "trueskill"]),
        (SchedulerConfig, {"init_method": "zscore"}, ["percentile", "rank", "midpoint"]),
        (CommitteeConfig, {"weighting": "softmax"}, ["log_odds", "accuracy", "equal"]),
    ],
)
def test_config_literals_are_checked(cls, kwargs, choices):
    field = next(iter(kwargs))
    with pytest.raises(ValueError) as err:
        cls(**kwargs)
    message = str(err.value)
    assert f"{cls.__name__}.{field}" in message
    for choice in choices:
        assert repr(choice) in message


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (BPAConfig, {"rho": 1.5}, "rho"),
        (BPAConfig, {"delta_bounds": (0.0, 1.0)}, "delta_bounds"),
        (BPAConfig, {"sigma_min": 5.0}, "sigma_min"),
        (BPAConfig, {"eta_init": 1.0}, "eta_init"),
        (BPAConfig, {"score_min": 9.0}, "score_min"),
        (SchedulerConfig, {"anchor_share": 0.5}, "exploration_share"),
        (SchedulerConfig, {"refit_every": 0}, "refit_every"),
        (SchedulerConfig, {"init_percentiles": (90.0, 10.0)}, "init_percentiles"),
        (CommitteeConfig, {"smoothing": -1.0}, "smoothing"),
    ],
)
def test_config_values_are_checked(cls, kwargs, field):
    with pytest.raises(ValueError, match=f"{cls.__name__}.{field}"):
        cls(**kwargs)
