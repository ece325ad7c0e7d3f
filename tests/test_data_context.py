"""The one context rule (`emoreward.data.context`), the media rule (`emoreward.data.media.unused_media`) and the
normal form of names (`emoreward.data.text`), through the loaders and the route functions that use them."""

from __future__ import annotations

import json
import warnings

import pytest

from emoreward.data import DataError, MediaRef, load_pairs
from emoreward.data.context import (
    RewardContext,
    openrlhf_context,
    prompt_fields,
    reward_context,
    subtitle_from_text,
    verl_context,
)
from emoreward.data.media import MediaError, MediaOptions, refuse_unused_media, unused_media
from emoreward.data.tables import DescriptionTable
from emoreward.data.text import (
    NameNormaliser,
    description_length,
    markdown_cell,
    normal_name,
    short_names,
)


VIDEO_PART = {"type": "video", "video": "v/c1.mp4"}
ASSISTANT_UPSET = {"role": "assistant", "content": "Upset."}
PROMPT = "Describe the emotion.\nSubtitle:  Oh no, not again!  \nAnswer in one sentence.\nBe specific."


# ---------------------------------------------------------------------------------------------- the Subtitle: line
def test_the_subtitle_is_its_line_only():
    assert subtitle_from_text(PROMPT) == "Oh no, not again!"
    assert subtitle_from_text("Subtitle: oh<|im_end|>\n<|im_start|>assistant\n", ["<|im_end|>"]) == "oh"
    assert subtitle_from_text("  Subtitle:\tyes") == "yes"
    assert subtitle_from_text("Describe it.\nSubtitle:   \nThen stop.") is None  # an empty line names none
    assert subtitle_from_text("The subtitle: is not at the start of a line") is None
    assert subtitle_from_text("Subtitle: a\nSubtitle: a") == "a"
    with pytest.raises(DataError, match="names two subtitles"):
        subtitle_from_text("Subtitle: a\nSubtitle: b", source="x.jsonl", row=3)


def test_trl_rows_read_the_subtitle_line_and_not_the_instruction_after_it(tmp_path):
    rows = [
        {"prompt": PROMPT, "chosen": "She is upset.", "rejected": "Calm."},
        {"chosen": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Upset."}],
         "rejected": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Calm."}]},
        {"prompt": [{"role": "user", "content": [VIDEO_PART, {"type": "text", "text": PROMPT}]}],
         "chosen": [ASSISTANT_UPSET], "rejected": [{"role": "assistant", "content": "Calm."}]},
        {"prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Describe."}]}],
         "chosen": "Upset.", "rejected": "Calm.", "video": "v/c2.mp4", "subtitle": " oh "},
    ]  # fmt: skip
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_pairs(path)
    assert [p.media.subtitle for p in pairs] == ["Oh no, not again!"] * 3 + ["oh"]
    assert [p.media.video for p in pairs] == [None, None, "v/c1.mp4", "v/c2.mp4"]  # a part without path: a placeholder


def test_a_field_that_disagrees_with_the_prompt_is_an_error():
    with pytest.raises(
        DataError, match=r"g\.jsonl, row 4, field 'sub': 'other' differs from the subtitle in the prompt"
    ):
        reward_context(prompt=PROMPT, subtitle="other", source="g.jsonl", row=4, names={"subtitle": "sub"})
    same = reward_context(prompt=PROMPT, subtitle=" Oh no, not again! ", sample_id=7)
    assert same == RewardContext("Oh no, not again!", None, None, "7")
    with pytest.raises(DataError, match="names two videos"):
        prompt_fields([{"role": "user", "content": [{"type": "video", "video": "a"}, {"type": "video", "path": "b"}]}])
    with pytest.raises(DataError, match="field 'video': expected text, got list"):
        reward_context(video=["a"])
    assert reward_context(subtitle=float("nan"), video="  ", audio=None) == RewardContext()


