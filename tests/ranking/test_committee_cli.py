"""`emoreward rank` with a committee of judges (E3mo-Score): `--judge` given more than once, `--committee-calibration`,
`--committee-weighting`, through the real entry point; the weighted vote on hand-made verdicts; the refusals."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
from _helpers import save_tiny_bert_rm
from relations._inputs import assert_same_numbers

from emoreward.cli.main import main
from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.committee import weights_from_agreement
from emoreward.ranking.committee import MemberRun, calibration_pairs, committee_votes, rank_with_committee
from emoreward.ranking.rank import fit_ranking
from emoreward.ranking.records import PairwiseRecord


WORDS = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet", "tense", "relaxed"]
MODELS = ("alpha", "beta", "gamma", "delta")
# the scripted zero-shot judge (zero_shot.testing.ScriptedBackend): prefers the longer description
LENGTH_JUDGE = "name: {name}\nmllm:\n  backend: scripted\n  model: length\n"
# the report fields every ranking has, whoever judged
FITS = ("ranking", "ranks", "W", "bradley_terry_ties", "bradley_terry_binarized", "bradley_terry_ties_paper",
        "length_controlled", "tie_share")  # fmt: skip


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def table_rows(n_samples: int = 6) -> list[dict]:
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(MODELS):
            r = random.Random(s * 10 + m)
            text = " ".join(r.choice(WORDS) for _ in range(3 + 2 * m + r.randint(0, 3)))
            rows.append({"sample": f"s{s}", "model": name, "description": text})
    return rows


def length_pairs(n: int, longer_wins: list[bool]) -> list[dict]:
    """Labelled pairs of different lengths: the label is on the longer description where ``longer_wins``."""
    rows = []
    for i in range(n):
        short, long = f"clip {i} calm", f"clip {i} the woman is tense and her voice is loud and quick"
        first_long = i % 2 == 0
        d1, d2 = (long, short) if first_long else (short, long)
        label_long = "1" if first_long else "2"
        label = label_long if longer_wins[i] else ("2" if label_long == "1" else "1")
        rows.append({"sample_id": f"p{i}", "description_1": d1, "description_2": d2, "label": label})
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("committee")
    (root / "len.yaml").write_text(LENGTH_JUDGE.format(name="lengthjudge"), encoding="utf-8")
    (root / "len2.yaml").write_text(LENGTH_JUDGE.format(name="lengthjudge2"), encoding="utf-8")
    return {
        "rm": save_tiny_bert_rm(root / "rm" / "model", max_length=64),
        "rm2": save_tiny_bert_rm(root / "rm2" / "model", hidden=32, max_length=64),
        "len": root / "len.yaml",
        "len2": root / "len2.yaml",
        "table": write_jsonl(root / "table.jsonl", table_rows()),
        # the length judge is right on 3 of 4 pairs in either order: 6 / 8
        "calibration": write_jsonl(root / "calibration.jsonl", length_pairs(4, [True, True, False, True])),
        # the length judge is always wrong: 0 / 8
        "wrong": write_jsonl(root / "wrong.jsonl", length_pairs(4, [False] * 4)),
    }


def rank(capsys, tmp_path, name, *argv) -> tuple[int, dict | None, str]:
    out = tmp_path / f"{name}.json"
    capsys.readouterr()
    code = main(
        ["rank", "--output", str(out), *(["--n-boot", "20"] if "bpa" not in argv else []), "--quiet", *map(str, argv)]
    )
    _, err = capsys.readouterr()
    return code, (json.loads(out.read_text(encoding="utf-8")) if out.exists() else None), err


def rank_ok(capsys, tmp_path, name, *argv) -> dict:
    code, report, err = rank(capsys, tmp_path, name, *argv)
    assert code == 0, err[-2000:]
    return report


# ------------------------------------------------------------------------------------------- (a) committee of one
@pytest.mark.parametrize("member", ["len", "rm"])
def test_committee_of_one_with_equal_weights_is_the_single_judge(member, files, tmp_path, capsys):
    cache = tmp_path / "cache"
    common = ["--judge", files[member], "--data", files["table"], "--cache-dir", cache]
    single = rank_ok(capsys, tmp_path, "single", *common)
    one = rank_ok(capsys, tmp_path, "one", *common, "--committee-weighting", "equal")
    # the sameness relation (float sums of the same records in another order may differ in the last bit)
    assert_same_numbers({k: one[k] for k in FITS}, {k: single[k] for k in FITS})
    assert [m["weight"] for m in one["committee"]["members"]] == [1.0]
    assert one["committee"]["calibration"] is None
    verdicts = one["committee"]["verdicts"]
    assert verdicts["n_verdicts"] == sum(map(sum, single["W"]["wins"])) + sum(map(sum, single["W"]["ties"])) / 2
    if member == "rm":  # the member scored through the single judge's score cache: nothing scored again
        cost = one["cost"]["members"][str(files["rm"])]
        assert cost["n_scored"] == 0 and cost["n_cached"] == cost["n_scorings"] == 24


# ------------------------------------------------------------------------------------ (b) the weighted vote by hand
def test_weighted_vote_on_known_verdicts_gives_the_expected_records_and_fit(files):
    from emoreward.data.tables import load_description_table

    table = load_description_table(files["table"]).subset(["s0", "s1"], ["alpha", "beta", "gamma"])
    F, S, T, X = Verdict.FIRST, Verdict.SECOND, Verdict.TIE, Verdict.INVALID
    weights = {"A": 0.5, "B": 0.3, "C": 0.3}
    # (sample, a, b): votes of A, B, C -> the expected committee verdict (None: no verdict)
    cases = {
        ("s0", "alpha", "beta"): ((F, S, S), S),  # 0.6 against 0.5
        ("s0", "alpha", "gamma"): ((F, F, T), F),
        ("s0", "beta", "gamma"): ((T, F, S), T),  # TIE has the largest total, 0.5
        ("s1", "alpha", "beta"): ((X, F, S), T),  # equal largest totals of different outcomes: a tie
        ("s1", "alpha", "gamma"): ((S, X, X), S),  # the valid votes only
        ("s1", "beta", "gamma"): ((X, X, X), None),  # nobody voted
    }
    members = {
        name: MemberRun({key: {None: votes[k]} for key, (votes, _) in cases.items()}, {"judge": "custom"})
        for k, name in enumerate("ABC")
    }
    got = committee_votes({m: r.verdicts for m, r in members.items()}, weights)
    expected = [PairwiseRecord(a, b, v, "committee", s) for (s, a, b), (_, v) in cases.items() if v is not None]
    assert got.records == expected
    assert got.counts["n_verdicts"] == 5 and got.counts["n_no_verdict"] == 1
    assert (got.counts["first"], got.counts["second"], got.counts["tie"]) == (1, 2, 2)
    assert got.counts["members"]["A"] == {"n_votes": 4, "n_agree": 3}  # all but s0 alpha-beta

    report = rank_with_committee(members, weights, table, n_boot=20, length_control=False)
    fits = fit_ranking(expected, table.models, n_boot=20)
    assert report.counts.wins.tolist() == fits.counts.wins.tolist()
    assert report.counts.ties.tolist() == fits.counts.ties.tolist()
    assert report.ties.estimate.scores.tolist() == fits.ties.estimate.scores.tolist()
    assert report.binarized.estimate.scores.tolist() == fits.binarized.estimate.scores.tolist()
    assert report.cost["n_verdicts"] == 5


# ------------------------------------------------------------------------------------------- (c) calibration weights
def test_calibration_weights_are_weights_from_agreement_on_counted_agreements(files, tmp_path, capsys):
    from emoreward.data import load_pairs
    from emoreward.data.verdicts import verdict_from_difference
    from emoreward.judges import load_judge

    pairs = load_pairs(files["calibration"])
    judge = load_judge(str(files["rm"]))
    r1, r2 = judge.pair_rewards(pairs)
    rm_correct = 2 * sum(  # a reward model answers the swapped order alike
        verdict_from_difference(float(a - b), judge.tie_threshold) == Verdict.from_label(p.label)
        for a, b, p in zip(r1, r2, pairs)
    )
    counts = {str(files["len"]): (6, 8), str(files["rm"]): (rm_correct, 8)}
    for weighting in ("log_odds", "accuracy"):
        report = rank_ok(capsys, tmp_path, weighting, "--judge", files["len"], "--judge", files["rm"], "--data",
                         files["table"], "--committee-calibration", files["calibration"], "--no-cache",
                         "--committee-weighting", weighting)  # fmt: skip
        members = {m["name"]: m for m in report["committee"]["members"]}
        assert {n: (m["n_agree"], m["n_calibration"]) for n, m in members.items()} == counts
        expected = weights_from_agreement({n: c for n, (c, _) in counts.items()}, {n: t for n, (_, t) in counts.items()},
                                          _config(weighting))  # fmt: skip
        assert {n: m["weight"] for n, m in members.items()} == pytest.approx(expected, rel=1e-12)
        assert report["committee"]["weighting"] == weighting
        assert report["committee"]["n_calibration_pairs"] == 4
    # the log-odds weight by hand: Laplace-smoothed accuracy 7/10, w = log(0.7 * 2 / 0.3)
    assert weights_from_agreement({"len": 6}, {"len": 8})["len"] == pytest.approx(math.log(0.7 * 2 / 0.3))


def _config(weighting):
    from emoreward.ranking.bpa.config import CommitteeConfig

    return CommitteeConfig(weighting=weighting)


def test_a_member_with_weight_zero_is_reported_and_does_not_vote(files, tmp_path, capsys):
    """Calibration pairs where the length judge is always wrong and the reward model always right: the length judge
    gets weight 0, and the committee ranks as the reward model alone."""
    from emoreward.data import load_pairs
    from emoreward.judges import load_judge

    candidates = write_jsonl(tmp_path / "candidates.jsonl", length_pairs(16, [True] * 16))
    pairs = load_pairs(candidates)
    r1, r2 = load_judge(str(files["rm"])).pair_rewards(pairs)
    rows = []
    for p, a, b in zip(pairs, r1, r2):  # label the side the reward model prefers, where that is the shorter one
        prefers = "1" if a > b else "2"
        longer = "1" if len(p.description_1) > len(p.description_2) else "2"
        if prefers != longer and abs(a - b) > 1e-3:
            rows.append({"sample_id": p.sample_id, "description_1": p.description_1,
                         "description_2": p.description_2, "label": prefers})  # fmt: skip
    assert len(rows) >= 2, "the tiny reward model prefers the longer description everywhere"
    calibration = write_jsonl(tmp_path / "rm_right.jsonl", rows)
    common = ["--data", files["table"], "--cache-dir", tmp_path / "cache"]
    report = rank_ok(capsys, tmp_path, "c", "--judge", files["len"], "--judge", files["rm"], *common,
                     "--committee-calibration", calibration)  # fmt: skip
    members = {m["name"]: m for m in report["committee"]["members"]}
    assert members[str(files["len"])]["weight"] == 0 and members[str(files["rm"])]["weight"] > 0
    assert report["committee"]["zero_weight"] == [str(files["len"])]
    assert any("weight 0" in w and str(files["len"]) in w for w in report["warnings"])
    alone = rank_ok(capsys, tmp_path, "alone", "--judge", files["rm"], *common)
    # the reward model's one verdict votes in both order slots of the length judge: every count doubled
    assert report["W"]["wins"] == [[2 * w for w in row] for row in alone["W"]["wins"]]
    assert report["ranking"] == alone["ranking"]


# --------------------------------------------------------------------------------------------------- BPA committee
def test_bpa_takes_the_committee_as_its_annotator(files, tmp_path, capsys):
    report = rank_ok(capsys, tmp_path, "bpa", "--method", "bpa", "--budget", "12", "--judge", files["len"],
                     "--judge", files["rm"], "--data", files["table"], "--committee-calibration",
                     files["calibration"], "--no-cache")  # fmt: skip
    assert report["method"] == "bpa"
    assert report["cost"]["judge"] == "committee" and report["cost"]["n_queries"] == 12
    assert list(report["reliabilities"]) == ["committee"]
    verdicts = report["committee"]["verdicts"]
    assert verdicts["n_verdicts"] == report["n_records"] == 24  # the length judge's two orders: two slots a query
    assert {m["name"] for m in report["committee"]["members"]} == {str(files["len"]), str(files["rm"])}


# ------------------------------------------------------------------------------------------------------ (e) refusals
@pytest.mark.parametrize(
    "case",
    ["one-member-calibration", "one-member-weighting", "same-judge", "same-judge-other-spelling", "same-judge-copied",
     "same-judge-file-renamed", "weighting-alone", "unlabelled", "bad-label", "all-zero", "hierarchical"],
)  # fmt: skip
def test_committee_refusals(case, files, tmp_path, capsys):
    unlabelled = tmp_path / "unlabelled.jsonl"
    rows = [{k: v for k, v in r.items() if k != "label"} for r in length_pairs(3, [True] * 3)]
    write_jsonl(unlabelled, rows)
    bad_label = write_jsonl(
        tmp_path / "bad-label.jsonl", [{**r, "label": "maybe"} for r in length_pairs(3, [True] * 3)]
    )
    rm, other = str(files["rm"]), str(files["rm"]) + "/../model"
    copied = shutil.copytree(files["rm"], tmp_path / "copy" / "model")  # the same content under another path
    renamed = shutil.copy(files["len"], tmp_path / "another-name.yaml")  # one judge file under another name
    argv, option = {
        "one-member-calibration": (["--judge", rm, "--committee-calibration", files["calibration"]],
                                   "--committee-calibration"),
        "one-member-weighting": (["--judge", rm, "--committee-weighting", "log_odds"], "--committee-weighting"),
        "same-judge": (["--judge", rm, "--judge", files["len"], "--judge", rm], "--judge"),
        "same-judge-other-spelling": (["--judge", rm, "--judge", other], "--judge"),
        "same-judge-copied": (["--judge", rm, "--judge", copied], "--judge"),
        "same-judge-file-renamed": (["--judge", files["len"], "--judge", renamed], "--judge"),
        "weighting-alone": (["--judge", rm, "--judge", files["len"], "--committee-weighting", "accuracy"],
                            "--committee-weighting"),
        "unlabelled": (["--judge", rm, "--judge", files["len"], "--committee-calibration", unlabelled],
                       "--committee-calibration"),
        "bad-label": (["--judge", rm, "--judge", files["len"], "--committee-calibration", bad_label],
                      "--committee-calibration"),
        "all-zero": (["--judge", files["len"], "--judge", files["len2"], "--committee-calibration", files["wrong"]],
                     "--committee-calibration"),
        "hierarchical": (["--judge", rm, "--judge", files["len"], "--hierarchical", "2"], "--hierarchical"),
    }[case]  # fmt: skip
    cache = tmp_path / "cache"
    code, report, err = rank(capsys, tmp_path, "refused", *argv, "--data", files["table"], "--cache-dir", cache)
    assert code == 2 and report is None
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("emoreward rank: error: ") and option in lines[0], err
    if case != "all-zero":  # refused before any scoring: no score cache, no judge call cache
        assert not cache.exists()


def test_a_model_its_export_and_their_copies_are_one_judge(files, tmp_path, capsys):
    """rtG2 g13: `emoreward export` writes other bytes (merged weights) of the same reward model, and records the
    model it came from (`emoreward.models.loading.EXPORTED_FROM`, its source's identity), so a committee of the model
    and its export (or a copy of the export, or an export of the export) is refused, one line naming both, before
    any scoring; the second model beside them is a judge of its own."""
    from emoreward.models.base import load_settings
    from emoreward.models.loading import EXPORTED_FROM, content_identity

    rm, rm2 = files["rm"], files["rm2"]
    exported, again = tmp_path / "export", tmp_path / "export-of-export"
    for source, out in ((rm, exported), (exported, again)):
        assert main(["export", "--model", str(source), "--output", str(out)]) == 0
    capsys.readouterr()
    assert load_settings(exported).extra[EXPORTED_FROM] == load_settings(again).extra[EXPORTED_FROM]
    assert load_settings(exported).extra[EXPORTED_FROM] == content_identity(rm) != content_identity(exported)
    copied = shutil.copytree(exported, tmp_path / "copy" / "export")
    cache = tmp_path / "cache"
    for member in (exported, copied, again):
        code, report, err = rank(capsys, tmp_path, "refused", "--judge", rm, "--judge", member, "--judge", rm2,
                                 "--data", files["table"], "--cache-dir", cache)  # fmt: skip
        lines = err.strip().splitlines()
        assert code == 2 and report is None and len(lines) == 1, err
        assert f"--judge {member}: the same judge as --judge {rm} (content {content_identity(rm)}" in lines[0]
        assert not cache.exists()
    report = rank_ok(capsys, tmp_path, "two", "--judge", exported, "--judge", rm2, "--data", files["table"],
                     "--no-cache")  # fmt: skip
    assert len(report["committee"]["members"]) == 2


def test_a_member_calibrated_on_its_training_pairs_is_flagged(files, tmp_path, capsys):
    """A reward model's agreement on pairs it was trained on is in-sample: the same check as `emoreward evaluate`
    (`training.provenance.in_sample_pairs`) warns on stderr and in the report, and the member's count is recorded."""
    from emoreward.data import load_pairs
    from emoreward.training.provenance import write_training_data

    model = shutil.copytree(files["rm"], tmp_path / "trained" / "model")
    calibration = load_pairs(files["calibration"])
    write_training_data(model, str(files["calibration"]), calibration[:3])  # trained on 3 of the 4 pairs
    argv = ["--judge", model, "--judge", files["len"], "--committee-calibration", files["calibration"]]
    code, report, err = rank(capsys, tmp_path, "in-sample", *argv, "--data", files["table"], "--no-cache")
    assert code == 0, err
    assert f"--judge {model}: 3 of 4 pairs in --committee-calibration" in err
    member = {m["name"]: m for m in report["committee"]["members"]}[str(model)]
    assert member["n_in_sample_calibration"] == 3
    assert any("trained on 3 of the 4 calibration pairs" in w for w in report["warnings"])


def test_calibration_pairs_are_read_as_every_command_reads_pairs(files, tmp_path, capsys):
    # with --media-root clips are read by sample id, so the same two descriptions about two clips are two pairs
    # (load_pairs' media_by_id, as evaluate, judge and train read them); without it they repeat one pair: refused
    rows = length_pairs(4, [True] * 4)
    rows += [{**r, "sample_id": r["sample_id"] + "-other-clip"} for r in rows]
    calibration = write_jsonl(tmp_path / "two-clips.jsonl", rows)
    argv = ["--judge", files["len"], "--judge", files["len2"], "--data", files["table"], "--no-cache",
            "--committee-calibration", calibration]  # fmt: skip
    (tmp_path / "media").mkdir()
    assert len(calibration_pairs(str(calibration), str(tmp_path / "media"))) == 8
    # these judges read text only: --media-root cannot apply to them (emoreward.judges.reads_media)
    code, _, err = rank(capsys, tmp_path, "by-id", *argv, "--media-root", tmp_path / "media")
    assert code == 2 and "--media-root applies to judges that read media files" in err, err
    code, _, err = rank(capsys, tmp_path, "no-root", *argv)
    assert code == 2 and "row 5, field 'description_1': repeats the pair of row 1" in err
