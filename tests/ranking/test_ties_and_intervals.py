"""Tie models that let ties carry information, shared ranks for equal scores, and bootstrap intervals that are
anchored on the resamples where a model was compared and always contain their estimate."""

import itertools
import math

import numpy as np
import pytest
from tqdm import tqdm

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import (
    BTResult,
    equal_score_groups,
    fit_binarized_bradley_terry,
    fit_bradley_terry_ties,
)
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.effects import tie_probability_between_equals
from emoreward.ranking.fit import FitSpec
from emoreward.ranking.rank import fit_ranking
from emoreward.ranking.records import OUTCOMES, PairwiseRecord, as_outcome
from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL


def three_models(a, x, y, n=10):
    """The issue's example: ``a`` ties ``x`` every time, beats ``y`` every time; ``x`` and ``y`` split evenly."""
    records = []
    for s in range(n):
        records += [
            PairwiseRecord(a, x, Verdict.TIE, sample=f"s{s}"),
            PairwiseRecord(a, y, Verdict.FIRST, sample=f"s{s}"),
            PairwiseRecord(x, y, Verdict.FIRST if s < n // 2 else Verdict.SECOND, sample=f"s{s}"),
        ]
    return records


NAMINGS = [("A", "X", "Y"), ("A", "Y", "X"), ("b", "c", "a"), ("m", "a", "z")]


@pytest.mark.parametrize(("a", "x", "y"), NAMINGS)
@pytest.mark.parametrize("item_order", ["sorted", "reversed"])
def test_ties_carry_information_in_the_default_tie_model(a, x, y, item_order):
    records = three_models(a, x, y)
    items = sorted([a, x, y]) if item_order == "sorted" else sorted([a, x, y], reverse=True)
    counts = PairwiseCounts.from_records(records, items)
    assert DEFAULT_TIE_MODEL == "davidson"
    for model in ("davidson", "rao-kupper"):
        fit = fit_bradley_terry_ties(counts, tie_model=model)
        assert fit.score(x) - fit.score(y) > 1.0  # tying the best model is better than losing to it
        assert fit.ranking == [a, x, y] and fit.ranks == [1, 2, 3]
    davidson = fit_bradley_terry_ties(counts, tie_model="davidson")
    # Davidson's sufficient statistic is wins + ties / 2 (15, 10, 5 here), symmetric about x: x sits midway
    assert davidson.score(x) == pytest.approx(0.0, abs=1e-6)
    assert davidson.score(a) == pytest.approx(-davidson.score(y), abs=1e-6)


@pytest.mark.parametrize(("a", "x", "y"), NAMINGS)
@pytest.mark.parametrize("item_order", ["sorted", "reversed"])
def test_emoprefer_counts_a_tie_as_a_loss_and_equal_scores_share_a_rank(a, x, y, item_order):
    records = three_models(a, x, y)
    items = sorted([a, x, y]) if item_order == "sorted" else sorted([a, x, y], reverse=True)
    fit = fit_bradley_terry_ties(PairwiseCounts.from_records(records, items), tie_model="emoprefer")
    # a tie with a costs x exactly what a loss to a costs y (EmoPrefer appendix F): identical scores
    assert fit.score(x) == pytest.approx(fit.score(y), abs=1e-6)
    # a shared rank whatever the names and the item order; within it, names in alphabetical order
    assert fit.rank(x) == fit.rank(y) == 2 and fit.rank(a) == 1
    assert fit.ranking == [a, *sorted([x, y])] and fit.ranks == [1, 2, 2]
    assert fit.tied_groups() == [sorted([x, y])]
    assert "| 2 | " in fit.to_markdown() and "| 3 | " not in fit.to_markdown()


def test_fit_ranking_default_is_davidson_with_the_paper_column():
    fits = fit_ranking(three_models("A", "X", "Y"), ["A", "X", "Y"], n_boot=20)
    assert fits.ties.estimate.model == "davidson" and fits.paper.estimate.model == "emoprefer"
    assert fits.ties.estimate.ranks == [1, 2, 3] and fits.paper.estimate.ranks == [1, 2, 2]
    assert (
        fit_ranking(three_models("A", "X", "Y"), ["A", "X", "Y"], FitSpec.resolve("emoprefer"), n_boot=5).paper is None
    )


def test_equal_score_groups():
    assert equal_score_groups(["d", "c", "b", "a"], np.array([1.0, 2.0, 1.0 + 5e-7, -1.0])) == [
        ["c"],
        ["b", "d"],
        ["a"],
    ]
    assert equal_score_groups(["x", "y"], np.array([np.nan, 0.0])) == [["y"], ["x"]]
    result = BTResult(["p", "q", "r", "s"], np.array([0.0, 1.0, 0.0, 0.0]), "bradley-terry", 0.0, 1)
    assert result.ranking == ["q", "p", "r", "s"] and result.ranks == [1, 2, 2, 2]


def test_tie_probability_between_equal_models():
    # hand values: nu = beta = 2 gives 2 / 4; Rao-Kupper nu = 3 gives 2 / 4
    assert tie_probability_between_equals("davidson", 2.0) == 0.5
    assert tie_probability_between_equals("emoprefer", 2.0) == 0.5
    assert tie_probability_between_equals("rao-kupper", 3.0) == 0.5
    with pytest.raises(ValueError, match="unknown tie model"):
        tie_probability_between_equals("bt", 1.0)


# ------------------------------------------------------------------------------------------------- bootstrap


def rare_model_records():
    """a, b, c on 10 samples (a > b > c on each); "rare" wrote for s3 only and beats everyone there."""
    records = []
    for s in range(10):
        for hi, lo in itertools.combinations("abc", 2):
            records.append(PairwiseRecord(hi, lo, Verdict.FIRST, sample=f"s{s}"))
        if s == 3:
            records += [PairwiseRecord("rare", m, Verdict.FIRST, sample="s3") for m in "abc"]
    return records


def test_bootstrap_uses_only_resamples_where_a_model_was_compared():
    records = rare_model_records()
    items = ["a", "b", "c", "rare"]
    n_boot, seed = 200, 7
    fit = lambda counts, **kw: fit_bradley_terry_ties(counts, tie_model="davidson", on_disconnected="warn", **kw)  # noqa: E731
    ci = bootstrap_ci(records, fit, n_boot=n_boot, seed=seed, items=items)
    # the resamples that contain s3 (unit 3: samples are numbered in order of first appearance), drawn as
    # bootstrap_ci draws them
    rng = np.random.default_rng(seed)
    with_s3 = sum(np.bincount(rng.integers(0, 10, 10), minlength=10)[3] > 0 for _ in range(n_boot))
    assert ci.n_compared.tolist() == [n_boot, n_boot, n_boot, with_s3]
    assert 0.55 < with_s3 / n_boot < 0.75  # 1 - 0.9^10 = 0.651 expected
    assert np.isnan(ci.scores[:, 3]).sum() == n_boot - with_s3
    assert ci.unit_counts.tolist() == [10, 10, 10, 1]
    # rare won everything it played: no resample that compared it puts it at the prior's 0
    k = items.index("rare")
    assert ci.estimate.scores[k] > 0 and ci.lower[k] > 0
    assert ci.lower[k] <= ci.estimate.scores[k] <= ci.upper[k]
    assert ci.sparse_items() == ["rare"]
    # a resample without rare is shifted so that a, b, c keep their full-data mean
    absent = np.isnan(ci.scores[:, 3])
    np.testing.assert_allclose(ci.scores[absent, :3].mean(axis=1), ci.estimate.scores[:3].mean(), atol=1e-9)


def test_interval_never_excludes_its_estimate():
    # sample k: its own pair of p..t (10 pairs) plus a hub h compared with all five, so every item is in every
    # resample. The number of distinct p..t pairs in a resample is 10 only when every sample is drawn
    # (p = 10! / 10^10): the "score" below has its whole bootstrap distribution below its estimate
    items = ["p", "q", "r", "s", "t", "h"]
    records = []
    for k, (x, y) in enumerate(itertools.combinations(items[:5], 2)):
        records += [PairwiseRecord(x, y, Verdict.FIRST, sample=f"u{k}")]
        records += [PairwiseRecord("h", z, Verdict.TIE, sample=f"u{k}") for z in items[:5]]

    def distinct_pairs(counts):
        compared = float((counts.totals[:5, :5] > 0).sum() / 2)
        return BTResult(counts.items, np.array([compared, 0.0, 0.0, 0.0, 0.0, 0.0]), "custom", 0.0, 0)

    ci = bootstrap_ci(records, distinct_pairs, n_boot=200, seed=0, items=items)
    assert ci.n_compared.tolist() == [200] * 6
    assert ci.estimate.scores[0] == 10.0 and ci.scores[:, 0].max() < 10.0
    assert np.percentile(ci.scores[:, 0], 97.5) < 10.0  # the plain percentile interval excludes the estimate ...
    assert ci.upper[0] == 10.0 and ci.lower[0] == np.percentile(ci.scores[:, 0], 2.5)  # ... extended to it
    assert ci.widened.tolist() == [True, False, False, False, False, False]
    assert ci.lower[1:].tolist() == ci.upper[1:].tolist() == [0.0] * 5


def test_resamples_that_reproduce_the_data_land_exactly_on_the_estimate():
    # a strict order a > b > c > d on every sample: every resample has the same binarized W, so every refit lands
    # within the fit tolerance of the estimate and counts as equal to it: the interval is the estimate itself
    records = [
        PairwiseRecord(x, y, Verdict.FIRST, sample=f"s{s}")
        for s in range(12)
        for x, y in itertools.combinations("abcd", 2)
    ]
    ci = bootstrap_ci(records, fit_binarized_bradley_terry, n_boot=50, seed=1)
    assert np.array_equal(ci.lower, ci.estimate.scores) and np.array_equal(ci.upper, ci.estimate.scores)
    assert not ci.widened.any() and not ci.at_edge.any()


def test_binarized_estimate_at_the_edge_is_flagged():
    # a beats b on 7 of 10 samples: W gives a the pair in most resamples, never more than in the data
    records = [PairwiseRecord("a", "b", Verdict.FIRST if s < 7 else Verdict.SECOND, sample=f"s{s}") for s in range(10)]
    ci = bootstrap_ci(records, fit_binarized_bradley_terry, n_boot=300, seed=0)
    a = ci.items.index("a")
    assert ci.upper[a] == ci.estimate.scores[a] and ci.lower[a] < ci.upper[a]
    assert ci.at_edge.tolist() == [True, True] and not ci.widened.any()


def test_bootstrap_progress_bar_goes_to_stderr_only_when_asked(capsys):
    records = three_models("A", "X", "Y")
    bootstrap_ci(records, fit_binarized_bradley_terry, n_boot=5, progress=True, desc="resampling W")
    assert "resampling W" in capsys.readouterr().err
    bootstrap_ci(records, fit_binarized_bradley_terry, n_boot=5, progress=None)  # stderr is not a terminal here
    bootstrap_ci(records, fit_binarized_bradley_terry, n_boot=5, progress=False)
    assert capsys.readouterr().err == ""
    assert tqdm(range(1), disable=None).disable  # what progress=None relies on under pytest's capture


# --------------------------------------------------------------------------------------------- one encoding


def test_records_hold_verdicts_converted_in_one_place():
    assert OUTCOMES == (Verdict.FIRST, Verdict.SECOND, Verdict.TIE)
    for spelling, verdict in (
        ("a", Verdict.FIRST),
        ("1", Verdict.FIRST),
        (" B ", Verdict.SECOND),
        ("2", Verdict.SECOND),
    ):
        assert as_outcome(spelling) is verdict
        assert PairwiseRecord("x", "y", spelling).outcome is verdict
    assert PairwiseRecord("x", "y", "TIE").outcome is Verdict.TIE
    record = PairwiseRecord("x", "y", Verdict.FIRST, "judge", "s1")
    assert record.swapped() == PairwiseRecord("y", "x", Verdict.SECOND, "judge", "s1")
    for bad in (Verdict.INVALID, "invalid", "yes", 1, None):
        with pytest.raises(ValueError, match="outcome"):
            PairwiseRecord("x", "y", bad)
    counts = PairwiseCounts.from_records([record, PairwiseRecord("x", "y", "b"), PairwiseRecord("y", "x", "tie")])
    assert counts.wins.tolist() == [[0.0, 1.0], [1.0, 0.0]] and counts.ties.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert math.isclose(counts.n_comparisons, 3.0)
