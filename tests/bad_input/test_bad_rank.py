"""Bad input to `emoreward rank`: description tables, subset options (`--models`, `--samples`, `--sample-ids`,
`--hierarchical`), fit and judge options, judges that are not judges, and outputs that could not be written. Every
problem is refused before any scoring, in one line naming the file, the line and the field, or the option."""

from __future__ import annotations

import json

import pytest
from bad_input_helpers import TABLE_ROWS, fails, jsonl, run, write


GOOD = jsonl(TABLE_ROWS)  # 9 lines: line 10 is the first one a case adds


@pytest.fixture()
def rank(tmp_path, rm_dir):
    """The argv of `emoreward rank` with the tiny reward model, a cache folder in tmp_path and 5 resamples."""

    def argv(data, *options, judge=None):
        cache = ["--cache-dir", tmp_path / "cache", "--n-boot", "5", "--quiet"]
        return ["rank", "--judge", judge or rm_dir, "--data", data, *cache, *options]

    return argv


TABLES = [
    # (id, content, fragments after "<table>")
    ("bad-json-line", GOOD + '{"sample": "s9", "model": "A", "description": \n', [", line 10: invalid JSON"]),
    ("missing-field", GOOD + '{"sample": "s9", "model": "A"}\n', [", line 10, field 'description': missing"]),
    ("wrong-type", GOOD + '{"sample": "s9", "model": "A", "description": 7}\n',
     [", line 10, field 'description': expected a string, got int"]),
    ("empty-model", GOOD + '{"sample": "s9", "model": "  ", "description": "x"}\n', [", line 10, field 'model': empty"]),
    ("duplicate-sample-model", GOOD + json.dumps(TABLE_ROWS[4]) + "\n",
     [", line 10, field 'model': a second description of sample 's1' by 'B' (the first is on line 5)"]),
    ("media-disagree", GOOD + '{"sample": "s0", "model": "D", "description": "x", "subtitle": "hi"}\n',
     [", line 10, field 'subtitle': sample 's0' has subtitle 'hi' here but None on line 1"]),
    ("media-wrong-type", GOOD + '{"sample": "s9", "model": "A", "description": "x", "video": 3}\n',
     [", line 10, field 'video': expected a string, got int"]),
    ("not-an-object", GOOD + "[1, 2]\n", [", line 10: expected a JSON object, got list"]),
    ("latin1", GOOD.encode() + b'{"sample": "s9", "model": "A", "description": "h\xe9las"}\n',
     [", line 10, field 'description': undecodable bytes b'\\xe9'"]),
    ("empty-file", "", [": no rows"]),
]  # fmt: skip


@pytest.mark.parametrize("content, fragments", [c[1:] for c in TABLES], ids=[c[0] for c in TABLES])
def test_bad_tables_name_file_line_and_field(rank, tmp_path, capsys, content, fragments):
    table = write(tmp_path / "table.jsonl", content)
    fails(rank(table), capsys, f"{table}{fragments[0]}", *fragments[1:])


def test_a_missing_table(rank, tmp_path, capsys):
    fails(rank(tmp_path / "nope.jsonl"), capsys, f"description table {tmp_path / 'nope.jsonl'} does not exist")


def test_a_byte_order_mark_is_fine(rank, tmp_path, capsys):
    table = write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + GOOD.encode())
    code, out, err = run(rank(table), capsys)
    assert code == 0 and err == "" and f"3 models x 3 samples from {table}" in out


