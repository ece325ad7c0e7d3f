import pytest

from emoreward.data import PreferencePair
from emoreward.data.verdicts import Judgement, Verdict
from emoreward.evaluation.harness import JudgementSet
from zero_shot.crowd import CrowdMember, combine_normal_swapped, crowdsource, majority_vote, per_run_summary


def test_majority_vote_tie_breaks_are_explicit():
    assert majority_vote(["1", "1", "2", "invalid"]) == "1"
    assert majority_vote(["1", "2", "2", "1"], tie_break="tie") == "tie"
    assert majority_vote(["2", "1", "1", "2"], tie_break="first-voter") == "2"
    assert majority_vote(["invalid", "invalid"]) == "invalid"
    with pytest.raises(ValueError, match="tie_break"):
        majority_vote(["1"], tie_break="coin")


def _set(normal_runs, swapped_runs):
    pairs = [PreferencePair(f"s{i}", "a" * (i + 1), "b", "1") for i in range(len(normal_runs[0]))]
    js = JudgementSet("j", pairs)
    js.normal = [
        [Judgement(p.sample_id, Verdict(v), run=r) for p, v in zip(pairs, run)] for r, run in enumerate(normal_runs)
    ]
    js.swapped = [
        [Judgement(p.sample_id, Verdict(v), "swapped", run=r) for p, v in zip(pairs, run)]
        for r, run in enumerate(swapped_runs)
    ]
    return js


def test_normal_swapped_combination_majority_of_four():
    js = _set(
        [["1", "2", "1", "invalid"], ["1", "2", "2", "invalid"]], [["1", "1", "2", "invalid"], ["2", "1", "2", "2"]]
    )
    # pair 0: 1,1,1,2 -> 1; pair 1: 2,1,2,1 -> split -> tie; pair 2: 1,2,2,2 -> 2; pair 3: only one valid vote
    assert combine_normal_swapped(js, tie_break="tie") == ["1", "tie", "2", "2"]
    # first-voter order: normal run 0, swapped run 0, ...
    assert combine_normal_swapped(js, tie_break="first-voter")[1] == "2"
    with pytest.raises(ValueError, match="2 normal and 2 swapped"):
        combine_normal_swapped(_set([["1"]], [["1"]]))


def test_per_run_summary_mean_std_and_multi_run_consistency():
    js = _set([["1", "1", "2", "1"], ["1", "1", "1", "1"]], [["1", "2", "2", "1"], ["1", "1", "1", "1"]])
    s = per_run_summary(js)
    assert s["2c_acc"]["mean"] == pytest.approx(87.5) and s["2c_acc"]["std"] == pytest.approx(12.5)
    assert s["swap"]["mean"] == pytest.approx((75.0 + 100.0) / 2)
    assert s["multi_run_consistency"] == pytest.approx(75.0)


def test_crowdsourcing_filters_ranks_and_votes_top_k():
    y = ["1", "2", "1", "2", "tie"]
    a = CrowdMember("A", ("1", "2", "1", "1", "tie"), ("1", "2", "1", "1", "tie"), waf=80.0, swap_consistency=100.0)
    b = CrowdMember("B", ("1", "1", "2", "2", "1"), ("1", "1", "2", "2", "2"), waf=70.0, swap_consistency=80.0)
    c = CrowdMember("C", ("2", "2", "1", "2", "tie"), ("2", "2", "1", "2", "tie"), waf=65.0, swap_consistency=100.0)
    low_waf = CrowdMember("D", y, y, waf=59.9, swap_consistency=100.0)
    low_swap = CrowdMember("E", y, y, waf=90.0, swap_consistency=50.0)
    out = crowdsource([c, low_waf, a, low_swap, b], y)
    assert out["kept"] == ["A", "B", "C"]
    assert set(out["dropped"]) == {"D", "E"}
    rows = {r["k"]: r for r in out["rows"]}
    assert rows[1]["two_class"]["acc"] == pytest.approx(75.0)  # A alone: 1,2,1,1 vs 1,2,1,2
    # k=3 votes: pair0 1,1,2->1; pair1 2,1,2->2; pair2 1,2,1->1; pair3 1,2,2->2 -> all four right
    assert rows[3]["two_class"]["acc"] == pytest.approx(100.0)
    # k=2 (A, B) splits on pairs 1-3; first-voter = A's verdict
    assert rows[2]["two_class"]["acc"] == pytest.approx(75.0)
    assert rows[3]["swap_consistency"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="k must be"):
        crowdsource([a, b, c], y, ks=[4])
