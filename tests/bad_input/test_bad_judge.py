"""Bad input to `emoreward judge`: judge definitions (YAML syntax, keys, backends, types), reference-description
files, pair files and options. Every judge here runs on the scripted backend (no model); every problem is refused
before the first judge call, in one line naming the file, the line and the key or field."""

from __future__ import annotations

import pytest
from bad_input_helpers import fails, run, write


GOOD_JUDGE = "name: tj\nmllm: {backend: scripted, model: m}\n"


def judge(spec, data, output, *options):
    return ["judge", "--judge", spec, "--data", data, "--output", output, "--no-progress", *options]


JUDGE_FILES = [
    # (id, YAML, fragments after "<file>")
    ("invalid-yaml", "name: tj\nmllm: {backend: scripted, model: m\n", [", line 3, column 1: invalid YAML"]),
    ("invalid-yaml-mapping", "name: tj\nprompts: emoprefer_v1: x\n", [", line 2, column 22: invalid YAML"]),
    ("unknown-backend", "name: tj\nmllm: {backend: vllm, model: m}\n", [", line 2: mllm: backend: unknown 'vllm'", "'scripted'"]),
    ("missing-model", "name: tj\nmllm: {backend: scripted}\n", [", line 2: mllm: missing key 'model'"]),
    ("missing-mllm", "name: tj\nprompts: emoprefer_v1\n", [": missing key 'mllm'"]),
    ("mllm-not-a-mapping", "name: tj\nmllm: scripted\n", [", line 2: mllm: expected a mapping", "got str"]),
    ("unknown-key", GOOD_JUDGE + "temperature: 0.5\n", [", line 3: temperature: unknown key"]),
    ("unknown-model-key", "name: tj\nmllm:\n  backend: scripted\n  model: m\n  temp: 1\n", [", line 5: mllm.temp: unknown key"]),
    ("wrong-type", "name: tj\nmllm: {backend: scripted, model: m, batch_size: eight}\n",
     [", line 2: mllm.batch_size: expected an integer, got str ('eight')"]),
    ("bad-sampling-value", GOOD_JUDGE + "sampling:\n  temperature: 0\n", [", line 4: sampling: temperature must be > 0, got 0"]),
    ("bad-sampling-type", GOOD_JUDGE + "sampling: {max_new_tokens: lots}\n", [", line 3: sampling.max_new_tokens: expected an integer"]),
    ("unknown-verdict", GOOD_JUDGE + "verdict: vibes\n", [", line 3: verdict: unknown 'vibes'"]),
    ("unknown-prompt-set", GOOD_JUDGE + "prompts: nope_v9\n", [", line 3: prompts: unknown prompt set 'nope_v9'"]),
    ("openai-without-url", "name: tj\nmllm: {backend: openai, model: m}\n", [", line 2: mllm: base_url: required"]),
    ("not-a-mapping", "- name: tj\n", [": a judge definition is a mapping of keys to values, got list"]),
    ("latin1", (GOOD_JUDGE + "description: caf\xe9\n").encode("latin-1"), [", line 3: undecodable bytes b'\\xe9'"]),
]  # fmt: skip


@pytest.mark.parametrize("content, fragments", [c[1:] for c in JUDGE_FILES], ids=[c[0] for c in JUDGE_FILES])
def test_bad_judge_definitions_name_file_line_and_key(tmp_path, good_pairs, capsys, content, fragments):
    spec = write(tmp_path / "judge.yaml", content)
    fails(judge(spec, good_pairs, tmp_path / "out"), capsys, f"{spec}{fragments[0]}", *fragments[1:])
    assert not (tmp_path / "out").exists()


def test_an_unknown_registered_judge(good_pairs, tmp_path, capsys):
    fails(judge("no-such-judge", good_pairs, tmp_path / "out"), capsys, "unknown judge 'no-such-judge'; available:")


def test_a_missing_judge_file(good_pairs, tmp_path, capsys):
    spec = tmp_path / "nope.yaml"
    fails(judge(spec, good_pairs, tmp_path / "out"), capsys, f"judge definition not found: {spec}")


REFERENCES = [
    # (id, file name, content, fragments after "<file>, ")
    ("bad-json-line", "r.jsonl", '{"sample_id": "v1", "description": "calm"}\n{"sample_id": "v2", "description": \n',
     ["line 2: malformed JSON"]),
    ("missing-description", "r.jsonl", '{"sample_id": "v1"}\n', ["line 1, field 'description': missing"]),
    ("missing-sample-id", "r.jsonl", '{"description": "calm"}\n', ["line 1, field 'sample_id': missing"]),
    ("description-not-text", "r.jsonl", '{"sample_id": "v1", "description": 5}\n',
     ["line 1, field 'description': expected text, got int"]),
    ("duplicate-sample", "r.jsonl", '{"sample_id": "v1", "description": "a"}\n\n{"name": "v1", "reference": "b"}\n',
     ["line 3, field 'name': duplicate sample id 'v1' (first on line 1)"]),
    ("not-an-object", "r.jsonl", "[1]\n", ["line 1: expected a JSON object, got list"]),
    ("latin1", "r.jsonl", b'{"sample_id": "v1", "description": "caf\xe9"}\n', ["line 1, field 'description': undecodable"]),
    ("csv-empty-description", "r.csv", "sample_id,description\nv1,calm\nv2,\n", ["line 3, field 'description': missing"]),
]  # fmt: skip


