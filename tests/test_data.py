"""Loader: both EmoPrefer CSV layouts, JSONL, `datasets`; every bad input names file, row and field."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from emoreward.data import DataError, load_pairs


def write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_bundled_release_counts():
    pairs = load_pairs("emoprefer")
    assert len(pairs) == 459
    labels = [p.label for p in pairs]
    assert (labels.count("1"), labels.count("2"), labels.count("tie")) == (220, 230, 9)
    assert {p.model_1 for p in pairs} == {"mercaptionplus", "merrfine"}
    four = load_pairs("emoprefer-4col")
    assert [(p.sample_id, p.description_1, p.label) for p in four] == [
        (p.sample_id, p.description_1, p.label) for p in pairs
    ]
    assert four[0].model_1 is None


def test_csv_label_mapping_and_quoting(tmp_path):
    path = write(
        tmp_path,
        "p.csv",
        'name,a1,a2,preference\nv1,"calm, then ""angry""",sad,a1\nv2,x,y,a2\nv3,x,"multi\nline",same\n',
    )
    pairs = load_pairs(path)
    assert [p.label for p in pairs] == ["1", "2", "tie"]
    assert pairs[0].description_1 == 'calm, then "angry"'
    assert pairs[2].description_2 == "multi\nline"
    assert pairs[1].row == 2


def test_jsonl_and_dataset_give_the_same_pairs(tmp_path):
    rows = [
        {"sample_id": "a", "description_1": "happy", "description_2": "sad", "label": "1", "subtitle": "hi"},
        {"sample_id": "b", "description_1": "calm", "description_2": "tense", "label": "tie"},
    ]
    path = write(tmp_path, "p.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    from_file = load_pairs(path)
    from_ds = load_pairs(Dataset.from_list(rows))
    assert [(p.sample_id, p.label, p.media.subtitle) for p in from_file] == [("a", "1", "hi"), ("b", "tie", None)]
    assert [(p.sample_id, p.label, p.description_2) for p in from_ds] == [
        (p.sample_id, p.label, p.description_2) for p in from_file
    ]


@pytest.mark.parametrize(
    "content, row, field, words",
    [
        ("name,a1,preference\nv1,x,a1\n", "header", "a2", "missing column"),
        ("name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,better\n", 2, "preference", "unknown label"),
        ("name,a1,a2,preference\nv1,x,  ,a1\n", 1, "a2", "empty description"),
        ("name,a1,a2,preference,subtitle\nv1,x,y,a1,hi\nv2,x,q,a2,\nv1,z,w,a2,bye\n", 3, "name", "another video"),
        ("name,a1,a2,preference\nv1,x,y,a1\nv2,y,x,a2\n", 2, "a1", "repeats the pair of row 1"),
        ("name,a1,a2,preference\nv1,x,y,\n", 1, "preference", "missing label"),
        ("name,a1,a2,preference\nv1,x,y\n", 1, None, "fewer cells"),
    ],
)
def test_bad_csv_names_file_row_and_field(tmp_path, content, row, field, words):
    path = write(tmp_path, "bad.csv", content)
    with pytest.raises(DataError) as info:
        load_pairs(path)
    err = info.value
    assert err.source == str(path) and err.row == row and err.field_name == field
    assert words in str(err) and str(path) in str(err)


def test_empty_file(tmp_path):
    with pytest.raises(DataError, match="empty"):
        load_pairs(write(tmp_path, "empty.csv", "  \n"))
    with pytest.raises(DataError, match="no data rows"):
        load_pairs(write(tmp_path, "header.csv", "name,a1,a2,preference\n"))


def test_undecodable_bytes_report_the_line(tmp_path):
    path = write(tmp_path, "latin1.csv", "name,a1,a2,preference\nv1,ok,y,a1\nv2,caf\xe9,y,a2\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.csv, row 2, line 3, field 'a1': undecodable bytes b'\\xe9'") as info:
        load_pairs(path)
    assert (info.value.line, info.value.row, info.value.field_name) == (3, 2, "a1")


def test_bad_jsonl_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"name": "a", "a1": "x", "a2": "y", "preference": "a1"}\n{"name": "b",\n')
    with pytest.raises(DataError, match=r"row 2: invalid JSON on line 2"):
        load_pairs(path)


def test_unlabelled_pairs_allowed_when_asked(tmp_path):
    path = write(tmp_path, "u.csv", "name,a1,a2\nv1,x,y\n")
    assert load_pairs(path, require_labels=False)[0].label is None
    with pytest.raises(DataError, match="missing column"):
        load_pairs(path)


def test_swapped_pair_flips_label_and_writers():
    pair = load_pairs("emoprefer")[0]
    s = pair.swapped()
    assert (s.description_1, s.description_2, s.model_1) == (pair.description_2, pair.description_1, pair.model_2)
    assert {pair.label, s.label} == {"1", "2"}
