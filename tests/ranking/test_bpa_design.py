"""Ranking-variance exploration (emoreward.ranking.bpa.design): Fisher information, covariance updates, gains."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from emoreward.ranking.bpa import BPAConfig, BPAScheduler, SchedulerConfig, SimulatedCrowd, make_items
from emoreward.ranking.bpa.design import (
    centred_design_comparisons,
    crowd_fisher_information,
    expected_fisher_information,
    outcome_fisher_information,
    rank_one_update,
    ranking_variance_gains,
    record_information_matrix,
)
from emoreward.ranking.bpa.model import rao_kupper_probabilities


@pytest.mark.parametrize("eta", [1.0, 0.6, 0.0])
def test_fisher_information_matches_finite_differences(eta):
    d, h, delta, slope = np.array([-2.0, 0.0, 0.7, 3.0]), 1e-5, 0.6, 1.3

    def q(x):
        return eta * rao_kupper_probabilities(x, delta, slope) + (1 - eta) / 3

    dq = (q(d + h) - q(d - h)) / (2 * h)
    np.testing.assert_allclose(outcome_fisher_information(d, delta, slope, eta), (dq**2 / q(d)).sum(-1), atol=1e-8)
    if eta == 0.0:  # a guesser tells nothing
        assert np.all(outcome_fisher_information(d, delta, slope, eta) == 0)


def test_expected_fisher_information_averages_over_the_posterior():
    assert expected_fisher_information(0.5, 0.0, 0.6) == pytest.approx(outcome_fisher_information(0.5, 0.6))
    rng = np.random.default_rng(0)
    mc = outcome_fisher_information(rng.normal(0.5, 1.5, 200_000), 0.6).mean()
    assert expected_fisher_information(0.5, 1.5**2, 0.6) == pytest.approx(mc, rel=5e-3)


def test_information_matrix_and_rank_one_update():
    # candidates 0, 1, 2; item 3 is an anchor
    idx_a, idx_b, info = np.array([0, 1, 2]), np.array([1, 3, 0]), np.array([0.2, 0.3, 0.1])
    fisher = record_information_matrix(idx_a, idx_b, info, 3)
    expected = np.array([[0.3, -0.2, -0.1], [-0.2, 0.5, 0.0], [-0.1, 0.0, 0.1]])
    np.testing.assert_allclose(fisher, expected)
    precision = fisher + np.eye(3)
    cov = np.linalg.inv(precision)
    for i, j in [(0, 2), (1, 3)]:  # candidate pair, candidate-anchor pair
        e = np.zeros(3)
        e[i] += 1
        if j < 3:
            e[j] -= 1
        np.testing.assert_allclose(rank_one_update(cov, i, j, 0.4), np.linalg.inv(precision + 0.4 * np.outer(e, e)))


def test_gains_prefer_uncertain_close_pairs():
    mean = np.array([5.0, 5.2, 8.5, 5.0, 2.0])  # three candidates, two anchors
    cov = np.diag([1.0, 1.0, 0.05])
    gain = ranking_variance_gains(mean, cov, delta=0.5)
    np.testing.assert_allclose(gain[np.isfinite(gain)], gain.T[np.isfinite(gain.T)])
    assert np.isneginf(gain[3, 4]) and np.isneginf(np.diag(gain)).all()
    assert gain[0, 1] > gain[0, 2] and gain[0, 1] > gain[2, 4]  # close and uncertain beats far or settled
    assert gain[0, 3] > gain[0, 4]  # the nearby anchor beats the far one


def test_scheduler_keeps_the_laplace_covariance_and_ranks():
    truth, anchors = make_items(20, 3, np.random.default_rng(0))
    crowd = SimulatedCrowd({**truth, **anchors}, {"good": 0.95, "guesser": 0.0}, seed=0)
    sconfig = SchedulerConfig(policy="exploration", exploration_rule="ranking_variance", refit_every=20, seed=0)
    sched = BPAScheduler(list(truth), anchors, config=BPAConfig(), scheduler_config=sconfig)
    for _ in range(300):
        a, b, strategy = sched.next_pair()
        assert strategy == "exploration" and (a in truth or b in truth)
        sched.add_record(crowd(a, b), strategy=strategy)
    # right after a refit the covariance is the inverse expected-Fisher precision plus prior, symmetric positive
    assert sched.n_since_refit == 0
    cov = sched._cov
    np.testing.assert_allclose(cov, cov.T, atol=1e-10)
    assert np.all(np.linalg.eigvalsh(cov) > 0)
    rho = spearmanr([truth[c] for c in truth], [sched.fit.scores[c] for c in truth]).statistic
    assert rho > 0.9


def test_trueskill_policy_ignores_the_exploration_rule():
    cands = [f"c{i}" for i in range(8)]
    sconfig = SchedulerConfig(policy="trueskill", exploration_rule="ranking_variance")
    sched = BPAScheduler(cands, scheduler_config=sconfig)
    assert not sched._track_cov
    with pytest.raises(ValueError, match="exploration_rule must be one of"):
        SchedulerConfig(exploration_rule="entropy")


def test_crowd_information_averages_annotators_not_reliabilities():
    # Delta = 0, delta = 0.6, eta = 1: P(a) = P(b) = sigmoid(-0.6) = 0.354344, dP/dDelta = +-0.228784, dP(tie) = 0,
    # so J = 2 * 0.228784^2 / 0.354344 = 0.295430; a guesser adds nothing
    j0 = 2 * 0.228784**2 / 0.354344
    assert outcome_fisher_information(0.0, 0.6) == pytest.approx(j0, rel=1e-5)
    assert crowd_fisher_information(0.0, 0.6, 1.0, [1.0, 0.0]) == pytest.approx(0.5 * j0, rel=1e-5)
    assert crowd_fisher_information(0.0, 0.6, 1.0, [1.0, 0.0], weights=[0.25, 0.75]) == pytest.approx(
        0.25 * j0, rel=1e-5
    )
    # the mixture over annotators is not the information at the mean reliability
    assert crowd_fisher_information(0.0, 0.6, 1.0, [1.0, 0.0]) != pytest.approx(
        outcome_fisher_information(0.0, 0.6, 1.0, 0.5)
    )
    d, var, etas = np.array([0.0, 1.5, -3.0]), np.array([0.0, 0.5, 2.0]), [0.9, 0.6]
    expected = np.mean([expected_fisher_information(d, var, 0.6, 1.0, e) for e in etas], axis=0)
    np.testing.assert_allclose(crowd_fisher_information(d, 0.6, 1.0, etas, diff_var=var), expected)


def test_centred_design_bound():
    j0 = 2 * 0.228784**2 / 0.354344
    # at huge precision every centred pair has Delta ~ 0: raising precision by 1 takes 1 / (2 J(0)) per candidate
    assert centred_design_comparisons(1e8, 1e8 + 1.0, 0.6, 1.0, [1.0]) == pytest.approx(1 / (2 * j0), rel=1e-4)
    # in general the trapezoid rule over 1 / (2 E[J]) with Delta ~ N(0, 2 / P)
    grid = np.linspace(0.25, 1.5, 5)
    info = np.array([expected_fisher_information(0.0, 2 / p, 0.6, 1.0, 0.8) for p in grid])
    by_hand = np.sum((grid[1:] - grid[:-1]) * (1 / info[1:] + 1 / info[:-1]) / 4)
    assert centred_design_comparisons(0.25, 1.5, 0.6, 1.0, [0.8], n_grid=5) == pytest.approx(by_hand)
    # uncertain candidates carry less information per comparison than known ones: the bound exceeds 1.25 / (2 J(0))
    assert centred_design_comparisons(0.25, 1.5, 0.6, 1.0, [1.0]) > 1.25 / (2 * j0)
    for bad in [(0.0, 1.0), (2.0, 1.0)]:
        with pytest.raises(ValueError, match="precision_from"):
            centred_design_comparisons(*bad, 0.6, 1.0, [1.0])
    with pytest.raises(ValueError, match="n_grid"):
        centred_design_comparisons(0.25, 1.0, 0.6, 1.0, [1.0], n_grid=1)
