"""The controlled-error section (issue 38, deliver 4): Wilson intervals and per-kind shares against hand-computed
values, and the section through `emoreward evaluate` (a reward model) and `emoreward judge` (the scripted length
judge, both orders), from generated negatives or a file, JSON and Markdown from the same values."""

from __future__ import annotations

import json

import pytest
from _helpers import save_tiny_bert_rm

from emoreward.cli.main import main
from emoreward.data.negatives import read_negatives
from emoreward.data.negatives.records import make_negative
from emoreward.evaluation.controlled import controlled_markdown, controlled_section, wilson_interval


LENGTH_JUDGE = "name: lengthjudge\nmllm:\n  backend: scripted\n  model: length\n"


def test_wilson_interval_matches_hand_computed_values():
    # 8 of 10: centre (0.8 + 1.96^2/20) / (1 + 1.96^2/10) = 0.7167, half-width 0.2266 (Agresti and Coull 1998)
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(49.016, abs=1e-2) and hi == pytest.approx(94.331, abs=1e-2)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(27.753, abs=1e-2)
    assert wilson_interval(0, 0) is None


def test_section_counts_ties_as_stated_and_puts_the_length_judge_beside():
    flip = make_negative("a", "She is happy.", "emotion_flip", 7, 12, "sad")  # shorter by 2: length judge prefers it
    cue = make_negative("b", "He is smiling.", "evidence_contradiction", 6, 13, "frowning", modality="face")
    same = make_negative("c", "She is calm.", "emotion_flip", 7, 11, "cool")  # the same length: a length tie
    normal = [["1", "tie", "2"]]
    swapped = [["1", "2", "2"]]
    section = controlled_section([flip, cue, same], normal, swapped, "hand")
    flips = section["kinds"]["emotion_flip"]
    assert flips["n"] == 2 and flips["judge"]["prefers_original"] == 1 and flips["judge"]["rate"] == 50.0
    assert flips["length_judge"]["prefers_original"] == 1 and flips["length_judge"]["ties"] == 1
    assert flips["judge"]["swap_consistency"] == 100.0 and flips["random"] == 50.0
    cues = section["kinds"]["evidence_contradiction"]
    assert cues["judge"]["ties"] == 1 and cues["judge"]["rate"] == 0.0  # a tie does not prefer the original
    assert cues["length_judge"]["rate"] == 0.0 and cues["length_change_mean"] == 1.0
    assert cues["judge"]["swap_consistency"] == 0.0 and cues["judge"]["both_orders"]["prefers_original"] == 0
    everything = section["all"]
    assert everything["judge"]["prefers_original"] == 1 and everything["judge"]["ci95"] == pytest.approx(
        list(wilson_interval(1, 3))
    )
    assert (
        section["kinds"]["modality_omission"]["n"] == 0
        and section["kinds"]["modality_omission"]["judge"]["rate"] is None
    )
    text = controlled_markdown(section)
    assert "| emotion_flip | 2 | 50.0 [" in text and "| modality_omission | 0 | - |" in text
    # without a training-data record the in-sample count is unknown (null, "-"), never 0
    assert section["n_in_sample"] is None and flips["n_in_sample"] is None and "IN-SAMPLE" not in text
    assert text.split("| all kinds |")[1].split("\n")[0].endswith(" - |")
    # flags per negative: counted per kind and over all, in the JSON and in the Markdown from the same values
    flagged = controlled_section([flip, cue, same], normal, swapped, "hand", in_sample=[True, False, True])
    assert flagged["n_in_sample"] == flagged["all"]["n_in_sample"] == 2
    assert flagged["kinds"]["emotion_flip"]["n_in_sample"] == 2
    assert flagged["kinds"]["evidence_contradiction"]["n_in_sample"] == 0
    assert flagged["kinds"]["modality_omission"]["n_in_sample"] == 0
    text = controlled_markdown(flagged)
    assert "**IN-SAMPLE: 2 of 3 negatives**" in text
    assert text.split("| emotion_flip |")[1].split("\n")[0].endswith(" 2 |")
    assert text.split("| all kinds |")[1].split("\n")[0].endswith(" 2 |")
    with pytest.raises(ValueError, match="in_sample: 2 values for 3 negatives"):
        controlled_section([flip, cue, same], normal, swapped, "hand", in_sample=[True, False])


