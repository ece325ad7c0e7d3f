"""Statistics at the edges of a ranking: separation, a tie parameter with no ties, too few samples and rewards with
no variance are detected, warned about and written as null where a number would mislead (through
`rank_with_judge` / `rank_with_reward_model` and their JSON reports)."""

import json

import numpy as np
import pytest
from _helpers import StubRewardModel

from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import Judgement, Verdict
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.edges import min_resamples, reward_edges, separated_groups
from emoreward.ranking.rank import rank_with_judge, rank_with_reward_model
from emoreward.ranking.tie_models import get_model


def table(n_samples, models=("champ", "mid1", "mid2", "dud")):
    rows = [
        {"sample": f"s{s}", "model": m, "description": f"{m} says {s} " + "word " * (3 * k + s % 2)}
        for s in range(n_samples)
        for k, m in enumerate(models)
    ]
    return DescriptionTable.from_rows(rows)


class OrderJudge:
    """A stand-in generative judge: champ beats everyone, everyone beats dud; mid1 / mid2 alternate by sample."""

    name = "order"

    def judge(self, pairs, *, run=0):
        rank = {"champ": 0, "mid1": 1, "mid2": 1, "dud": 2}
        out = []
        for p in pairs:
            a, b = p.description_1.split()[0], p.description_2.split()[0]
            if rank[a] != rank[b]:
                verdict = Verdict.FIRST if rank[a] < rank[b] else Verdict.SECOND
            else:  # the two middle models split the samples
                first = (int(p.sample_id[1:]) % 2 == 0) == (a == "mid1")
                verdict = Verdict.FIRST if first else Verdict.SECOND
            out.append(Judgement(p.sample_id, verdict, run=run))
        return out


def test_separation_and_no_ties_are_warned_and_null_in_the_report():
    report = rank_with_judge(OrderJudge(), table(12), n_boot=30)
    data = json.loads(json.dumps(report.to_dict()))  # JSON-safe
    warnings = report.warnings
    for key, name in (("bradley_terry_ties", "BT-ties (davidson)"), ("bradley_terry_binarized", "BT binarized W")):
        fit = data[key]
        assert fit["separated"] == {"champ": "never lost", "dud": "never won"}
        champ, dud, mid = (fit["items"].index(m) for m in ("champ", "dud", "mid1"))
        assert fit["ci_upper"][champ] is None and fit["ci_lower"][champ] is not None
        assert fit["ci_lower"][dud] is None and fit["ci_upper"][dud] is not None
        assert None not in (fit["ci_lower"][mid], fit["ci_upper"][mid])
        assert any(w.startswith(f"{name}: separation (never lost: champ; never won: dud") for w in warnings)
    # no ties at all: the tie parameter sits at its bound and is no estimate
    ties = data["bradley_terry_ties"]
    assert ties["tie_parameter"] is None and ties["tie_parameter_at_bound"] == "no ties"
    assert ties["tie_probability_between_equals"] is None
    assert any(w.startswith("BT-ties (davidson): no ties in the data") for w in warnings)
    text = report.to_markdown()
    assert "+inf]" in text and "[-inf," in text
    rows = {r["model"]: r for r in report.dataset_rows()}
    assert rows["champ"]["bt-ties_davidson_upper"] is None and rows["dud"]["bt-ties_davidson_lower"] is None


def test_one_sample_gives_no_intervals():
    report = rank_with_judge(OrderJudge(), table(1), n_boot=10)
    data = report.to_dict()
    assert all(v is None for v in data["bradley_terry_ties"]["ci_lower"] + data["bradley_terry_ties"]["ci_upper"])
    assert any("1 resampling unit(s): the bootstrap cannot vary the data" in w for w in report.warnings)


class LengthModel(StubRewardModel):
    def reward(self, description, subtitle):
        return 0.1 * len(description.split())


