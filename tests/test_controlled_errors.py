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
    with pytest.raises(ValueError, match="2 flags for 3 negatives"):
        controlled_section([flip, cue, same], normal, swapped, "hand", in_sample=[True, False])


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
    whole = controlled_section(negs, normal, swapped, "x")
    parts = [controlled_section(negs[:2], [normal[0][:2]], [swapped[0][:2]], "x"),
             controlled_section(negs[2:], [normal[0][2:]], [swapped[0][2:]], "x")]  # fmt: skip
    pooled = pool_sections(parts, "x")
    assert rounded(pooled["kinds"]) == rounded(whole["kinds"]) and rounded(pooled["all"]) == rounded(whole["all"])
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
