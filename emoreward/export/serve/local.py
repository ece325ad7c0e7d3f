"""The one in-process scorer: a `RewardService` and its `Batcher` per process, model and settings, shared by every
thread and event loop that scores (OpenRLHF's Python reward file, verl's ``model=`` route, any framework that calls a
reward function from many threads). The model is loaded once, under a lock, and concurrent calls are scored together
in the batcher's model calls, exactly as the HTTP server scores concurrent requests (same routes, parsing, context
rule, limits and replies). See docs/serving.md.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from emoreward.export.serve import routes
from emoreward.export.serve.batching import Batcher
from emoreward.export.serve.protocol import RequestError, ServerLimits
from emoreward.export.serve.service import RewardService
from emoreward.models.loading import DEFAULT_ENGINE, open_reward_model


# no request limits in process: the queue is as long as the callers make it, and nothing times out
UNLIMITED = ServerLimits(max_items=2**31, max_queue=2**31, queue_timeout=1e9, max_chars=2**31)

_LOCK = threading.Lock()
_SHARED: dict[tuple, Batcher] = {}


def shared_batcher(
    model: str | Path,
    *,
    media_root: str | Path | None = None,
    vllm_url: str | None = None,
    batch_size: int = 64,
    limits: ServerLimits | None = None,
    allow_unused_media: bool = False,
    settings_in: str = "server",
    **route_options: Any,
) -> Batcher:
    """The process's batcher for a reward model directory and settings (loaded and started on first use; a model
    changed in place under the same path is loaded again: the key holds its content).

    Args:
        model: a reward-model directory (`emoreward train`, or a merged export).
        media_root: the only folder media paths may point into (multimodal models).
        vllm_url: score through the vLLM server at this URL serving ``model`` (an export folder;
            `emoreward.models.loading.open_reward_model`, engine ``"vllm"``) instead of loading it here.
        batch_size, allow_unused_media, settings_in, **route_options: as `RewardService` (OpenRLHF's
            ``openrlhf_labels``, ``extra_query_markers``, ...; ``settings_in="environment"``: OpenRLHF's reward file).
        limits: request limits and queueing (default `ServerLimits()`; `UNLIMITED`: none).

    Raises:
        ValueError / OSError: the model cannot be loaded (as `open_reward_model`).
    """
    from emoreward.models.loading import source_identity

    key = (
        source_identity(model),  # its content: a model changed in place under the same path is loaded again
        str(Path(model).resolve()),
        None if media_root is None else str(Path(media_root).resolve()),
        vllm_url,
        batch_size,
        limits,
        allow_unused_media,
        settings_in,
        repr(routes.settings(route_options)),  # every route's options, defaults filled in
    )
    with _LOCK:
        batcher = _SHARED.get(key)
        if batcher is None:
            root = None if media_root is None else str(media_root)
            engine = "vllm" if vllm_url else DEFAULT_ENGINE
            loaded = open_reward_model(str(model), engine, url=vllm_url, media_root=root)
            service = RewardService(
                loaded,
                limits,
                batch_size=batch_size,
                name=str(model),
                media_root=media_root,
                allow_unused_media=allow_unused_media,
                settings_in=settings_in,
                **route_options,
            )
            batcher = _SHARED[key] = Batcher(service)
            batcher.start()
        return batcher


def score_request(route: str, body: Any, batcher: Batcher) -> dict[str, Any]:
    """The reply to one request body, scored with the concurrent callers' requests (blocks the calling thread).

    Args:
        route: a route's name (`emoreward.export.serve.routes`: ``"rewards"``, ``"openrlhf"``, ...).
        body: the request body (a dict, as JSON would carry it).

    Raises:
        RequestError: what the HTTP server would answer with that status (400 / 413 / 503 / 500).
    """
    service = batcher.service
    try:
        return batcher.score(service.parse(route, body))
    except RequestError as err:
        service.record_error(err)
        raise


__all__ = ["UNLIMITED", "score_request", "shared_batcher"]
