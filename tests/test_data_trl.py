"""Preference data in TRL's layout (chosen / rejected, optional prompt; standard and conversational) plus `tie`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import Dataset
from trl.data_utils import is_conversational, maybe_extract_prompt

from emoreward.data import DataError, MediaRef, load_pairs, read_pairs


PROMPT = "Describe the emotional state of the person in the clip.\nSubtitle: I can't believe you did that."
SUBTITLE = "I can't believe you did that."


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


STANDARD = [
    {"prompt": PROMPT, "chosen": "Surprised, then hurt.", "rejected": "Happy."},
    {"prompt": PROMPT, "chosen": "Angry.", "rejected": "Annoyed.", "tie": True},
]
IMPLICIT = [{"chosen": "Surprised, then hurt.", "rejected": "Happy.", "tie": False}]
CONVERSATIONAL_IMPLICIT = [
    {
        "chosen": [user(PROMPT), assistant("Surprised, then hurt.")],
        "rejected": [user(PROMPT), assistant("Happy.")],
    }
]
CONVERSATIONAL_EXPLICIT = [
    {
        "sample_id": "sample_00000007",
        "prompt": [
            user(
                [
                    {"type": "video", "video": "video/sample_00000007.mp4"},
                    {"type": "text", "text": PROMPT},
                ]
            )
        ],
        "chosen": [assistant("Surprised, then hurt.")],
        "rejected": [assistant("Happy.")],
        "tie": True,
    },
    {
        "sample_id": "sample_00000008",
        "prompt": [user([{"type": "audio", "audio": "audio/sample_00000008.wav"}, {"type": "text", "text": "Go."}])],
        "chosen": [assistant([{"type": "text", "text": "Calm."}])],
        "rejected": [assistant("Tense.")],
        "tie": False,
    },
]


def as_parts(value):
    if not isinstance(value, list):
        return value
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]}
        for m in value
    ]


def as_tuples(pairs):
    return [(p.sample_id, p.description_1, p.description_2, p.label, p.media, p.row) for p in pairs]


def test_the_examples_are_what_trl_itself_calls_standard_and_conversational():
    assert not is_conversational(STANDARD[0]) and not is_conversational(IMPLICIT[0])
    assert is_conversational(CONVERSATIONAL_IMPLICIT[0]) and is_conversational(CONVERSATIONAL_EXPLICIT[0])
    # TRL splits the implicit prompt off exactly where the loader takes the final assistant turn
    extracted = maybe_extract_prompt(CONVERSATIONAL_IMPLICIT[0])
    assert extracted["prompt"] == [user(PROMPT)] and extracted["chosen"] == [assistant("Surprised, then hurt.")]


def test_standard_explicit_prompt_and_tie_column(tmp_path):
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in STANDARD))
    loaded = read_pairs(path)
    assert loaded.layout == "trl" and loaded.n_records == 2
    assert as_tuples(loaded.pairs) == [
        ("row-1", "Happy.", "Surprised, then hurt.", "2", MediaRef(subtitle=SUBTITLE), 1),  # content order
        ("row-2", "Angry.", "Annoyed.", "tie", MediaRef(subtitle=SUBTITLE), 2),
    ]


def test_standard_implicit_prompt_from_csv(tmp_path):
    path = tmp_path / "trl.csv"
    path.write_text('chosen,rejected,tie\n"Surprised, then hurt.",Happy.,false\nAngry.,Annoyed.,true\nA.,B.,\n')
    assert [(p.description_1, p.label, p.media) for p in load_pairs(path)] == [
        ("Happy.", "2", MediaRef()),
        ("Angry.", "tie", MediaRef()),
        ("A.", "1", MediaRef()),
    ]


def test_conversational_implicit_prompt_gives_the_final_assistant_turn():
    pair = load_pairs(CONVERSATIONAL_IMPLICIT)[0]
    assert (pair.description_1, pair.description_2, pair.label) == ("Happy.", "Surprised, then hurt.", "2")
    assert pair.media == MediaRef(subtitle=SUBTITLE)


def test_conversational_explicit_prompt_maps_media_parts(tmp_path):
    expected = [
        (
            "sample_00000007",
            "Happy.",
            "Surprised, then hurt.",
            "tie",
            MediaRef(video="video/sample_00000007.mp4", subtitle=SUBTITLE),
            1,
        ),
        ("sample_00000008", "Calm.", "Tense.", "1", MediaRef(audio="audio/sample_00000008.wav"), 2),
    ]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CONVERSATIONAL_EXPLICIT))
    assert as_tuples(load_pairs(path)) == expected
    # a dataset column holds one type, so every content becomes a list of parts; `datasets` stores parts as
    # structs (absent keys become None), and the same pairs come out
    dataset = Dataset.from_list([{k: as_parts(v) for k, v in row.items()} for row in CONVERSATIONAL_EXPLICIT])
    assert dataset[1]["prompt"][0]["content"][0]["video"] is None
    assert as_tuples(load_pairs(dataset)) == expected
    frame = dataset.to_pandas()  # list columns become NumPy object arrays
    assert type(frame["chosen"][0]).__name__ == "ndarray"
    assert as_tuples(load_pairs(frame)) == expected


def test_media_columns_agree_with_or_override_the_prompt():
    row = {**STANDARD[0], "subtitle": SUBTITLE, "video": "v.mp4"}
    assert load_pairs([row])[0].media == MediaRef(video="v.mp4", subtitle=SUBTITLE)
    with pytest.raises(DataError, match=r"row 1, field 'subtitle': 'Other\.' differs from the subtitle in the prompt"):
        load_pairs([{**STANDARD[0], "subtitle": "Other."}])


@pytest.mark.parametrize(
    "row, field, words",
    [
        (
            {"chosen": [user("x"), assistant("a")], "rejected": [user("x"), user("b")]},
            "rejected",
            "the final message is the 'user' turn",
        ),
        (
            {"chosen": [user("x"), assistant("a")], "rejected": [user("y"), assistant("b")]},
            "rejected",
            "differ from those in 'chosen'",
        ),
        ({"chosen": "a", "rejected": None}, "rejected", "missing value"),
        ({"chosen": "a", "rejected": float("nan")}, "rejected", "missing value"),
        ({"chosen": " ", "rejected": "b"}, "chosen", "empty description"),
        ({"chosen": "a", "rejected": "b", "tie": "maybe"}, "tie", "expected true or false"),
        (
            {"chosen": [{"content": "a"}], "rejected": [assistant("b")]},
            "chosen",
            "message 0 is not a {'role', 'content'} mapping",
        ),
        (
            {"chosen": "a", "rejected": "b", "prompt": [user([{"type": "video", "video": [1, 2]}])]},
            "prompt",
            "a video part holds list, not a path",
        ),
    ],
)
def test_bad_trl_rows_name_row_and_field(row, field, words):
    rows = [IMPLICIT[0], row]
    with pytest.raises(DataError) as info:
        load_pairs(rows)
    assert (info.value.row, info.value.field_name) == (2, field)
    assert words in str(info.value)


def test_trl_columns_need_both_and_no_second_layout(tmp_path):
    with pytest.raises(DataError, match=r"header, field 'rejected': missing column \(TRL layout\)"):
        load_pairs([{"chosen": "a"}])
    with pytest.raises(DataError, match=r"columns \['chosen', 'rejected'\] \(TRL layout\) and \['a1'\]"):
        load_pairs([{"chosen": "a", "rejected": "b", "a1": "c"}])
    with pytest.raises(DataError, match=r"row 2, field 'chosen': repeats the pair of row 1"):
        load_pairs([{"sample_id": "s", **IMPLICIT[0]}, {"sample_id": "s", **IMPLICIT[0]}])


def test_the_docs_example_line_loads_as_documented(tmp_path):
    section = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    line = section.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.jsonl"
    path.write_text(line)
    loaded = read_pairs(path)
    assert as_tuples(loaded.pairs) == [
        ("row-1", "Happy.", "Surprised, then hurt.", "2", MediaRef(subtitle="I can't believe it."), 1)
    ]
    assert loaded.summary() == f"1 pair of 1 sample from 1 record of {path} (trl layout)"
