"""verl hand-off: custom reward functions that score emotion descriptions with an emoreward reward model, loaded in
the reward worker or behind a running `emoreward serve`.

verl calls a custom reward function (`custom_reward_function` in its trainer config; `verl/trainer/ppo/reward.py`
merges ``reward_kwargs`` into every call) in one of two shapes:

- per sample (reward managers ``naive``, ``dapo``, and the experimental reward loop):
  ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``;
- per batch (reward manager ``batch``): ``compute_score_batch(data_sources=..., solution_strs=..., ground_truths=...,
  extra_infos=..., **reward_kwargs)``, one list each.

``solution_str`` is the response decoded with ``skip_special_tokens=True`` (no EOS or pad text): it is the emotion
description, scored as it is. The sample's context comes from ``extra_info`` (the dataset's ``extra_info`` column):
``subtitle``, ``video``, ``audio`` and ``sample_id`` (names configurable; ``subtitle_key="ground_truth"`` reads the
subtitle from ``reward_model.ground_truth`` instead). Each call returns ``{"score": reward, "truncated": 0/1,
"empty": 0/1}`` (verl logs every key; ``score`` is the reward). Example config::

    custom_reward_function:
      path: pkg://emoreward.export.verl
      name: compute_score              # compute_score_batch with reward_model.reward_manager=batch
      reward_kwargs:
        server_url: http://127.0.0.1:8000   # a running `emoreward serve` (batches all workers' requests)
        # model: /path/to/reward-model      # or: load the model in every reward worker
        # media_root: /data/mer2025         # local multimodal model: where relative media paths resolve
        # token_env: EMOREWARD_SERVE_TOKEN  # the environment variable holding the server's bearer token

A failure (server unreachable after the retries, a 4xx) raises: verl then stops instead of training on a made-up
reward.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from emoreward.data.context import verl_context
from emoreward.data.media_check import warn_text_media


TOKEN_ENV = "EMOREWARD_SERVE_TOKEN"
# keyword arguments verl itself may pass to a custom reward function (sandbox / reward-loop plumbing), unused here
VERL_KWARGS = frozenset(
    {
        "sandbox_fusion_url",
        "concurrent_semaphore",
        "memory_limit_mb",
        "reward_router_address",
        "reward_model_tokenizer",
    }
)


def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's per-sample custom reward function: the reward of one description.

    Args:
        data_source: the sample's data source (unused: every sample is scored by the reward model).
        solution_str (`str`): the decoded response, i.e. the emotion description.
        ground_truth: the sample's ``reward_model.ground_truth`` (the subtitle with ``subtitle_key="ground_truth"``).
        extra_info (`dict`): the sample's ``extra_info`` (subtitle, media paths, sample id).
        **kwargs: verl's ``reward_kwargs``: see `score_descriptions`.

    Returns:
        ``{"score": float, "truncated": 0.0 | 1.0, "empty": 0.0 | 1.0}``.

    Raises:
        ValueError: no ``server_url`` or ``model``, or unknown keyword arguments; RuntimeError: the server failed.
    """
    return score_descriptions([solution_str], [ground_truth], [extra_info], **kwargs)[0]


def compute_score_batch(
    data_sources: Sequence[Any] = (),
    solution_strs: Sequence[str] = (),
    ground_truths: Sequence[Any] = (),
    extra_infos: Sequence[dict | None] = (),
    **kwargs: Any,
) -> list[dict[str, float]]:
    """verl's batch custom reward function (``reward_model.reward_manager=batch``): one model call, or one request,
    for the whole batch. Arguments as `compute_score`, one list each; returns one dict per response."""
    n = len(solution_strs)
    ground_truths = list(ground_truths) if len(ground_truths) else [None] * n
    extra_infos = list(extra_infos) if len(extra_infos) else [None] * n
    if len(ground_truths) != n or len(extra_infos) != n:
        raise ValueError(f"{n} responses but {len(ground_truths)} ground truths and {len(extra_infos)} extra_infos")
    return score_descriptions(list(solution_strs), ground_truths, extra_infos, **kwargs)


