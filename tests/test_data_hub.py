"""Hub datasets and local dataset folders: the `hf://` id, offline and unreachable failures in one line, a
push and a pinned load against a Hub imitation on loopback (never the real Hub), `save_to_disk` and data-file
folders."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from datasets import Dataset, DatasetDict
from hub_mock import MockHub, hub_env

from emoreward.cli import main
from emoreward.data import DataError, HubPushError, load_pairs, push_records_to_hub, read_pairs
from emoreward.data.hub import HubDatasetSpec, parse_hub_spec


REPO = Path(__file__).resolve().parents[1]
ROWS = [
    {"name": "v1", "a1": "calm", "a2": "tense", "preference": "a2"},
    {"name": "v2", "a1": "sad", "a2": "angry", "preference": "same"},
]
TRL_ROWS = [{"chosen": "Surprised, then hurt.", "rejected": "Happy.", "tie": False}]


# ------------------------------------------------------------------------------------------------ the hf:// id


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("hf://me/pairs", HubDatasetSpec("me/pairs")),
        ("hf://me/pairs:test", HubDatasetSpec("me/pairs", split="test")),
        ("hf://me/pairs/with_models@v1.0:train", HubDatasetSpec("me/pairs", "with_models", "v1.0", "train")),
        ("hf://me/pairs@refs/pr/3:train[:10]", HubDatasetSpec("me/pairs", None, "refs/pr/3", "train[:10]")),
        ("hf://Org-1/my.data_set@3f2a9c1", HubDatasetSpec("Org-1/my.data_set", revision="3f2a9c1")),
    ],
)
def test_hub_ids_parse_and_print_back(spec, expected):
    assert parse_hub_spec(spec) == expected
    assert str(expected) == spec


@pytest.mark.parametrize("spec", ["hf://pairs", "hf://me/pairs@", "hf://me/pairs:", "hf://a/b/c/d", "hf://me/-x"])
def test_malformed_hub_ids_give_the_syntax(spec):
    with pytest.raises(DataError, match=r"malformed Hub dataset id: .*expected hf://OWNER/NAME\[/CONFIG\]"):
        load_pairs(spec)


def test_an_owner_name_path_that_does_not_exist_hints_at_hf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"not found: me/pairs; for the Hub dataset 'me/pairs' write hf://me/pairs"
    ):
        load_pairs("me/pairs")


# ------------------------------------------------------------------------------------------------------ offline


def offline_mode():
    from huggingface_hub import constants

    return constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE


@pytest.mark.parametrize("spec", ["hf://owner/name@v1:train", "hf://owner/name"])
def test_offline_hub_load_fails_in_one_line_naming_the_dataset(spec):
    assert offline_mode(), "the test suite runs with HF_HUB_OFFLINE=1"
    with pytest.raises(DataError) as info:
        load_pairs(spec)
    message = str(info.value)
    assert message.startswith(f"{spec}: cannot load offline (HF_HUB_OFFLINE=1)") and "\n" not in message


def test_the_cli_prints_the_offline_failure_as_one_line(tmp_path, capsys):
    assert main(["evaluate", "--model", str(tmp_path), "--data", "hf://owner/name@v1:test"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hf://owner/name@v1:test: cannot load offline" in err


def test_offline_push_is_refused_in_one_line():
    with pytest.raises(HubPushError, match=r"^cannot push to the Hub dataset 'me/judgements': offline mode is on"):
        push_records_to_hub([{"sample_id": "v1", "verdict": "FIRST"}], "me/judgements")


def test_unreachable_hub_fails_fast_in_one_line(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "from emoreward.data import DataError, load_pairs\n"
        "try:\n    load_pairs('hf://me/pairs@v1:train')\n"
        "except DataError as err:\n    print(err)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=hub_env(tmp_path, f"http://127.0.0.1:{port}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("\n") == 1
    assert run.stdout.startswith(f"hf://me/pairs@v1:train: cannot reach the Hub at http://127.0.0.1:{port} (")
    assert "set HF_HUB_OFFLINE=1" in run.stdout


PUSH_AND_LOAD = r"""
import json
import datasets
from emoreward.data import DataError, load_pairs, push_records_to_hub

