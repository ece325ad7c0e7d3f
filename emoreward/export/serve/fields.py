"""Request-field validation of the reward server, as one object every route receives (`RequestFields`): the body's
top-level fields against the route's declaration (`BodyField`: unknown, missing, per-item counts, by the server's
settings), lists, texts (Unicode, the character limit), media objects into `RewardContext`s by the one context and
media rules, media paths confined to the media root, and the `Job` of a parsed request. No HTTP and no scoring:
routes validate here and never call back into `RewardService`. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

from emoreward.data.context import MediaRef, RewardContext, reward_context
from emoreward.data.errors import DataError
from emoreward.data.media import unused_media
from emoreward.data.text import normal_text
from emoreward.export.serve.batching import Job
from emoreward.export.serve.facts import ServedModelFacts
from emoreward.export.serve.protocol import RequestError, ServerLimits


# bytes of one file or folder name at most (NAME_MAX of Linux, macOS and Windows file systems)
MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class BodyField:
    """One top-level field of a route's request body, as the route declares it (`Route.body_fields`): what
    `RequestFields.body` checks before the route reads anything, on every engine.

    Args:
        name (`str`): the JSON key.
        help (`str`): what it carries (quoted by the refusal of a missing field).
        role (`str`): ``"items"``: the list scored, one reward per item (exactly one field of a route);
            ``"per_item"``: a list with one item per item of the ``items`` field; ``"per_item_or_object"``: that,
            or one object for every item; ``"whole"``: one value for the whole request (the route checks it).
        required (`bool`): the request has it whatever the settings (absent: a 400 ``missing field``).
        required_when (`tuple`): ``(setting, values)``: required when the route's setting (a `RouteOption` name)
            is one of ``values``, which read it; under any other value it is optional (its counts still checked).
        allow_empty (`bool`): ``items`` only: an empty list is a request (answered at once with empty lists).
        noun (`str`): ``items`` only: what its items are, in messages (``"queries"``).
    """

    name: str
    help: str
    role: Literal["items", "per_item", "per_item_or_object", "whole"] = "per_item"
    required: bool = False
    required_when: tuple[str, tuple[Any, ...]] | None = None
    allow_empty: bool = False
    noun: str = "items"


def check_body_fields(route: type) -> None:
    """A route's declaration (a `emoreward.export.serve.routes.Route` subclass) is whole: ``body_fields`` names each
    field once, exactly one ``items`` field, and every ``required_when`` names one of the route's options and values
    it takes. Raises ValueError naming the route."""
    declared = getattr(route, "body_fields", ())
    names = [field.name for field in declared]
    if len([f for f in declared if f.role == "items"]) != 1 or len(set(names)) != len(names):
        raise ValueError(f"route {route.path}: body_fields must name each field once, exactly one with role 'items'")
    options = {option.name: option for option in route.options}
    for field in declared:
        if field.required_when is None:
            continue
        setting, values = field.required_when
        choices = options[setting].choices if setting in options else None
        if choices is None or not set(values) <= set(choices):
            raise ValueError(f"route {route.path}: '{field.name}' is required by {setting}={values}, no option of it")


class RequestFields:
    """The validation of request fields that every route shares; each check is a 400 / 413 `RequestError` naming
    the field, raised before any work.

    Args:
        facts (`ServedModelFacts`): what the served model reads (kind, modalities, length limit, characters).
        limits (`ServerLimits`): request limits (``max_items``; ``max_chars``, default ``facts.max_chars``).
        media_root (`str` or `Path`, *optional*): the only folder media paths may point into (multimodal models);
            without it every media path is refused.
        allow_unused_media (`bool`): a text model accepts (and ignores) video / audio paths (otherwise 400).
        settings_in (`str`): where the route settings an error names are set: ``"server"`` (``emoreward serve``'s
            options) or ``"environment"`` (OpenRLHF's reward file: each `RouteOption`'s ``env``).

    Raises:
        ValueError: a ``media_root`` that is not a directory.
    """

    def __init__(
        self,
        facts: ServedModelFacts,
        limits: ServerLimits,
        *,
        media_root: str | Path | None = None,
        allow_unused_media: bool = False,
        settings_in: str = "server",
    ):
        if settings_in not in ("server", "environment"):
            raise ValueError(f"settings_in must be 'server' or 'environment', got {settings_in!r}")
        self.settings_in = settings_in
        self.facts = facts
        self.limits = limits
        self.max_chars = limits.max_chars or facts.max_chars
        self.max_length = facts.max_length
        self.allow_unused_media = allow_unused_media
        self.media_root = None if media_root is None else Path(media_root).resolve()
        if self.media_root is not None and not self.media_root.is_dir():
            raise ValueError(f"--media-root {media_root} is not a directory")

    def body(self, body: dict, route: Any) -> dict[str, Any]:
        """The fields ``route`` (a `Route`: its ``body_fields``, ``settings``, ``options``) declares, checked against
        its settings before any work: name -> value, None where not given (absent, or ``null`` for a field that is not
        required).

        Raises:
            RequestError: 400 naming the field: a field the route does not declare; a required field absent (one
                that a setting makes required names the option); the ``items`` field not a list, empty where that
                is no request (413 over ``max_items``); a per-item field that is not a list of one item per item,
                whatever the settings.
        """
        declared = route.body_fields
        names = [field.name for field in declared]
        unknown = sorted(set(body) - set(names))
        if unknown:
            expected = ", ".join(f"'{name}'" for name in names)
            raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown fields {unknown}; expected {expected}")
        for field in declared:
            if field.name not in body and field.required:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"missing field '{field.name}' ({field.help})")
        items = next(field for field in declared if field.role == "items")
        n = len(self.items(body[items.name], items.name, allow_empty=items.allow_empty))
        for field in declared:
            if body.get(field.name) is None and field.required_when is not None:
                setting, values = field.required_when
                value = route.settings[setting]
                if value in values:
                    option = next(o for o in route.options if o.name == setting)
                    where = option.where(value, self.settings_in)
                    where = where if self.settings_in == "environment" and option.env else f"the server's {where}"
                    raise RequestError(
                        HTTPStatus.BAD_REQUEST, f"missing field '{field.name}': {where} reads it ({field.help})"
                    )
        for field in declared:
            if field.role.startswith("per_item") and (body.get(field.name) is not None or field.required):
                self.per_item(body[field.name], field.name, n, items, object_ok=field.role == "per_item_or_object")
        return {name: body.get(name) for name in names}

    def per_item(self, value: Any, field_name: str, n: int, items: BodyField, object_ok: bool = False) -> None:
        """A 400 naming ``field_name`` unless ``value`` is a list of one item per item of ``items`` (``n``), or an
        object where ``object_ok`` (one object for every item)."""
        if object_ok and isinstance(value, dict):
            return
        if not isinstance(value, list):
            kind = "an object or a list" if object_ok else "a list"
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field_name}' must be {kind} with one item per item of '{items.name}'"
            )
        if len(value) != n:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' has {len(value)} items for {n} {items.noun}")

    def items(self, value: Any, field_name: str, allow_empty: bool = False) -> list:
        """The list at ``field_name``, or a 400 / 413 naming it (empty, not a list, over ``max_items``)."""
        if not isinstance(value, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a list")
        if not value and not allow_empty:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' is empty")
        if len(value) > self.limits.max_items:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {len(value)} items; the limit is {self.limits.max_items} per request",
            )
        return value

    def text(self, item: Any, field_name: str, allow_none: bool = False, cap: bool = True) -> str | None:
        """The text at ``field_name``, or a 400 / 413 naming it (not a string, a lone surrogate, over ``max_chars``)."""
        if item is None and allow_none:
            return None
        if not isinstance(item, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a string")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' is not valid Unicode text: a lone surrogate (\\u{ord(item[err.start]):04x}) at "
                f"character {err.start}",
            ) from None
        n_chars = len(normal_text(item)) if cap else 0  # counted as the model reads it: NFC and NFD are one text
        if n_chars > self.max_chars:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field_name}' has {n_chars} characters; the limit is {self.max_chars} (no text that long fits "
                f"the model's {self.max_length} tokens)",
            )
        return item

    def estimate_tokens(self, description: str, context: RewardContext) -> int:
        """About how many tokens the model reads for one (description, context) (4 characters a token, at most
        ``max_length``): what the batcher's fair slices and the forward-pass size count."""
        tokens = 2 + (len(description) + len(context.subtitle or "")) // 4
        return min(tokens, self.max_length) if self.max_length else tokens

    def job(self, route: str, descriptions: list[str], contexts: list[RewardContext], fields: list[str]) -> Job:
        """The `Job` of a parsed request, its token costs estimated."""
        costs = [self.estimate_tokens(d, c) for d, c in zip(descriptions, contexts)]
        return Job(route, descriptions, contexts, fields, costs)

    def contexts(self, media: Any, n: int) -> list[RewardContext]:
        """Contexts, one per description, from ``media`` (an object, a list of ``n`` objects as `body` checked it, or
        None).

        A text model reads the subtitle only (media paths are a 400 unless ``allow_unused_media``). A multimodal
        model reads ``video`` / ``audio`` paths relative to the server's media root: absolute paths, ``..`` parts
        and paths that leave the root through a symlink are a 400 naming the field, and no file is read for them.
        """
        if isinstance(media, dict):  # one object for every description: checked and resolved once
            return [self.context(media, "media[0]")] * n
        if media is None:
            media = [None] * n
        if not isinstance(media, list) or len(media) != n:  # a route passes only what `body` checked
            raise ValueError(f"media must be checked first (RequestFields.body): {type(media).__name__} for {n}")
        return [self.context(ref, f"media[{k}]") for k, ref in enumerate(media)]

    def context(
        self,
        ref: Any,
        where: str,
        keys: tuple[str, ...] = ("subtitle", "video", "audio"),
        prompt: str | None = None,
        end_markers: list[str] | tuple[str, ...] = (),
    ) -> RewardContext:
        """The context of one media object (None: no media) found at ``where`` in the request (``media[3]``, or
        ``labels[3]`` for an OpenRLHF label that names the clip, which may also carry a ``sample_id``; its
        ``prompt`` may name the subtitle on a ``Subtitle:`` line), by the one context rule
        (`emoreward.data.context.reward_context`) and the one media rule (`emoreward.data.media.unused_media`)."""
        if ref is None:
            ref = {}
        if not isinstance(ref, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{where}' must be an object")
        unknown = sorted(set(ref) - set(keys))
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{where}' has unknown keys {unknown}")
        paths = {key: self.text(ref.get(key), f"{where}.{key}", allow_none=True) for key in ("video", "audio")}
        subtitle = self.text(ref.get("subtitle"), f"{where}.subtitle", allow_none=True)
        sample_id = self.text(ref.get("sample_id"), f"{where}.sample_id", allow_none=True)
        facts = self.facts
        if facts.kind == "text":
            given = [key for key, value in paths.items() if value]
            if given and not self.allow_unused_media:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST,
                    f"'{where}.{given[0]}' given, but this reward model is text-only (it uses the subtitle); "
                    "start the server with --allow-unused-media to accept and ignore media paths",
                )
            return self._rule(where, end_markers, subtitle=subtitle, prompt=prompt)
        ref_paths = MediaRef(paths["video"], paths["audio"])
        for key, why in unused_media(ref_paths, need_video=facts.sees_video, need_audio=facts.hears_audio,
                                     use_audio_in_video=facts.use_audio_in_video):  # fmt: skip
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{where}.{key}' given, but {why}: remove it (it would not change the reward)"
            )
        resolved = {key: self.media_path(value, f"{where}.{key}") for key, value in paths.items()}
        for needed in sorted(facts.modalities):
            if resolved[needed] is None and not (needed == "audio" and self._audio_from_video(resolved)):
                raise RequestError(
                    HTTPStatus.BAD_REQUEST, f"'{where}.{needed}' is required: this reward model reads {needed}"
                )
        # the sample id names the media as the client wrote it: equal media share one prefix, and errors name the
        # client's path, not the server's file layout
        sample = sample_id or paths["video"] or paths["audio"]
        return self._rule(
            where,
            end_markers,
            subtitle=subtitle,
            prompt=prompt,
            video=resolved["video"],
            audio=resolved["audio"],
            sample_id=sample,
        )

    def _rule(self, where: str, end_markers, **fields: Any) -> RewardContext:
        """`reward_context` of the request's fields; a conflict (a subtitle field and a prompt's `Subtitle:` line
        that differ) is a 400 naming the field."""
        try:
            return reward_context(**fields, source="request", names={"subtitle": f"{where}.subtitle"},
                                  end_markers=end_markers)  # fmt: skip
        except DataError as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, str(err)) from None

    def _audio_from_video(self, resolved: dict[str, str | None]) -> bool:
        return bool(self.facts.use_audio_in_video and resolved["video"])

    def media_path(self, value: str | None, field_name: str) -> str | None:
        """The absolute path of a media file inside the media root, or a 400 naming `field_name` (no file is read
        for a refused path: only the path is resolved)."""
        if not value:
            return None
        if self.media_root is None:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}': media paths are refused: the server was started without --media-root",
            )
        path = Path(value)
        if path.is_absolute() or ".." in path.parts or "\x00" in value:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field_name}' must be a relative path inside the media root, without '..'"
            )
        longest = max(len(os.fsencode(part)) for part in path.parts)
        if longest > MAX_NAME_BYTES:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' has a file or folder name of {longest} bytes; names have at most {MAX_NAME_BYTES}",
            )
        try:
            full = (self.media_root / path).resolve()
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13, OSError after)
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field_name}' cannot be resolved in the media root (a symlink loop?): {value}",
            ) from None
        if not full.is_relative_to(self.media_root):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}' leaves the media root (through a symlink)")
        try:
            found = full.is_file()
        except OSError as err:  # e.g. a path longer than the system takes
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field_name}' cannot be a file in the media root: {err.strerror}"
            ) from None
        if not found:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field_name}': no such file in the media root: {value}")
        return str(full)


__all__ = ["MAX_NAME_BYTES", "BodyField", "RequestFields", "check_body_fields"]
