"""Bad input to `emoreward evaluate`: preference-pair files (CSV, JSON lines, JSON, parquet, TRL layout, Hub ids),
model directories (also for `emoreward export`) and options. Data are read before torch loads; each problem is one
line naming the file, the row or line, and the field."""

from __future__ import annotations

import json
import shutil

import pytest
from bad_input_helpers import GOOD_PAIRS, fails, run, write


HEADER = "name,a1,a2,preference\n"
ROW = {"sample_id": "s1", "description_1": "calm", "description_2": "tense", "label": "1"}


def evaluate(model, data, *options):
    return ["evaluate", "--model", model, "--data", data, *options]


PAIR_FILES = [
    # (id, file name, content, fragments: the first follows "<file>, " (or "<file>" when it starts with ":"))
    ("csv-unclosed-quote", "p.csv", HEADER + 'v1,x,"sad and then,a1\nv2,x,y",a2\nv3,p,q,a1\n',
     ["row 1, line 2, field 'a2': the quoted field that begins on this line does not close"]),
    ("csv-quote-never-closed", "p.csv", HEADER + 'v1,x,y,a1\nv2,"calm,y,a2\n', ["row 2, line 3, field 'a1'", "never closes"]),
    ("csv-text-after-quote", "p.csv", HEADER + 'v1,"She sighs" twice,y,a1\n', ["row 1, line 2, field 'a1'", "text after its closing quote"]),
    ("csv-duplicate-header", "p.csv", "name,a1,a1,preference\nv1,x,y,a1\n", ["header, field 'a1': duplicate column 'a1' (columns 2 and 3)"]),
    ("csv-missing-column", "p.csv", "name,a1,preference\nv1,x,a1\n", ["header, field 'a2': missing column"]),
    ("csv-two-names-for-a-field", "p.csv", "name,sample_id,a1,a2,preference\nv1,v1,x,y,a1\n", ["header, field 'name'", "all give the sample id"]),
    ("csv-bad-label", "p.csv", HEADER + "v1,x,y,a1\nv2,x,y,a3\n", ["row 2, field 'preference': unknown label 'a3'"]),
    ("csv-empty-description", "p.csv", HEADER + "v1,x,   ,a1\n", ["row 1, field 'a2': empty description"]),
    ("csv-nan-id", "p.csv", HEADER + "v1,x,y,a1\nNaN,x,y,a2\n", ["row 2, field 'name': missing value: the sample id 'NaN'"]),
    ("csv-na-id", "p.csv", HEADER + "N/A,x,y,a1\n", ["row 1, field 'name': missing value: the sample id 'N/A'"]),
    ("csv-sample-other-context", "p.csv", "name,a1,a2,preference,subtitle\nv1,x,y,a1,hi\nv1,p,q,a2,bye\n",
     ["row 2, field 'name': sample 'v1' names another video, audio or subtitle than at row 1"]),
    ("csv-annotator-twice", "p.csv", "name,a1,a2,preference,annotator\nv1,x,y,a1,ann\nv1,y,x,a2,ann\n",
     ["row 2, field 'annotator': repeats the pair of row 1 by the same annotator 'ann'"]),
    ("csv-extra-cell", "p.csv", HEADER + "v1,x,y,a1,oops\n", ["row 1: more cells (5) than the 4 header columns (line 2)"]),
    ("csv-latin1", "p.csv", (HEADER + "v1,ok,y,a1\nv2,caf\xe9 au lait,y,a2\n").encode("latin-1"),
     ["row 2, line 3, field 'a1': undecodable bytes b'\\xe9'"]),
    ("csv-latin1-header", "p.csv", "name,a1,a2,pr\xe9f\n".encode("latin-1"), ["header, line 1, field 'column 4': undecodable"]),
    ("csv-utf16", "p.csv", (HEADER + "v1,x,y,a1\n").encode("utf-16"), [": the file is UTF-16 or UTF-32"]),
    ("csv-empty-file", "p.csv", "", [": the file is empty"]),
    ("csv-header-only", "p.csv", HEADER, [": no data rows"]),
    ("jsonl-bad-json", "p.jsonl", json.dumps(ROW) + '\n{"sample_id": "s2", "label": \n', ["row 2: invalid JSON on line 2"]),
    ("jsonl-missing-field", "p.jsonl", json.dumps({k: v for k, v in ROW.items() if k != "description_2"}) + "\n",
     ["header, field 'description_2': missing column"]),
    ("jsonl-wrong-type", "p.jsonl", json.dumps({**ROW, "description_2": 5}) + "\n", ["row 1, field 'description_2': expected text, got int"]),
    ("jsonl-label-bool", "p.jsonl", json.dumps({**ROW, "label": True}) + "\n", ["row 1, field 'label': unknown label True"]),
    ("jsonl-duplicate-key", "p.jsonl", json.dumps(ROW) + '\n{"sample_id": "s2", "label": "1", "label": "2"}\n',
     ["row 2, line 2, field 'label': the key appears twice"]),
    ("jsonl-not-an-object", "p.jsonl", json.dumps(ROW) + "\n[1, 2]\n", ["row 2: line 2 is a JSON list, expected an object"]),
    ("jsonl-latin1", "p.jsonl", json.dumps(ROW).encode() + b'\n{"sample_id": "s2", "description_1": "caf\xe9"}\n',
     ["row 2, line 2, field 'description_1': undecodable bytes"]),
    ("json-array-bad", "p.json", '[{"name": "v1",\n "a1": }]', ["line 2: invalid JSON"]),
    ("parquet-not-parquet", "p.parquet", "not parquet", [": not a readable parquet file"]),
    ("unsupported-suffix", "p.txt", "x", [": unsupported file type '.txt'"]),
    ("trl-missing-rejected", "p.jsonl", '{"chosen": "calm"}\n', ["header, field 'rejected': missing column (TRL layout)"]),
    ("trl-final-turn-not-assistant", "p.jsonl",
     json.dumps({"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}) + "\n",
     ["row 1, field 'chosen': the final message is the 'user' turn"]),
    ("trl-prompts-differ", "p.jsonl",
     json.dumps({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
                 "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "y"}]}) + "\n",
     ["row 1, field 'rejected': the turns before the final assistant message differ"]),
    ("trl-bad-tie", "p.jsonl", '{"chosen": "x", "rejected": "y", "tie": "maybe"}\n', ["row 1, field 'tie': expected true or false"]),
    ("trl-mixed-layouts", "p.jsonl", '{"chosen": "x", "rejected": "y", "label": "1"}\n', ["header: columns ['chosen', 'rejected'] (TRL layout)"]),
    ("trl-two-subtitles", "p.jsonl",
     json.dumps({"prompt": "Subtitle: hi", "chosen": "x", "rejected": "y", "subtitle": "bye"}) + "\n",
     ["row 1, field 'subtitle': 'bye' differs from the subtitle in the prompt"]),
]  # fmt: skip


@pytest.mark.parametrize("name, content, fragments", [c[1:] for c in PAIR_FILES], ids=[c[0] for c in PAIR_FILES])
def test_bad_pair_files_name_file_row_and_field(rm_dir, tmp_path, capsys, name, content, fragments):
    data = write(tmp_path / name, content)
    first = f"{data}{fragments[0]}" if fragments[0].startswith(":") else f"{data}, {fragments[0]}"
    fails(evaluate(rm_dir, data), capsys, first, *fragments[1:])


def test_a_missing_data_file(rm_dir, tmp_path, capsys):
    fails(evaluate(rm_dir, tmp_path / "nope.csv"), capsys, f"preference data file not found: {tmp_path / 'nope.csv'}")


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ("hf://nobody/nothing-here", ["hf://nobody/nothing-here: cannot load offline (HF_HUB_OFFLINE=1)"]),
        ("hf://nobody", ["hf://nobody: malformed Hub dataset id", "hf://OWNER/NAME"]),
        ("hf://me/pairs@", ["hf://me/pairs@: malformed Hub dataset id", "'@' must be followed by a revision"]),
    ],
    ids=["offline-not-cached", "no-name", "empty-revision"],
)
def test_hub_ids_offline_or_malformed(rm_dir, capsys, monkeypatch, spec, fragments):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fails(evaluate(rm_dir, spec), capsys, *fragments)


def test_an_empty_data_path(rm_dir, capsys):
    fails(evaluate(rm_dir, ""), capsys, "'': an empty path names no data source")


def test_a_folder_that_is_not_a_dataset(rm_dir, tmp_path, capsys):
    fails(evaluate(rm_dir, tmp_path), capsys, f"{tmp_path}: not a dataset folder datasets can read")


def test_a_byte_order_mark_is_fine(rm_dir, tmp_path, capsys):
    data = write(tmp_path / "bom.csv", b"\xef\xbb\xbf" + GOOD_PAIRS.encode())
    code, out, err = run(evaluate(rm_dir, data), capsys)
    assert code == 0 and err == "" and f"on {data} (2 pairs)" in out


# ---------------------------------------------------------------------------------------------- model directories
@pytest.fixture()
def broken_model(rm_dir, tmp_path):
    """A copy of the tiny reward model with `emoreward_config.json` replaced."""

    def make(settings: str):
        path = tmp_path / "model"
        shutil.copytree(rm_dir, path)
        (path / "emoreward_config.json").write_text(settings)
        return path

    return make


def test_a_folder_that_is_not_a_model(good_pairs, tmp_path, capsys):
    fails(evaluate(tmp_path, good_pairs), capsys, f"{tmp_path} is not an emoreward model directory: emoreward_config")


def test_the_traceback_on_request(good_pairs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EMOREWARD_TRACEBACK", "1")  # for bug reports: the one line, and the traceback above it
    code, _, err = run(evaluate(tmp_path / "nope", good_pairs), capsys)
    assert code == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1] == f"emoreward evaluate: error: model directory not found: {tmp_path / 'nope'}"


def test_output_that_is_the_data_file_itself_is_refused(rm_dir, tmp_path, capsys):
    data = write(tmp_path / "pairs.csv", GOOD_PAIRS)
    before = data.read_bytes()
    fails(evaluate(rm_dir, data, "--output", data), capsys, f"--output {data} is the input file")
    assert data.read_bytes() == before


def test_output_where_nothing_can_be_written_is_refused_before_scoring(rm_dir, good_pairs, capsys):
    fails(
        evaluate(rm_dir, good_pairs, "--output", "/proc/emoreward/r.json"), capsys, "cannot write in /proc/emoreward"
    )


def test_a_model_that_is_a_file(good_pairs, capsys):
    fails(evaluate(good_pairs, good_pairs), capsys, f"{good_pairs} is a file, not a model directory")


@pytest.mark.parametrize("missing", ["tokenizer.json", "adapter_model.safetensors"])
def test_a_model_folder_missing_a_file(tiny_adapter_dir, tmp_path, good_pairs, capsys, missing):
    """Without tokenizer.json transformers builds another tokenizer from what is left, and every text got the same
    reward: refused instead, as a missing adapter is (peft's own message named no file)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_adapter_dir, model)
    (model / missing).unlink()
    fails(evaluate(model, good_pairs), capsys, f"{model}: {missing} is missing")


def test_a_model_folder_that_does_not_exist(good_pairs, tmp_path, capsys):
    fails(evaluate(tmp_path / "nope", good_pairs), capsys, f"model directory not found: {tmp_path / 'nope'}")


def test_a_torn_settings_file(broken_model, good_pairs, capsys):
    model = broken_model('{"kind": "text", "max_len')
    fails(
        evaluate(model, good_pairs), capsys, f"{model / 'emoreward_config.json'}: not valid JSON", "line 1 column 18"
    )


def test_a_model_folder_without_weights(rm_dir, tmp_path, good_pairs, capsys):
    model = tmp_path / "model"
    shutil.copytree(rm_dir, model)
    (model / "model.safetensors").unlink()
    fails(evaluate(model, good_pairs), capsys, f"{model}: model.safetensors is missing")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_a_weights_file_cut_short(rm_dir, tmp_path, good_pairs, capsys, keep):
    """An interrupted copy: the header cut (50%) or only the last bytes of the tensors missing (99.9%)."""
    model = tmp_path / "model"
    shutil.copytree(rm_dir, model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    fails(evaluate(model, good_pairs), capsys, f"{weights}: not a complete safetensors file", "copy or save")


def test_an_unknown_model_kind(broken_model, good_pairs, capsys):
    model = broken_model('{"kind": "video"}')
    fails(evaluate(model, good_pairs), capsys, f"{model / 'emoreward_config.json'}: unknown kind 'video'")


def test_an_unknown_settings_key(broken_model, good_pairs, capsys):
    model = broken_model('{"kind": "text", "max_lenght": 32}')
    fails(evaluate(model, good_pairs), capsys, f"{model / 'emoreward_config.json'}: unknown keys ['max_lenght']")


def test_export_into_the_model_itself_or_inside_it(rm_dir, capsys):
    fails(["export", "--model", rm_dir, "--output", rm_dir], capsys, f"--output {rm_dir} is --model {rm_dir}")
    inside = rm_dir / "export"
    fails(["export", "--model", rm_dir, "--output", inside], capsys, f"--output {inside} lies inside --model {rm_dir}")
    assert not inside.exists()


def test_export_onto_a_file(rm_dir, tmp_path, capsys):
    target = write(tmp_path / "f.txt", "x")
    fails(["export", "--model", rm_dir, "--output", target], capsys, f"--output {target} is a file")


def test_export_of_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    fails(
        ["export", "--model", tmp_path / "m", "--output", tmp_path / "e"],
        capsys,
        f"{tmp_path / 'm'} is not an emoreward model",
    )


@pytest.mark.parametrize("command", ["export", "serve"])
def test_a_trained_judge_is_named_as_one_with_what_takes_it(command, tmp_path, capsys):
    """A trained generative judge's folder (`judge.yaml` beside a causal LM) is not a reward model: `export` and
    `serve` say what it is and where it goes (`emoreward.models.base.load_settings`, the one opening of a model
    directory), not that a settings file is missing."""
    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "judge.yaml").write_text("name: trained\n")
    (judge / "config.json").write_text("{}\n")
    options = ["--output", tmp_path / "e"] if command == "export" else ["--port", "0"]
    line = fails([command, "--model", judge, *options], capsys, f"{judge} is a trained generative judge (judge.yaml)")
    assert "serve it with vLLM" in line and "evaluate, judge and rank" in line and "is missing" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["judge"]


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--batch-size", "0"], ["argument --batch-size: expected an integer >= 1, got 0"]),
        (["--batch-size", "-3"], ["argument --batch-size: expected an integer >= 1, got -3"]),
        (["--two-class-ties", "maybe"], ["argument --two-class-ties: invalid choice: 'maybe'"]),
        (["--dtype", "float8"], ["argument --dtype: invalid choice: 'float8'"]),
    ],
    ids=["batch-size-zero", "batch-size-negative", "unknown-tie-policy", "unknown-dtype"],
)
def test_bad_options(rm_dir, good_pairs, capsys, options, fragments):
    fails(evaluate(rm_dir, good_pairs, *options), capsys, *fragments)


def test_output_that_is_a_folder_is_refused_before_scoring(rm_dir, good_pairs, tmp_path, capsys):
    fails(evaluate(rm_dir, good_pairs, "--output", tmp_path), capsys, f"--output {tmp_path} is a folder")


def test_output_below_a_file_is_refused_before_scoring(rm_dir, good_pairs, capsys):
    target = good_pairs / "report.json"
    fails(evaluate(rm_dir, good_pairs, "--output", target), capsys, f"--output {target}: {good_pairs} is a file")


def test_a_media_root_for_a_text_model(rm_dir, good_pairs, tmp_path, capsys):
    # a text reward model reads no media: the option cannot apply, whatever the folder (emoreward.judges.reads_media)
    (tmp_path / "media").mkdir()
    fails(evaluate(rm_dir, good_pairs, "--media-root", tmp_path / "media"), capsys, "--media-root applies to judges "
          f"that read media files; {rm_dir} reads text only")  # fmt: skip


def test_settings_that_are_not_an_object(broken_model, good_pairs, capsys):
    model = broken_model("[1]")
    fails(evaluate(model, good_pairs), capsys, f"{model / 'emoreward_config.json'}: expected a JSON object")


def test_a_settings_value_of_the_wrong_type(broken_model, good_pairs, capsys):
    model = broken_model('{"kind": "text", "max_length": "long"}')
    fails(
        evaluate(model, good_pairs), capsys, f"{model / 'emoreward_config.json'}, field 'max_length'", "expected int"
    )
