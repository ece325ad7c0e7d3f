"""The model card's `license` and `datasets` are the training data's own (unknown when unknown), through
`emoreward train`, and the export's card says the same (`emoreward.models.cards.data_metadata`)."""

from __future__ import annotations

from pathlib import Path

from _helpers import synthetic_pairs
from test_training_run import tiny_recipe, write_pairs_csv

from emoreward.cli import main
from emoreward.models.cards import DataMetadata, data_metadata


def front(card: str) -> str:
    return card.split("---\n")[1]


def licensed_folder(path: Path, license: str) -> Path:
    """A `save_to_disk` dataset folder (emoreward columns) whose info names `license`."""
    from datasets import Dataset, DatasetInfo

    rows = {k: [] for k in ("sample_id", "description_1", "description_2", "label")}
    for p in synthetic_pairs(16):
        for key in rows:
            rows[key].append(getattr(p, key))
    Dataset.from_dict(rows, info=DatasetInfo(license=license)).save_to_disk(path)
    return path


def test_data_metadata_of_each_source(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert data_metadata("emoprefer") == DataMetadata("cc-by-nc-4.0", ())
    assert data_metadata(str(write_pairs_csv(tmp_path / "p.csv", synthetic_pairs(4)))) == DataMetadata("unknown", ())
    assert data_metadata(str(licensed_folder(tmp_path / "ds", "apache-2.0"))) == DataMetadata("apache-2.0", ())
    readme = tmp_path / "hub-layout"
    readme.mkdir()
    (readme / "README.md").write_text("---\nlicense: mit\npretty_name: x\n---\n# data\n")
    assert data_metadata(str(readme)).license == "mit"
    # a Hub dataset not in the cache (offline): its id is known, its licence is not
    assert data_metadata("hf://someone/emotion-pairs") == DataMetadata("unknown", ("someone/emotion-pairs",))


def test_card_licence_follows_the_training_data(tiny_bert_dir, tmp_path, capsys):
    from emoreward.models import load_reward_model

    settings = {"cv_folds": 0, "max_steps": 1, "calibrate_tie_threshold": False}
    own = tiny_recipe(tmp_path, tiny_bert_dir, **settings)  # the user's own CSV: licence unknown
    assert main(["train", "--config", str(own)]) == 0
    card = (tmp_path / "out" / "model" / "README.md").read_text()
    assert "license: unknown" in front(card) and "datasets:" not in front(card)
    assert "cc-by-nc" not in card.lower() and "licence is unknown" in card
    folder = licensed_folder(tmp_path / "ds", "apache-2.0")
    assert (
        main(["train", "--config", str(own), "--set", f"train_file={folder}", "--output-dir", str(tmp_path / "o2")])
        == 0
    )
    card = (tmp_path / "o2" / "model" / "README.md").read_text()
    assert "license: apache-2.0" in front(card)
    # the export's card reads the same record
    from emoreward.export.hf import export_card

    assert "license: apache-2.0" in front(export_card(load_reward_model(tmp_path / "o2" / "model")))
    capsys.readouterr()