def test_route_forms_give_one_context():
    expected = RewardContext("oh", "video/c0.mp4", None, "c0")
    assert reward_context(subtitle="oh", video="video/c0.mp4", sample_id="c0") == expected
    info = {"subtitle": "oh ", "video": "video/c0.mp4", "sample_id": "c0"}
    assert verl_context(info) == expected
    assert verl_context({"video": "video/c0.mp4", "sample_id": "c0"}, "oh", subtitle_key="ground_truth") == expected
    with pytest.raises(DataError, match="verl extra_info, row 2: expected a dict"):
        verl_context(["oh"], row=2)
    chat = "<|im_start|>user\nDescribe.\nSubtitle: oh<|im_end|>\n<|im_start|>assistant\n"
    assert openrlhf_context(chat, end_markers=["<|im_end|>"]) == RewardContext("oh")
    assert openrlhf_context("Describe.", "oh", labels="subtitle") == RewardContext("oh")
    assert openrlhf_context(chat, "oh", labels="ignore", end_markers=["<|im_end|>"]) == RewardContext("oh")
    with pytest.raises(DataError, match="field 'labels'"):
        openrlhf_context(chat, "other", labels="subtitle", end_markers=["<|im_end|>"])


# ---------------------------------------------------------------------------------------------- media rule
@pytest.mark.parametrize(
    "needs, in_video, ref, unused",
    [
        ((True, True), True, MediaRef("v.mp4", "a.wav"), ["audio"]),  # Omni hearing the video's own track
        ((True, True), False, MediaRef("v.mp4", "a.wav"), []),  # Omni with a separate wav
        ((True, False), False, MediaRef("v.mp4", "a.wav"), ["audio"]),  # Qwen2.5-VL: frames only
        ((False, True), False, MediaRef("v.mp4", "a.wav"), ["video"]),  # Qwen2-Audio
        ((False, False), False, MediaRef("v.mp4", "a.wav"), ["video", "audio"]),  # a text model
        ((True, True), True, MediaRef("v.mp4"), []),
    ],
)
def test_which_files_a_model_reads(needs, in_video, ref, unused):
    found = unused_media(ref, need_video=needs[0], need_audio=needs[1], use_audio_in_video=in_video)
    assert [key for key, _ in found] == unused


def test_an_unused_file_is_refused_naming_sample_file_and_field():
    options = MediaOptions(use_audio_in_video=True)
    with pytest.raises(
        MediaError, match=r"sample 'c1': noise\.wav: audio file given, but it hears the video's own"
    ) as e:
        refuse_unused_media("c1", MediaRef("c1.mp4", "noise.wav"), options, need_video=True, need_audio=True)
    assert e.value.field == "audio" and e.value.path == "noise.wav"
    refuse_unused_media("c1", MediaRef("c1.mp4"), options, need_video=True, need_audio=True)


