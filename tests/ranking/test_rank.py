"""Ranking description-writing models with a judge (emoreward.ranking.rank): tables, cached scoring, verdicts,
the generative-judge path and the report."""

import hashlib
import itertools
import json
import math

import numpy as np
import pytest
from _helpers import StubRewardModel
from scipy.stats import spearmanr

from emoreward.data.tables import DescriptionTable, TableError, bundled_ovmerd_path, load_description_table
from emoreward.data.verdicts import Judgement, Verdict, verdict_from_difference
from emoreward.models.loading import content_identity
from emoreward.ranking.annotators import annotator_for
from emoreward.ranking.api import rank
from emoreward.ranking.judging import judge_records
from emoreward.ranking.methods import Hierarchical
from emoreward.ranking.rank import parse_groups, rank_with_judge, rank_with_reward_model
from emoreward.ranking.score_cache import ScoreCache
from emoreward.ranking.scoring import records_from_scores, score_table, table_pairs


class LengthModel(StubRewardModel):
    """A stand-in reward model: reward = words / 10 (+ 1 with a subtitle); counts what it scores."""

    def reward(self, description, subtitle):
        return len(description.split()) / 10 + (1.0 if subtitle else 0.0)


class LongerJudge:
    """A generative stand-in: prefers the description with more words (tie if equal); counts calls."""

    name = "longer"

    def __init__(self, bias_first=False):
        self.n_calls = 0
        self.bias_first = bias_first

    def judge(self, pairs, *, run=0):
        self.n_calls += len(pairs)
        out = []
        for p in pairs:
            a, b = len(p.description_1.split()), len(p.description_2.split())
            v = (
                Verdict.FIRST
                if self.bias_first
                else (Verdict.FIRST if a > b else Verdict.SECOND if b > a else Verdict.TIE)
            )
            out.append(Judgement(p.sample_id, v, run=run))
        return out


