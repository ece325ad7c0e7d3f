"""Duplication: a repeated row is refused with one line naming the file, both rows and the field (exit 2), never
counted twice and never split across cross-validation folds. A repeated pair is the same two descriptions (in
either order, in either Unicode form) about the same context, whatever its sample id. Applied to every command
that reads pairs (`evaluate`, `judge`, `train` with cross-validation) and to `rank`'s table and selections.

Owners: `emoreward.data.pairs._build_pairs` (`pair_content`), `emoreward.data.tables.DescriptionTable` (a second
description of one sample by one model; `subset`: a sample or model selected twice).
"""

from __future__ import annotations

import unicodedata

import pytest
from _inputs import pair_rows, run_cli, table_rows, train_recipe, write_jsonl


COVERS = {
    "evaluate": ("*", "--data"),
    "judge": ("*", "--data"),
    "train": ("*", "--train_file", "--cv_folds"),
    "rank": ("*", "--data", "--sample-ids", "--models"),
}

REPEATS = {
    "copy": lambda r: {**r, "sample_id": r["sample_id"] + "-again"},
    "swapped": lambda r: {
        **r,
        "sample_id": r["sample_id"] + "-swapped",
        "description_1": r["description_2"],
        "description_2": r["description_1"],
        "label": {"1": "2", "2": "1"}.get(r["label"], r["label"]),
    },
    "other unicode form": lambda r: {
        **r,
        "sample_id": r["sample_id"] + "-nfd",
        "description_1": unicodedata.normalize("NFD", r["description_1"]),
        "description_2": r["description_2"],
    },
}


def repeated_pairs(kind: str) -> list[dict]:
    rows = pair_rows(24)
    if kind == "other unicode form":
        rows[3]["description_1"] += " café"
    rows.insert(17, REPEATS[kind](rows[3]))  # file row 18 repeats file row 4
    return rows


def assert_refused(code: int, err: str, *names: str) -> None:
    """THE duplication relation's refusal: exit 2 and one line naming each of ``names``, no traceback."""
    assert code == 2, f"exit {code}: {err[-800:]}"
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-800:]
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"


@pytest.mark.parametrize("kind", list(REPEATS))
@pytest.mark.parametrize("command", ["evaluate", "judge", "train"])
def test_a_repeated_pair_is_refused_by_every_command_that_reads_pairs(
    command, kind, rm_dir, length_judge_yaml, tiny_bert_dir, tmp_path, capsys
):
    data = write_jsonl(tmp_path / "pairs.jsonl", repeated_pairs(kind))
    argv = {
        "evaluate": ["evaluate", "--model", rm_dir, "--data", data],
        "judge": ["judge", "--judge", length_judge_yaml, "--data", data, "--output", tmp_path / "j", "--no-progress"],
        "train": ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, data), "--cv_folds", "3"],
    }[command]
    code, _, err = run_cli(capsys, argv)
    assert_refused(code, err, str(data), "row 18", "row 4")
    assert not (tmp_path / "out" / "cv").exists()  # no fold trained


def test_a_repeated_table_row_is_refused(rm_dir, tmp_path, capsys):
    rows = table_rows(n_samples=6)
    rows.insert(9, dict(rows[2]))
    data = write_jsonl(tmp_path / "table.jsonl", rows)
    code, _, err = run_cli(capsys, ["rank", "--judge", rm_dir, "--data", data, "--no-cache"])
    assert_refused(code, err, str(data), "line 10", "line 3")


@pytest.mark.parametrize("option", ["--sample-ids", "--models"])
def test_a_sample_or_model_selected_twice_is_refused(option, rm_dir, table, tmp_path, capsys):
    if option == "--sample-ids":
        ids = tmp_path / "ids.txt"
        ids.write_text("s1\ns2\ns1\n", encoding="utf-8")
        value, name = ids, "s1"
    else:
        value, name = "alpha,beta,alpha", "alpha"
    code, _, err = run_cli(capsys, ["rank", "--judge", rm_dir, "--data", table, option, value, "--no-cache"])
    assert_refused(code, err, name, "more than once")
    if option == "--sample-ids":  # the file and both lines named, as every other repeated row is
        assert_refused(code, err, f"{value}, line 3", "line 1")


@pytest.mark.parametrize("command", ["evaluate", "judge", "train"])
def test_a_label_repeated_by_one_annotator_is_refused_by_every_command(
    command, rm_dir, length_judge_yaml, tiny_bert_dir, tmp_path, capsys
):
    # one row per annotator is several labels of one pair; the same annotator twice is one label counted twice
    rows = [{**r, "annotator": "a"} for r in pair_rows(24)]
    rows.insert(17, {**rows[3], "description_1": rows[3]["description_2"], "description_2": rows[3]["description_1"],
                     "label": {"1": "2", "2": "1"}[rows[3]["label"]]})  # fmt: skip
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    argv = {
        "evaluate": ["evaluate", "--model", rm_dir, "--data", data],
        "judge": ["judge", "--judge", length_judge_yaml, "--data", data, "--output", tmp_path / "j", "--no-progress"],
        "train": ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, data), "--cv_folds", "3"],
    }[command]
    code, _, err = run_cli(capsys, argv)
    assert_refused(code, err, str(data), "row 18", "row 4", "'annotator'", "the same annotator 'a'")
    assert not (tmp_path / "out" / "cv").exists()  # no fold trained
