"""Result records written as JSON lines or parquet read back equal through `datasets.load_dataset`."""

from __future__ import annotations

import math

import pytest
from datasets import load_dataset

from emoreward.data import write_records
from emoreward.data.records import records_to_dataset


JUDGEMENTS = [
    {
        "sample_id": "sample_00000001",
        "judge": "smollm2-135m-text",
        "strategy": "S1",
        "run": 0,
        "order": "normal",
        "verdict": "FIRST",
        "probabilities": {"first": 0.1 + 0.2, "second": 1 / 3, "tie": 0.3666666666666667},
        "raw": 'Answer: 1 \u2014 caf\u00e9 \u2028 "quoted"',
        "steps": ["She frowns.", "Then she smiles."],
        "valid": True,
    },
    {
        "sample_id": "sample_00000002",
        "judge": "smollm2-135m-text",
        "strategy": "S1",
        "run": 0,
        "order": "swapped",
        "verdict": "INVALID",
        "probabilities": {"first": None, "second": None, "tie": None},
        "raw": "",
        "steps": [],
        "valid": False,
    },
]


@pytest.mark.parametrize("suffix, builder", [(".jsonl", "json"), (".json", "json"), (".parquet", "parquet")])
def test_records_read_back_equal(tmp_path, suffix, builder):
    path = write_records(JUDGEMENTS, tmp_path / "out" / f"judgements{suffix}")
    assert path == tmp_path / "out" / f"judgements{suffix}"
    back = load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert back.to_list() == JUDGEMENTS
    assert back.features == records_to_dataset(JUDGEMENTS).features
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


def test_rankings_with_missing_keys_come_back_with_nulls(tmp_path):
    rows = [{"model": "mercaptionplus", "score": 1.25, "rank": 1}, {"model": "merrfine", "rank": 2, "ci_low": -0.5}]
    path = write_records(rows, tmp_path / "r.jsonl")
    back = load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert back.column_names == ["model", "score", "rank", "ci_low"]
    assert back.to_list() == [
        {"model": "mercaptionplus", "score": 1.25, "rank": 1, "ci_low": None},
        {"model": "merrfine", "score": None, "rank": 2, "ci_low": -0.5},
    ]


def test_nan_is_refused_in_json_and_kept_in_parquet(tmp_path):
    rows = [{"model": "a", "score": 0.5}, {"model": "b", "score": float("nan")}]
    with pytest.raises(ValueError, match=r"r\.jsonl: record 2, column 'score': NaN or infinity cannot be written"):
        write_records(rows, tmp_path / "r.jsonl")
    assert not (tmp_path / "r.jsonl").exists()
    path = write_records(rows, tmp_path / "r.parquet")
    back = load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert back[0]["score"] == 0.5 and math.isnan(back[1]["score"])


def test_bad_records_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"unknown suffix '\.csv'"):
        write_records(JUDGEMENTS, tmp_path / "j.csv")
    with pytest.raises(ValueError, match=r"no records to write"):
        write_records([], tmp_path / "j.jsonl")
    with pytest.raises(ValueError, match=r"record 2 is a list"):
        write_records([{"a": 1}, [1]], tmp_path / "j.jsonl")
    with pytest.raises(ValueError, match=r"column 'score': record 3 \('high'\) does not match the type"):
        write_records([{"score": 1.0}, {"score": 2.0}, {"score": "high"}], tmp_path / "j.parquet")
    assert list(tmp_path.iterdir()) == []
