"""Tests for emoreward.ranking: counts, Bradley-Terry (with and without ties), bootstrap, hierarchy, plots."""

import functools
import itertools
import json
import math
import warnings

import choix
import numpy as np
import pytest
from scipy.stats import spearmanr

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import (
    TIE_MODELS,
    BTResult,
    fit_binarized_bradley_terry,
    fit_bradley_terry,
    fit_bradley_terry_ties,
)
from emoreward.ranking.counts import PairwiseCounts, check_connected, connected_item_groups
from emoreward.ranking.hierarchical import rank_hierarchical
from emoreward.ranking.plots import plot_scores, plot_win_matrix
from emoreward.ranking.records import PairwiseRecord


def simulate(strengths, n_per_pair, tie_model=None, tie=0.0, seed=0, pairs=None):
    """Records drawn from a (tie) model; one sample id per repetition so bootstrap units are samples."""
    rng = np.random.default_rng(seed)
    m = len(strengths)
    items = [f"m{k}" for k in range(m)]
    theta = np.exp(np.asarray(strengths, dtype=float))
    pairs = list(itertools.combinations(range(m), 2)) if pairs is None else pairs
    records = []
    for n in range(n_per_pair):
        for a, b in pairs:
            ta, tb = theta[a], theta[b]
            if tie_model is None:
                p = [ta / (ta + tb), tb / (ta + tb), 0.0]
            elif tie_model == "emoprefer":
                p = np.array([ta, tb, tie]) / (ta + tb + tie)
            elif tie_model == "davidson":
                p = np.array([ta, tb, tie * math.sqrt(ta * tb)]) / (ta + tb + tie * math.sqrt(ta * tb))
            else:  # rao-kupper
                pw, pl = ta / (ta + tie * tb), tb / (tb + tie * ta)
                p = [pw, pl, 1.0 - pw - pl]
            outcome = ("a", "b", "tie")[rng.choice(3, p=p)]
            records.append(PairwiseRecord(items[a], items[b], outcome, sample=f"s{n}"))
    return items, records


def rec(a, b, outcome, sample=None):
    return PairwiseRecord(a, b, outcome, sample=sample)


# ---------------------------------------------------------------------------------------------------- counts


def test_counts_hand_case():
    records = [rec("x", "y", "a"), rec("y", "x", "a"), rec("y", "x", "b"), rec("x", "z", "tie"), rec("z", "y", "b")]
    counts = PairwiseCounts.from_records(records)
    assert counts.items == ["x", "y", "z"]
    np.testing.assert_array_equal(counts.wins, [[0, 2, 0], [1, 0, 1], [0, 0, 0]])
    np.testing.assert_array_equal(counts.ties, [[0, 0, 1], [0, 0, 0], [1, 0, 0]])
    assert counts.n_comparisons == 5
    fixed = PairwiseCounts.from_records(records, items=["z", "y", "x", "w"])
    assert fixed.wins[2, 1] == 2 and fixed.wins[1, 0] == 1 and fixed.n_items == 4
    with pytest.raises(ValueError, match="'x' is not in items"):
        PairwiseCounts.from_records(records, items=["y", "z"])


