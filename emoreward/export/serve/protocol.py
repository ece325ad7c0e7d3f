"""The reward server's protocol, shared by every engine (`emoreward serve`, single process or Ray Serve): request
and response schemas, limits (`ServerLimits`, in tokens; `max_chars_for`), strict JSON, `RequestError` and the error
codes (JSON ``{"error": ...}`` naming the field), escaped logging (`loggable`) and bearer authentication.
The routes themselves are `emoreward.export.serve.routes`. See docs/serving.md#reward-server-emoreward-serve.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any


LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "EMOREWARD_SERVE_TOKEN"


def _limit(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """Request limits and queueing (defaults sized for RL rollouts: hundreds of samples in flight). Each field's help
    is the help of its ``emoreward serve`` option (``--max-body-bytes`` for ``max_body_bytes``, ...)."""

    max_body_bytes: int = _limit(
        64 * 1024 * 1024, "largest request body in bytes (older OpenRLHF posts a rollout at once)"
    )
    max_items: int = _limit(8192, "most descriptions (or OpenRLHF queries) per request")
    max_chars: int | None = _limit(
        None,
        "longest text field (description, subtitle, query) in characters, checked before tokenizing (default: "
        "derived from the model's max_length tokens, so that no text that fits is refused)",
    )
    max_queue: int = _limit(
        32768, "descriptions queued or being scored; beyond it a request is held until there is room"
    )
    queue_timeout: float = _limit(
        150.0, "seconds a request may wait (held, then queued) to be scored before a 503 + Retry-After"
    )
    max_batch_tokens: int = _limit(
        16384, "most estimated tokens (4 characters each) of queued requests in a model call"
    )
    max_call_seconds: float = _limit(
        1.0,
        "target seconds of one model call (at the measured scoring rate, at most --max-batch-tokens): larger "
        "requests are scored in slices, interleaved with the requests queued after them",
    )
    max_connections: int = _limit(
        1024,
        "open connections at most; when all are taken, a new client gets the slot of the connection that has waited "
        "longest (at least 1 s) for its client, else it waits unread for a slot (at most --queue-timeout s; as many "
        "waiting as the listen backlog, 1,024; beyond them 503)",
    )
    keepalive_timeout: float = _limit(15.0, "seconds an idle keep-alive connection stays open")
    read_timeout: float = _limit(
        60.0, "seconds to receive a whole request (head and body) from its first byte; then 408"
    )
    drain_timeout: float = _limit(
        60.0,
        "seconds SIGTERM / Ctrl-C waits for the requests in flight (received, queued, or in the accept queue) to be "
        "scored and answered; then the rest are closed and the exit status is 1",
    )

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "max_chars" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ServerLimits.{name} must be positive, got {value!r}")
        if self.max_items > self.max_queue:
            raise ValueError(f"ServerLimits.max_items ({self.max_items}) exceeds max_queue ({self.max_queue})")


def max_chars_for(model: Any, fallback: int = 32_000) -> int:
    """The longest text (characters) that can still fit in the model's ``max_length`` tokens.

    ``max_length`` times the longest token of the model's vocabulary in characters (a byte-level token, a word
    piece or a sentencepiece never decodes to more characters than its vocabulary entry has), and for WordPiece
    tokenizers at least the longest word that becomes one ``[UNK]``. Whitespace that a tokenizer drops is not
    bounded by this; such text is refused as over-long. Without a tokenizer: ``fallback``.
    """
    tokenizer = getattr(model, "tokenizer", None)
    max_length = int(getattr(getattr(model, "settings", None), "max_length", 0) or 0)
    if tokenizer is None or not max_length or not hasattr(tokenizer, "get_vocab"):
        return fallback
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    backend = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    longest = max(longest, int(getattr(backend, "max_input_chars_per_word", 0) or 0))
    return max_length * max(1, longest)


class RequestError(Exception):
    """A request answered with an error: HTTP status, a message for the client, extra headers."""

    def __init__(self, status: HTTPStatus | int, message: str, headers: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.status = HTTPStatus(status)
        self.message = message
        self.headers = headers or []


def parse_json(raw: bytes) -> Any:
    """A request body as JSON.

    Raises:
        RequestError: 400 for a body that is not UTF-8, not JSON, or nested too deeply to parse.
    """
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_int=_json_int)
    except UnicodeDecodeError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not UTF-8: {err}") from None
    except json.JSONDecodeError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid JSON body: {err}") from None
    except RecursionError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "invalid JSON body: nested too deeply") from None


class OversizedNumber:
    """A JSON integer of more than `MAX_INT_DIGITS` digits, kept unconverted (Python refuses to convert more than
    4,300 digits, and no request field takes a number): the field it is in is refused by its type check."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


MAX_INT_DIGITS = 4300


def _json_int(text: str) -> int | OversizedNumber:
    return OversizedNumber(len(text)) if len(text) > MAX_INT_DIGITS else int(text)


def loggable(text: Any, limit: int = 300) -> str:
    """What a client sent (a path, a field's value, an error message quoting it), fit for one log line: every
    character that is not printable (newlines, carriage returns, terminal escapes, U+2028, ...) written as its
    Python escape (``\\n``, ``\\x1b``), and cut to ``limit`` characters. So no client can write a line (a forged
    ``ERROR``) into the server's log."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def log_refusal(logger: Any, method: str, path: str, err: RequestError) -> None:
    """The server log's line for a refused request (every engine's): method, path, status and message, each
    escaped (`loggable`)."""
    logger.info("%s %s -> %d %s", loggable(method, 20), loggable(path, 200), err.status.value, loggable(err.message))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (JSON leaves duplicates undefined; Python keeps the last one,
    so `{"descriptions": [...], "descriptions": [...]}` would silently score only the second list)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"'{key}' appears twice in one JSON object")
        out[key] = value
    return out


def check_body_headers(headers: dict[str, str], limits: ServerLimits) -> None:
    """The checks of a POST that need no body (``headers``: lower-case names), so that a refused request's body is
    never read: JSON content type, a Content-Length (no chunked bodies), within ``limits.max_body_bytes``.

    Raises:
        RequestError: 415, 411 or 413.
    """
    ctype = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be application/json, got {ctype}")
    length = headers.get("content-length", "")
    if "chunked" in headers.get("transfer-encoding", "").lower() or not length.strip().isdigit():
        raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header (chunked bodies are refused)")
    if int(length) > limits.max_body_bytes:
        raise RequestError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {int(length)} bytes; the limit is {limits.max_body_bytes}"
        )


def check_bearer(headers: dict[str, str], token: str | None) -> None:
    """Refuse a request without ``Authorization: Bearer <token>`` (``headers``: lower-case names; no check when
    ``token`` is None). Compared in constant time; the token is never logged.

    Raises:
        RequestError: 401 with ``WWW-Authenticate``.
    """
    if token is None:
        return
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise RequestError(
            HTTPStatus.UNAUTHORIZED,
            "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
            [("WWW-Authenticate", 'Bearer realm="emoreward"')],
        )
