"""``POST /get_reward``, OpenRLHF's remote reward model: the description a policy wrote, recovered from OpenRLHF's
decoded query (`description_from_query`, the markers of `query_markers`), its context from the prompt or the label
(`clip_from_label`), and the reply OpenRLHF reads (``rewards``, ``scores``, ``extra_logs``). The route's options:
``--openrlhf-labels`` and ``--query-marker``. See docs/serving.md ("OpenRLHF").
"""

from __future__ import annotations

import functools
import mimetypes
import re
from http import HTTPStatus
from typing import Any

from emoreward.data.context import openrlhf_context
from emoreward.data.errors import DataError
from emoreward.data.media import layout_path, layout_sample_id
from emoreward.export.length_monitor import per_sample
from emoreward.export.serve.batching import Job
from emoreward.export.serve.protocol import RequestError
from emoreward.export.serve.routes.base import BodyField, Route, RouteOption, register
from emoreward.models.base import ScoreInfo


# the environment variables of OpenRLHF's reward file (`emoreward.export.serve.reward_func`) for this route's options
ENV_LABELS, ENV_MARKERS = "EMOREWARD_RM_LABELS", "EMOREWARD_RM_QUERY_MARKERS"


# End-of-turn, EOS and pad markers of common chat models, as `tokenizer.decode(..., skip_special_tokens=False)`
# writes them into OpenRLHF's queries (Qwen / ChatML, Llama 3, Phi, Gemma, Mistral / Llama 2, GPT-2 style).
DEFAULT_QUERY_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "<pad>",
    "</s>",
)


@functools.lru_cache(maxsize=64)
def _marker_pattern(markers: tuple[str, ...], at: str) -> re.Pattern:
    """The regex of a run of `markers` at the start or end of a query (compiled once per marker set: the markers
    are fixed for a server's life, and every OpenRLHF query is matched against them)."""
    alternatives = "|".join(re.escape(m) for m in sorted(set(markers), key=len, reverse=True) if m)
    if at == "start":
        return re.compile(rf"^(?:\s*(?:{alternatives}))+")
    return re.compile(rf"(?:{alternatives})(?:\s*(?:{alternatives}))*\s*$")


# what opens a chat turn in the templates of common policies (ChatML, Llama 3, Gemma, Mistral, Phi): a query that
# holds one holds a prompt, which only the request's 'prompts' can remove
CHAT_TURN_OPENERS = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "[INST]", "<|user|>", "<|assistant|>")


def chat_turn_opener(query: str) -> str | None:
    """The first chat-turn opener (`CHAT_TURN_OPENERS`) in ``query``, or None: a query sent without its prompt must
    be the response alone."""
    return next((marker for marker in CHAT_TURN_OPENERS if marker in query), None)


def description_from_query(
    query: str, prompt: str | None, pad_markers: list[str], end_markers: list[str]
) -> str | None:
    """The response text of an OpenRLHF query (``tokenizer.decode(prompt_ids + response_ids,
    skip_special_tokens=False)``, older versions: whole padded rows), exactly as the policy wrote it: ``pad_markers``
    stripped from the start of the query and the prompt, the prompt removed, ``end_markers`` (and whitespace between
    and after them) stripped from the end. None if ``query`` does not contain ``prompt`` where it should.
    """
    text = _marker_pattern(tuple(pad_markers), "start").sub("", query, count=1) if pad_markers else query
    if prompt is not None:
        prompt = _marker_pattern(tuple(pad_markers), "start").sub("", prompt, count=1) if pad_markers else prompt
        if text.startswith(prompt):
            text = text[len(prompt) :]
        elif text.lstrip().startswith(prompt.lstrip()):  # decoders that write a space after a special token
            text = text.lstrip()[len(prompt.lstrip()) :]
        else:
            return None
    return _marker_pattern(tuple(end_markers), "end").sub("", text, count=1) if end_markers else text