@pytest.mark.parametrize("name, content, fragments", [c[1:] for c in REFERENCES], ids=[c[0] for c in REFERENCES])
def test_bad_reference_files_name_file_line_and_field(
    judge_yaml, good_pairs, tmp_path, capsys, name, content, fragments
):
    refs = write(tmp_path / name, content)
    argv = judge(judge_yaml, good_pairs, tmp_path / "out", "--strategy", "S2", "--references", refs)
    fails(argv, capsys, f"{refs}, {fragments[0]}", *fragments[1:])


def test_references_that_miss_a_sample_without_media(judge_yaml, good_pairs, tmp_path, capsys):
    refs = write(tmp_path / "r.jsonl", '{"sample_id": "v1", "description": "calm"}\n')
    argv = judge(judge_yaml, good_pairs, tmp_path / "out", "--strategy", "S1", "S3", "--references", refs)
    fails(argv, capsys, f"--references {refs}: no reference description for sample 'v2' ({good_pairs}, row 2)", "S3")


def test_no_references_and_no_media_for_s2(judge_yaml, good_pairs, tmp_path, capsys):
    fails(judge(judge_yaml, good_pairs, tmp_path / "out", "--strategy", "S2"), capsys, "no --references file", "row 1")


def test_a_missing_reference_file(judge_yaml, good_pairs, tmp_path, capsys):
    refs = tmp_path / "nope.jsonl"
    argv = judge(judge_yaml, good_pairs, tmp_path / "out", "--strategy", "S2", "--references", refs)
    fails(argv, capsys, f"reference-description file not found: {refs}")


def test_bad_pairs(judge_yaml, tmp_path, capsys):
    data = write(tmp_path / "p.csv", "name,a1,a2,preference\nv1,x,y,a1\nv2,x,y,second\n")
    fails(judge(judge_yaml, data, tmp_path / "out"), capsys, f"{data}, row 2, field 'preference': unknown label")


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--strategy", "S9"], ["argument --strategy: invalid choice: 'S9'"]),
        (["--runs", "0"], ["argument --runs: expected an integer >= 1, got 0"]),
        (["--limit", "-1"], ["argument --limit: expected an integer >= 1, got -1"]),
        (["--two-class-ties", "both"], ["argument --two-class-ties: invalid choice: 'both'"]),
    ],
    ids=["unknown-strategy", "zero-runs", "negative-limit", "unknown-tie-policy"],
)
def test_bad_options(judge_yaml, good_pairs, tmp_path, capsys, options, fragments):
    fails(judge(judge_yaml, good_pairs, tmp_path / "out", *options), capsys, *fragments)


def test_output_that_is_a_file_is_refused_before_any_call(judge_yaml, good_pairs, capsys):
    fails(judge(judge_yaml, good_pairs, good_pairs), capsys, f"--output {good_pairs} is a file")


def test_a_dataset_file_of_an_unknown_kind_is_refused_before_any_call(judge_yaml, good_pairs, tmp_path, capsys):
    target = tmp_path / "judgements.csv"
    fails(
        judge(judge_yaml, good_pairs, tmp_path / "out", "--dataset", target),
        capsys,
        f"--dataset {target}: unknown suffix '.csv'",
    )
    assert not (tmp_path / "out").exists()


def test_a_media_root_that_does_not_exist_is_not_ignored(good_pairs, tmp_path, capsys):
    # a judge that reads media (served, refused before any call)
    seeing = write(tmp_path / "seeing.yaml", "name: seeing\nmllm: {backend: openai, model: m, base_url: "
                   "'http://127.0.0.1:9/v1', modalities: [text, video]}\n")  # fmt: skip
    argv = judge(seeing, good_pairs, tmp_path / "out", "--media-root", tmp_path / "media")
    fails(argv, capsys, f"--media-root {tmp_path / 'media'}: no such folder")


def test_the_good_judge_runs(judge_yaml, good_pairs, tmp_path, capsys):
    code, out, err = run(judge(judge_yaml, good_pairs, tmp_path / "out", "--runs", "1"), capsys)
    assert code == 0 and err == "" and "scripted-judge" in out


@pytest.mark.parametrize(
    "mllm, reads",
    [
        ("{backend: transformers-text, model: ./model}", False),  # a trained text judge's definition
        ("{backend: scripted, model: m}", False),
        ("{backend: openai, model: m, base_url: 'http://127.0.0.1:9/v1', modalities: [text, video]}", True),
    ],
)
def test_a_media_root_applies_to_judges_that_read_media(mllm, reads, good_pairs, tmp_path, capsys):
    # `--media-root` where the judge's model reads no media would be ignored with exit 0: refused before any call.
    # The judge's folder (a trained judge: judge.yaml inside) is asked, not the pairs.
    from emoreward.judges import reads_media

    folder = tmp_path / "judge"
    write(folder / "judge.yaml", f"name: j\nmllm: {mllm}\n")
    (tmp_path / "media").mkdir()
    assert reads_media(folder) is reads
    if not reads:  # (a served judge that reads media would be called: the CLI run is for the text judges)
        argv = judge(folder, good_pairs, tmp_path / "out", "--media-root", tmp_path / "media")
        fails(argv, capsys, f"--media-root applies to judges that read media files; {folder} reads text only")
        assert not (tmp_path / "out").exists()