def score_descriptions(
    descriptions: list[str],
    ground_truths: list[Any],
    extra_infos: list[dict | None],
    *,
    server_url: str | None = None,
    model: str | None = None,
    media_root: str | None = None,
    subtitle_key: str = "subtitle",
    video_key: str = "video",
    audio_key: str = "audio",
    sample_key: str = "sample_id",
    token_env: str = TOKEN_ENV,
    timeout: float = 180.0,
    retries: int = 5,
    **verl_kwargs: Any,
) -> list[dict[str, float]]:
    """Rewards of descriptions with their samples' contexts, from a server or a local model.

    Args:
        descriptions (`list[str]`): N descriptions; ground_truths, extra_infos: N each.
        server_url (`str`): base URL of a running `emoreward serve` (``/v1/rewards`` is posted to); media paths are
            then relative to the server's ``--media-root``.
        model (`str`): a reward-model directory to load in this process instead (cached per process).
        media_root (`str`): with ``model``: the folder relative media paths resolve in.
        subtitle_key, video_key, audio_key, sample_key (`str`): ``extra_info`` keys of the context
            (``subtitle_key="ground_truth"``: the subtitle is the ground truth).
        token_env (`str`): environment variable with the server's bearer token (sent when set).
        timeout (`float`): seconds per HTTP request; retries (`int`): attempts on a 503 (after its Retry-After) or a
            connection error.

    Returns:
        `list[dict]`: ``{"score", "truncated", "empty"}`` per description.

    Raises:
        ValueError: neither or both of ``server_url`` and ``model``, or an unknown keyword argument.
        RuntimeError: the server answered an error, or did not answer after ``retries`` attempts.
    """
    unknown = sorted(set(verl_kwargs) - VERL_KWARGS)
    if unknown:
        raise ValueError(f"unknown reward_kwargs {unknown} for emoreward.export.verl")
    if (server_url is None) == (model is None):
        raise ValueError("give exactly one of reward_kwargs 'server_url' (a running emoreward serve) or 'model'")
    keys = {"subtitle_key": subtitle_key, "video_key": video_key, "audio_key": audio_key, "sample_key": sample_key}
    contexts = [
        verl_context(info, truth, **keys, row=k + 1) for k, (truth, info) in enumerate(zip(ground_truths, extra_infos))
    ]
    if model is not None:
        local = _local_model(str(model), media_root)
        warn_text_media(local, [(f"sample {k + 1}", c.media_ref()) for k, c in enumerate(contexts)], "verl extra_info")
        info = local.score_info(descriptions, contexts)
        rewards, truncated = info.rewards.tolist(), info.truncated.tolist()
    else:
        media = [
            {k: v for k, v in (("subtitle", c.subtitle), ("video", c.video), ("audio", c.audio)) if v}
            for c in contexts
        ]
        reply = _post(server_url, {"descriptions": descriptions, "media": media}, token_env, timeout, retries)
        rewards, truncated = reply["rewards"], reply["truncated"]
    return [
        {"score": float(r), "truncated": float(bool(t)), "empty": float(not d.strip())}
        for r, t, d in zip(rewards, truncated, descriptions)
    ]


@lru_cache(maxsize=4)
def _local_model(path: str, media_root: str | None):
    from emoreward.models import load_reward_model

    return load_reward_model(path, media_root=media_root)


def _post(server_url: str, payload: dict, token_env: str, timeout: float, retries: int) -> dict:
    url = server_url.rstrip("/") + "/v1/rewards"
    headers = {"Content-Type": "application/json"}
    token = os.environ.get(token_env)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = json.dumps(payload).encode("utf-8")
    last = "no attempt"
    for attempt in range(max(1, retries)):
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace")
            if err.code != 503:
                raise RuntimeError(f"{url} answered {err.code}: {detail}") from None
            last = f"503: {detail}"
            wait = float(err.headers.get("Retry-After") or 1)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            last = str(err)
            wait = 1.0
        if attempt + 1 < retries:
            time.sleep(min(wait, 60.0))
    raise RuntimeError(f"{url} did not answer after {retries} attempts (last: {last})")


__all__ = ["compute_score", "compute_score_batch", "score_descriptions"]
