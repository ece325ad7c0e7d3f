"""`emoreward rank` reports what a reader must know: warnings about degenerate fits, the fit on raw reward
differences, empty and truncated descriptions, and bad description tables (through the real entry point)."""

import json

import numpy as np
import pytest

from emoreward.cli import main
from emoreward.data.tables import DescriptionTable, TableError, load_description_table, read_utf8
from emoreward.models import TextRewardModel
from emoreward.ranking.effects import fit_reward_effects
from emoreward.ranking.rank import rank_with_judge, rank_with_reward_model
from emoreward.ranking.score_cache import ScoreCache
from emoreward.ranking.scoring import ScoreMatrix, score_table, truncation_counts


WORDS = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet"]


def table_rows(n_samples=12, models=("alpha", "beta", "gamma", "delta")):
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(models):
            text = " ".join(WORDS[(s + m + k) % len(WORDS)] for k in range(3 + 2 * m))
            rows.append({"sample": f"s{s}", "model": name, "description": text})
    return rows


def write_rows(path, rows, prefix=b""):
    path.write_bytes(prefix + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
    return path


def run(argv, capsys):
    code = main(["rank", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------------------------------------- warnings


def test_all_ties_print_and_store_the_degenerate_fit_warnings(tmp_path, tiny_rm_dir, capsys):
    data = write_rows(tmp_path / "table.jsonl", table_rows())
    out = tmp_path / "rank.json"
    argv = ["--judge", str(tiny_rm_dir), "--data", str(data), "--n-boot", "20", "--no-cache", "--output", str(out)]
    code, printed, err = run([*argv, "--tie-threshold", "1e6"], capsys)
    assert code == 0 and "bootstrap" not in err  # no progress bar: stderr is not a terminal
    report = json.loads(out.read_text())
    warnings = report["warnings"]
    assert warnings[0].startswith("100.0% of the 72 verdicts are ties below the tie threshold |r1 - r2| < 1e+06")
    assert report["tie_share"] == 1.0
    # every tie model: a tie parameter at its bound (null, not an estimate), and four identical scores at rank 1
    for fit, key in (
        ("BT-ties (davidson)", "bradley_terry_ties"),
        ("BT-ties (emoprefer, paper)", "bradley_terry_ties_paper"),
    ):
        assert any(
            w.startswith(f"{fit}: every verdict is a tie: the tie parameter sits at its upper bound") for w in warnings
        )
        assert not any(w.startswith(f"{fit}: fitted tie parameter") for w in warnings)
        assert report[key]["tie_parameter"] is None and report[key]["tie_parameter_at_bound"] == "only ties"
        assert report[key]["tie_probability_between_equals"] is None
        assert f"{fit}: 4 models have identical scores (alpha, beta, delta, gamma; +0.000)" in printed
    assert report["ranks"] == [1, 1, 1, 1] and report["ranking"] == ["alpha", "beta", "delta", "gamma"]
    # the Markdown names the bound, as the JSON's null does, not the number the optimiser stopped at
    assert (
        "davidson tie parameter at its bound (only ties); emoprefer tie parameter at its bound (only ties)" in printed
    )
    assert "| 1= | alpha |" in printed and f"Warnings ({len(warnings)}):" in printed
    assert all(f"- {w}" in printed for w in warnings)
    assert out.with_suffix(".md").read_text().count("- ") >= len(warnings)
    # no interval excludes its own estimate, in any fit
    for key in ("bradley_terry_ties", "bradley_terry_ties_paper", "bradley_terry_binarized", "reward_effects"):
        fit = report[key]
        # an open end is null (EmoPrefer's paper column: ties only put the tie level above every model, so only
        # the prior bounds each score from below: PairModel.orders)
        ends = zip(fit["scores"], fit["ci_lower"], fit["ci_upper"])
        assert all((lo is None or lo <= s) and (hi is None or s <= hi) for s, lo, hi in ends)
    assert set(report["bradley_terry_ties_paper"]["ci_lower"]) == {None}
    # the length-controlled fit meets the same edge: no tie parameter, no coefficient, no p-value (never NaN)
    controlled = report["length_controlled"]
    assert controlled["tie_parameter"] is None
    assert all(set(c.values()) - {c["scale"]} == {None} for c in controlled["covariates"].values())
    assert any("every verdict is a tie" in w for w in report["warnings"]) and "nan" not in printed
    assert None not in report["bradley_terry_ties"]["ci_lower"]  # Davidson: a tie binds the difference

    # the model's own threshold: decisive verdicts, no tie warnings; the reward effects are the mean rewards'
    code, printed, _ = run(argv, capsys)
    report = json.loads(out.read_text())
    assert code == 0 and not any("verdicts are ties" in w for w in report["warnings"])
    means = np.array([report["mean_reward"][m] for m in report["models"]])  # complete table: effect = mean - mean
    np.testing.assert_allclose(report["reward_effects"]["scores"], means - means.mean(), atol=1e-9)
    assert "reward effect, no threshold [95% CI]" in printed


def test_generative_judges_get_the_same_warnings():
    table = DescriptionTable.from_rows(table_rows(n_samples=6))

    class AlwaysTie:
        name = "always-tie"

        def judge(self, pairs, *, run=0):
            from emoreward.data.verdicts import Judgement, Verdict

            return [Judgement(p.sample_id, Verdict.TIE, run=run) for p in pairs]

    report = rank_with_judge(AlwaysTie(), table, n_boot=10)
    assert report.warnings[0].startswith("100.0% of the 72 verdicts are ties: ")
    assert report.reward_effects is None and report.n_truncated is None


# --------------------------------------------------------------------------------------- reward effects


def test_reward_effects_hand_values():
    # additive rewards, model 2 missing on s2: effects (-2, 0, 2) exactly
    scores = ScoreMatrix(["m1", "m2", "m3"], ["s1", "s2"], np.array([[1.0, 2.0], [3.0, np.nan], [5.0, 6.0]]))
    effects = fit_reward_effects(scores, n_boot=50)
    np.testing.assert_allclose(effects.scores, [-2.0, 0.0, 2.0], atol=1e-12)
    assert effects.n_compared[0] == 50 and effects.n_compared[1] < 50  # m2 is compared on s1 only


def test_reward_effects_match_least_squares_with_sample_effects():
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(5, 9))
    rewards[[0, 2, 4, 4], [1, 3, 5, 8]] = np.nan
    effects = fit_reward_effects(ScoreMatrix([f"m{k}" for k in range(5)], [f"s{k}" for k in range(9)], rewards), 30)
    # reference: r[m, s] = a_m + b_s by ordinary least squares on a dummy design, a centred
    rows, targets = [], []
    for m, s in zip(*np.nonzero(np.isfinite(rewards))):
        x = np.zeros(5 + 9)
        x[m], x[5 + s] = 1.0, 1.0
        rows.append(x)
        targets.append(rewards[m, s])
    coef = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)[0][:5]
    np.testing.assert_allclose(effects.scores, coef - coef.mean(), atol=1e-10)
    assert np.all(effects.lower <= effects.scores) and np.all(effects.scores <= effects.upper)


# --------------------------------------------------------------------------------------------- bad tables


def test_byte_order_mark_is_accepted(tmp_path, tiny_rm_dir, capsys):
    rows = table_rows(n_samples=4)
    data = write_rows(tmp_path / "bom.jsonl", rows, prefix=b"\xef\xbb\xbf")
    table = load_description_table(data)
    assert "s0" in table.samples and len(table.descriptions) == 16
    code, printed, _ = run(["--judge", str(tiny_rm_dir), "--data", str(data), "--n-boot", "5", "--no-cache"], capsys)
    assert code == 0 and "4 models x 4 samples" in printed


def test_latin1_byte_names_file_and_line(tmp_path, tiny_rm_dir, capsys):
    data = write_rows(tmp_path / "latin.jsonl", table_rows(n_samples=2))
    lines = data.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"description": "', b'"description": "h\xe9las ')  # Latin-1 e-acute, line 3
    data.write_bytes(b"\n".join(lines))
    with pytest.raises(TableError, match=r"latin\.jsonl, line 3, field 'description': undecodable bytes b'\\xe9'"):
        load_description_table(data)
    code, _, err = run(["--judge", str(tiny_rm_dir), "--data", str(data), "--no-cache"], capsys)
    assert code == 2 and f"{data}, line 3, field 'description': undecodable bytes" in err
    with pytest.raises(ValueError, match="line 1: undecodable"):
        read_utf8(write_rows(tmp_path / "x.jsonl", [], prefix=b"\xff"), ValueError)


def test_rows_name_their_file_line_even_after_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"sample": "s", "model": "a", "description": "x"}\n\n\n{"sample": "s", "model": " "}\n')
    with pytest.raises(TableError, match=r"t\.jsonl, line 4, field 'description'"):
        load_description_table(path)
    path.write_text('{"sample": "s", "model": " ", "description": "x"}\n')
    with pytest.raises(TableError, match="line 1, field 'model': empty"):
        load_description_table(path)
    path.write_text('{"sample": "s", "model": "a", "description": "x", "subtitle": 3}\n')
    with pytest.raises(TableError, match="line 1, field 'subtitle': expected a string, got int"):
        load_description_table(path)
    # a line separator inside a JSON string is text, not a line break
    path.write_text(json.dumps({"sample": "s", "model": "a", "description": "one\u2028two"}) + "\n")
    assert load_description_table(path).descriptions["s", "a"] == "one\u2028two"


