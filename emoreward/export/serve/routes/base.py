"""What a wire route is (`Route`, `RouteOption`) and the registry of routes (`ROUTES`, `register`, `admit`,
`endpoints`, `options`, `settings`): the built-in routes and any added later register here. See docs/serving.md."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar

from emoreward.export.serve.fields import BodyField, check_body_fields
from emoreward.export.serve.protocol import RequestError, ServerLimits, check_bearer, check_body_headers


if TYPE_CHECKING:
    from emoreward.export.length_monitor import StreamLengthMonitor
    from emoreward.export.serve.batching import Job
    from emoreward.export.serve.fields import RequestFields


@dataclass(frozen=True)
class RouteOption:
    """A setting of one route: a keyword of `RewardService` (and `local.shared_batcher`) named ``name``, and the
    ``emoreward serve`` option ``flag`` (``repeat``: given once per value, a tuple; ``choices``: the values taken;
    ``env``: the environment variable OpenRLHF's reward file, `emoreward.export.serve.reward_func`, reads it from;
    ``media_only``: the choices that apply only to a reward model that reads media, refused for a text model by
    `settings`)."""

    name: str
    flag: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    repeat: bool = False
    env: str | None = None
    media_only: tuple[str, ...] = ()

    def where(self, value: Any, settings_in: str = "server") -> str:
        """How the user set ``value``: ``--flag value`` (``emoreward serve``), or ``ENV=value`` (OpenRLHF's reward
        file, ``settings_in="environment"``)."""
        return f"{self.env}={value}" if settings_in == "environment" and self.env else f"{self.flag} {value}"


class Route:
    """One wire route, bound to the request fields of the service that serves it (one instance per service).

    A subclass sets ``path`` (``"/v1/rewards"``), ``name`` (what `RewardService.parse` takes), ``media_field`` (the
    request field a media error names), ``options`` and ``body_fields`` (its request's top-level fields and when
    each is required, `emoreward.export.serve.fields.BodyField`: `RewardService.parse` checks a body against them,
    `RequestFields.body`, before `parse` sees it), and writes `parse` and `reply`; ``fields`` (`RequestFields`:
    ``items``, ``text``, ``contexts``, ``context``, ``job``) validates fields as every route does. A route never
    calls back into the service.

    Args:
        fields (`RequestFields`): the request-field validation of the served model.
        model_name (`str`): the model name replies carry.
        length_monitor (`StreamLengthMonitor`, *optional*): the server's length-hacking monitor (replies that
            report its figures read it).
        **options: this route's options (`RouteOption` names), defaults filled in (`settings`).
    """

    path: ClassVar[str]
    name: ClassVar[str]
    media_field: ClassVar[str] = "media"
    options: ClassVar[tuple[RouteOption, ...]] = ()
    body_fields: ClassVar[tuple[BodyField, ...]] = ()

    def __init__(
        self,
        fields: RequestFields,
        *,
        model_name: str = "emoreward",
        length_monitor: StreamLengthMonitor | None = None,
        **options: Any,
    ):
        self.fields = fields
        self.model_name = model_name
        self.length_monitor = length_monitor
        self.settings = options

    def parse(self, body: dict) -> Job:
        """A validated `Job` from a request body whose top-level fields `RequestFields.body` checked (name -> value,
        None where not given, for every field of ``body_fields``). Raises `RequestError` (400 / 413 naming the
        field)."""
        raise NotImplementedError

    def reply(self, job: Job, rewards: list[float], truncated: list[bool], empty: list[bool]) -> dict[str, Any]:
        """The JSON reply of a scored job (``rewards``, ``truncated``, ``empty``: one per description)."""
        raise NotImplementedError


ROUTES: dict[str, type[Route]] = {}  # path -> route class


def register(route: type[Route]) -> type[Route]:
    """Add a route to the registry (a class decorator). Raises ValueError for a path or name already taken, or a
    ``body_fields`` declaration that is not whole (`fields.check_body_fields`)."""
    check_body_fields(route)
    taken = {r.name for r in ROUTES.values()}
    if route.path in ROUTES or route.name in taken or route.name == "health":
        raise ValueError(f"route {route.name!r} ({route.path}): its path or name is taken")
    ROUTES[route.path] = route
    return route


def unregister(route: type[Route]) -> None:
    """Remove a route (tests that register one of their own)."""
    ROUTES.pop(route.path, None)


def options() -> dict[str, RouteOption]:
    """Every route's options by keyword name."""
    return {option.name: option for route in ROUTES.values() for option in route.options}


def settings(
    given: dict[str, Any], *, reads_media: bool | None = None, settings_in: str = "server"
) -> dict[str, dict[str, Any]]:
    """route name -> its options, ``given`` (keyword -> value) over the defaults.

    Args:
        reads_media: whether the served model reads media (None: not known yet, nothing checked): a text model
            refuses an option's ``media_only`` choices.
        settings_in: where an error says an option is set (`RouteOption.where`).

    Raises:
        TypeError: a keyword no route takes; ValueError: a value outside an option's choices, or a ``media_only``
            choice for a model that reads no media (one line naming the option).
    """
    known = options()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"unknown route options {unknown}; known: {sorted(known)}")
    out = {}
    for route in ROUTES.values():
        values = {o.name: given.get(o.name, o.default) for o in route.options}
        for o in route.options:
            if o.choices is not None and values[o.name] not in o.choices:
                raise ValueError(f"{o.where(values[o.name], settings_in)}: expected one of {', '.join(o.choices)}")
            if reads_media is False and values[o.name] in o.media_only:
                others = [c for c in o.choices or () if c not in o.media_only]
                raise ValueError(
                    f"{o.where(values[o.name], settings_in)} applies to reward models that read media; this one is a "
                    f"text model (choose one of {others})"
                )
            if o.repeat:
                values[o.name] = tuple(values[o.name] or ())
        out[route.name] = values
    return out


def endpoints() -> str:
    """The served endpoints for a banner: ``POST /v1/rewards, POST /get_reward, GET /health``."""
    return ", ".join([*(f"POST {path}" for path in ROUTES), "GET /health"])


def admit(method: str, path: str, headers: dict[str, str], token: str | None, limits: ServerLimits) -> str:
    """The name of the route a request head names (``"health"`` for ``GET /health``) after the checks every engine
    makes before reading a body (``headers``: lower-case names): the path, the method, the bearer token, and for a
    route the body headers (`protocol.check_body_headers`).

    Raises:
        RequestError: 404 (naming the paths served), 405, 401, 415, 411 or 413.
    """
    if path == "/health":
        if method != "GET":
            raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "/health takes GET", [("Allow", "GET")])
        check_bearer(headers, token)
        return "health"
    route = ROUTES.get(path)
    if route is None:
        raise RequestError(HTTPStatus.NOT_FOUND, f"no endpoint {path}; try {' or '.join(ROUTES)}")
    if method != "POST":
        raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes POST", [("Allow", "POST")])
    check_bearer(headers, token)
    check_body_headers(headers, limits)  # a Content-Length within the limit; chunked bodies are a 411
    return route.name


__all__ = [
    "ROUTES",
    "BodyField",
    "Route",
    "RouteOption",
    "admit",
    "endpoints",
    "options",
    "register",
    "settings",
    "unregister",
]
