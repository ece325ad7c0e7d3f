"""`emoreward serve`: an HTTP reward server for RL pipelines (standard library only).

    emoreward serve --model DIR [--host 127.0.0.1] [--port 8000]

Endpoints (JSON in, JSON out):

- ``POST /v1/rewards``: ``{"descriptions": [str, ...], "media": {"subtitle": str, "video": str, "audio": str}}``
  (``media`` may also be a list with one object per description, or omitted) ->
  ``{"rewards": [float, ...], "model": str}``.
- ``POST /get_reward``: OpenRLHF's remote reward model (``--remote_rm_url http://HOST:PORT/get_reward``):
  ``{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [...]}`` ->
  ``{"rewards": [...], "scores": [...], "extra_logs": {...}}`` (the shape of ``openrlhf.cli.serve_rm`` and of
  ``openrlhf.utils.remote_rm_utils.remote_rm_fn``). The description is the query with its prompt removed
  (the whole query when ``prompts`` is absent); ``labels`` are the sample's subtitles with
  ``--openrlhf-labels subtitle`` and are ignored otherwise.
- ``GET /health``: ``{"status": "ok", "model": ..., "limits": {...}}``.

Bad requests get a 4xx with ``{"error": "..."}``: 400 (invalid JSON or fields), 404, 405, 411 (no
Content-Length), 413 (body, item count or description length over the limits), 415 (not JSON), 503 when all
request slots are busy. The server binds to 127.0.0.1 by default and has no authentication.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from emoreward.models.base import RewardContext


logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerLimits:
    """Request limits.

    Attributes:
        max_body_bytes (`int`): largest request body.
        max_items (`int`): most descriptions (or queries) in one request.
        max_chars (`int`): longest description, subtitle or query, in characters.
        max_concurrent (`int`): requests scored at once; more get 503.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_items: int = 256
    max_chars: int = 32_000
    max_concurrent: int = 4

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerLimits.{name} must be a positive integer, got {value!r}")


