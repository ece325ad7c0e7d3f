"""Training with controlled negatives (`controlled_negatives:` in a recipe): what a fit trains on, that a held-out
fold's negatives never train it, the recipe field's forms, the run identity, and `emoreward train` end to end."""

from __future__ import annotations

import json

import pytest
import yaml
from _helpers import synthetic_pairs
from test_training_run import tiny_recipe

from emoreward.data import PreferencePair
from emoreward.data.negatives import KINDS, generate_negatives, negatives_text
from emoreward.training.config import load_config
from emoreward.training.negatives import training_pairs
from emoreward.training.run_identity import run_identity


def emotional_pairs(n: int = 12) -> list[PreferencePair]:
    """Pairs whose preferred description names an emotion, an intensity, a facial and a vocal cue."""
    out = []
    for i in range(n):
        good = f"In clip {i} she is very happy, smiling, and her voice is loud. She waves her arms."
        bad = f"In clip {i} she says something."
        out.append(PreferencePair(f"s{i}", good, bad, "1", row=i + 1) if i % 2 else PreferencePair(
            f"s{i}", bad, good, "2", row=i + 1))  # fmt: skip
    return out


def config(tmp_path, **fields):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "minilm", "report_to": ["none"], **fields}))
    return load_config(path)


def test_a_fit_trains_on_its_pairs_and_the_negatives_of_their_preferred_descriptions(tmp_path):
    pairs = emotional_pairs(6)
    got = training_pairs(config(tmp_path, controlled_negatives=["emotion_flip"]), pairs)
    assert got.n_human == 6 and got.pairs[:6] == pairs
    negatives = got.pairs[6:]
    assert len(negatives) == got.per_kind["emotion_flip"] == 6  # one per preferred description
    for pair in negatives:
        source = next(p for p in pairs if p.sample_id == pair.sample_id)
        preferred = source.description_1 if source.label == "1" else source.description_2
        assert pair.label == "1" and pair.description_1 == preferred and pair.description_2 != preferred
        assert "happy" not in pair.description_2  # the named emotion flipped
    # no negatives asked: the human pairs alone
    plain = training_pairs(config(tmp_path), pairs)
    assert plain.pairs == pairs and plain.summary() == "6 human pairs"


def test_negatives_from_a_file_train_only_the_fit_of_their_samples(tmp_path):
    everything = emotional_pairs(8)
    file = tmp_path / "negatives.jsonl"
    file.write_text(negatives_text(generate_negatives(everything).negatives, "jsonl"))
    fold = everything[:5]  # a fold's training pairs: the other three samples are held out
    got = training_pairs(config(tmp_path, controlled_negatives=["all"], controlled_negatives_file=str(file)), fold)
    trained_samples = {p.sample_id for p in got.pairs[5:]}
    assert trained_samples == {p.sample_id for p in fold}
    assert sum(got.per_kind.values()) == len(got.pairs) - 5 > 5


def test_the_recipe_field_has_one_form(tmp_path):
    assert config(tmp_path, controlled_negatives=["all"]).controlled_negatives == list(KINDS)
    assert config(tmp_path, controlled_negatives=["modality_omission", "emotion_flip"]).controlled_negatives == [
        "emotion_flip",
        "modality_omission",
    ]
    assert config(tmp_path, controlled_negatives=[]).controlled_negatives is None
    with pytest.raises(ValueError, match="unknown kind 'sarcasm'"):
        config(tmp_path, controlled_negatives=["sarcasm"])
    with pytest.raises(
        ValueError, match="controlled_negatives_file='x.jsonl' does not apply with controlled_negatives=None"
    ):
        config(tmp_path, controlled_negatives_file="x.jsonl")


def test_the_run_identity_follows_the_setting_and_the_file_content(tmp_path):
    pairs = emotional_pairs(4)
    base = run_identity(config(tmp_path), pairs)["fingerprint"]
    flips = config(tmp_path, controlled_negatives=["emotion_flip"])
    assert run_identity(flips, pairs)["fingerprint"] != base
    file = tmp_path / "negatives.jsonl"
    file.write_text(negatives_text(generate_negatives(pairs).negatives, "jsonl"))
    with_file = config(tmp_path, controlled_negatives=["all"], controlled_negatives_file=str(file))
    first = run_identity(with_file, pairs)["fingerprint"]
    moved = tmp_path / "moved.jsonl"
    moved.write_text(file.read_text())
    same_content = config(tmp_path, controlled_negatives=["all"], controlled_negatives_file=str(moved))
    assert run_identity(same_content, pairs)["fingerprint"] == first  # the file's content, not its path
    file.write_text(negatives_text(generate_negatives(pairs, kinds=["emotion_flip"]).negatives, "jsonl"))
    assert run_identity(with_file, pairs)["fingerprint"] != first


def test_train_with_controlled_negatives_end_to_end(tiny_bert_dir, tmp_path, capsys, caplog):
    from emoreward.cli.main import main

    recipe = tiny_recipe(tmp_path, tiny_bert_dir, controlled_negatives=["all"], final_fit=False)
    import logging

    with caplog.at_level(logging.INFO, logger="emoreward.training.pipeline"):
        assert main(["train", "--config", str(recipe)]) == 0
    assert any("controlled negatives (" in r.getMessage() for r in caplog.records)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["recipe"]["controlled_negatives"] == list(KINDS)
    folds = report["cross_validation"]["folds"]
    assert all(f["n_train"] == 12 and f["n_train_negatives"] > 0 for f in folds)  # the human pairs, then the negatives
    assert f"12 human pairs + {folds[0]['n_train_negatives']} controlled negatives" in capsys.readouterr().out
    assert synthetic_pairs  # the tiny recipe's pairs: preferred descriptions with emotion words


def test_negatives_match_by_content_not_sample_id_and_a_foreign_file_is_refused(tmp_path):
    pairs = emotional_pairs(6)
    renamed = [PreferencePair(f"x{p.sample_id}", p.description_1, p.description_2, p.label, row=p.row) for p in pairs]
    file = tmp_path / "negatives.jsonl"
    file.write_text(negatives_text(generate_negatives(renamed[3:]).negatives, "jsonl"))  # of x3, x4, x5
    recipe = config(tmp_path, controlled_negatives=["all"], controlled_negatives_file=str(file))
    # the fit holds s0..s5: the file's samples are named otherwise, but x3..x5's texts are not s3..s5's sample
    assert training_pairs(recipe, pairs).pairs == pairs
    # a held-out description never trains, whatever its sample id: rename the file's negatives to the fit's ids
    shifted = generate_negatives([PreferencePair(f"s{k - 3}", p.description_1, p.description_2, p.label, row=p.row)
                                  for k, p in enumerate(pairs) if k >= 3]).negatives  # fmt: skip
    file.write_text(negatives_text(shifted, "jsonl"))
    fold = pairs[:3]  # s0..s2 train; the file edits s3..s5's descriptions under the ids s0..s2
    assert training_pairs(recipe, fold).pairs == fold
    with pytest.raises(ValueError, match="none of its .* negatives .* edits a preferred description"):
        training_pairs(recipe, fold, require_match=True)