def test_a_reward_models_order_with_no_tie_threshold_is_counted_beside_its_verdicts():
    flip = make_negative("a", "She is happy.", "emotion_flip", 7, 12, "sad")
    cue = make_negative("b", "He is smiling.", "evidence_contradiction", 6, 13, "frowning", modality="face")
    same = make_negative("c", "She is calm.", "emotion_flip", 7, 11, "cool")
    # the calibrated threshold made the first two ties; their margins still order them: +0.01 right, -0.02 wrong;
    # the third is right by 0.5, and a NaN margin (unreadable media) is invalid, not a preference
    normal, swapped = [["tie", "tie", "1"]], [["tie", "tie", "1"]]
    section = controlled_section([flip, cue, same], normal, swapped, "hand", margins=[0.01, -0.02, 0.5])
    flips = section["kinds"]["emotion_flip"]["judge"]
    assert flips["rate"] == 50.0 and flips["ties"] == 1
    assert flips["no_tie_threshold"]["prefers_original"] == 2 and flips["no_tie_threshold"]["rate"] == 100.0
    assert section["kinds"]["evidence_contradiction"]["judge"]["no_tie_threshold"]["rate"] == 0.0
    ordered = section["all"]["judge"]["no_tie_threshold"]
    assert ordered["prefers_original"] == 2 and ordered["ci95"] == pytest.approx(list(wilson_interval(2, 3)))
    text = controlled_markdown(section)
    assert "No tie threshold:" in text and "| no tie threshold |" in text
    assert text.split("| emotion_flip | 2 | 50.0 [")[1].split(" | ")[2].startswith("100.0 [")
    nan = controlled_section([flip], [["invalid"]], [], "hand", margins=[float("nan")])
    assert (
        nan["all"]["judge"]["no_tie_threshold"]["invalid"] == 1
        and nan["all"]["judge"]["no_tie_threshold"]["rate"] == 0.0
    )
    # a generative judge has no margins: no such figure, no such column
    plain = controlled_section([flip, cue, same], normal, swapped, "hand")
    assert "no_tie_threshold" not in plain["all"]["judge"] and "no tie threshold" not in controlled_markdown(plain)
    with pytest.raises(ValueError, match="margins: 2 values for 3 negatives"):
        controlled_section([flip, cue, same], normal, swapped, "hand", margins=[0.1, 0.2])