SUBSETS = [
    # (id, options, fragments)
    ("unknown-model", ["--models", "A,Z"], ["--models: ['Z'] not in the table {table}; its models are ['A', 'B', 'C']"]),
    ("one-model", ["--models", "B"], ["--models: a ranking needs at least two models, got ['B']"]),
    ("repeated-model", ["--models", "A,B,A"], ["--models: ['A'] listed more than once in 'A,B,A'"]),
    ("samples-zero", ["--samples", "0"], ["argument --samples: expected an integer >= 1, got 0"]),
    ("samples-beyond-the-table", ["--samples", "99"], ["--samples 99: the table {table} has 3 samples"]),
    ("hierarchical-unknown-model", ["--hierarchical", "A,B|Z"], ["--hierarchical 'A,B|Z': unknown models in groups: ['Z']"]),
    ("hierarchical-too-many-groups", ["--hierarchical", "9"], ["--hierarchical '9': number of groups must be in [2, 3]"]),
    ("hierarchical-empty-group", ["--hierarchical", "A,B|C|"], ["--hierarchical 'A,B|C|': group 3 of 3 is empty"]),
    ("hierarchical-empty-middle-group", ["--hierarchical", "A||B,C"], ["--hierarchical 'A||B,C': group 2 of 3 is empty"]),
    ("hierarchical-repeated-model", ["--hierarchical", "A,B|B,C"], ["--hierarchical 'A,B|B,C': ['B'] named more than once"]),
    ("hierarchical-missing-model", ["--hierarchical", "A|B"], ["--hierarchical 'A|B': ", "['C'] in no group"]),
]  # fmt: skip


@pytest.mark.parametrize("options, fragments", [c[1:] for c in SUBSETS], ids=[c[0] for c in SUBSETS])
def test_bad_subsets_name_the_option_and_the_table(rank, good_table, capsys, options, fragments):
    fails(rank(good_table, *options), capsys, *[f.format(table=good_table) for f in fragments])


def test_sample_ids_not_in_the_table(rank, good_table, tmp_path, capsys):
    ids = write(tmp_path / "ids.txt", "s0\n\ns7\n")
    fails(
        rank(good_table, "--sample-ids", ids), capsys, f"{ids}, line 3: sample 's7' is not in the table {good_table}"
    )


def test_a_missing_sample_ids_file(rank, good_table, tmp_path, capsys):
    fails(
        rank(good_table, "--sample-ids", tmp_path / "ids.txt"), capsys, f"--sample-ids {tmp_path / 'ids.txt'}: no such"
    )


OPTIONS = [
    ("n-boot-negative", ["--n-boot", "-5"], ["argument --n-boot: expected an integer in [1, 100,000], got -5"]),
    ("n-boot-zero", ["--n-boot", "0"], ["argument --n-boot: expected an integer in [1, 100,000], got 0"]),
    ("n-boot-huge", ["--n-boot", "1000000000000"],
     ["argument --n-boot: expected an integer in [1, 100,000], got 1000000000000"]),
    ("seed-negative", ["--seed", "-1"], ["argument --seed: expected an integer >= 0, got -1"]),
    ("seed-not-a-number", ["--seed", "x"], ["argument --seed: expected an integer >= 0, got 'x'"]),
    ("alpha-above-one", ["--alpha", "1.5"], ["argument --alpha: expected a number between 0 and 1 (exclusive)"]),
    ("unknown-tie-model", ["--tie-model", "bogus"], ["argument --tie-model: invalid choice: 'bogus'"]),
    ("unknown-strategy", ["--strategy", "S7"], ["argument --strategy: invalid choice: 'S7'"]),
    ("batch-size-zero", ["--batch-size", "0"], ["argument --batch-size: expected an integer >= 1, got 0"]),
    ("negative-tie-threshold", ["--tie-threshold", "-1"], ["argument --tie-threshold: expected a number >= 0"]),
    ("nan-tie-threshold", ["--tie-threshold", "nan"], ["argument --tie-threshold: expected a number >= 0, got 'nan'"]),
    ("zero-runs", ["--runs", "0"], ["argument --runs: expected an integer >= 1, got 0"]),
    ("bpa-zero-budget", ["--method", "bpa", "--budget", "0"], ["argument --budget: expected an integer >= 1, got 0"]),
    ("bpa-zero-refit", ["--method", "bpa", "--refit-every", "0"], ["argument --refit-every: expected an integer >= 1"]),
    ("bpa-negative-sigma", ["--method", "bpa", "--sigma-tau", "-1"], ["argument --sigma-tau: expected a number > 0"]),
    ("bpa-hierarchical", ["--method", "bpa", "--hierarchical", "2"], ["--hierarchical is a --method full option"]),
    ("hierarchical-without-groups", ["--method", "hierarchical"], ["--method hierarchical ranks the --hierarchical groups"]),
    ("budget-with-hierarchical", ["--method", "hierarchical", "--hierarchical", "2", "--budget", "5"], ["--budget is a --method bpa option"]),
    ("budget-without-bpa", ["--budget", "50"], ["--budget is a --method bpa option; the full method compares every pair"]),
    ("policy-without-bpa", ["--policy", "paper"], ["--policy is a --method bpa option"]),
    ("sigma-without-bpa", ["--sigma-tau", "0.5"], ["--sigma-tau is a --method bpa option"]),
]  # fmt: skip


