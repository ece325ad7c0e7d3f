"""Judge bias figures: JudgeLM's position-bias rates, the two swap inconsistencies, INVALID as its own class, and
the longer-description rate beside the humans' on the same pairs, by hand and through the harness and report."""

from __future__ import annotations

import pytest

from emoreward.data import PreferencePair
from emoreward.data.verdicts import Judgement, Verdict
from emoreward.evaluation import harness, metrics, report


def test_position_bias_by_hand():
    normal = ["1", "2", "1", "tie", "invalid", "1"]
    swapped = ["1", "1", "2", "tie", "1", "2"]  # mapped back to the original order
    # pairs: consistent, second wins both, first wins both, consistent tie, invalid, first wins both
    got = metrics.position_bias(normal, swapped)
    assert got["consistency"] == pytest.approx(100 * 2 / 6)
    assert got["first_wins_both"] == pytest.approx(100 * 2 / 6)
    assert got["second_wins_both"] == pytest.approx(100 * 1 / 6)
    assert got["delta_bias"] == pytest.approx(100 * 1 / 6)
    assert got["invalid_either"] == pytest.approx(100 * 1 / 6)
    assert got["tie_inconsistent"] == pytest.approx(0.0)
    # by position shown: normal 1,2,1,tie,invalid,1; swapped (shown d2 first) 2,2,1,tie,2,1 -> "1" 5, "2" 4 of 12
    assert got["prefer_first_rate"] == pytest.approx(100 * 5 / 12)
    assert got["prefer_second_rate"] == pytest.approx(100 * 4 / 12)
    assert got["tie_rate"] == pytest.approx(100 * 2 / 12)
    assert got["invalid_rate"] == pytest.approx(100 * 1 / 12)
    assert got["consistency"] == pytest.approx(metrics.swap_consistency(normal, swapped))
    single = metrics.position_bias(["1", "1", "2", "invalid"])
    assert single == {"prefer_first_rate": 50.0, "prefer_second_rate": 25.0, "tie_rate": 0.0, "invalid_rate": 25.0,
                      "n_pairs": 4, "n_verdicts": 4}  # fmt: skip
    with pytest.raises(ValueError, match="unknown verdicts"):
        metrics.position_bias(["1", "first"])


def _pairs():
    return [
        PreferencePair("s1", "a long description", "short", label="1"),  # d1 longer, humans: longer
        PreferencePair("s2", "another long one", "brief", label="2"),  # d1 longer, humans: shorter
        PreferencePair("s3", "tiny", "a much longer text", label="2"),  # d2 longer, humans: longer
        PreferencePair("s4", "same", "size", label="1"),  # equal lengths: in no rate
        PreferencePair("s5", "abc", "abcdef", label="tie"),  # d2 longer, humans: tie
    ]


def test_longer_description_rate_beside_the_human_rate_on_the_same_pairs():
    lc = metrics.length_control(_pairs(), ["1", "1", "1", "1", "2"])
    # judge decisive on unequal pairs s1, s2, s3, s5: picks the longer on s1, s2, s5 -> 3 of 4
    assert lc["prefers_longer_rate"] == pytest.approx(75.0) and lc["n_longer_decided"] == 4
    # humans decisive on s1, s2, s3 of those: the longer on s1, s3 -> 2 of 3
    assert lc["human_prefers_longer_rate"] == pytest.approx(100 * 2 / 3) and lc["n_longer_human"] == 3


class FirstShownJudge:
    """Always prefers the description shown first, and answers nothing on sample s4."""

    name = "first-shown"

    def judge(self, pairs, *, run=0):
        return [Judgement(p.sample_id, Verdict.INVALID if p.sample_id == "s4" else Verdict.FIRST) for p in pairs]


def test_the_evaluation_report_shows_every_bias_figure():
    evaluation = harness.evaluate_judgements(harness.run_judge(FirstShownJudge(), _pairs(), runs=2))
    bias = evaluation["judge"]["position_bias"]
    assert bias["first_wins_both"] == pytest.approx(80.0) and bias["second_wins_both"] == 0.0
    assert bias["delta_bias"] == pytest.approx(80.0) and bias["invalid_either"] == pytest.approx(20.0)
    assert bias["prefer_first_rate"] == pytest.approx(80.0) and bias["invalid_rate"] == pytest.approx(20.0)
    assert bias["consistency"] == 0.0
    head = report.headline(evaluation)["judge"]
    # judge (normal order) picks d1: longer on s1, s2; shorter on s3, s5 -> 50; humans on s1, s2, s3 -> 2 of 3
    assert head["prefers_longer_rate"] == pytest.approx(50.0)
    assert head["human_prefers_longer_rate"] == pytest.approx(100 * 2 / 3)
    table = report.markdown_table(head and report.headline(evaluation))
    for label in ("first shown wins both", "second shown wins both", "delta bias", "invalid answers",
                  "prefers the description shown first", "humans prefer the longer description"):  # fmt: skip
        assert label in table
    assert "| swap-inconsistent: first shown wins both | 80.00 | - | - |" in table
    # every row has the header's cells: no label may break the Markdown table (a `|` in it is escaped)
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert len({line.replace("\\|", "").count("|") for line in rows}) == 1, rows