def pairs_file(path):
    rows = [
        {
            "sample_id": "a",
            "description_1": "She is happy and smiling, slightly.",
            "description_2": "Flat.",
            "label": "1",
        },
        {
            "sample_id": "b",
            "description_1": "Flat too.",
            "description_2": "He is angry, his voice loud.",
            "label": "2",
        },
        {
            "sample_id": "c",
            "description_1": "She seems calm. Her face is smiling.",
            "description_2": "No.",
            "label": "1",
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_bert_rm(tmp_path_factory.mktemp("controlled") / "rm", max_length=64)


def test_evaluate_reports_the_section_from_generated_negatives_and_a_file(model_dir, tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl")
    report = tmp_path / "report.json"
    assert main(["evaluate", "--model", str(model_dir), "--data", str(data), "--output", str(report)]) == 0
    section = json.loads(report.read_text())["controlled_errors"]
    assert main(["augment", "--data", str(data), "--output", str(tmp_path / "neg.csv")]) == 0
    negatives = read_negatives(tmp_path / "neg.csv")
    assert section["n_negatives"] == len(negatives) and section["source"].startswith("rules engine")
    for kind, row in section["kinds"].items():
        of_kind = [n for n in negatives if n.kind == kind]
        assert row["n"] == len(of_kind)
        longer = sum(len(n.original) > len(n.negative) for n in of_kind)
        assert row["length_judge"]["prefers_original"] == longer
        if of_kind:  # a reward model is swap-consistent by construction
            assert row["judge"]["swap_consistency"] == 100.0
            assert row["judge"]["swapped_order"]["rate"] == row["judge"]["rate"]
    # the reward's own order, from rewards the model gives the same texts (scored here again)
    # (other batches: equal within the precision's bound, `reward_tolerance`, so margins inside it may go either way)
    from emoreward.models import load_reward_model
    from emoreward.models.precision import model_precision_name, reward_tolerance

    model = load_reward_model(str(model_dir))
    originals, edited = model.score([n.original for n in negatives]), model.score([n.negative for n in negatives])
    margins = originals - edited
    tol = 2 * reward_tolerance(
        model_precision_name(model), magnitude=float(max(abs(originals).max(), abs(edited).max()))
    )
    got = section["all"]["judge"]["no_tie_threshold"]["prefers_original"]
    assert sum(margins > tol) <= got <= sum(margins > -tol) and sum(margins > tol) > 0
    markdown = (tmp_path / "report.md").read_text()
    assert "### Controlled errors" in markdown and "### Controlled errors" in capsys.readouterr().out
    assert f"| all kinds | {len(negatives)} | {section['all']['judge']['rate']:.1f} [" in markdown
    # the same negatives given as a file: the same figures
    report2 = tmp_path / "report2.json"
    argv = ["evaluate", "--model", str(model_dir), "--data", str(data), "--output", str(report2)]
    assert main([*argv, "--controlled-negatives", str(tmp_path / "neg.csv")]) == 0
    from_file = json.loads(report2.read_text())["controlled_errors"]
    assert from_file["kinds"] == section["kinds"] and from_file["source"] == f"file {tmp_path / 'neg.csv'}"
    assert main([*argv, "--no-controlled-negatives"]) == 0
    assert "controlled_errors" not in json.loads(report2.read_text())
    # no negatives at all: a reward model's section still has its order's figure (n 0), as every fold's must to pool
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    assert main([*argv, "--controlled-negatives", str(tmp_path / "empty.jsonl")]) == 0
    empty = json.loads(report2.read_text())["controlled_errors"]
    assert empty["n_negatives"] == 0 and empty["all"]["judge"]["no_tie_threshold"]["n"] == 0


def test_judge_scores_both_orders_and_the_length_judge_agrees_with_itself(tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl")
    spec = tmp_path / "length.yaml"
    spec.write_text(LENGTH_JUDGE, encoding="utf-8")
    out = tmp_path / "judged"
    assert main(["judge", "--judge", str(spec), "--data", str(data), "--output", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    section = report["controlled_errors"]["S1"]
    assert section["runs"] == 2 and section["n_negatives"] > 0
    for row in [*section["kinds"].values(), section["all"]]:  # a judge that prefers the longer IS the length judge
        assert row["judge"]["prefers_original"] == row["length_judge"]["prefers_original"]
        assert row["judge"]["ties"] == row["length_judge"]["ties"]
    assert "### Controlled errors, lengthjudge/S1" in (out / "report.md").read_text()


@pytest.mark.parametrize("bad", ["tampered", "both-options"])
def test_a_bad_negatives_file_is_one_line_before_any_work(bad, model_dir, tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl")
    assert main(["augment", "--data", str(data), "--output", str(tmp_path / "neg.jsonl")]) == 0
    lines = (tmp_path / "neg.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["span_start"] = row["span_start"] + 1
    (tmp_path / "neg.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    capsys.readouterr()
    argv = ["evaluate", "--model", str(model_dir), "--data", str(data), "--output", str(tmp_path / "r.json"),
            "--controlled-negatives", str(tmp_path / "neg.jsonl")]  # fmt: skip
    if bad == "both-options":
        argv.append("--no-controlled-negatives")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err, err
    if bad == "tampered":
        assert "neg.jsonl, row 2, field 'original_span'" in err
    assert not (tmp_path / "r.json").exists()


def test_pooled_folds_equal_the_section_of_all_negatives():
    from emoreward.evaluation.controlled import pool_sections

    negs = [
        make_negative("a", "She is happy.", "emotion_flip", 7, 12, "sad"),
        make_negative("b", "He is smiling.", "evidence_contradiction", 6, 13, "frowning", modality="face"),
        make_negative("c", "She is calm.", "emotion_flip", 7, 11, "cool"),
        make_negative("d", "A slight smile.", "intensity_mismatch", 2, 8, "strong"),
    ]
    normal, swapped = [["1", "tie", "2", "1"]], [["1", "2", "2", "invalid"]]
    margins = [0.3, -0.1, 0.0, float("nan")]  # a reward model's: its order with no tie threshold pools too
    whole = controlled_section(negs, normal, swapped, "x", margins=margins)
    parts = [controlled_section(negs[:2], [normal[0][:2]], [swapped[0][:2]], "x", margins=margins[:2]),
             controlled_section(negs[2:], [normal[0][2:]], [swapped[0][2:]], "x", margins=margins[2:])]  # fmt: skip
    pooled = pool_sections(parts, "x")
    assert rounded(pooled["kinds"]) == rounded(whole["kinds"]) and rounded(pooled["all"]) == rounded(whole["all"])
    assert pooled["all"]["judge"]["no_tie_threshold"] == whole["all"]["judge"]["no_tie_threshold"]
    assert [whole["all"]["judge"]["no_tie_threshold"][k] for k in ("prefers_original", "ties", "invalid")] == [1, 1, 1]
    assert pooled["n_negatives"] == 4 and pooled["n_sections"] == 2
    flags = [True, False, False, True]  # in-sample counts add up too; one unknown part makes the pool unknown
    whole = controlled_section(negs, normal, swapped, "x", flags)
    parts = [controlled_section(negs[:2], [normal[0][:2]], [swapped[0][:2]], "x", flags[:2]),
             controlled_section(negs[2:], [normal[0][2:]], [swapped[0][2:]], "x", flags[2:])]  # fmt: skip
    pooled = pool_sections(parts, "x")
    assert rounded(pooled["kinds"]) == rounded(whole["kinds"]) and pooled["n_in_sample"] == whole["n_in_sample"] == 2
    parts[1] = controlled_section(negs[2:], [normal[0][2:]], [swapped[0][2:]], "x")
    assert pool_sections(parts, "x")["n_in_sample"] is None


def rounded(value):
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return round(value, 9) if isinstance(value, float) else value


def test_the_section_counts_distinct_negatives_as_the_pair_loader_identifies_them(model_dir, tmp_path, capsys):
    """Four text-only samples sharing one preferred description (no media root: one description to the pair
    loader) give one negative per kind, each counted once (n = 1, Wilson [0, 79.3] or [20.7, 100]), not four times
    (n = 4) as when the sample id was part of a negative and not of a pair."""
    text = "In the video she is smiling, slightly Happy. The audio has a trembling tone. She says thanks."
    rows = [{"sample_id": f"d{k}", "description_1": text, "description_2": f"Other text {k}.", "label": "1"}
            for k in range(4)]  # fmt: skip
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = tmp_path / "report.json"
    assert main(["evaluate", "--model", str(model_dir), "--data", str(data), "--output", str(report)]) == 0
    section = json.loads(report.read_text())["controlled_errors"]
    assert section["n_negatives"] == 4 and section["all"]["n"] == 4
    for row in section["kinds"].values():
        assert row["n"] == 1 and [round(x, 1) for x in row["judge"]["ci95"]] in ([0.0, 79.3], [20.7, 100.0])


def test_an_edit_is_its_substitution_and_new_edits_are_counted_apart():
    from emoreward.evaluation.controlled import new_edit_flags, pool_sections

    happy = make_negative("a", "She is happy.", "emotion_flip", 7, 12, "sad")
    happy_too = make_negative("b", "Happy, he laughs.", "emotion_flip", 0, 5, "Sad")  # the same words, other case
    glad = make_negative("c", "She is glad.", "emotion_flip", 7, 11, "sad")  # another word replaced
    quiet = make_negative("d", "He is smiling. He is quiet.", "modality_omission", 14, 27, "", modality="voice")
    quiet_too = make_negative("e", "She smiles. Her voice is soft.", "modality_omission", 11, 30, "", modality="voice")
    assert happy.edit() == happy_too.edit() != glad.edit() and quiet.edit() == quiet_too.edit()
    assert happy.edit() == ("emotion_flip", "happy", "sad") and glad.edit() == ("emotion_flip", "glad", "sad")
    # an edit is the words changed, read from the two texts: a span recorded wider (the comma, the space before it)
    # or a cue relabelled to another modality is the same edit
    wide = make_negative("f", "She is happy, then calm.", "emotion_flip", 6, 13, " sad,")
    assert wide.edit() == happy.edit() and wide.edit_key() == happy.edit_key()
    face = make_negative("g", "He is smiling, warmly.", "evidence_contradiction", 6, 13, "frowning", modality="face")
    voice = make_negative(
        "h", "He is smiling, warmly.", "evidence_contradiction", 6, 14, "frowning,", modality="voice"
    )
    assert face.edit() == voice.edit() == ("evidence_contradiction", "smiling", "frowning")
    negatives = [happy_too, glad, quiet_too]
    assert new_edit_flags(negatives, {happy.edit_key(), quiet.edit_key()}) == [False, True, False]
    assert new_edit_flags(negatives, None) is None  # trained on no negatives: nothing to tell apart
    assert new_edit_flags(negatives, set()) == [True, True, True]  # negatives asked, none written: every edit new
    # a negative the judge trained on (that very pair) is never new, whatever its record says of the edit
    assert new_edit_flags(negatives, {happy.edit_key()}, trained=[False, True, False]) == [False, False, True]
    # the section over the new edits alone: glad -> sad, judged "1" and ordered the right way
    normal, swapped = [["tie", "1", "1"]], [["tie", "1", "1"]]
    flags = [False, True, False]
    section = controlled_section(negatives, normal, swapped, "x", margins=[0.1, 0.2, 0.3], new_edit=flags)
    new = section["kinds"]["emotion_flip"]["new_edits"]
    assert new["n"] == 1 and new["judge"]["rate"] == 100.0 and new["judge"]["no_tie_threshold"]["rate"] == 100.0
    assert new["length_judge"]["prefers_original"] == 1  # glad -> sad: the original is longer
    assert section["all"]["new_edits"]["n"] == 1 and section["kinds"]["modality_omission"]["new_edits"]["n"] == 0
    assert section["kinds"]["emotion_flip"]["judge"]["rate"] == 50.0  # the whole kind: the tie counts against
    text = controlled_markdown(section)
    assert "| emotion_flip | 1 | 100.0 [" in text.split("Edits no negative the judge trained on made")[1]
    parts = [controlled_section(negatives[:1], [["tie"]], [["tie"]], "x", margins=[0.1], new_edit=flags[:1]),
             controlled_section(negatives[1:], [["1", "1"]], [["1", "1"]], "x", margins=[0.2, 0.3],
                                new_edit=flags[1:])]  # fmt: skip
    assert rounded(pool_sections(parts, "x")["all"]) == rounded(section["all"])
    assert "new_edits" not in controlled_section(negatives, normal, swapped, "x")["all"]
