"""Many pairs per sample and one row per annotator: the loader's merge, the aggregation rule, the agreement figures
(hand-computed), the sample groups every split uses, and columns of other tools kept out of the way."""

from __future__ import annotations

import pytest

from emoreward.data import DataError, load_pairs, read_pairs
from emoreward.data.annotators import agreement, krippendorff_alpha, majority_label
from emoreward.data.pairs import sample_groups


HEADER = "name,a1,a2,preference,annotator\n"


def write(tmp_path, text: str, name: str = "p.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_majority_label_and_its_tie_break():
    assert majority_label(["1"]) == "1"
    assert majority_label(["1", "2", "2"]) == "2"
    assert majority_label(["1", "2"]) == "tie"  # no single most-voted label
    assert majority_label(["1", "1", "tie", "tie", "2"]) == "tie"
    with pytest.raises(ValueError):
        majority_label([])


def test_krippendorff_alpha_by_hand():
    # units (1,1) and (1,2): coincidences o11 = 2, o12 = o21 = 1; n = 4, n1 = 3, n2 = 1
    # alpha = ((n-1) * sum o_cc - sum n_c (n_c-1)) / (n (n-1) - sum n_c (n_c-1)) = (3*2 - 6) / (12 - 6) = 0
    assert krippendorff_alpha([["1", "1"], ["1", "2"]]) == pytest.approx(0.0)
    # perfect agreement on two categories: 1
    assert krippendorff_alpha([["1", "1"], ["2", "2", "2"]]) == pytest.approx(1.0)
    # (1,2), (2,1): o12 = o21 = 2, n = 4, n1 = n2 = 2: (3*0 - 4) / (12 - 4) = -0.5
    assert krippendorff_alpha([["1", "2"], ["2", "1"]]) == pytest.approx(-0.5)
    assert krippendorff_alpha([["1", "1"]]) is None  # one category: undefined
    assert krippendorff_alpha([["1"], ["2"]]) is None  # nothing pairable


def test_rows_per_annotator_become_one_pair_in_either_order(tmp_path):
    path = write(
        tmp_path,
        HEADER
        + "v1,happy face,sad voice,a1,ann1\n"
        + "v1,sad voice,happy face,a1,ann2\n"  # the same pair swapped: ann2 prefers 'sad voice' = description 2
        + "v1,happy face,sad voice,a2,ann3\n"
        + "v1,happy face,angry tone,a1,ann1\n"  # a second pair of the same sample
        + "v2,calm,tense,same,ann1\n"
        + "v2,calm,tense,a1,ann2\n",
    )
    loaded = read_pairs(path)
    assert [(p.sample_id, p.row, p.label) for p in loaded.pairs] == [("v1", 1, "2"), ("v1", 4, "1"), ("v2", 5, "tie")]
    assert loaded.pairs[0].annotations == (("ann1", "1"), ("ann2", "2"), ("ann3", "2"))
    assert loaded.pairs[0].swapped().annotations == (("ann1", "2"), ("ann2", "1"), ("ann3", "1"))
    assert (loaded.n_records, loaded.n_merged, len(loaded.pairs), loaded.n_samples) == (6, 3, 3, 2)
    figures = agreement(loaded.pairs)
    # repeated pairs: (1, 2, 2) -> 2, two of three agree; (tie, 1) -> tie, one of two: 3 of 5 labels
    assert (figures.n_repeated, figures.n_labels, figures.n_annotators) == (2, 6, 3)
    assert figures.majority_share == pytest.approx(60.0)
    # alpha, each unit in both orders ((1,2,2), (2,1,1), (tie,1), (tie,2)): o11 = o22 = 1, o12 = o21 = 2,
    # o(1,tie) = o(tie,1) = o(2,tie) = o(tie,2) = 1; n = 10, n1 = n2 = 4, ntie = 2:
    # ((10-1) * 2 - (12 + 12 + 2)) / (10*9 - 26) = -8/64 (the same whichever description sorts first)
    assert figures.alpha == pytest.approx(-0.125)
    assert "6 labels from 3 annotators" in loaded.summary() and "3 pairs of 2 samples from 6 records" in (
        loaded.summary()
    )


def test_a_label_repeated_by_one_annotator_or_without_annotators_is_refused(tmp_path):
    path = write(tmp_path, HEADER + "v1,x,y,a1,ann\nv1,y,x,a2,ann\n")
    with pytest.raises(DataError, match=r"row 2, field 'annotator': repeats the pair of row 1 by the same annotator"):
        load_pairs(path)
    path = write(tmp_path, "name,a1,a2,preference\nv1,x,y,a1\nv1,y,x,a2\n", "plain.csv")
    with pytest.raises(DataError, match=r"row 2, field 'a1': repeats the pair of row 1"):
        load_pairs(path)
    path = write(tmp_path, HEADER + "v1,x,y,a1,ann\nv1,x,y,a1,\n", "blank.csv")
    with pytest.raises(DataError, match=r"row 2, field 'annotator': missing annotator"):
        load_pairs(path)


def test_a_sample_is_one_context(tmp_path):
    path = write(tmp_path, "name,a1,a2,preference,subtitle\nv1,x,y,a1,hi\nv1,p,q,a2,bye\n")
    with pytest.raises(DataError, match=r"row 2, field 'name': sample 'v1' names another video, audio or subtitle"):
        load_pairs(path)


def test_sample_groups_link_ids_media_and_shared_descriptions(tmp_path):
    path = write(
        tmp_path,
        "name,a1,a2,preference\n"
        "v1,a,b,a1\n"
        "v1,a,c,a1\n"  # the same id
        "v2,d,e,a1\n"
        "v3,e,f,a2\n"  # shares 'e' with v2: one sample for every split
        "v4,g,h,a1\n",
    )
    assert sample_groups(load_pairs(path)) == [0, 0, 1, 1, 2]


def test_columns_of_other_tools_are_kept_out_of_the_way(tmp_path):
    # the controlled-negatives generator's columns: one original against several edited negatives
    path = write(
        tmp_path,
        "sample_id,description_1,description_2,label,kind,span,replacement,length_change\n"
        "v1,She is happy.,She is sad.,1,emotion_flip,happy,sad,-2\n"
        "v1,She is happy.,She is very happy.,1,intensity,is,is very,5\n",
    )
    loaded = read_pairs(path)
    assert (len(loaded.pairs), loaded.n_samples, loaded.n_merged) == (2, 1, 0)


def test_the_order_of_annotator_rows_changes_nothing(tmp_path):
    import random

    from emoreward.data.pairs import canonical_pairs

    rows = [
        "v1,happy face,sad voice,a1,ann1",
        "v1,sad voice,happy face,a1,ann2",
        "v1,happy face,sad voice,a2,ann3",
        "v2,calm,tense,same,ann1",
        "v2,tense,calm,a2,ann2",
    ]

    def content(lines):
        pairs = canonical_pairs(load_pairs(write(tmp_path, HEADER + "\n".join(lines) + "\n")))
        return [(p.sample_id, p.description_1, p.description_2, p.label, p.annotations) for p in pairs]

    expected = content(rows)
    assert ("v2", "calm", "tense", "tie", (("ann1", "tie"), ("ann2", "1"))) in expected
    for seed in range(4):
        shuffled = list(rows)
        random.Random(seed).shuffle(shuffled)
        assert content(shuffled) == expected


def test_with_clips_read_by_id_a_shared_text_links_no_samples(tmp_path):
    # with a media root each sample id is its own clip: the same text about two clips is two inputs
    path = write(tmp_path, "name,a1,a2,preference\nc1,She is happy.,She is sad.,a1\nc2,She is happy.,She is sad.,a2\n")
    assert read_pairs(path, media_by_id=True).n_samples == 2
    assert sample_groups(load_pairs(path, media_by_id=True), media_by_id=True) == [0, 1]
    with pytest.raises(DataError, match="repeats the pair of row 1"):  # text only: one pair twice
        load_pairs(path)


def test_a_margin_on_annotator_rows_that_disagree_is_refused(tmp_path):
    """TRL's margin says how much more the chosen side is preferred: per-annotator rows choosing differently (or
    weighing differently) give no one margin; rows that agree keep theirs."""
    import json

    def write(rows):
        path = tmp_path / "trl.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    base = {"sample_id": "s1", "prompt": "How does she feel?"}
    a, b = "She is calm and smiles.", "She is furious."
    rows = [{**base, "chosen": a, "rejected": b, "margin": 3.0, "annotator": "x"},
            {**base, "chosen": b, "rejected": a, "margin": 0.5, "annotator": "y"},
            {**base, "chosen": b, "rejected": a, "margin": 0.5, "annotator": "z"}]  # fmt: skip
    with pytest.raises(DataError, match="row 2, field 'margin': the pair of row 1 has per-annotator rows"):
        load_pairs(write(rows))
    with pytest.raises(DataError, match="field 'margin'"):
        load_pairs(write(rows[::-1]))  # in any order
    agreeing = [{**r, "chosen": b, "rejected": a, "margin": 0.5} for r in rows]
    (pair,) = load_pairs(write(agreeing))
    chosen = pair.description_1 if pair.label == "1" else pair.description_2
    assert pair.margin == 0.5 and chosen == b