class RequestError(Exception):
    """A bad request: HTTP status and a message for the client."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class RewardService:
    """The scoring behind the endpoints: validates request bodies and scores them with one reward model.

    Args:
        model (`RewardModel`): the reward model, text (conditions on the subtitle only) or multimodal.
        limits (`ServerLimits`): request limits.
        batch_size (`int`): sequences per forward pass.
        openrlhf_labels (`"ignore"` or `"subtitle"`): what OpenRLHF ``labels`` are.
        allow_unused_media (`bool`): accept video / audio paths the text model cannot use (otherwise 400).
        media_root (`str` or `Path`, *optional*): the only folder media paths may point into (multimodal models);
            without it every media path is refused.
        name (`str`): the model name returned to clients.
    """

    def __init__(
        self,
        model: Any,
        limits: ServerLimits | None = None,
        batch_size: int = 16,
        openrlhf_labels: str = "ignore",
        allow_unused_media: bool = False,
        name: str = "emoreward",
        media_root: str | Path | None = None,
    ):
        if openrlhf_labels not in ("ignore", "subtitle"):
            raise ValueError(f"openrlhf_labels must be 'ignore' or 'subtitle', got {openrlhf_labels!r}")
        self.model = model
        self.limits = limits or ServerLimits()
        self.batch_size = batch_size
        self.openrlhf_labels = openrlhf_labels
        self.allow_unused_media = allow_unused_media
        self.name = name
        self.media_root = None if media_root is None else Path(media_root).resolve()
        if self.media_root is not None and not self.media_root.is_dir():
            raise ValueError(f"--media-root {media_root} is not a directory")
        self._model_lock = threading.Lock()  # one forward pass at a time bounds memory
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent)
        self.n_requests = 0
        self.n_scored = 0

    # ------------------------------------------------------------------ validation helpers
    def _strings(self, value: Any, field: str, allow_none: bool = False) -> list:
        if not isinstance(value, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field}' must be a list")
        if not value:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field}' is empty")
        if len(value) > self.limits.max_items:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field}' has {len(value)} items; the limit is {self.limits.max_items} per request",
            )
        for k, item in enumerate(value):
            self._string(item, f"{field}[{k}]", allow_none)
        return value

    def _string(self, item: Any, field: str, allow_none: bool = True) -> str | None:
        if item is None and allow_none:
            return None
        if not isinstance(item, str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field}' must be a string")
        if len(item) > self.limits.max_chars:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"'{field}' has {len(item)} characters; the limit is {self.limits.max_chars}",
            )
        return item

    def _media(self, media: Any, n: int) -> list[RewardContext]:
        """Contexts, one per description, from ``media`` (an object, a list of objects, or None).

        A text model reads the subtitle only (media paths are a 400 unless ``allow_unused_media``). A multimodal
        model reads ``video`` / ``audio`` paths relative to the server's media root: absolute paths, ``..`` parts
        and paths that leave the root through a symlink are a 400 naming the field, and no file is read for them.
        """
        if media is None:
            media = [None] * n
        elif isinstance(media, dict):
            media = [media] * n
        if not isinstance(media, list) or len(media) != n:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, "'media' must be an object or a list with one object per description"
            )
        contexts = []
        for k, ref in enumerate(media):
            if ref is None:
                ref = {}
            if not isinstance(ref, dict):
                raise RequestError(HTTPStatus.BAD_REQUEST, f"'media[{k}]' must be an object")
            unknown = sorted(set(ref) - {"subtitle", "video", "audio"})
            if unknown:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"'media[{k}]' has unknown keys {unknown}")
            paths = {key: self._string(ref.get(key), f"media[{k}].{key}") for key in ("video", "audio")}
            subtitle = self._string(ref.get("subtitle"), f"media[{k}].subtitle")
            if self.model.kind == "text":
                given = [key for key, value in paths.items() if value]
                if given and not self.allow_unused_media:
                    raise RequestError(
                        HTTPStatus.BAD_REQUEST,
                        f"'media[{k}].{given[0]}' given, but this reward model is text-only (it uses the subtitle); "
                        "start the server with --allow-unused-media to accept and ignore media paths",
                    )
                contexts.append(RewardContext(subtitle))
                continue
            resolved = {key: self._media_path(value, f"media[{k}].{key}") for key, value in paths.items()}
            for needed in sorted(self.model.modalities):
                if resolved[needed] is None and not (needed == "audio" and self._audio_from_video(resolved)):
                    raise RequestError(
                        HTTPStatus.BAD_REQUEST, f"'media[{k}].{needed}' is required: this reward model reads {needed}"
                    )
            contexts.append(RewardContext(subtitle, resolved["video"], resolved["audio"], sample_id=f"media[{k}]"))
        return contexts

    def _audio_from_video(self, resolved: dict[str, str | None]) -> bool:
        return bool(self.model.settings.use_audio_in_video and resolved["video"])

    def _media_path(self, value: str | None, field: str) -> str | None:
        """The absolute path of a media file inside the media root, or a 400 naming `field`."""
        if not value:
            return None
        if self.media_root is None:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                f"'{field}': media paths are refused: the server was started without --media-root",
            )
        path = Path(value)
        if path.is_absolute() or ".." in path.parts or "\x00" in value:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"'{field}' must be a relative path inside the media root, without '..'"
            )
        full = (self.media_root / path).resolve()
        if not full.is_relative_to(self.media_root):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field}' leaves the media root (through a symlink)")
        if not full.is_file():
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{field}': no such file in the media root: {value}")
        return str(full)

    def _score(self, descriptions: list[str], contexts: list[RewardContext]) -> list[float]:
        from emoreward.data.media import MediaError

        with self._model_lock:
            try:
                scores = self.model.score(descriptions, contexts, batch_size=self.batch_size)
            except MediaError as err:
                raise RequestError(
                    HTTPStatus.BAD_REQUEST, f"{err.sample_id}: cannot read media: {err.problem}"
                ) from None
        self.n_requests += 1
        self.n_scored += len(descriptions)
        return [float(s) for s in scores]

    # ------------------------------------------------------------------ endpoints
    def rewards(self, body: Any) -> dict[str, Any]:
        """``/v1/rewards``: ``{"descriptions": [...], "media": {...} | [...]}`` -> ``{"rewards": [...]}``."""
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        unknown = sorted(set(body) - {"descriptions", "media"})
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown fields {unknown}; expected 'descriptions', 'media'")
        if "descriptions" not in body:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing field 'descriptions'")
        descriptions = self._strings(body["descriptions"], "descriptions")
        contexts = self._media(body.get("media"), len(descriptions))
        return {"rewards": self._score(descriptions, contexts), "model": self.name}

    def openrlhf(self, body: Any) -> dict[str, Any]:
        """``/get_reward``: OpenRLHF ``{"query", "prompts", "labels"}`` -> ``{"rewards", "scores", "extra_logs"}``."""
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        if "query" not in body:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing field 'query' (OpenRLHF remote reward model request)")
        queries = self._strings(body["query"], "query")
        n = len(queries)
        prompts = body.get("prompts")
        if prompts is not None:
            prompts = self._strings(prompts, "prompts")
            if len(prompts) != n:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{len(prompts)} prompts for {n} queries")
        descriptions = []
        for k, query in enumerate(queries):
            if prompts is None:
                descriptions.append(query.strip())
            elif query.startswith(prompts[k]):
                descriptions.append(query[len(prompts[k]) :].strip())
            else:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"query[{k}] does not start with prompts[{k}]")
        subtitles: list[str | None] = [None] * n
        labels = body.get("labels")
        if self.openrlhf_labels == "subtitle" and labels is not None:
            labels = self._strings(labels, "labels", allow_none=True)
            if len(labels) != n:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"{len(labels)} labels for {n} queries")
            subtitles = [label or None for label in labels]
        if self.model.modalities:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                "/get_reward carries no media and this reward model reads "
                f"{' and '.join(sorted(self.model.modalities))}: use /v1/rewards with 'media'",
            )
        rewards = self._score(descriptions, [RewardContext(s) for s in subtitles])
        return {"rewards": rewards, "scores": rewards, "extra_logs": {"emotion_reward": rewards}}

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.name, "limits": asdict(self.limits), "n_requests": self.n_requests}


def _handler(service: RewardService) -> type[BaseHTTPRequestHandler]:
    routes = {"/v1/rewards": service.rewards, "/get_reward": service.openrlhf}

    class Handler(BaseHTTPRequestHandler):
        server_version = "emoreward-serve"
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds to read a request; a stalled client cannot hold a thread forever

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            logger.info("%s %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._send(HTTPStatus.OK, service.health())
            elif path in routes:
                self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} takes POST"})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {path}; try /v1/rewards or /get_reward"})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            try:
                endpoint = routes.get(path)
                if endpoint is None:
                    status = HTTPStatus.METHOD_NOT_ALLOWED if path == "/health" else HTTPStatus.NOT_FOUND
                    raise RequestError(status, f"no POST endpoint {path}; try /v1/rewards or /get_reward")
                body = self._read_json()
                if not service._slots.acquire(blocking=False):
                    raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "all request slots are busy; retry later")
                try:
                    result = endpoint(body)
                finally:
                    service._slots.release()
            except RequestError as err:
                self._send(err.status, {"error": err.message})
                return
            except Exception:  # a failure inside the model: 500, without internals in the reply
                logger.exception("scoring failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "scoring failed; see the server log"})
                return
            self._send(HTTPStatus.OK, result)

        def _read_json(self) -> Any:
            ctype = self.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
            if ctype != "application/json":
                raise RequestError(
                    HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be application/json, got {ctype}"
                )
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or "Content-Length" not in self.headers:
                raise RequestError(
                    HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header (chunked bodies are refused)"
                )
            try:
                length = int(self.headers["Content-Length"])
            except ValueError:
                raise RequestError(HTTPStatus.BAD_REQUEST, "invalid Content-Length") from None
            if length < 0:
                raise RequestError(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
            if length > service.limits.max_body_bytes:
                raise RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"body of {length} bytes; the limit is {service.limits.max_body_bytes}",
                )
            raw = self.rfile.read(length)
            try:
                return json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {err}") from None

    return Handler


class RewardServer:
    """A threading HTTP server around a `RewardService`; use as a context manager in tests.

    Args:
        service (`RewardService`): what the endpoints call.
        host (`str`): address to bind (default loopback; anything else warns: there is no authentication).
        port (`int`): TCP port; 0 picks a free one (read it back from ``.port``).
    """

    def __init__(self, service: RewardService, host: str = "127.0.0.1", port: int = 8000):
        if host not in LOOPBACK:
            logger.warning(
                "binding the reward server to %s: it has no authentication, anyone who reaches it can use it", host
            )
        self.service = service
        self.httpd = ThreadingHTTPServer((host, port), _handler(service))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return self.httpd.server_address[0]

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RewardServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="emoreward-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------------- CLI


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward serve`."""
    p.add_argument("--model", required=True, help="a reward-model directory (emoreward train, or a merged export)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; no authentication)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass")
    p.add_argument("--max-body-bytes", type=int, default=ServerLimits.max_body_bytes, help="largest request body")
    p.add_argument("--max-items", type=int, default=ServerLimits.max_items, help="most descriptions per request")
    p.add_argument("--max-chars", type=int, default=ServerLimits.max_chars, help="longest text field, in characters")
    p.add_argument(
        "--max-concurrent", type=int, default=ServerLimits.max_concurrent, help="requests at once (else 503)"
    )
    p.add_argument(
        "--openrlhf-labels",
        choices=["ignore", "subtitle"],
        default="ignore",
        help="what the 'labels' of OpenRLHF requests are (--label_key): ignored, or the sample's subtitle",
    )
    p.add_argument("--allow-unused-media", action="store_true", help="text models: accept (and ignore) media paths")
    p.add_argument(
        "--media-root",
        help="multimodal models: the only folder request media paths may point into (relative paths); without it "
        "media paths are refused",
    )


def run_serve(args: argparse.Namespace) -> int:
    """Load the model and serve until interrupted (Ctrl-C)."""
    from emoreward.models import load_reward_model

    limits = ServerLimits(args.max_body_bytes, args.max_items, args.max_chars, args.max_concurrent)
    model = load_reward_model(args.model, media_root=args.media_root)
    service = RewardService(
        model,
        limits,
        batch_size=args.batch_size,
        openrlhf_labels=args.openrlhf_labels,
        allow_unused_media=args.allow_unused_media,
        name=str(args.model),
        media_root=args.media_root,
    )
    server = RewardServer(service, args.host, args.port)
    _echo(f"emoreward serve: {args.model} on {server.url}  (POST /v1/rewards, POST /get_reward, GET /health)")
    if args.host not in LOOPBACK:
        _echo("warning: not bound to loopback and there is no authentication")
    start = time.time()
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    _echo(f"served {service.n_requests} requests ({service.n_scored} descriptions) in {time.time() - start:.0f} s")
    return 0


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["RequestError", "RewardServer", "RewardService", "ServerLimits", "add_serve_arguments", "run_serve"]
