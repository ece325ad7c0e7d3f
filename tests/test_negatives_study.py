"""The controlled-negatives probe study (`scripts/studies/negatives_study.py`) through its entry point on a tiny model
and a dozen pairs: what each setting trains on, that the held-out negatives' counts add up, and that its margin table
and its controlled-error sections agree."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from emoreward.data import PreferencePair
from emoreward.data.negatives import KINDS, generate_negatives
from emoreward.training.pipeline import stratified_folds


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "studies"))
import negatives_study  # noqa: E402


EMOTIONS = ["happy", "sad", "angry", "calm"]


def _pairs(n: int = 12) -> list[PreferencePair]:
    """`n` pairs whose preferred description names an emotion, an intensity, a facial and a vocal cue, and 3 ties."""
    out = []
    for i in range(n):
        good = f"In clip {i} she is very {EMOTIONS[i % 4]}, smiling, and her voice is loud. She waves her arms."
        bad = f"In clip {i} she says something."
        out.append(PreferencePair(f"s{i}", good, bad, "1", row=i + 1) if i % 2 else PreferencePair(
            f"s{i}", bad, good, "2", row=i + 1))  # fmt: skip
    # three tie pairs (one per fold) with nothing to edit: the tie threshold is calibrated on them
    out += [PreferencePair(f"t{i}", f"In clip t{i} she says something.", f"In clip t{i} she said a thing.", "tie",
                           row=n + i + 1) for i in range(3)]  # fmt: skip
    return out


def _write(pairs, path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sample_id", "description_1", "description_2", "label"])
        writer.writerows([p.sample_id, p.description_1, p.description_2, p.label] for p in pairs)
    return path


def test_the_study_runs_each_setting_on_the_same_folds(tiny_bert_dir, tmp_path, capsys):
    pairs = _pairs()
    data = _write(pairs, tmp_path / "pairs.csv")
    out = tmp_path / "study"
    argv = ["--model", str(tiny_bert_dir), "--train-file", str(data), "--folds", "3", "--output-dir", str(out),
            "--settings", "none", "all", "emotion_flip@2", "--epochs", "20"]  # fmt: skip
    assert negatives_study.main(argv) == 0
    results = json.loads((out / "study.json").read_text())
    assert "length baseline" in capsys.readouterr().out and (out / "study.md").exists()
    settings = results["settings"]
    # what each fit trains on: its training folds' own negatives (one of each kind per preferred description)
    folds = stratified_folds(pairs, 3, 42)
    per_fold = [generate_negatives([pairs[i] for i in tr]).per_kind for tr, _ in folds]
    assert all(set(kinds.values()) == {8} for kinds in per_fold)  # 8 training samples, every kind written
    assert settings["none"]["negatives_per_fold"] == [0, 0, 0]
    assert settings["all"]["negatives_per_fold"] == [8 * len(KINDS)] * 3
    assert settings["emotion_flip@2"]["negatives_per_fold"] == [8] * 3 and settings["emotion_flip@2"]["weight"] == 2
    for spec, s in settings.items():
        section = s["controlled_errors"]
        # the held-out negatives: every sample's in one fold, 12 of each kind
        assert section["n_negatives"] == 12 * len(KINDS), spec
        assert {k: row["n"] for k, row in section["kinds"].items()} == dict.fromkeys(KINDS, 12)
        # the length judge by hand: the original wins where the negative is shorter, ties where equal
        for kind, row in section["kinds"].items():
            negs = [n for n in generate_negatives(pairs).negatives if n.kind == kind]
            assert row["length_judge"]["prefers_original"] == sum(len(n.negative) < len(n.original) for n in negs)
            assert row["length_judge"]["ties"] == sum(len(n.negative) == len(n.original) for n in negs)
            # the margins table and the sections are the same verdicts: below the threshold = a tie; d > 0 = what
            # the judge that never ties prefers
            margin = s["margins"][kind]
            assert margin["n"] == 12
            assert margin["positive"] == s["controlled_errors_no_tie"]["kinds"][kind]["judge"]["prefers_original"]
            assert margin["below_threshold"] == row["judge"]["ties"]
        assert 0 <= s["summary"]["judge"]["two_class_waf"]["mean"] <= 100
        assert s["summary"]["length_baseline"]["two_class_waf"]["mean"] == pytest.approx(100.0)  # good is longer
    # the shortcut test: with no negatives trained every inserted word is new; an omission inserts none; with
    # flips trained, a held-out flip inserts a word the other folds' flips inserted (4 emotions, 8 samples each)
    none, flips = settings["none"]["margins"], settings["emotion_flip@2"]["margins"]
    assert [none[k]["unseen"] for k in KINDS] == [12, 12, 12, 0]
    assert flips["emotion_flip"]["unseen"] == 0 and flips["intensity_mismatch"]["unseen"] == 12
    assert none["emotion_flip"]["unseen_positive"] == none["emotion_flip"]["positive"]
    # (some fold calibrated a positive threshold on the tie pairs: the relation above is not only d == 0)
    assert any(t > 0 for s in settings.values() for t in s["margins"]["threshold_over_scale"])
    assert settings["none"]["controlled_errors"]["all"]["length_judge"] == settings["all"]["controlled_errors"][
        "all"]["length_judge"]  # fmt: skip
    # an omission drops a whole sentence: the features move; and the study is reproducible from its cache
    assert results["visibility"]["modality_omission"]["median_distance_over_human"] > 0
    assert negatives_study.main(argv) == 0
    assert json.loads((out / "study.json").read_text())["settings"] == settings


def test_a_bad_setting_is_one_line_and_exit_2(capsys):
    assert negatives_study.main(["--settings", "all@0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--settings all@0" in err


def test_several_weight_decays_are_chosen_per_fold_on_its_training_folds(tiny_bert_dir, tmp_path):
    data = _write(_pairs(), tmp_path / "pairs.csv")
    argv = ["--model", str(tiny_bert_dir), "--train-file", str(data), "--folds", "3", "--output-dir",
            str(tmp_path / "s"), "--settings", "none", "all", "--epochs", "20", "--weight-decay", "0.01", "1000",
            "--inner-folds", "2"]  # fmt: skip
    assert negatives_study.main(argv) == 0
    settings = json.loads((tmp_path / "s" / "study.json").read_text())["settings"]
    for s in settings.values():
        assert len(s["weight_decay_per_fold"]) == 3 and set(s["weight_decay_per_fold"]) <= {0.01, 1000.0}
    one = tmp_path / "one"
    single = ["--weight-decay", "1000", "--output-dir", str(one)]
    assert negatives_study.main(argv[: argv.index("--weight-decay")] + single) == 0
    assert json.loads((one / "study.json").read_text())["settings"]["all"]["weight_decay_per_fold"] == [1000.0] * 3
