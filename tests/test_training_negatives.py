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
    # each fold's held-out negatives are flagged new where no training negative of that fold made their edit: the
    # counts recomputed from the fold's own pairs (its held-out samples are the ones it scored)
    from emoreward.data.pairs import load_pairs
    from emoreward.evaluation.controlled import new_edit_flags

    recipe_config = load_config(recipe)
    pairs = load_pairs(recipe_config.train_file)
    for fold in folds:
        held = set(fold["pair_rewards"]["sample_id"])
        test = [p for p in pairs if p.sample_id in held]
        trained = training_pairs(recipe_config, [p for p in pairs if p.sample_id not in held]).edits
        negatives = generate_negatives(test).negatives
        flags = new_edit_flags(negatives, trained)
        section = fold["controlled_errors"]
        assert section["all"]["new_edits"]["n"] == sum(flags) and section["n_negatives"] == len(negatives)
        for kind, row in section["kinds"].items():
            assert row["new_edits"]["n"] == sum(f for f, n in zip(flags, negatives) if n.kind == kind)
    pooled = report["cross_validation"]["controlled_errors"]
    assert pooled["all"]["new_edits"]["n"] == sum(f["controlled_errors"]["all"]["new_edits"]["n"] for f in folds)
    assert "Edits no negative the judge trained on made" in (tmp_path / "out" / "report.md").read_text()


def test_negatives_match_by_content_not_sample_id_and_a_foreign_file_is_refused(tmp_path):
    pairs = emotional_pairs(6)
    renamed = [PreferencePair(f"x{p.sample_id}", p.description_1, p.description_2, p.label, row=p.row) for p in pairs]
    file = tmp_path / "negatives.jsonl"
    file.write_text(negatives_text(generate_negatives(renamed[3:]).negatives, "jsonl"))  # of xs3, xs4, xs5
    recipe = config(tmp_path, controlled_negatives=["all"], controlled_negatives_file=str(file))
    # text-only pairs read without a media root: a sample id is not part of a description (the pair loader's
    # identity, data.pairs.description_content), so xs3..xs5's negatives are s3..s5's and train the fit that holds them
    taken = training_pairs(recipe, pairs)
    assert taken.pairs[:6] == pairs and {p.sample_id for p in taken.pairs[6:]} == {"xs3", "xs4", "xs5"}
    assert training_pairs(recipe, pairs[:3]).pairs == pairs[:3]  # never a fit without those descriptions
    # a held-out description never trains, whatever its sample id: rename the file's negatives to the fit's ids
    shifted = generate_negatives([PreferencePair(f"s{k - 3}", p.description_1, p.description_2, p.label, row=p.row)
                                  for k, p in enumerate(pairs) if k >= 3]).negatives  # fmt: skip
    file.write_text(negatives_text(shifted, "jsonl"))
    fold = pairs[:3]  # s0..s2 train; the file edits s3..s5's descriptions under the ids s0..s2
    assert training_pairs(recipe, fold).pairs == fold
    with pytest.raises(ValueError, match="none of its .* negatives .* edits a preferred description"):
        training_pairs(recipe, fold, require_match=True)


def test_evaluate_flags_the_negatives_a_model_trained_on(tiny_bert_dir, tmp_path, capsys):
    """A model trained with controlled negatives, evaluated on new pairs against the negatives of its own training
    data (what `augment` writes from it): every negative is counted in-sample in the controlled section, JSON and
    Markdown alike; a human pair holding a negative it trained on is an in-sample pair (`training_data.json` records
    the negatives' pairs); the negatives of new pairs are not in-sample."""
    from test_training_run import write_pairs_csv

    from emoreward.cli.main import main
    from emoreward.data.negatives import read_negatives

    recipe = tiny_recipe(tmp_path, tiny_bert_dir, controlled_negatives=["all"], cv_folds=0, num_train_epochs=1)
    assert main(["train", "--config", str(recipe)]) == 0
    model = tmp_path / "out" / "model"
    negatives = tmp_path / "neg.jsonl"
    assert main(["augment", "--data", str(tmp_path / "train.csv"), "--output", str(negatives)]) == 0
    trained = read_negatives(negatives)
    record = json.loads((model / "training_data.json").read_text())
    assert record["n_pairs"] == 24 and record["n_negatives"] == len(trained) > 0
    new = synthetic_pairs(30)[24:]  # s24..s29: the same generator, samples the model never saw
    holding = PreferencePair("s99", trained[0].negative, "In clip 99 the woman is calm.", "2", row=7)
    held = write_pairs_csv(tmp_path / "held.csv", [*new, holding])
    capsys.readouterr()
    argv = ["evaluate", "--model", str(model), "--data", str(held), "--controlled-negatives", str(negatives)]
    assert main([*argv, "--output", str(tmp_path / "ev.json")]) == 0
    err = capsys.readouterr().err
    n = len(trained)
    assert f"warning: 1 of 7 pairs in {held} are pairs the model was trained on" in err
    assert f"warning: IN-SAMPLE: {n} of {n} controlled negatives" in err
    evaluation = json.loads((tmp_path / "ev.json").read_text())
    assert evaluation["n_in_sample_pairs"] == 1
    section = evaluation["controlled_errors"]
    assert section["n_negatives"] == section["n_in_sample"] == section["all"]["n_in_sample"] == n
    assert all(row["n_in_sample"] == row["n"] for row in section["kinds"].values())
    markdown = (tmp_path / "ev.md").read_text()
    assert f"**IN-SAMPLE: {n} of {n} negatives**" in markdown
    assert f"| all kinds | {n} | " in markdown and markdown.split("| all kinds |")[1].split("\n")[0].endswith(
        f" {n} |"
    )
    # the negatives of the new pairs (generated from the evaluated data): none in-sample, counted as 0, not unknown
    assert main(["evaluate", "--model", str(model), "--data", str(held), "--output", str(tmp_path / "ev2.json")]) == 0
    fresh = json.loads((tmp_path / "ev2.json").read_text())["controlled_errors"]
    assert fresh["n_negatives"] > 0 and fresh["n_in_sample"] == 0
    assert "negatives** are ones" not in (tmp_path / "ev2.md").read_text()
    # on its own training pairs, the negatives generated from them (the very negatives it trained on): all in-sample
    argv = [
        "evaluate",
        "--model",
        str(model),
        "--data",
        str(tmp_path / "train.csv"),
        "--output",
        str(tmp_path / "t.json"),
    ]
    assert main(argv) == 0
    own = json.loads((tmp_path / "t.json").read_text())
    assert own["n_in_sample_pairs"] == 24 and own["controlled_errors"]["n_in_sample"] == n
    # the record keeps the negatives' edits: the very negatives it trained on make no new edit; of the new pairs'
    # negatives, those whose edit none of them made are counted apart (recomputed here from the two files)
    assert record["negative_edits"] == sorted({t.edit_key() for t in trained})
    assert own["controlled_errors"]["all"]["new_edits"]["n"] == 0
    from emoreward.data.negatives import generate_negatives

    theirs = generate_negatives([*new, holding]).negatives  # what `evaluate --data held.csv` generated
    expected = sum(t.edit_key() not in set(record["negative_edits"]) for t in theirs)
    assert fresh["all"]["new_edits"]["n"] == expected > 0
