"""Bad preference data: quoting faults, missing values, header faults, encodings; every record accounted for."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from datasets import Dataset

from emoreward.cli import main
from emoreward.data import DataError, is_missing, load_pairs, read_pairs
from emoreward.data.readers import Records, check_count


HEADER = "name,a1,a2,preference\n"


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ------------------------------------------------------------------------------------------------- CSV quoting


def test_unclosed_quote_that_swallows_the_next_row_is_refused(tmp_path):
    # The quote opened in v1's a2 is "closed" by the stray quote in v2's row: the csv module alone reads 2 rows,
    # v1 with v2's label. The loader must refuse and point at the line where the quoted field began.
    path = write(tmp_path, "glued.csv", HEADER + 'v1,x,"sad and then,a1\nv2,x,y",a2\nv3,p,q,a1\n')
    with pytest.raises(DataError) as info:
        load_pairs(path)
    err = info.value
    assert (err.source, err.row, err.line, err.field_name) == (str(path), 1, 2, "a2")
    assert str(err).startswith(f"{path}, row 1, line 2, field 'a2': the quoted field that begins on this line")
    assert "line 3, inside the field, reads as a row of its own ('v2,x,y\",a2')" in str(err)


def test_the_cli_reports_the_unclosed_quote_in_one_line(tmp_path, capsys):
    path = write(tmp_path, "glued.csv", HEADER + 'v1,x,"sad and then,a1\nv2,x,y",a2\nv3,p,q,a1\n')
    assert main(["evaluate", "--model", str(tmp_path / "no-model"), "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}, row 1, line 2, field 'a2'" in err


def test_quote_never_closed_names_the_line_it_opened(tmp_path):
    path = write(tmp_path, "eof.csv", HEADER + 'v1,x,y,a1\nv2,"calm,y,a2\nv3,p,q,a1\n')
    with pytest.raises(DataError) as info:
        load_pairs(path)
    err = info.value
    assert (err.row, err.line, err.field_name) == (2, 3, "a1")
    assert "never closes: the file ends inside it" in str(err)


@pytest.mark.parametrize(
    "cells, field",
    [('"She sighs" twice then smiles,y', "a1"), ('x,"She sighs" twice, then smiles', "a2")],
)
def test_text_after_a_closing_quote_is_refused_not_unquoted(tmp_path, cells, field):
    # Without strict reading the first cell silently became `She sighs twice then smiles`.
    path = write(tmp_path, "sighs.csv", HEADER + "v0,x,y,a2\n" + f"v1,{cells},a1\n")
    with pytest.raises(DataError) as info:
        load_pairs(path)
    err = info.value
    assert (err.row, err.line, err.field_name) == (2, 3, field)
    assert 'text after its closing quote (line 3: \'"She sighs" twice' in str(err)


def test_doubled_quotes_and_multiline_cells_load_exactly(tmp_path):
    path = write(
        tmp_path,
        "good.csv",
        HEADER + 'v1,"""She sighs"" twice, then smiles",y,a1\n\nv2,"one\n\nthree",y,a2\nv3,"a\r\nb",c,same\n',
    )
    loaded = read_pairs(path)
    assert [p.description_1 for p in loaded.pairs] == ['"She sighs" twice, then smiles', "one\n\nthree", "a\r\nb"]
    assert [p.row for p in loaded.pairs] == [1, 2, 3]
    assert (loaded.n_records, loaded.n_blank_lines, loaded.layout) == (3, 1, "emoprefer")
    assert (
        loaded.summary() == f"3 pairs of 2 samples from 3 records of {path} (emoprefer layout, 1 blank line skipped)"
    )  # v1, v2 share "y"


def test_a_multiline_description_that_merely_has_commas_is_kept(tmp_path):
    # Line 3 has the header's 4 cells but no label in the `preference` cell: prose, not a swallowed row.
    path = write(tmp_path, "prose.csv", HEADER + 'v1,"She frowns.\nShe cries, shouts, then, leaves.",y,a1\n')
    assert load_pairs(path)[0].description_1 == "She frowns.\nShe cries, shouts, then, leaves."


def test_the_record_count_check_refuses_a_shortfall():
    records = Records("f.csv", "csv", [(1, {"name": "v1"})], ["name"], n_physical=2)
    with pytest.raises(DataError, match=r"^f\.csv: the reader returned 1 data rows but the csv source holds 2"):
        check_count(records)
    check_count(Records("f.csv", "csv", [(1, {"name": "v1"})], ["name"], n_physical=1))


# ---------------------------------------------------------------------------------------------- missing values


def test_is_missing_covers_what_pandas_and_datasets_produce():
    import numpy as np

    for value in (None, float("nan"), np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT, np.datetime64("NaT")):
        assert is_missing(value), value
    for value in ("", "nan", 0, 0.0, False, np.int64(3), [], {}):
        assert not is_missing(value), value