# ---------------------------------------------------------------------------------------------- names
def test_normal_name_and_length():
    assert normal_name(" GPT\u00a04o \n") == "GPT 4o"
    assert normal_name("Cafe\u0301  model") == "Caf\u00e9 model"
    assert description_length("She smiles  warmly.") == 19 and description_length("She smiles  warmly.", "words") == 3
    with pytest.raises(ValueError, match="unknown length unit"):
        description_length("x", "tokens")
    names = NameNormaliser("model name", "t.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert names("GPT-4o", "line 1") == names("GPT-4o ", "line 5") == names("GPT-4o\t", "line 6") == "GPT-4o"
    assert len(caught) == 1 and "'GPT-4o' (line 1) and 'GPT-4o ' (line 5) differ only" in str(caught[0].message)


def test_tables_and_pairs_read_names_in_their_normal_form(tmp_path):
    rows = [
        {"sample": "s1", "model": "Qwen2.5-Omni", "description": "Happy."},
        {"sample": "s1", "model": "Qwen2.5\u2009Omni", "description": "Sad."},
        {"sample": "s1", "model": "Qwen2.5-Omni ", "description": "Happy!"},
    ]
    with pytest.warns(UserWarning, match="differ only in whitespace or Unicode form") as record:
        table = DescriptionTable.from_rows(rows[:2] + [{**rows[2], "sample": "s2"}], "t.jsonl")
    assert sorted(table.models) == sorted(["Qwen2.5-Omni", "Qwen2.5 Omni"]) and len(record) == 1
    with pytest.raises(ValueError, match="a second description of sample 's1' by 'Qwen2.5-Omni'"):
        with pytest.warns(UserWarning):
            DescriptionTable.from_rows(rows[:1] + rows[2:], "t.jsonl")
    path = tmp_path / "p.csv"
    path.write_text("name,model1,a1,model2,a2,preference\nx1,GPT  4o,A,Caf\u00e9,B,a1\nx2,GPT 4o,A2,Cafe\u0301,B,a2\n")
    with pytest.warns(UserWarning, match="model names 'GPT  4o' \\(row 1\\) and 'GPT 4o' \\(row 2\\)"):
        pairs = load_pairs(path)
    assert {p.model_1 for p in pairs} == {"GPT 4o"} and {p.model_2 for p in pairs} == {"Caf\u00e9"}


def test_report_names_are_escaped_and_never_collide():
    assert markdown_cell("a|b\nc") == "a\\|b c"
    names = ["qwen2.5-omni-7b", "qwen2.5-omni-3b", "gpt-4o", "emotion-llama"]
    assert short_names(names) == ["qwen2.5-omni-7b", "qwen2.5-omni-3b", "gpt-4o", "emotion-l…"]
    assert short_names(["abcdefghij", "abcdefghijk"]) == ["abcdefghij", "abcdefghi…"]
    assert short_names(["abcdefghijk", "abcdefghijx"]) == ["abcdefghijk", "abcdefghijx"]
    assert short_names(["Video-ChatGPT", "VideoChat"]) == ["Video-Cha…", "VideoChat"]


def test_rank_report_keeps_long_names_apart_and_escapes_pipes():
    from _helpers import StubRewardModel

    from emoreward.ranking.rank import rank_with_reward_model

    class Words(StubRewardModel):
        def reward(self, description, subtitle):
            return len(description.split()) / 10

    long_a, long_b = "model-with-long-name-A", "model-with-long-name-B"
    rows = [
        {"sample": f"s{i}", "model": m, "description": d}
        for i in range(6)
        for m, d in ((long_a, "a " * (i + 2)), (long_b, "b"), ("x|y", "c c"))
    ]
    report = rank_with_reward_model(Words(), DescriptionTable.from_rows(rows, "t.jsonl"), n_boot=5)
    lines = report.to_markdown().splitlines()
    w_header = next(line for line in lines if line.startswith("| | "))
    assert long_a in w_header and long_b in w_header and "x\\|y" in w_header
    assert not any("| x|y |" in line for line in lines)
    assert sum(line.startswith("| x\\|y |") for line in lines) == 1  # its W row


def test_a_judge_and_a_reward_model_find_the_same_layout_file(tmp_path):
    """The media root's MER layout is spelled once (`emoreward.data.media.layout_path`): a pair naming no media
    file reads `video/<id>.mp4` and `audio/<id>.wav` for a reward model (`resolve_paths`) and for a judge
    (`zero_shot.strategies.resolve_media`); a clip under another suffix is neither's (the judge then judges the
    text, the reward model refuses naming the layout file), and a layout path names its sample id."""
    from emoreward.data import PreferencePair
    from emoreward.data.media import layout_path, layout_sample_id, resolve_paths
    from zero_shot.strategies import resolve_media

    for kind in ("video", "audio"):
        (tmp_path / kind).mkdir()
        (tmp_path / layout_path("s1", kind)).write_bytes(b"x")
    (tmp_path / "video" / "s2.avi").write_bytes(b"x")
    options = MediaOptions(media_root=str(tmp_path))
    judge = resolve_media(PreferencePair("s1", "a", "b", "1"), tmp_path)
    reward = resolve_paths("s1", PreferencePair("s1", "a", "b", "1").media, options, need_video=True, need_audio=True)
    assert (judge.video, judge.audio) == (str(reward[0]), str(reward[1]))
    assert reward == (tmp_path / "video" / "s1.mp4", tmp_path / "audio" / "s1.wav")
    assert resolve_media(PreferencePair("s2", "a", "b", "1"), tmp_path) is None
    with pytest.raises(MediaError, match=r"video/s2\.mp4"):
        resolve_paths("s2", PreferencePair("s2", "a", "b", "1").media, options, need_video=True, need_audio=False)
    assert [layout_sample_id(layout_path("s1", k)) for k in ("video", "audio")] == ["s1", "s1"]
    assert layout_sample_id("clips/s1.mp4") == "clips/s1.mp4" and layout_sample_id("video/a/b.mp4") == "video/a/b.mp4"