def query_markers(facts: Any, extra: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(pad markers, end markers) for `description_from_query`: `DEFAULT_QUERY_MARKERS`, the reward model's own
    EOS and pad tokens (end markers also its SEP token, which closes an encoder's input), and ``extra`` (the
    policy's markers when they are not among these). ``facts``: the model's `facts.ServedModelFacts` (its
    ``eos_token`` / ``pad_token`` / ``sep_token``)."""
    own = [t for t in (facts.eos_token, facts.pad_token) if t]
    pad = [*DEFAULT_QUERY_MARKERS, *own, *extra]
    end = pad + ([facts.sep_token] if facts.sep_token else [])
    return pad, end


# ---------------------------------------------------------------------------------------------- labels naming the clip
LABEL_OBJECT_KEYS = ("sample_id", "subtitle", "video", "audio")


def clip_from_label(label: Any, where: str, modalities: frozenset[str] | set[str], audio_from_video: bool) -> dict:
    """The media object (``subtitle`` / ``video`` / ``audio`` paths relative to the media root, ``sample_id``) an
    OpenRLHF label names under ``--openrlhf-labels clip`` (a model that reads media: a text model refuses the
    option, `routes.settings`). OpenRLHF's query is decoded text, so the clip of a sample can only travel in its
    label (the dataset's ``--data.label_key`` column). One clip, one reading, whatever the form:

    - a sample id (text without a path separator or a video / audio file suffix), the same as ``{"sample_id": id}``;
    - an object with the keys ``sample_id``, ``subtitle``, ``video``, ``audio`` (all optional): a sample id with
      no ``video`` / ``audio`` path names the media root's layout, ``video/<id>.mp4`` and ``audio/<id>.wav``
      (`emoreward.data.media`), for the media the model reads;
    - a media path relative to the media root (``video/s1.mp4``): the one file a model that reads one medium
      needs (a model reading video and audio needs a sample id or an object, unless its audio comes from the
      video).

    None (or an empty string) names nothing. Paths are only parsed here; the caller confines them to the media
    root (`RewardService`).

    Raises:
        RequestError: 400 naming ``where`` for a label of another type, unknown keys, or a path whose medium is
            ambiguous.
    """
    if label is None or label == "":
        return {}
    if isinstance(label, dict):
        unknown = sorted(set(label) - set(LABEL_OBJECT_KEYS))
        if unknown:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{where}' has unknown keys {unknown}; expected {list(LABEL_OBJECT_KEYS)}"
            )
        ref = dict(label)
    elif not isinstance(label, str):
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"'{where}' must be a sample id, a media path or an object, got {type(label).__name__}",
        )
    else:
        text = label.strip()
        if "/" in text or "\\" in text or _media_type(text):
            wanted = set(modalities) - ({"audio"} if audio_from_video else set())
            if len(wanted) != 1:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"'{where}' is a media path, but this reward model reads {' and '.join(sorted(modalities))}: "
                    "name the sample id, or give an object with 'video' and 'audio'",
                )
            return {next(iter(wanted)): text, "sample_id": layout_sample_id(text)}
        ref = {"sample_id": text}
    sample = ref.get("sample_id")
    if isinstance(sample, str) and sample and not ref.get("video") and not ref.get("audio"):
        if "video" in modalities or ("audio" in modalities and audio_from_video):
            ref["video"] = layout_path(sample, "video")
        if "audio" in modalities and not audio_from_video:
            ref["audio"] = layout_path(sample, "audio")
    return ref


def _media_type(name: str) -> bool:
    """The name ends in a video or audio file suffix (`mimetypes`): ``clip.mp4`` is a path, ``s0042.1`` an id."""
    kind = mimetypes.guess_type(name, strict=False)[0] or ""
    return kind.startswith(("video/", "audio/"))


# ---------------------------------------------------------------------------------------------- the route
LABELS = ("ignore", "subtitle", "clip")


@register
class OpenRLHF(Route):
    """``{"query": [...], "prompts": [...], "labels": [...]}`` (OpenRLHF's remote reward request; an empty query is
    a request too: OpenRLHF with several reward URLs splits a batch over them) -> ``{"rewards", "scores",
    "truncated", "empty", "extra_logs"}``, ``extra_logs`` holding the reward, its flags and the length monitor's
    figures once per sample."""

    path = "/get_reward"
    name = "openrlhf"
    media_field = "labels"
    options = (
        RouteOption(
            "openrlhf_labels",
            "--openrlhf-labels",
            "ignore",
            "what the 'labels' of OpenRLHF requests are (its --data.label_key / --label_key column): ignored, the "
            "sample's subtitle, or its clip (a sample id, a media path under --media-root, or an object with "
            "sample_id / subtitle / video / audio); under subtitle and clip a request without 'labels' is a 400",
            choices=LABELS,
            env=ENV_LABELS,
            media_only=("clip",),  # a text model reads no clip: its label is the subtitle
        ),
        RouteOption(
            "extra_query_markers",
            "--query-marker",
            (),
            "a special-token string of the policy to strip from OpenRLHF queries (its EOS / pad / end-of-turn "
            "text) when it is not one of: " + " ".join(DEFAULT_QUERY_MARKERS) + " (repeatable)",
            repeat=True,
            env=ENV_MARKERS,
        ),
    )
    # what OpenRLHF's clients send: `query` alone (early versions), `query` + `prompts`, or all three (labels: ""
    # per sample when --data.label_key is unset); 'labels' is read, so required, unless --openrlhf-labels ignore
    body_fields = (
        BodyField(
            "query",
            "the decoded prompt + response of each sample",
            role="items",
            required=True,
            allow_empty=True,
            noun="queries",
        ),
        BodyField("prompts", "the prompt of each sample"),
        BodyField(
            "labels",
            "each sample's subtitle or clip, OpenRLHF's --data.label_key column",
            required_when=("openrlhf_labels", ("subtitle", "clip")),
        ),
    )

    def __init__(self, fields: Any, **options: Any):
        super().__init__(fields, **options)
        self.labels = options["openrlhf_labels"]
        self.pad_markers, self.end_markers = query_markers(fields.facts, list(options["extra_query_markers"]))

    def parse(self, body: dict) -> Job:
        fields = self.fields
        queries = [fields.text(q, f"query[{k}]", cap=False) for k, q in enumerate(body["query"])]
        n = len(queries)
        prompts: list[str | None] = [None] * n
        if body["prompts"] is not None:
            prompts = [fields.text(p, f"prompts[{k}]", cap=False) for k, p in enumerate(body["prompts"])]
        descriptions = []
        for k, (query, prompt) in enumerate(zip(queries, prompts)):
            if prompt is None and (opener := chat_turn_opener(query)) is not None:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"query[{k}] holds a chat prompt ({opener!r}) and the request has no 'prompts': send "
                    "'prompts' (OpenRLHF's prompt text) so the response can be told apart from the prompt",
                )
            description = description_from_query(query, prompt, self.pad_markers, self.end_markers)
            if description is None:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"query[{k}] does not start with prompts[{k}] (after its left padding); send the decoded "
                    "prompt + response as OpenRLHF does",
                )
            descriptions.append(fields.text(description, f"query[{k}] (its response)"))
        job = fields.job(
            self.name, descriptions, self._contexts(body["labels"], prompts), [f"query[{k}]" for k in range(n)]
        )
        if not n:
            job.info = ScoreInfo([], [], [])  # answered at once, never queued
        return job

    def _contexts(self, labels: Any, prompts: list[str | None]) -> list:
        fields, n = self.fields, len(prompts)
        if self.labels == "ignore":  # their count is checked (`RequestFields.body`), their values not read
            labels = [None] * n
        modalities = fields.facts.modalities
        if modalities and self.labels != "clip":
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"{self.path} carries no media and this reward model reads "
                f"{' and '.join(sorted(modalities))}: start the server with --openrlhf-labels clip and "
                "name each sample's clip in its label, or use /v1/rewards with 'media'",
            )
        if self.labels == "clip":
            refs = [
                clip_from_label(label, f"labels[{k}]", modalities, fields.facts.use_audio_in_video)
                for k, label in enumerate(labels)
            ]
            return [
                fields.context(ref, f"labels[{k}]", LABEL_OBJECT_KEYS, prompt=prompts[k], end_markers=self.end_markers)
                for k, ref in enumerate(refs)
            ]
        subtitles = [fields.text(s, f"labels[{k}]", allow_none=True) or None for k, s in enumerate(labels)]
        try:  # the one context rule: the label, else the prompt's Subtitle: line (emoreward.data.context)
            return [
                openrlhf_context(p, s, labels="subtitle", end_markers=self.end_markers, row=k + 1)
                for k, (p, s) in enumerate(zip(prompts, subtitles))
            ]
        except DataError as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, str(err)) from None

    def reply(self, job: Job, rewards: list[float], truncated: list[bool], empty: list[bool]) -> dict[str, Any]:
        monitor = self.length_monitor
        return {
            "rewards": rewards,
            "scores": rewards,
            "truncated": truncated,
            "empty": empty,
            "extra_logs": {  # the same keys in every reply, an empty share's included (lists of its length)
                "emotion_reward": rewards,
                "emotion_reward_truncated": [float(t) for t in truncated],
                "emotion_reward_empty": [float(e) for e in empty],
                # the length-hacking monitor's figures over the server's recent rewards, once per sample
                **per_sample(monitor.figures() if monitor is not None else {}, job.n),
            },
        }