rows = json.loads(ROWS_JSON)
info = push_records_to_hub(rows, "me/pairs")
out = {"oid": info.oid}
out["rows_back"] = datasets.load_dataset("me/pairs", split="train", revision=info.oid).to_list()
out["pairs"] = [[p.sample_id, p.description_1, p.label] for p in load_pairs(f"hf://me/pairs@{info.oid}:train")]
out["default_split"] = len(load_pairs("hf://me/pairs"))
out["errors"] = []
for spec in ("hf://me/nothing", "hf://me/pairs@v9:train", "hf://me/pairs:test"):
    try:
        load_pairs(spec)
    except DataError as err:
        out["errors"].append(str(err))
print("RESULT " + json.dumps(out))
"""


def test_push_then_load_a_pinned_revision_through_a_hub_on_loopback(tmp_path):
    hub = MockHub()
    try:
        run = subprocess.run(
            [sys.executable, "-c", PUSH_AND_LOAD.replace("ROWS_JSON", repr(json.dumps(ROWS)))],
            env=hub_env(tmp_path, hub.url),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        hub.close()
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert out["rows_back"] == ROWS
    assert out["pairs"] == [["v1", "calm", "2"], ["v2", "sad", "tie"]]
    assert out["default_split"] == 2
    files = hub.repos["me/pairs"]["commits"][out["oid"]]
    assert sorted(files) == ["README.md", "data/train-00000-of-00001.parquet"]
    assert hub.auth == {"Bearer hf_test_token"}
    assert out["errors"] == [
        f"hf://me/nothing: no dataset 'me/nothing' on the Hub at {hub.url}, or it is private (log in, or set HF_TOKEN)",
        "hf://me/pairs@v9:train: the dataset has no revision 'v9'",
        "hf://me/pairs:test: cannot load the dataset: ValueError: Unknown split \"test\". Should be one of ['train'].",
    ]


# ------------------------------------------------------------------------------------------------ local folders


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """Keep the arrow files `load_dataset` prepares for a local folder inside the test's directory."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def test_a_save_to_disk_folder_loads(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    loaded = read_pairs(tmp_path / "saved")
    assert [(p.sample_id, p.label) for p in loaded.pairs] == [("v1", "2"), ("v2", "tie")]
    assert (loaded.source, loaded.n_records, loaded.layout) == (str(tmp_path / "saved"), 2, "emoprefer")


def test_a_saved_dataset_dict_gives_train_or_the_split_asked(tmp_path):
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:1])}).save_to_disk(
        str(tmp_path / "dd")
    )
    assert len(load_pairs(tmp_path / "dd")) == 2
    assert len(load_pairs(tmp_path / "dd", split="test")) == 1
    with pytest.raises(DataError, match=r"dd: no split 'dev'; the splits are \['test', 'train'\]"):
        load_pairs(tmp_path / "dd", split="dev")
    with pytest.raises(DataError, match=r"split='test' applies to dataset folders, not to a file"):
        load_pairs("emoprefer", split="test")


def test_a_data_file_folder_in_the_hub_layout_loads(tmp_path, datasets_cache):
    folder = tmp_path / "repo"
    (folder / "data").mkdir(parents=True)
    Dataset.from_list(TRL_ROWS).to_parquet(str(folder / "data" / "test-00000-of-00001.parquet"))
    pair = load_pairs(folder)[0]  # no train split: the only split
    assert (pair.description_1, pair.description_2, pair.label) == ("Happy.", "Surprised, then hurt.", "2")
    two = [{"chosen": "Angry.", "rejected": "Calm.", "tie": True}, *TRL_ROWS]
    Dataset.from_list(two).to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
    assert [p.label for p in load_pairs(folder)] == ["tie", "2"]  # train, when there is one
    assert load_pairs(folder, split="test")[0].description_1 == "Happy."


def test_a_jsonl_folder_with_a_byte_order_mark_loads(tmp_path, datasets_cache):
    folder = tmp_path / "bom"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert [p.description_2 for p in load_pairs(folder)] == ["tense", "angry"]


def test_a_folder_datasets_cannot_read_is_one_line(tmp_path, datasets_cache):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as info:
        load_pairs(tmp_path / "empty")
    assert str(info.value).startswith(f"{tmp_path / 'empty'}: not a dataset folder datasets can read: ")
    assert "\n" not in str(info.value)
