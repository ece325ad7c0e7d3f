"""The reward server's wire routes, as objects: each route is one `Route` subclass in one module of this package (its
path, name, request parsing into a `Job`, JSON reply, media wording and route options), registered in `base.ROUTES`.
The HTTP server, the Ray replica, the 404 hint, the start-up banners, `emoreward serve`'s options and the in-process
scorer read this registry; a new client protocol is one module plus its test. See docs/serving.md.
"""

from __future__ import annotations

# the built-in routes register themselves on import, in the order the hints and banners list them
import emoreward.export.serve.routes.rewards  # noqa: F401


# isort: split
import emoreward.export.serve.routes.openrlhf  # noqa: F401
from emoreward.export.serve.routes.base import (
    ROUTES,
    BodyField,
    Route,
    RouteOption,
    admit,
    endpoints,
    options,
    register,
    settings,
    unregister,
)


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