@pytest.mark.parametrize("options, fragments", [c[1:] for c in OPTIONS], ids=[c[0] for c in OPTIONS])
def test_bad_options_name_the_option(rank, good_table, capsys, options, fragments):
    fails(rank(good_table, *options), capsys, *fragments)


def test_output_that_is_a_folder_is_refused_before_scoring(rank, good_table, tmp_path, capsys):
    fails(rank(good_table, "--output", tmp_path), capsys, f"--output {tmp_path} is a folder")
    assert not (tmp_path / "cache").exists()  # nothing was scored


def test_output_that_is_the_table_itself_is_refused(rank, good_table, tmp_path, capsys):
    before = good_table.read_bytes()
    fails(rank(good_table, "--output", good_table), capsys, f"--output {good_table} is the input file")
    assert good_table.read_bytes() == before


def test_output_where_nothing_can_be_written_is_refused_before_scoring(rank, good_table, capsys):
    fails(
        rank(good_table, "--output", "/proc/emoreward/r.json"), capsys, "--output /proc/emoreward/r.json: cannot write"
    )


def test_a_dataset_file_of_an_unknown_kind_is_refused_before_scoring(rank, good_table, tmp_path, capsys):
    target = tmp_path / "ranking.csv"
    fails(rank(good_table, "--dataset", target), capsys, f"--dataset {target}: unknown suffix '.csv'")
    assert not (tmp_path / "cache").exists()


def test_a_media_root_for_a_text_model(rank, rm_dir, good_table, tmp_path, capsys):
    # the tiny reward model reads text only: --media-root cannot apply (emoreward.judges.reads_media), refused first
    (tmp_path / "media").mkdir()
    fails(rank(good_table, "--media-root", tmp_path / "media"), capsys, "--media-root applies to judges that read "
          f"media files; {rm_dir} read(s) text only")  # fmt: skip
    assert not (tmp_path / "cache").exists()


def test_a_judge_folder_that_is_not_a_model(rank, good_table, tmp_path, capsys):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    fails(
        rank(good_table, judge=folder), capsys, f"{folder} is not an emoreward model directory: emoreward_config.json"
    )


def test_a_judge_that_does_not_exist(rank, good_table, tmp_path, capsys):
    fails(rank(good_table, judge=tmp_path / "nope"), capsys, f"model directory not found: {tmp_path / 'nope'}")


def test_a_bad_judge_yaml(rank, good_table, tmp_path, capsys):
    spec = write(tmp_path / "j.yaml", "name: j\nmllm:\n  backend: scripted\n  model: m\n  fps: fast\n")
    fails(rank(good_table, judge=spec), capsys, f"{spec}, line 5: mllm.fps: expected a number, got str ('fast')")


def test_a_hub_id_is_named_as_given(rm_dir, capsys):
    """A Hub id where a local file or folder is read is one line naming it as typed (Path would drop a slash)."""
    fails(["rank", "--judge", rm_dir, "--data", "hf://nobody/table"], capsys,
          "description table hf://nobody/table does not exist", "a description table is a local JSONL file")  # fmt: skip
    fails(["evaluate", "--model", "hf://nobody/model", "--data", "emoprefer"], capsys,
          "model directory not found: hf://nobody/model")  # fmt: skip


def test_a_subtitle_that_leaves_no_room_is_named_before_any_scoring(tmp_path, rank, capsys):
    """The model reads at most 32 tokens: a sample whose subtitle alone fills them is refused in one line naming the
    table, the sample and the field, before any description is scored (red team B, F4)."""
    long = "she says that " * 20
    rows = [{**r, "subtitle": long} if r["sample"] == "s2" else r for r in TABLE_ROWS]
    data = write(tmp_path / "t.jsonl", jsonl(rows))
    fails(rank(data), capsys, str(data), "sample 's2', field 'subtitle'", "leaves no room for the description")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.jsonl"))