def test_empty_and_truncated_descriptions_are_counted_and_reported(tmp_path, tiny_rm_dir, capsys):
    rows = table_rows(n_samples=6)
    for row in rows:
        if row["model"] == "beta" and row["sample"] in ("s1", "s4"):
            row["description"] = "   " if row["sample"] == "s1" else ""
        if row["model"] == "delta":
            row["description"] = " ".join(WORDS * 6)  # 60 words: more than the 32 tokens the model reads
    data = write_rows(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    code, printed, _ = run(
        ["--judge", str(tiny_rm_dir), "--data", str(data), "--n-boot", "5", "--no-cache", "--output", str(out)], capsys
    )
    report = json.loads(out.read_text())
    assert code == 0
    assert report["empty_descriptions"] == {"alpha": 0, "beta": 2, "gamma": 0, "delta": 0}
    assert report["cost"]["n_scorings"] == 24  # the empty ones are scored as given
    assert "2 empty or whitespace-only descriptions were judged as given: beta 2." in report["warnings"]
    assert report["n_truncated"] == {"alpha": 0, "beta": 0, "gamma": 0, "delta": 6}
    assert "6 descriptions are longer than the judge reads (32 tokens) and were cut when scored: delta 6." in printed
    # the counts come from the model's own per-description flags, kept in the score cache with each score
    model = TextRewardModel.from_pretrained(tiny_rm_dir)
    table = load_description_table(data)
    cache = ScoreCache(tmp_path / "cache.jsonl")
    scores = score_table(model, table, cache)
    texts = [table.descriptions[s, "delta"] for s in table.samples]
    assert truncation_counts(scores)["delta"] == int(model.score_info(texts).truncated.sum()) == 6
    again = score_table(model, table, ScoreCache(tmp_path / "cache.jsonl"))  # from the cache alone
    assert again.n_scored == 0 and truncation_counts(again) == truncation_counts(scores)
    # a committee of reward models counts what its members cut: each member's count, the most any member cut, and
    # the warning a single judge's report gives
    from emoreward.ranking.committee import MemberRun, rank_with_committee, reward_model_member

    members = {"rm": reward_model_member(model, table), "rm2": reward_model_member(model, table)}
    committee = rank_with_committee(members, {"rm": 1.0, "rm2": 1.0}, table, n_boot=5)
    assert committee.n_truncated == report["n_truncated"]
    assert committee.cost["members"]["rm2"]["n_truncated"] == report["n_truncated"]
    assert "6 descriptions are longer than the judge reads (32 tokens) and were cut when scored: delta 6." in (
        committee.warnings
    )
    uncounted = {"rm": MemberRun(members["rm"].verdicts, dict(members["rm"].cost))}  # a judge that cannot count
    assert rank_with_committee(uncounted, {"rm": 1.0}, table, n_boot=5).n_truncated is None


def test_report_for_scores_without_truncation_flags(tmp_path, tiny_rm_dir):
    """A score cache written without truncation flags (an older cache) gives None ("not known"), never 0."""
    model = TextRewardModel.from_pretrained(tiny_rm_dir)
    table = DescriptionTable.from_rows(table_rows(n_samples=5))
    path = tmp_path / "old.jsonl"
    scores = score_table(model, table, ScoreCache(path))
    path.write_text(
        "".join(
            json.dumps({"key": e["key"], "score": e["score"]}) + "\n"
            for e in map(json.loads, path.read_text().splitlines())
        )
    )
    report = rank_with_reward_model(model, table, ScoreCache(path), n_boot=5)
    assert scores.n_scored > 0 and report.cost["n_scored"] == 0
    assert report.n_truncated is None and not any("longer than the judge" in w for w in report.warnings)
    assert report.to_dict()["n_truncated"] is None


def test_the_ranking_is_written_as_a_dataset_table(tmp_path, tiny_rm_dir, capsys):
    import datasets

    data = write_rows(tmp_path / "t.jsonl", table_rows(n_samples=6))
    table = tmp_path / "ranking.parquet"
    code, printed, _ = run(
        ["--judge", str(tiny_rm_dir), "--data", str(data), "--n-boot", "5", "--no-cache", "--dataset", str(table),
         "--output", str(tmp_path / "r.json")],
        capsys,
    )  # fmt: skip
    assert code == 0 and f"ranking dataset: {table}" in printed
    rows = datasets.load_dataset("parquet", data_files=str(table), split="train").to_list()
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["model"] for r in rows] == report["ranking"]
    assert [r["rank"] for r in rows] == sorted(r["rank"] for r in rows)
    first = rows[0]
    assert first["bt-ties_davidson"] == pytest.approx(max(report["bradley_terry_ties"]["scores"]))
    assert first["bt-ties_davidson_lower"] <= first["bt-ties_davidson"] <= first["bt-ties_davidson_upper"]
    assert 0 <= first["win_rate"] <= 1 and first["comparisons"] > 0 and "reward_effect" in first