def test_binarized_hand_case():
    # x beats y 3-1 (plus 2 ties), x and z are 2-2, y and z only tied, w never compared with x.
    wins = np.array([[0, 3, 2, 0], [1, 0, 0, 0], [2, 0, 0, 1], [0, 0, 0, 0]], dtype=float)
    ties = np.zeros((4, 4))
    ties[0, 1] = ties[1, 0] = 2
    ties[1, 2] = ties[2, 1] = 4
    counts = PairwiseCounts(["x", "y", "z", "w"], wins, ties)
    half = counts.binarized()
    expected = np.array([[0, 1, 0.5, 0], [0, 0, 0.5, 0], [0.5, 0.5, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(half.wins, expected)
    assert not half.ties.any()
    assert half.n_comparisons == 4  # one comparison per compared pair: xy, xz, yz, zw
    drop = counts.binarized("drop")
    np.testing.assert_array_equal(drop.wins, [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="equal must be one of"):
        counts.binarized("coin")


def test_fit_binarized_is_bt_on_w():
    items, records = simulate([1.0, 0.3, 0.0, -0.5], 7, seed=3)
    counts = PairwiseCounts.from_records(records)
    direct = fit_bradley_terry(counts.binarized("half"))
    np.testing.assert_allclose(fit_binarized_bradley_terry(counts).scores, direct.scores)
    assert direct.n_comparisons == 6


def test_counts_validation():
    with pytest.raises(ValueError, match="symmetric"):
        PairwiseCounts(["a", "b"], np.zeros((2, 2)), np.array([[0, 1], [0, 0]]))
    with pytest.raises(ValueError, match="shape"):
        PairwiseCounts(["a", "b"], np.zeros((3, 3)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="with itself"):
        PairwiseRecord("a", "a", "a")  # records reject self-comparisons before counts see them


# -------------------------------------------------------------------------------------------- connectivity


def test_disconnected_graph_error_and_warning():
    records = [rec("a", "b", "a"), rec("b", "a", "tie"), rec("c", "d", "b"), rec("d", "e", "a")]
    counts = PairwiseCounts.from_records(records)
    assert connected_item_groups(counts) == [["c", "d", "e"], ["a", "b"]]
    with pytest.raises(ValueError, match=r"2 components \[\['c', 'd', 'e'\], \['a', 'b'\]\]"):
        check_connected(counts, "error")
    with pytest.raises(ValueError, match="disconnected"):
        fit_bradley_terry(counts)
    with pytest.raises(ValueError, match="disconnected"):
        fit_bradley_terry_ties(counts, tie_model="davidson")
    with pytest.warns(UserWarning, match="disconnected"):
        result = fit_bradley_terry(counts, on_disconnected="warn")
    assert np.all(np.isfinite(result.scores))
    with pytest.raises(ValueError, match="on_disconnected must be one of"):
        check_connected(counts, "ignore")


def test_ties_connect_items_and_unseen_item_is_disconnected():
    counts = PairwiseCounts.from_records([rec("a", "b", "tie"), rec("b", "c", "a")])
    assert check_connected(counts) == [["a", "b", "c"]]
    with_unseen = PairwiseCounts.from_records([rec("a", "b", "a")], items=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"\['c'\]"):
        check_connected(with_unseen)


# --------------------------------------------------------------------------------------------- Bradley-Terry


def test_matches_choix_map_and_mle():
    strengths = [1.2, 0.6, 0.1, -0.2, -0.7, -1.0]
    items, records = simulate(strengths, 30, seed=1)
    counts = PairwiseCounts.from_records(records)
    data = [
        (items.index(r.item_a), items.index(r.item_b))
        if r.outcome is Verdict.FIRST
        else (items.index(r.item_b), items.index(r.item_a))
        for r in records
    ]
    variance = 2.0
    ours = fit_bradley_terry(counts, prior_variance=variance)
    # choix's penalty is alpha * ||s||^2, i.e. a Gaussian prior of variance 1 / (2 alpha).
    ref = choix.opt_pairwise(len(items), data, alpha=1 / (2 * variance), method="Newton-CG", tol=1e-10)
    np.testing.assert_allclose(ours.scores, ref - ref.mean(), atol=1e-3)
    mle = fit_bradley_terry(counts, prior_variance=None)
    ref_mle = choix.ilsr_pairwise(len(items), data, alpha=0.0, tol=1e-12)
    np.testing.assert_allclose(mle.scores, ref_mle - ref_mle.mean(), atol=1e-3)
    assert abs(mle.scores.mean()) < 1e-12
    # the prior shrinks: MAP spread is strictly smaller than the MLE spread
    assert np.ptp(ours.scores) < np.ptp(mle.scores)


def test_recovers_known_strengths():
    strengths = np.array([1.5, 1.0, 0.6, 0.2, -0.1, -0.5, -0.9, -1.4])
    items, records = simulate(strengths, 40, seed=2)
    result = fit_bradley_terry(PairwiseCounts.from_records(records))
    assert spearmanr(result.scores, strengths).statistic > 0.9
    np.testing.assert_allclose(result.scores, strengths - strengths.mean(), atol=0.35)
    assert result.ranking[0] == "m0" and set(result.ranking[-2:]) == {"m6", "m7"}
    assert result.n_comparisons == len(records)


def test_two_item_likelihood_by_hand():
    counts = PairwiseCounts(["x", "y"], np.array([[0.0, 3.0], [1.0, 0.0]]), np.array([[0.0, 2.0], [2.0, 0.0]]))
    bt = fit_bradley_terry(counts, prior_variance=None)
    np.testing.assert_allclose(bt.scores, [math.log(3) / 2, -math.log(3) / 2], atol=1e-6)
    assert bt.log_likelihood == pytest.approx(3 * math.log(3 / 4) + math.log(1 / 4), abs=1e-9)
    half = fit_bradley_terry(counts, prior_variance=None, ties="half")  # 4 vs 2 wins
    assert half.scores[0] - half.scores[1] == pytest.approx(math.log(2), abs=1e-6)
    # MAP with prior N(0, 1): stationarity 3 * sigmoid(-d) - sigmoid(d) = d / 2 for d = s_x - s_y = 2 s_x
    map_fit = fit_bradley_terry(counts, prior_variance=1.0)
    d = map_fit.scores[0] - map_fit.scores[1]
    assert 3 / (1 + math.exp(d)) - 1 / (1 + math.exp(-d)) == pytest.approx(d / 2, abs=1e-6)

    # Tie models, MLE: multinomial proportions 3:1:2 are reproduced exactly.
    emo = fit_bradley_terry_ties(counts, "emoprefer", prior_variance=None)
    c = 1 / math.sqrt(3)  # theta_x = 3c, theta_y = c, beta = 2c with log theta centred
    np.testing.assert_allclose(emo.scores, [math.log(3 * c), math.log(c)], atol=1e-5)
    assert emo.tie_parameter == pytest.approx(2 * c, rel=1e-4)
    loglik = 3 * math.log(1 / 2) + math.log(1 / 6) + 2 * math.log(1 / 3)
    assert emo.log_likelihood == pytest.approx(loglik, abs=1e-8)
    dav = fit_bradley_terry_ties(counts, "davidson", prior_variance=None)
    assert dav.tie_parameter == pytest.approx(2 / math.sqrt(3), rel=1e-4)
    assert dav.log_likelihood == pytest.approx(loglik, abs=1e-8)
    rk = fit_bradley_terry_ties(counts, "rao-kupper", prior_variance=None)  # r/(r+nu)=1/2, 1/(1+nu r)=1/6
    assert rk.tie_parameter == pytest.approx(math.sqrt(5), rel=1e-4)
    np.testing.assert_allclose(rk.scores, [math.log(5) / 4, -math.log(5) / 4], atol=1e-5)
    assert rk.log_likelihood == pytest.approx(loglik, abs=1e-8)


def test_undefeated_item_has_finite_score():
    records = [rec("champ", o, "a") for o in ("p", "q", "r") for _ in range(5)]
    records += [rec("p", "q", "a"), rec("q", "r", "b"), rec("r", "p", "tie"), rec("p", "q", "b")]
    counts = PairwiseCounts.from_records(records)
    for result in (fit_bradley_terry(counts), fit_binarized_bradley_terry(counts)) + tuple(
        fit_bradley_terry_ties(counts, model) for model in TIE_MODELS
    ):
        assert np.all(np.isfinite(result.scores)), result.model
        assert result.ranking[0] == "champ"
        assert 0.5 < result.score("champ") < 15.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unregularised = fit_bradley_terry(counts, prior_variance=None)
    assert unregularised.score("champ") > fit_bradley_terry(counts).score("champ") + 2.0


@pytest.mark.parametrize(("tie_model", "tie"), [("davidson", 1.5), ("rao-kupper", 2.0), ("emoprefer", 0.8)])
def test_tie_parameter_recovered(tie_model, tie):
    strengths = np.array([0.9, 0.4, 0.0, -0.5, -0.8])
    strengths = strengths - strengths.mean()  # emoprefer's beta is on the centred scale
    items, records = simulate(strengths, 300, tie_model=tie_model, tie=tie, seed=4)
    result = fit_bradley_terry_ties(PairwiseCounts.from_records(records), tie_model=tie_model)
    assert result.model == tie_model
    assert result.tie_parameter == pytest.approx(tie, rel=0.1)
    np.testing.assert_allclose(result.scores, strengths, atol=0.15)
    assert result.ranking == items


def test_unknown_tie_model_lists_choices():
    counts = PairwiseCounts.from_records([rec("a", "b", "tie"), rec("a", "b", "a")])
    with pytest.raises(ValueError, match=r"unknown tie_model 'kupper'.*'emoprefer', 'rao-kupper', 'davidson'"):
        fit_bradley_terry_ties(counts, tie_model="kupper")
    with pytest.raises(ValueError, match="prior_variance"):
        fit_bradley_terry(counts, prior_variance=0.0)
    with pytest.raises(ValueError, match="ties must be one of"):
        fit_bradley_terry(counts, ties="ignore")


def test_result_serialisation():
    counts = PairwiseCounts.from_records([rec("a", "b", "a"), rec("b", "c", "a"), rec("a", "c", "tie")])
    result = fit_bradley_terry_ties(counts, "davidson")
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["ranking"] == ["a", "b", "c"] and payload["model"] == "davidson"
    assert payload["tie_parameter"] == pytest.approx(result.tie_parameter)
    assert payload["ci_lower"] is None
    table = result.to_markdown()
    assert table.index("| 1 | a |") < table.index("| 2 | b |") < table.index("| 3 | c |")
    assert "tie parameter" in table
    with pytest.raises(ValueError, match="shape"):
        BTResult(["a", "b"], np.zeros(3), "bradley-terry", 0.0, 0)


# ---------------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_contains_estimate_and_is_deterministic():
    items, records = simulate([1.0, 0.5, 0.0, -0.6], 40, tie_model="davidson", tie=1.0, seed=5)
    fit = functools.partial(fit_bradley_terry_ties, tie_model="davidson")
    ci = bootstrap_ci(records, fit, n_boot=200, seed=7)
    estimate = fit(PairwiseCounts.from_records(records))
    assert ci.scores.shape == (200, 4) and ci.n_units == 40  # resampled units are the 40 samples
    assert np.all(ci.lower <= estimate.scores) and np.all(estimate.scores <= ci.upper)
    assert np.all(ci.upper - ci.lower > 0.05) and np.all(ci.upper - ci.lower < 1.5)
    np.testing.assert_allclose(ci.estimate.scores, estimate.scores)
    np.testing.assert_allclose(ci.estimate.ci_lower, ci.lower)
    assert ci.estimate.ci_level == pytest.approx(0.95)
    again = bootstrap_ci(records, fit, n_boot=200, seed=7)
    np.testing.assert_array_equal(again.scores, ci.scores)
    other = bootstrap_ci(records, fit, n_boot=200, seed=8)
    assert not np.array_equal(other.scores, ci.scores)
    assert "95% CI" in ci.estimate.to_markdown()


def test_bootstrap_resamples_whole_samples():
    # Each sample holds a win of a and a win of b over each other, so any resample of samples is exactly balanced;
    # resampling records instead would not be.
    records = [rec("a", "b", o, sample=f"s{k}") for k in range(10) for o in ("a", "b")]
    ci = bootstrap_ci(records, fit_bradley_terry, n_boot=50, seed=0)
    np.testing.assert_allclose(ci.scores, 0.0, atol=1e-8)
    no_samples = [rec("a", "b", r.outcome) for r in records]
    ci_records = bootstrap_ci(no_samples, fit_bradley_terry, n_boot=50, seed=0)
    assert ci_records.n_units == 20 and np.ptp(ci_records.scores[:, 0]) > 0.1
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci(records, fit_bradley_terry, alpha=1.5)


@pytest.mark.parametrize("model", ["bradley-terry", "binarized", *TIE_MODELS])
def test_warm_started_bootstrap_matches_cold_start(model):
    # Refits start from the full-data estimate by default; the intervals must not depend on it (beyond 1e-4).
    strengths = [1.1, 0.6, 0.2, -0.1, -0.5, -1.3]
    items, records = simulate(strengths, 30, tie_model="davidson", tie=0.8, seed=11)
    if model == "bradley-terry":
        fit = fit_bradley_terry
    elif model == "binarized":
        fit = functools.partial(fit_binarized_bradley_terry, on_disconnected="warn")
    else:
        fit = functools.partial(fit_bradley_terry_ties, tie_model=model)
    warm = bootstrap_ci(records, fit, n_boot=60, seed=3)
    cold = bootstrap_ci(records, fit, n_boot=60, seed=3, warm_start=False)
    np.testing.assert_allclose(warm.lower, cold.lower, atol=1e-4, rtol=0)
    np.testing.assert_allclose(warm.upper, cold.upper, atol=1e-4, rtol=0)
    np.testing.assert_allclose(warm.scores, cold.scores, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(warm.estimate.scores, cold.estimate.scores)


def test_bootstrap_warm_start_passes_full_fit_only_to_fits_that_accept_it():
    items, records = simulate([0.7, 0.0, -0.7], 20, tie_model="rao-kupper", tie=1.5, seed=12)
    seen = []

    def spy(counts, **kwargs):
        seen.append(kwargs)
        return fit_bradley_terry_ties(counts, "rao-kupper", **kwargs)

    ci = bootstrap_ci(records, spy, n_boot=5, seed=0)
    assert seen[0] == {} and len(seen) == 6
    for kwargs in seen[1:]:
        np.testing.assert_array_equal(kwargs["initial_scores"], ci.estimate.scores)
        assert kwargs["initial_tie_parameter"] == ci.estimate.tie_parameter
    # a fit without the keyword is called with the counts only
    plain = bootstrap_ci(records, lambda counts: fit_bradley_terry(counts), n_boot=5, seed=0)
    np.testing.assert_allclose(
        plain.scores, bootstrap_ci(records, fit_bradley_terry, n_boot=5, seed=0).scores, atol=1e-6
    )
    # a warm start from the answer stays at the answer; a bad starting tie parameter is rejected
    counts = PairwiseCounts.from_records(records)
    cold = fit_bradley_terry_ties(counts, "rao-kupper")
    again = fit_bradley_terry_ties(
        counts, "rao-kupper", initial_scores=cold.scores, initial_tie_parameter=cold.tie_parameter
    )
    np.testing.assert_allclose(again.scores, cold.scores, atol=1e-6)
    assert again.tie_parameter == pytest.approx(cold.tie_parameter, rel=1e-5)
    with pytest.raises(ValueError, match="initial_tie_parameter"):
        fit_bradley_terry_ties(counts, "rao-kupper", initial_tie_parameter=0.5)  # nu >= 1


def test_counts_from_records_match_a_loop_over_records():
    rng = np.random.default_rng(13)
    names = [f"x{k}" for k in range(7)]
    records = []
    for n in range(400):
        a, b = rng.choice(7, size=2, replace=False)
        records.append(rec(names[a], names[b], ("a", "b", "tie")[rng.integers(3)], sample=f"s{n % 9}"))
    items = names + ["never"]
    counts = PairwiseCounts.from_records(iter(records), items)
    wins, ties = np.zeros((8, 8)), np.zeros((8, 8))
    for r in records:
        a, b = items.index(r.item_a), items.index(r.item_b)
        if r.outcome is Verdict.TIE:
            ties[a, b] += 1
            ties[b, a] += 1
        else:
            wins[(a, b) if r.outcome is Verdict.FIRST else (b, a)] += 1
    np.testing.assert_array_equal(counts.wins, wins)
    np.testing.assert_array_equal(counts.ties, ties)
    assert PairwiseCounts.from_records([], items=["p", "q"]).n_comparisons == 0


# ------------------------------------------------------------------------------------------------- hierarchical


def test_rank_hierarchical_static_records_and_function():
    strengths = [0.2, 1.5, -0.3, 0.0, 0.9, -1.0, 0.4, -0.6]
    items, records = simulate(strengths, 30, seed=6)
    groups = [items[:4], items[4:]]
    result = rank_hierarchical(records, groups)
    assert result.group_winners == ["m1", "m4"]
    assert result.winner == "m1"
    assert result.n_comparisons == 2 * math.comb(4, 2) * 30 + 30
    assert result.final.items == ["m1", "m4"]
    json.dumps(result.to_dict())

    asked = []

    def judge(pairs):
        asked.append(pairs)
        wanted = set(pairs)
        return [r for r in records if (r.item_a, r.item_b) in wanted]

    on_demand = rank_hierarchical(judge, groups)
    assert on_demand.winner == "m1"
    assert asked[-1] == [("m1", "m4")]
    assert all(a in g and b in g for g, pairs in zip(groups, asked[:2]) for a, b in pairs)

    with pytest.raises(ValueError, match="not asked for"):
        rank_hierarchical(lambda pairs: records, groups)
    with pytest.raises(ValueError, match="disjoint"):
        rank_hierarchical(records, [items[:4], items[3:]])
    with pytest.raises(ValueError, match="at least two groups"):
        rank_hierarchical(records, [items])


def test_a_tie_at_the_top_of_a_stage_is_broken_by_content_order_not_by_name():
    """alpha and beta split their comparisons evenly and both beat gamma: the group's two top scores are equal. The
    pick follows `order` (a table's models in the order of their content), so renaming the models changes no pick and
    no score (it followed the names: a renamed twin sent the other model to the final)."""
    from emoreward.ranking.records import PairwiseRecord

    def records(names):
        a, b, c, d = names
        out = [PairwiseRecord(a, b, "1" if k % 2 else "2", sample=f"s{k}") for k in range(8)]
        out += [PairwiseRecord(x, c, "1" if k < 6 else "2", sample=f"s{k}") for k in range(8) for x in (a, b)]
        return out + [PairwiseRecord(d, x, "1" if k < 5 else "2", sample=f"s{k}") for k in range(8) for x in (a, b)]

    original, renamed = ["alpha", "beta", "gamma", "delta"], ["zz1", "aa2", "mm3", "bb4"]
    picks = {}
    for names in (original, renamed):
        a, b, c, d = names
        for order in ([b, a, c, d], [a, b, c, d]):
            result = rank_hierarchical(records(names), [[a, b, c], [d]], order=order)
            picks[(names[0], order[0])] = (result.group_winners, result.winner, sorted(result.final.scores))
            assert result.group_winners[0] == order[0]
            assert any(f"{order[0]!r} was picked by the order of the models' content" in w for w in result.warnings)
    assert picks[("alpha", "beta")][0] == ["beta", "delta"] and picks[("zz1", "aa2")][0] == ["aa2", "bb4"]
    assert picks[("alpha", "beta")][2] == picks[("zz1", "aa2")][2]  # the same scores under the renaming
    assert picks[("alpha", "alpha")][2] == picks[("zz1", "zz1")][2]


# ---------------------------------------------------------------------------------------------------------- plots


def test_plots_write_png(tmp_path):
    items, records = simulate([0.8, 0.0, -0.8], 10, tie_model="emoprefer", tie=0.5, seed=9)
    ci = bootstrap_ci(records, fit_bradley_terry_ties, n_boot=20, seed=0)
    counts = PairwiseCounts.from_records(records)
    for path in (
        plot_scores(ci.estimate, tmp_path / "scores.png"),
        plot_scores(fit_bradley_terry(counts), tmp_path / "no_ci.png"),
        plot_win_matrix(counts, tmp_path / "sub" / "w.png"),
        plot_win_matrix(counts.binarized(), tmp_path / "w_bin.png"),
    ):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
