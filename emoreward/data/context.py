"""The reward context of a description (subtitle, media paths, sample id), from every input form, by one rule.

`reward_context` is the one function every route calls (our pairs, TRL and GRPO rows, verl, OpenRLHF, the server);
`subtitle_from_text` is the `Subtitle:` rule. The input forms and conflicts: docs/data.md ("The context of a
description").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emoreward.data.errors import DataError
from emoreward.data.text import normal_text, same_text
from emoreward.data.values import is_missing, optional_text, plain


CONTEXT_FIELDS: tuple[str, ...] = ("subtitle", "video", "audio")
SUBTITLE_LINE = re.compile(r"^[ \t]*Subtitle:[ \t]*(.*)$", re.MULTILINE)
_MEDIA_KEYS = {"video": ("video", "path", "url"), "audio": ("audio", "path", "url", "audio_url")}


@dataclass(frozen=True)
class MediaRef:
    """Media of one sample, every part optional: `video` and `audio` file paths and the `subtitle` spoken in the clip."""

    video: str | None = None
    audio: str | None = None
    subtitle: str | None = None

    def is_empty(self) -> bool:
        return self.video is None and self.audio is None and self.subtitle is None


@dataclass(frozen=True)
class RewardContext:
    """What a description is conditioned on: `subtitle`, `video` and `audio` paths (absolute, or relative to the
    model's media root; None: `<media_root>/video/<sample_id>.mp4` / `audio/<sample_id>.wav`), `sample_id`, and
    `decoded` media (`emoreward.data.media.SampleMedia`) used instead of the files. A missing field (None, NaN) is
    none: `RewardContext(subtitle=float("nan")) == RewardContext()`."""

    subtitle: str | None = None
    video: str | None = None
    audio: str | None = None
    sample_id: str | None = None
    decoded: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        # a missing field (None, NaN: pandas' empty cell; `is_missing`) is no field, as `reward_context` reads one
        for name in ("subtitle", "video", "audio", "sample_id"):
            if getattr(self, name) is not None and is_missing(getattr(self, name)):
                object.__setattr__(self, name, None)

    @classmethod
    def from_media(cls, sample_id: str | None, media: MediaRef | None) -> RewardContext:
        """The context of a sample with `MediaRef` media (video / audio path, subtitle), by the one rule
        (`reward_context`: text stripped, empty means none)."""
        if media is None:
            return reward_context(sample_id=sample_id)
        return reward_context(subtitle=media.subtitle, video=media.video, audio=media.audio, sample_id=sample_id)

    @classmethod
    def from_pair(cls, pair: Any) -> RewardContext:
        """The context both descriptions of a preference pair (`emoreward.data.pairs.PreferencePair`) share (the
        loader applied `reward_context`)."""
        return cls.from_media(pair.sample_id, pair.media)

    def media_ref(self) -> MediaRef:
        return MediaRef(self.video, self.audio, self.subtitle)


def subtitle_key(context: RewardContext) -> tuple[str | None]:
    """The part of a context a text reward model reads: `(subtitle or None,)`, the subtitle in the form every model
    reads it (`normal_text`: `emoreward.models.layout.context_text`), so an NFC and an NFD subtitle are one key;
    equal keys give equal rewards. A multimodal model's key starts with it."""
    return (normal_text(context.subtitle) if context.subtitle else None,)


# ---------------------------------------------------------------------------------------------- prompt parsing
def subtitle_from_text(
    text: str, end_markers: Sequence[str] = (), *, source: str = "<prompt>", row: int | None = None, name="prompt"
) -> str | None:
    """The subtitle a prompt text names: the rest of its `Subtitle:` line, ended early by any of `end_markers`;
    None when no line names one.

    Raises:
        DataError: two `Subtitle:` lines name different subtitles (named by source, row and field)."""
    found: str | None = None
    for match in SUBTITLE_LINE.finditer(text):
        line = match.group(1)
        for marker in end_markers:
            if marker and marker in line:
                line = line[: line.index(marker)]
        line = line.strip()
        if not line:
            continue
        if found is not None and not same_text(found, line):
            raise DataError(source, row, name, f"names two subtitles ({found!r} and {line!r}); give one")
        found = line
    return found


def message_text(content: Any) -> Any:
    """The text of a chat message's content: the string itself, or the text parts of a content list joined by
    newlines; any other value as it is, for the caller to refuse."""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    return content


def prompt_fields(
    prompt: Any, *, source: str = "<prompt>", row: int | None = None, name: str = "prompt", end_markers=()
) -> dict[str, str]:
    """Subtitle and media paths a prompt names (a string, messages, or a list of both); media parts with a path
    (`video`, `audio`, `path`, `url`, `audio_url`) name media, a part without one is a placeholder.

    Returns:
        `dict` with the keys among ``"subtitle"``, ``"video"``, ``"audio"`` that the prompt names.

    Raises:
        DataError: the prompt names two different values of one field, or a media part holds no path text."""
    found: dict[str, str] = {}

    def put(key: str, value: str) -> None:
        if found.get(key) not in (None, value):
            raise DataError(source, row, name, f"names two {key}s ({found[key]!r} and {value!r})")
        found[key] = value

    prompt = plain(prompt)
    if is_missing(prompt):
        return found
    items = prompt if isinstance(prompt, list) else [prompt]
    texts: list[str] = []
    for item in items:
        content = item.get("content") if isinstance(item, Mapping) else item
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content if isinstance(content, list) else []:
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in _MEDIA_KEYS:
                paths = [part.get(k) for k in _MEDIA_KEYS[kind] if not is_missing(part.get(k))]
                if not paths:
                    continue  # a placeholder: the media come from a column
                if not isinstance(paths[0], str):
                    raise DataError(source, row, name, f"a {kind} part holds {type(paths[0]).__name__}, not a path")
                if paths[0].strip():
                    put(kind, paths[0].strip())
    for text in texts:
        subtitle = subtitle_from_text(text, end_markers, source=source, row=row, name=name)
        if subtitle is not None:
            put("subtitle", subtitle)
    return found


# ---------------------------------------------------------------------------------------------- the one rule
def same(key: str, a: str | None, b: str | None) -> bool:
    """Two values of one context field are one value: subtitles as texts (`same_text`: Unicode form and line
    endings do not matter), media paths exactly (a file system tells NFC and NFD names apart)."""
    return same_text(a, b) if key == "subtitle" else a == b


def same_media(a: MediaRef, b: MediaRef) -> str | None:
    """The first field in which two samples' media differ (`same`), None when they agree."""
    return next((k for k in ("video", "audio", "subtitle") if not same(k, getattr(a, k), getattr(b, k))), None)


def reward_context(
    *,
    prompt: Any = None,
    subtitle: Any = None,
    video: Any = None,
    audio: Any = None,
    sample_id: Any = None,
    source: str = "<input>",
    row: int | None = None,
    names: Mapping[str, str] | None = None,
    end_markers: Sequence[str] = (),
) -> RewardContext:
    """The reward context of one description, from explicit fields and / or a prompt (rule: docs/data.md).

    Args:
        prompt: a prompt (text, messages, or a list of both) whose `Subtitle:` line and media parts name fields.
        subtitle, video, audio, sample_id: explicit fields (missing / empty: none; text stripped).
        source, row, names: where the input comes from and how it names each field, for error messages.
        end_markers: end-of-turn markers that end a `Subtitle:` line early (decoded chat text).

    Raises:
        DataError: a field that is not text, a prompt naming two values of a field, or an explicit field that
            differs from the one the prompt names (named by source, row and field)."""
    names = dict(names or {})
    given = {
        key: optional_text(value, source, row, names.get(key, key))
        for key, value in (("subtitle", subtitle), ("video", video), ("audio", audio))
    }
    from_prompt = prompt_fields(
        prompt, source=source, row=row, name=names.get("prompt", "prompt"), end_markers=end_markers
    )
    for key in CONTEXT_FIELDS:
        if given[key] is not None and from_prompt.get(key) is not None and not same(key, given[key], from_prompt[key]):
            raise DataError(
                source,
                row,
                names.get(key, key),
                f"{given[key]!r} differs from the {key} in the prompt ({from_prompt[key]!r}); give one",
            )
        if given[key] is None:
            given[key] = from_prompt.get(key)
    sample = optional_text(sample_id, source, row, names.get("sample_id", "sample_id"))
    return RewardContext(given["subtitle"], given["video"], given["audio"], sample)


def verl_context(
    extra_info: Mapping[str, Any] | None,
    ground_truth: Any = None,
    *,
    subtitle_key: str = "subtitle",
    video_key: str = "video",
    audio_key: str = "audio",
    sample_key: str = "sample_id",
    row: int | None = None,
) -> RewardContext:
    """The context of one verl sample from its ``extra_info`` (``subtitle_key="ground_truth"``: the subtitle is
    ``reward_model.ground_truth``).

    Raises:
        DataError: ``extra_info`` is not a mapping, or a field is not text."""
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise DataError("verl extra_info", row, None, f"expected a dict, got {type(extra_info).__name__}")
    info = extra_info or {}
    by_truth = subtitle_key == "ground_truth"
    return reward_context(
        subtitle=ground_truth if by_truth else info.get(subtitle_key),
        video=info.get(video_key),
        audio=info.get(audio_key),
        sample_id=info.get(sample_key),
        source="verl extra_info",
        row=row,
        names={"subtitle": "ground_truth" if by_truth else subtitle_key, "video": video_key, "audio": audio_key,
               "sample_id": sample_key},
    )  # fmt: skip


def openrlhf_context(
    prompt: str | None, label: Any = None, *, labels: str = "ignore", end_markers: Sequence[str] = (), row=None
) -> RewardContext:
    """The context of one OpenRLHF sample: the subtitle is its label, else the decoded prompt's `Subtitle:` line.

    Raises:
        DataError: the label and the prompt name different subtitles, or the prompt names two."""
    return reward_context(
        prompt=prompt,
        subtitle=label if labels == "subtitle" else None,
        source="OpenRLHF request",
        row=row,
        names={"subtitle": "labels", "prompt": "prompts"},
        end_markers=end_markers,
    )


__all__ = [
    "CONTEXT_FIELDS",
    "RewardContext",
    "message_text",
    "openrlhf_context",
    "prompt_fields",
    "reward_context",
    "subtitle_from_text",
    "subtitle_key",
    "verl_context",
]