def test_a_nan_is_missing_text_but_not_null():
    """`is_null` (numeric fields): None, pandas.NA, NaT; a float NaN, NumPy's included, is a number, not null."""
    import numpy as np

    from emoreward.data.values import is_null

    for value in (None, pd.NA, pd.NaT, np.datetime64("NaT")):
        assert is_null(value) and is_missing(value), value
    for value in (float("nan"), np.float32("nan"), np.float64("nan"), float("inf"), 0.0, "", 0):
        assert not is_null(value), value


@pytest.mark.parametrize(
    "column, problem",
    [("name", "missing value"), ("a1", "missing value"), ("a2", "missing value"), ("preference", "unknown label nan")],
)
def test_nan_in_a_required_field_is_a_missing_value(column, problem):
    """A NaN in a text field is pandas' empty cell (missing); in the label, which may be a number, it is a number
    that is no label (`is_null`: a NaN is not null)."""
    rows = [
        {"name": "v1", "a1": "x", "a2": "y", "preference": "a1"},
        {"name": "v2", "a1": "x", "a2": "y", "preference": "a2"},
    ]
    rows[1][column] = float("nan")
    with pytest.raises(DataError) as info:
        load_pairs(rows)
    assert (info.value.row, info.value.field_name) == (2, column)
    assert problem in str(info.value)


def test_empty_and_na_cells_read_by_pandas_are_missing_not_text():
    frame = pd.read_csv(io.StringIO(HEADER + "v1,x,y,a1\n,x,y,a2\n"))
    assert math.isnan(frame["name"][1])
    for source in (frame, Dataset.from_pandas(frame), frame.to_dict(orient="records")):
        with pytest.raises(DataError) as info:
            load_pairs(source)
        assert (info.value.row, info.value.field_name) == (2, "name") and "missing value" in str(info.value)
    described = pd.read_csv(io.StringIO(HEADER + "v1,x,NA,a1\n"))  # pandas reads the text NA as missing
    with pytest.raises(DataError, match=r"row 1, field 'a2': missing value"):
        load_pairs(Dataset.from_pandas(described))
    nullable = pd.read_csv(io.StringIO(HEADER + "v1,x,y,a1\nv2,x,,a2\n")).astype("string")
    assert nullable["a2"][1] is pd.NA
    with pytest.raises(DataError, match=r"row 2, field 'a2': missing value"):
        load_pairs(nullable)


def test_nan_ids_from_a_float_column_and_nulls_from_pandas_are_missing():
    float_column = Dataset.from_dict({"name": [float("nan")], "a1": ["x"], "a2": ["y"], "preference": ["a1"]})
    assert math.isnan(float_column[0]["name"])  # NaN survives in a float column
    from_pandas = Dataset.from_pandas(pd.DataFrame(float_column.to_dict()))
    assert from_pandas[0]["name"] is None  # from_pandas turns it into a null
    for dataset in (float_column, from_pandas):
        with pytest.raises(DataError, match=r"row 1, field 'name': missing value \((nan|None)\)"):
            load_pairs(dataset)


def test_nan_in_optional_fields_means_absent():
    frame = pd.DataFrame(
        {"name": ["v1", "v2"], "a1": ["x", "x2"], "a2": ["y", "y"], "preference": ["a1", None], "model1": [None, "m"]}
    )
    pairs = load_pairs(Dataset.from_pandas(frame), require_labels=False)
    assert [(p.label, p.model_1) for p in pairs] == [("1", None), (None, "m")]


def test_float_ids_and_na_text_ids_are_refused():
    with pytest.raises(DataError, match=r"row 1, field 'sample_id': sample id 1\.0 is a float"):
        load_pairs([{"sample_id": 1.0, "description_1": "x", "description_2": "y", "label": "1"}])
    assert load_pairs([{"sample_id": 7, "description_1": "x", "description_2": "y", "label": 2}])[0].sample_id == "7"
    with pytest.raises(DataError, match=r"row 1, field 'name': missing value: the sample id 'nan'"):
        load_pairs(io_csv("nan,x,y,a1\n"))


def io_csv(rows):
    """Records as the CSV reader would give them (for a source without a file)."""
    import csv

    return list(csv.DictReader(io.StringIO(HEADER + rows)))


# ------------------------------------------------------------------------------------------------ header faults


def test_duplicate_header_column_is_named(tmp_path):
    path = write(tmp_path, "dup.csv", "name,a1,a1,preference\nv1,x,y,a1\n")
    with pytest.raises(DataError) as info:
        load_pairs(path)
    assert (info.value.row, info.value.field_name) == ("header", "a1")
    assert str(info.value) == (
        f"{path}, header, field 'a1': duplicate column 'a1' (columns 2 and 3); every column name must appear once"
    )


