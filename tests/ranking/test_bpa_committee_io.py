"""BPA data loading (JSONL / CSV, errors naming file, row and field) and E3mo-Score committee voting."""

import json
import math

import numpy as np
import pytest
from pairwise_io import PairwiseDataError, load_pairwise_records, save_pairwise_records  # beside this file

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa import (
    CommitteeConfig,
    CommitteeJudge,
    estimate_judge_weights,
    weighted_vote,
    weights_from_agreement,
)
from emoreward.ranking.records import PairwiseRecord, as_outcome


# --- loading ----------------------------------------------------------------------------------------------------


def _jsonl(tmp_path, rows, name="pairs.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_round_trip(tmp_path):
    records = [PairwiseRecord("m1", "m2", "a", "ann1", "vid1"), PairwiseRecord("m2", "m3", "tie", "ann2")]
    path = tmp_path / "out.jsonl"
    save_pairwise_records(records, path)
    assert load_pairwise_records(path) == records
    # written in the one encoding, the Verdict values
    assert [json.loads(line)["outcome"] for line in path.read_text().splitlines()] == ["1", "tie"]
    assert [r.outcome for r in load_pairwise_records(path)] == [Verdict.FIRST, Verdict.TIE]


def test_byte_order_mark_and_undecodable_bytes(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_bytes(b"\xef\xbb\xbfitem_a,item_b,outcome,annotator\nm1,m2,2,ann1\n")
    assert load_pairwise_records(path) == [PairwiseRecord("m1", "m2", Verdict.SECOND, "ann1")]
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b'{"item_a": "x", "item_b": "y", "outcome": "a", "annotator": "k"}\n{"item_a": "\xe9"}\n')
    with pytest.raises(PairwiseDataError, match=r"pairs\.jsonl, line 2, field 'item_a': undecodable bytes"):
        load_pairwise_records(path)


def test_csv_loading(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("item_a,item_b,outcome,annotator,sample\nm1,m2,B,ann1,v1\nm2,m3,tie,ann2,\n")
    assert load_pairwise_records(path) == [
        PairwiseRecord("m1", "m2", "b", "ann1", "v1"),
        PairwiseRecord("m2", "m3", "tie", "ann2", None),
    ]


def test_missing_field_names_file_row_field(tmp_path):
    path = _jsonl(
        tmp_path,
        [
            {"item_a": "x", "item_b": "y", "outcome": "a", "annotator": "k"},
            {"item_a": "x", "item_b": "y", "annotator": "k"},
        ],
    )
    with pytest.raises(PairwiseDataError) as err:
        load_pairwise_records(path)
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg and "'outcome'" in msg


def test_missing_annotator_unless_default(tmp_path):
    path = _jsonl(tmp_path, [{"item_a": "x", "item_b": "y", "outcome": "a"}])
    with pytest.raises(PairwiseDataError, match=r"row 1 .*'annotator'"):
        load_pairwise_records(path)
    assert load_pairwise_records(path, default_annotator="judge")[0].annotator == "judge"


def test_unknown_outcome_names_value_and_choices(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("item_a,item_b,outcome,annotator\nx,y,a,k\nx,y,a,k\nx,z,maybe,k\n")
    with pytest.raises(PairwiseDataError) as err:
        load_pairwise_records(path)
    msg = str(err.value)
    assert str(path) in msg and "row 3 (line 4)" in msg and "'outcome'" in msg and "'maybe'" in msg and "'tie'" in msg


def test_self_comparison_and_empty_file(tmp_path):
    path = _jsonl(tmp_path, [{"item_a": "x", "item_b": "x", "outcome": "a", "annotator": "k"}])
    with pytest.raises(PairwiseDataError, match=r"row 1 .*'item_a' and 'item_b'"):
        load_pairwise_records(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PairwiseDataError, match=r"empty\.jsonl: empty file"):
        load_pairwise_records(empty)
    empty_csv = tmp_path / "empty.csv"
    empty_csv.write_text("item_a,item_b,outcome,annotator\n")
    with pytest.raises(PairwiseDataError, match=r"empty\.csv: empty file"):
        load_pairwise_records(empty_csv)


def test_malformed_json_and_header_and_suffix(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"item_a": "x", "item_b": "y", "outcome": "a", "annotator": "k"}\n\n{not json\n')
    with pytest.raises(PairwiseDataError, match=r"bad\.jsonl, row 2 \(line 3\): invalid JSON"):
        load_pairwise_records(path)
    csv_path = tmp_path / "nohead.csv"
    csv_path.write_text("item_a,item_b,annotator\nx,y,k\n")
    with pytest.raises(PairwiseDataError, match=r"nohead\.csv, header .*'outcome'"):
        load_pairwise_records(csv_path)
    with pytest.raises(ValueError, match=r"\['\.jsonl', '\.csv'\]"):
        load_pairwise_records(tmp_path / "pairs.parquet")


# --- committee --------------------------------------------------------------------------------------------------


def test_log_odds_weights_hand_values():
    w = weights_from_agreement({"good": 9, "chance": 1, "bad": 0}, {"good": 10, "chance": 4, "bad": 10})
    assert w["good"] == pytest.approx(math.log(10.0))  # acc = 10/12 -> log(acc * 2 / (1 - acc)) = log 10
    assert w["chance"] == pytest.approx(0.0, abs=1e-12)  # acc = (1 + 1) / (4 + 2) = 1/3: chance
    assert w["bad"] == 0.0
    acc = weights_from_agreement({"good": 9}, {"good": 10}, CommitteeConfig(weighting="accuracy"))
    assert acc["good"] == pytest.approx(10 / 12)
    with pytest.raises(ValueError, match="n_correct <= n_total"):
        weights_from_agreement({"j": 5}, {"j": 3})


def test_weighted_vote_rules():
    weights = {"strong": 2.0, "weak1": 0.8, "weak2": 0.8}
    assert weighted_vote({"strong": "a", "weak1": "b", "weak2": "b"}, weights) is Verdict.FIRST
    assert (
        weighted_vote({"strong": "a", "weak1": "b", "weak2": "b"}, {**weights, "weak2": 1.2}) is Verdict.TIE
    )  # 2 vs 2
    assert weighted_vote({"strong": Verdict.TIE, "weak1": "2", "weak2": "b"}, weights) is Verdict.TIE
    with pytest.raises(ValueError, match="weight 0"):
        weighted_vote({"x": "a"}, {"x": 0.0})
    with pytest.raises(ValueError, match="'INVALID'"):
        weighted_vote({"x": "INVALID"}, {"x": 1.0})


def test_calibrated_committee_follows_reliable_judge():
    rng = np.random.default_rng(0)
    ref = {f"g{i}": float(v) for i, v in enumerate(rng.uniform(1, 9, 30))}

    def truthful(a, b):
        return "tie" if abs(ref[a] - ref[b]) <= 0.5 else ("a" if ref[a] > ref[b] else "b")

    def guesser(a, b):
        return ["a", "b", "tie"][int(rng.integers(3))]

    names = list(ref)
    calib = [(names[i], names[j]) for i in range(10) for j in range(i + 1, 10)]
    judges = {"truthful": truthful, "guess1": guesser, "guess2": guesser}
    weights = estimate_judge_weights(judges, calib, ref)
    assert weights["truthful"] > 2.0 and weights["guess1"] < 0.5 and weights["guess2"] < 0.5
    committee = CommitteeJudge(judges, weights, name="e3mo")
    test_pairs = [(names[i], names[j]) for i in range(10, 30) for j in range(i + 1, 30)]
    agree = np.mean([committee(a, b).outcome is as_outcome(truthful(a, b)) for a, b in test_pairs])
    assert agree == 1.0
    assert committee(names[0], names[1]).annotator == "e3mo"
    equal = CommitteeJudge(judges, dict.fromkeys(judges, 1.0))
    assert np.mean([equal(a, b).outcome is as_outcome(truthful(a, b)) for a, b in test_pairs]) < 0.9
    with pytest.raises(ValueError, match="no reference score"):
        estimate_judge_weights(judges, [("g0", "unknown")], ref)
