"""In-process serving: one `RewardService` and one `Batcher` per process and settings, shared by every thread that
scores (OpenRLHF's Python reward file, any framework that calls a reward function from many threads). The model is
loaded once, under a lock, and concurrent calls are scored together in the batcher's model calls, exactly as the
HTTP server scores concurrent requests (same parsing, OpenRLHF query decoding, context rule, limits and replies).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from emoreward.export.serve.batching import Batcher
from emoreward.export.serve.protocol import RequestError, ServerLimits
from emoreward.export.serve.service import RewardService


_LOCK = threading.Lock()
_SHARED: dict[tuple, Batcher] = {}


def shared_batcher(
    model: str | Path,
    *,
    media_root: str | Path | None = None,
    openrlhf_labels: str = "ignore",
    extra_query_markers: tuple[str, ...] = (),
    batch_size: int = 64,
    limits: ServerLimits | None = None,
    vllm_url: str | None = None,
) -> Batcher:
    """The process's batcher for a reward model directory and settings (loaded and started on first use).

    Args:
        model: a reward-model directory (`emoreward train`, or a merged export).
        media_root: the only folder media paths may point into (multimodal models).
        openrlhf_labels, extra_query_markers, batch_size: as `RewardService`.
        limits: request limits and queueing (default `ServerLimits()`).
        vllm_url: score through the vLLM server at this URL serving ``model`` (an export folder;
            `emoreward.export.vllm.reward_model`) instead of loading it here.

    Raises:
        ValueError / OSError: the model cannot be loaded (as `load_reward_model`).
    """
    from emoreward.utils.cache_key import current_fingerprint

    key = (
        current_fingerprint(model),  # its content: a model changed in place under the same path is loaded again
        str(Path(model).resolve()),
        None if media_root is None else str(Path(media_root).resolve()),
        openrlhf_labels,
        tuple(extra_query_markers),
        batch_size,
        limits,
        vllm_url,
    )
    with _LOCK:
        batcher = _SHARED.get(key)
        if batcher is None:
            from emoreward.export.vllm import reward_model

            root = None if media_root is None else str(media_root)
            loaded = reward_model(str(model), media_root=root, vllm_url=vllm_url)
            service = RewardService(
                loaded,
                limits,
                batch_size=batch_size,
                openrlhf_labels=openrlhf_labels,
                name=str(model),
                media_root=media_root,
                extra_query_markers=list(extra_query_markers),
            )
            batcher = _SHARED[key] = Batcher(service)
            batcher.start()
        return batcher


def score_request(route: str, body: Any, batcher: Batcher) -> dict[str, Any]:
    """The reply to one request body, scored with the concurrent callers' requests (blocks the calling thread).

    Args:
        route: ``"rewards"`` or ``"openrlhf"`` (`RewardService.parse`).
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


__all__ = ["score_request", "shared_batcher"]