def test_one_sample_gives_no_reward_effect_interval_either():
    # every resample of one sample is the data itself: the reward effects' interval is null as the fits' are (it
    # used to be the point [e, e]); with two samples it is an interval again
    report = rank_with_reward_model(LengthModel(), table(1), n_boot=10, tie_threshold=1e-3)
    effects = report.to_dict()["reward_effects"]
    assert effects["ci_lower"] == [None] * 4 and effects["ci_upper"] == [None] * 4
    assert effects["scores"][effects["items"].index("dud")] == pytest.approx(0.45)  # 0.1 x (12 words - 7.5 on average)
    assert "+0.450 [-inf, +inf]" in report.to_markdown()
    two = rank_with_reward_model(LengthModel(), table(2), n_boot=10, tie_threshold=1e-3).to_dict()["reward_effects"]
    assert None not in two["ci_lower"] + two["ci_upper"]


class ConstantModel(StubRewardModel):
    def reward(self, description, subtitle):
        return 0.5


def test_rewards_with_no_variance_are_warned_about():
    report = rank_with_reward_model(ConstantModel(), table(6), n_boot=10)
    assert any(w.startswith("reward effects: every description got the same reward") for w in report.warnings)
    assert report.to_dict()["reward_effects"]["scores"] == [0.0, 0.0, 0.0, 0.0]
    rewards = np.array([[1.0, 2.0, np.nan], [np.nan, np.nan, np.nan], [np.nan, 3.0, np.nan]])
    assert reward_edges(rewards, ["a", "b", "c"]) == [
        "reward effects: no rewards for b: their effect and mean reward are null.",
        "reward effects: c scored on one sample only: its effect rests on that sample.",
    ]


def test_separated_groups_follow_the_beat_graph():
    items = ["a", "b", "c", "d"]
    wins = np.zeros((4, 4))
    wins[0, 1] = wins[1, 2] = 3.0  # a > b > c, no reversal
    ties = np.zeros((4, 4))
    counts = PairwiseCounts(items, wins, ties)
    assert separated_groups(counts, get_model("bradley-terry")) == {"a": "never lost", "c": "never won"}
    ties[1, 2] = ties[2, 1] = 1.0  # a tie binds b and c in a tie model; d is never compared: not "separated"
    counts = PairwiseCounts(items, wins, ties)
    assert separated_groups(counts, get_model("davidson")) == {"a": "never lost", "b": "never won", "c": "never won"}
    wins[2, 0] = 1.0  # c beat a once: a cycle, every score bounded
    assert separated_groups(PairwiseCounts(items, wins, ties), get_model("bradley-terry")) == {}


def test_too_few_resamples_for_the_interval_are_warned_about():
    # a 95% percentile interval needs ceil(2 / 0.05) = 40 resamples to have its ends inside them
    assert min_resamples(0.05) == 40 and min_resamples(0.1) == 20 and min_resamples(0.01) == 200
    few = rank_with_judge(OrderJudge(), table(12), n_boot=39).warnings
    assert any(w.startswith("39 bootstrap resample(s) cannot give a 95% interval") for w in few)
    enough = rank_with_judge(OrderJudge(), table(12), n_boot=40).warnings
    assert not any("bootstrap resample(s) cannot give" in w for w in enough)


def test_emoprefer_tie_level_is_no_opponent_when_nobody_tied():
    """With no tie verdict EmoPrefer's likelihood is Bradley-Terry's in the scores (its tie parameter alone is at its
    bound, `FitEdges.tie` "no ties"): models that lost are never "never lost" because nobody lost to the tie level."""
    items = ["a", "b", "c", "d"]
    wins = np.array([[0, 3, 2, 4], [1, 0, 3, 2], [2, 1, 0, 3], [0, 2, 1, 0]], dtype=float)
    counts = PairwiseCounts(items, wins, np.zeros((4, 4)))
    assert separated_groups(counts, get_model("emoprefer")) == separated_groups(counts, get_model("davidson")) == {}
    # a real separation is found as under Davidson: d lost every comparison
    wins[3] = 0
    counts = PairwiseCounts(items, wins, np.zeros((4, 4)))
    expected = {"a": "never lost", "b": "never lost", "c": "never lost", "d": "never won"}
    assert (
        separated_groups(counts, get_model("emoprefer")) == separated_groups(counts, get_model("davidson")) == expected
    )