def test_two_names_for_one_field_are_refused(tmp_path):
    path = write(tmp_path, "alias.csv", "name,sample_id,a1,a2,preference\nv1,v1,x,y,a1\n")
    with pytest.raises(
        DataError, match=r"header, field 'name': columns \['name', 'sample_id'\] all give the sample id"
    ):
        load_pairs(path)


def test_missing_label_is_named_by_the_file_layout(tmp_path):
    rows = [{"sample_id": "a", "description_1": "x", "description_2": "y"}]
    path = write(tmp_path, "nolabel.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as info:
        load_pairs(path)
    assert (info.value.row, info.value.field_name) == ("header", "label")
    assert str(info.value) == (
        f"{path}, header, field 'label': missing column ('preference' in the EmoPrefer layout); "
        "found columns ['sample_id', 'description_1', 'description_2']"
    )
    prefer = write(tmp_path, "prefer.jsonl", json.dumps({"name": "a", "a1": "x", "a2": "y"}) + "\n")
    with pytest.raises(DataError) as info:
        load_pairs(prefer)
    assert info.value.field_name == "preference"
    one_missing = write(
        tmp_path,
        "one.jsonl",
        "".join(json.dumps(r) + "\n" for r in [{**rows[0], "label": "1"}, {**rows[0], "sample_id": "b"}]),
    )
    with pytest.raises(DataError, match=r"one\.jsonl, row 2, field 'label': missing label"):
        load_pairs(one_missing)


def test_duplicate_json_key_is_named(tmp_path):
    path = write(
        tmp_path,
        "dupkey.jsonl",
        '{"name": "a", "a1": "x", "a2": "y", "preference": "a1"}\n\n{"name": "b", "a1": "x", "a1": "z", "a2": "y", "preference": "a1"}\n',
    )
    with pytest.raises(DataError) as info:
        load_pairs(path)
    assert (info.value.row, info.value.line, info.value.field_name) == (2, 3, "a1")


# ---------------------------------------------------------------------------------------------------- encodings

ROW = {"name": "v1", "a1": "calm", "a2": "tense", "preference": "a2"}
TRL_ROW = {"chosen": "calm", "rejected": "tense"}


@pytest.mark.parametrize(
    "name, text",
    [
        ("p.csv", HEADER + "v1,calm,tense,a2\n"),
        ("p.jsonl", json.dumps(ROW) + "\n"),
        ("p.json", json.dumps([ROW])),
        ("trl.jsonl", json.dumps(TRL_ROW) + "\n"),
        ("trl.csv", "chosen,rejected\ncalm,tense\n"),
    ],
)
def test_a_utf8_byte_order_mark_is_accepted_by_every_text_reader(tmp_path, name, text):
    pair = load_pairs(write(tmp_path, name, b"\xef\xbb\xbf" + text.encode("utf-8")))[0]
    assert (pair.description_1, pair.description_2) == ("calm", "tense")
    assert pair.sample_id == ("row-1" if name.startswith("trl") else "v1")


def test_undecodable_jsonl_and_utf16_files(tmp_path):
    path = write(tmp_path, "bad.jsonl", json.dumps(ROW).encode() + b"\n" + b'{"name": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl, row 2, line 2, field 'name': undecodable bytes b'\\xe9'"):
        load_pairs(path)
    utf16 = write(tmp_path, "u16.csv", (HEADER + "v1,x,y,a1\n").encode("utf-16"))
    with pytest.raises(DataError, match=r"u16\.csv: the file is UTF-16 or UTF-32"):
        load_pairs(utf16)


def test_jsonl_lines_end_only_at_newline(tmp_path):
    rows = [{**ROW, "a1": "calm\u2028then\x0ctense"}, {**ROW, "name": "v2"}]
    path = write(tmp_path, "sep.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows))
    assert [p.description_1 for p in load_pairs(path)] == ["calm\u2028then\x0ctense", "calm"]


def test_json_array_and_parquet_files(tmp_path):
    array = write(
        tmp_path,
        "p.json",
        json.dumps([ROW, {**ROW, "name": "v2", "a1": "another description", "preference": "same"}], indent=1),
    )
    assert [(p.sample_id, p.label) for p in load_pairs(array)] == [("v1", "2"), ("v2", "tie")]
    Dataset.from_list([ROW]).to_parquet(str(tmp_path / "p.parquet"))
    assert load_pairs(tmp_path / "p.parquet")[0].description_2 == "tense"
    with pytest.raises(DataError, match=r"unsupported file type '\.txt'; use \.csv, \.jsonl, \.json or \.parquet"):
        load_pairs(write(tmp_path, "p.txt", "x"))
    with pytest.raises(DataError, match=r"not a readable parquet file"):
        load_pairs(write(tmp_path, "bad.parquet", "not parquet"))