def synthetic_table(strengths, n_samples, seed=0):
    """Model m writes ~strength*10 words (noisy) per sample, so longer = better under LengthModel."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_samples):
        for m, strength in enumerate(strengths):
            n_words = max(1, int(round(10 * strength + rng.normal(0, 6))))
            rows.append({"sample": f"s{s:03d}", "model": f"m{m}", "description": " ".join(["word"] * n_words)})
    return DescriptionTable.from_rows(rows)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ tables


def test_vendored_ovmerd_is_the_release():
    path = bundled_ovmerd_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "c69642e8a9289c0a2e5356b04d377916434bd03ee14b98e07ab818095bb13b61"
    )
    table = load_description_table(path)
    assert (table.n_models, table.n_samples, len(table.descriptions)) == (10, 332, 3320)
    lengths = table.lengths()
    assert lengths["Otter"]["n_empty"] == 1 and sum(v["n_empty"] for v in lengths.values()) == 1
    assert "ovmerd_descriptions_subtitle.jsonl" in (path.parent.parent / "NOTICE").read_text()


def test_table_errors_name_the_line(tmp_path):
    good = {"sample": "s1", "model": "a", "description": "x"}
    with pytest.raises(
        TableError,
        match="line 2, field 'model': a second description of sample 's1' by 'a' \\(the first is on line 1\\)",
    ):
        load_description_table(write_jsonl(tmp_path / "dup.jsonl", [good, good]))
    with pytest.raises(TableError, match="line 1, field 'description'"):
        load_description_table(write_jsonl(tmp_path / "miss.jsonl", [{"sample": "s1", "model": "a"}]))
    (tmp_path / "bad.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(TableError, match="line 2: invalid JSON"):
        load_description_table(tmp_path / "bad.jsonl")
    rows = [good, {**good, "model": "b", "subtitle": "other"}]
    with pytest.raises(
        TableError, match="line 2, field 'subtitle': sample 's1' has subtitle 'other' here but None on line 1"
    ):
        load_description_table(write_jsonl(tmp_path / "media.jsonl", rows))
    with pytest.raises(FileNotFoundError):
        load_description_table(tmp_path / "nope.jsonl")


def test_subsets_and_lengths():
    rows = [
        {"sample": s, "model": m, "description": "one two three" if m == "a" else "one", "subtitle": f"sub {s}"}
        for s in ("s1", "s2", "s3")
        for m in ("a", "b")
    ]
    table = DescriptionTable.from_rows(rows)
    assert table.subtitle("s2") == "sub s2"
    assert table.lengths()["a"] == {"chars": 13.0, "words": 3.0, "n": 3, "n_empty": 0}
    sub = table.subset(["s3", "s1"], ["b"])
    # in the table's own order (by content), whatever order the selection names them in
    assert sorted(sub.samples) == ["s1", "s3"] and sub.models == ["b"] and len(sub.descriptions) == 2
    assert sub.samples == table.subset(["s1", "s3"], ["b"]).samples
    picked = table.sample_subset(2, seed=1)
    assert picked.n_samples == 2 and picked.samples == [s for s in table.samples if s in picked.samples]
    assert table.sample_subset(2, seed=1).samples == picked.samples
    with pytest.raises(TableError, match="unknown models"):
        table.subset(models=["zz"])
    with pytest.raises(TableError):
        table.sample_subset(4)


def test_parse_groups():
    models = ["a", "b", "c", "d", "e"]
    assert parse_groups("2", models) == [["a", "b", "c"], ["d", "e"]]
    assert parse_groups("a,b|c,d,e", models) == [["a", "b"], ["c", "d", "e"]]
    with pytest.raises(ValueError, match="unknown"):
        parse_groups("a,b|c,x", models)
    with pytest.raises(ValueError, match="every ranked model"):
        parse_groups("a,b|c", models)
    with pytest.raises(ValueError):
        parse_groups("1", models)


# ------------------------------------------------------------------------------------- scoring and verdicts


def by_name(records) -> dict:
    """Verdicts keyed by the two models in name order (a record's own orientation is the table's order)."""
    flip = {Verdict.FIRST: Verdict.SECOND, Verdict.SECOND: Verdict.FIRST}
    return {
        (r.item_a, r.item_b) if r.item_a <= r.item_b else (r.item_b, r.item_a): (
            r.outcome if r.item_a <= r.item_b else flip.get(r.outcome, r.outcome)
        )
        for r in records
    }


def test_verdicts_from_scores_use_the_tie_threshold():
    table = DescriptionTable.from_rows(
        [
            {"sample": "s1", "model": "a", "description": "w " * 10},  # 1.0
            {"sample": "s1", "model": "b", "description": "w " * 9},  # 0.9
            {"sample": "s1", "model": "c", "description": "w " * 20},  # 2.0
            {"sample": "s2", "model": "a", "description": "w"},  # 0.1; b and c missing on s2
        ]
    )
    scores = score_table(LengthModel(), table)
    at = {m: i for i, m in enumerate(scores.models)}  # the table's order is its content's (canonical_order)
    s1, s2 = scores.samples.index("s1"), scores.samples.index("s2")
    assert scores.scores.shape == (3, 2) and np.isnan(scores.scores[at["b"], s2])
    np.testing.assert_allclose([scores.scores[at[m], s1] for m in "abc"], [1.0, 0.9, 2.0])
    got = by_name(records_from_scores(scores, tie_threshold=0.15))
    assert got == {("a", "b"): Verdict.TIE, ("a", "c"): Verdict.SECOND, ("b", "c"): Verdict.SECOND}
    got = by_name(records_from_scores(scores, tie_threshold=0.0))
    assert got[("a", "b")] is Verdict.FIRST
    # the one tie rule: the verdict of verdict_from_difference on r_a - r_b, at the threshold's edge too
    for threshold in (0.0, 0.1 - 1e-12, 0.1, 0.1 + 1e-12, 1.0, 1.1):
        got = by_name(records_from_scores(scores, tie_threshold=threshold))
        expected = {
            (x, y): verdict_from_difference(float(scores.scores[at[x], s1] - scores.scores[at[y], s1]), threshold)
            for x, y in itertools.combinations("abc", 2)
        }
        assert got == expected
    assert all(r.sample == "s1" for r in records_from_scores(scores))
    with pytest.raises(ValueError):
        records_from_scores(scores, tie_threshold=-1)


def test_scores_are_cached_on_disk(tmp_path):
    table = synthetic_table([1, 2, 3], n_samples=20)
    model = LengthModel()
    path = tmp_path / "cache" / "scores.jsonl"
    first = score_table(model, table, ScoreCache(path))
    distinct = len(set(table.descriptions.values()))
    assert first.n_scored == model.n_scored == distinct and first.n_cached == 0
    again = score_table(model, table, ScoreCache(path))
    assert model.n_scored == distinct and again.n_scored == 0 and again.n_cached == distinct
    np.testing.assert_array_equal(first.scores, again.scores)
    with path.open("a") as fh:  # a run killed mid-write leaves a partial line: ignored
        fh.write('{"key": "abc", "sco')
    assert len(ScoreCache(path)) == distinct
    # the cache key includes the subtitle: the same text with a subtitle is scored anew
    rows = [{"sample": "s000", "model": "m0", "description": table.descriptions["s000", "m0"], "subtitle": "hi"}]
    with_sub = score_table(model, DescriptionTable.from_rows(rows), ScoreCache(path))
    at = first.models.index("m0"), first.samples.index("s000")
    assert with_sub.n_scored == 1 and with_sub.scores[0, 0] == pytest.approx(first.scores[at] + 1.0)


def test_content_identity_changes_with_the_weights_anywhere(tmp_path):
    (tmp_path / "m").mkdir()
    weights = tmp_path / "m" / "w.bin"
    weights.write_bytes(b"\0" * (5 << 20))  # over 2 MiB: an edit in its middle, same size and name, is a change
    before = content_identity(tmp_path / "m")
    assert content_identity(tmp_path / "m") == before
    for at in (0, (5 << 20) // 2, (5 << 20) - 1):
        with weights.open("r+b") as fh:
            fh.seek(at)
            fh.write(b"\1")
        changed = content_identity(tmp_path / "m")
        assert changed != before
        before = changed


# -------------------------------------------------------------------------------------------------- ranking


def test_reward_model_ranking_recovers_known_order_and_reports_costs():
    strengths = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    table = synthetic_table(strengths, n_samples=60)
    model = LengthModel(tie_threshold=0.05)
    report = rank_with_reward_model(model, table, ScoreCache(None), n_boot=50, seed=0)
    for fit in (report.ties, report.binarized):
        est = fit.estimate
        rho = spearmanr([est.score(f"m{k}") for k in range(6)], strengths).statistic
        assert rho >= 0.95
        assert np.all(est.ci_lower <= est.scores + 1e-9) and np.all(est.scores <= est.ci_upper + 1e-9)
    assert report.ties.estimate.ranking[0] == "m5"
    assert report.cost["n_scorings"] == 360 and report.cost["n_pair_verdicts"] == 15 * 60
    assert report.cost["generative_pair_calls"] == 15 * 60
    assert report.counts.n_comparisons == 15 * 60
    assert report.meta["tie_threshold"] == 0.05
    assert report.lengths["m5"]["words"] > report.lengths["m0"]["words"]
    assert report.mean_reward["m5"] > report.mean_reward["m0"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ranking"] == report.ties.estimate.ranking and len(data["W"]["wins"]) == 6
    text = report.to_markdown()
    assert "95% CI" in text and "360 reward-model scorings" in text and all(f"| m{k} |" in text for k in range(6))


def test_undefeated_model_keeps_a_finite_score():
    table = synthetic_table([1.0, 1.5, 2.0, 30.0], n_samples=30)
    report = rank_with_reward_model(LengthModel(), table, n_boot=20)
    assert report.counts.wins[report.counts.items.index("m3")].sum() == 3 * 30  # m3 wins every comparison
    for fit in (report.ties, report.binarized):
        assert np.all(np.isfinite(fit.estimate.scores)) and fit.estimate.ranking[0] == "m3"


def test_generative_judge_runs_every_pair_in_both_orders():
    table = synthetic_table([1.0, 2.0, 3.0, 4.0], n_samples=25, seed=3)
    judge = LongerJudge()
    report = rank_with_judge(judge, table, n_boot=20)
    assert judge.n_calls == 2 * 6 * 25 == report.cost["n_judge_calls"]
    assert report.counts.n_comparisons == 2 * 6 * 25  # 'each': both orders count
    assert report.ties.estimate.ranking == ["m3", "m2", "m1", "m0"]
    # the same verdicts as the reward-model path with the equivalent pointwise score
    rm = rank_with_reward_model(LengthModel(), table, n_boot=20)
    np.testing.assert_array_equal(report.counts.wins, 2 * rm.counts.wins)


def test_position_biased_judge_gives_ties_under_consensus():
    table = synthetic_table([1.0, 2.0, 3.0], n_samples=10)
    got = judge_records(LongerJudge(bias_first=True), table, combine="consensus")
    assert got.n_calls == 2 * 3 * 10 and {r.outcome for r in got.records} == {"tie"}
    each = judge_records(LongerJudge(bias_first=True), table, combine="each")
    assert {r.outcome for r in each.records} == {Verdict.FIRST, Verdict.SECOND}
    with pytest.raises(ValueError):
        judge_records(LongerJudge(), table, combine="consensus", swap=False)


def test_hierarchical_generative_judge_asks_only_needed_pairs():
    strengths = [1.0, 5.0, 2.0, 3.0, 6.0, 4.0]
    table = synthetic_table(strengths, n_samples=15)
    groups = parse_groups("m0,m1,m2|m3,m4,m5", table.models)
    judge = LongerJudge()
    report = rank(table, annotator_for("judge", judge, {}), Hierarchical(groups), {"n_boot": 10})
    assert report.hierarchical.group_winners == ["m1", "m4"] and report.hierarchical.winner == "m4"
    # C(3,2) pairs in each group and 1 final pair, both orders, 15 samples (vs C(6,2) = 15 pairs in full)
    assert judge.n_calls == 2 * (3 + 3 + 1) * 15 == report.cost["n_judge_calls"]
    assert report.models == ["m1", "m4"]


def test_table_pairs_skip_missing_descriptions():
    table = DescriptionTable.from_rows(
        [{"sample": "s1", "model": m, "description": m} for m in "abc"]
        + [{"sample": "s2", "model": "a", "description": "a"}]
    )
    pairs = table_pairs(table)
    assert sorted(tuple(sorted((p.model_1, p.model_2))) for p in pairs) == list(itertools.combinations("abc", 2))
    assert all(p.sample_id == "s1" and p.label is None for p in pairs)


def test_ovmerd_rank_with_a_stand_in_model_is_consistent():
    table = load_description_table(bundled_ovmerd_path()).sample_subset(40, seed=0)
    report = rank_with_reward_model(LengthModel(), table, n_boot=30)
    assert report.cost["n_pair_verdicts"] == math.comb(10, 2) * 40
    # a length reward ranks by words: the binarized fit agrees with mean length order at the top and bottom
    by_words = sorted(table.models, key=lambda m: report.lengths[m]["words"])
    assert report.binarized.estimate.ranking[0] == by_words[-1]
    est = report.ties.estimate
    rho = spearmanr([est.score(m) for m in table.models], [report.lengths[m]["words"] for m in table.models])
    assert rho.statistic > 0.8
