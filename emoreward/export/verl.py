"""verl hand-off: custom reward functions that score emotion descriptions with an emoreward reward model, loaded in
the reward worker or behind running `emoreward serve` servers. `compute_score` (per sample, thread-safe),
`compute_score_async` (verl's reward loop) and `compute_score_batch` (reward manager ``batch``) return
``{"score", "truncated", "empty"}`` plus the length monitor's ``length/...`` figures::

    custom_reward_function:
      path: pkg://emoreward.export.verl
      name: compute_score_async        # compute_score (older verl), compute_score_batch (reward_manager=batch)
      reward_kwargs:
        server_url: http://127.0.0.1:8000   # or a list of URLs (round-robin); or model: /path/to/reward-model

See docs/serving.md#verl."""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from emoreward.data.context import RewardContext, verl_context
from emoreward.data.media_check import warn_text_media
from emoreward.export.length_monitor import StreamLengthMonitor, sample_record
from emoreward.export.reward_client import RetryPolicy, RewardClient, ServerError
from emoreward.export.serve.routes.rewards import Rewards  # the route verl's requests take (`/v1/rewards`)


TOKEN_ENV = "EMOREWARD_SERVE_TOKEN"
# `compute_score_async`: most concurrent calls of one event loop sent in one HTTP request (reward_kwargs
# `merge_samples`); docs/speed.md#what-to-expect
MERGE_SAMPLES = 16
# reward_kwargs of the client of running servers (server_url), refused with 'model' where nothing would read them
SERVER_KWARGS = frozenset({"token_env", "timeout", "retries", "merge_samples"})
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


# ---------------------------------------------------------------------------------------------- verl's functions
def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's per-sample custom reward function (thread-safe: verl's reward loop runs it in executor threads).

    Args:
        data_source: the sample's data source (unused: every sample is scored by the reward model).
        solution_str (`str`): the decoded response, i.e. the emotion description.
        ground_truth: the sample's ``reward_model.ground_truth`` (the subtitle with ``subtitle_key="ground_truth"``).
        extra_info (`dict`): the sample's ``extra_info`` (subtitle, media paths, sample id).
        **kwargs: verl's ``reward_kwargs``: see `score_descriptions`.

    Returns:
        ``{"score": float, "truncated": 0.0 | 1.0, "empty": 0.0 | 1.0}`` and the length monitor's ``length/...`` figures.

    Raises:
        ValueError: no ``server_url`` or ``model``, unknown keyword arguments, or a ``solution_str`` that is not a
            string; RuntimeError: the server failed.
    """
    return score_descriptions([solution_str], [ground_truth], [extra_info], **kwargs)[0]


async def compute_score_async(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """`compute_score` as a coroutine function, for verl's reward loop (many samples in flight on one event loop).
    Same arguments, result and errors. The calls that reach one event loop together share HTTP requests of at most
    ``merge_samples`` samples (`_Merger`); a sample the server refuses (4xx) is sent again alone, so that only its
    own call raises."""
    request = _Request.build([solution_str], [ground_truth], [extra_info], kwargs)
    if request.model is not None:
        batcher, job = _local_job(request)
        try:
            info = await batcher.run(job)
        except Exception as err:
            raise _scoring_failed(err) from None
    else:
        info = await _merger(request).submit(request)
    return _monitored(request, request.results(info))[0]


def compute_score_batch(
    data_sources: Sequence[Any] = (),
    solution_strs: Sequence[str] = (),
    ground_truths: Sequence[Any] = (),
    extra_infos: Sequence[dict | None] = (),
    **kwargs: Any,
) -> list[dict[str, float]]:
    """verl's batch custom reward function (``reward_model.reward_manager=batch``): one model call for the whole
    batch, or requests within the server's ``/health`` limits (``max_items`` descriptions, ``max_body_bytes``), a
    few in flight per server. Arguments as `compute_score`, one list each; returns one dict per response."""
    n = len(solution_strs)
    ground_truths = list(ground_truths) if len(ground_truths) else [None] * n
    extra_infos = list(extra_infos) if len(extra_infos) else [None] * n
    if len(ground_truths) != n or len(extra_infos) != n:
        raise ValueError(f"{n} responses but {len(ground_truths)} ground truths and {len(extra_infos)} extra_infos")
    return score_descriptions(list(solution_strs), ground_truths, extra_infos, **kwargs)


def score_descriptions(
    descriptions: list[str], ground_truths: list[Any], extra_infos: list[dict | None], **kwargs: Any
) -> list[dict[str, float]]:
    """Rewards of descriptions with their samples' contexts, from servers or a local model.

    Args:
        descriptions (`list[str]`): N descriptions; ground_truths, extra_infos: N each.
        server_url (`str` or `list[str]`): base URL(s) of running `emoreward serve` servers (``/v1/rewards`` is
            posted to), spread round-robin; media paths are then relative to the servers' ``--media-root``.
        model (`str`): a reward-model directory to load in this process instead (once per process).
        vllm_url (`str`): with ``model`` (an export folder): score through the vLLM server at this URL that serves
            it (`emoreward.export.vllm.VllmRewardModel`), behind this process's batcher, as a loaded model is.
        media_root (`str`): with ``model``: the folder relative media paths resolve in.
        subtitle_key, video_key, audio_key, sample_key (`str`): ``extra_info`` keys of the context.
        token_env (`str`): environment variable with the servers' bearer token (sent when set).
        timeout (`float`): seconds one HTTP request may take, every attempt included (default
            ``$EMOREWARD_ENGINE_TIMEOUT`` or 180: `emoreward.export.reward_client.RetryPolicy`); retries (`int`):
            attempts per request (default 5). A server that gives no answer in that time is one error, and the
            calls after it fail at once for as long.
        merge_samples (`int`): `compute_score_async`: most concurrent calls sent in one request (1: a request per
            call; default `MERGE_SAMPLES`).
        length_window (`int`), length_threshold (`float`): the length-hacking monitor's window (descriptions) and
            warning threshold (reward-length Spearman correlation).

    Returns:
        `list[dict]`: ``{"score", "truncated", "empty", "length/...": figures}`` per description, the same keys in
        every dict (`emoreward.export.length_monitor.SAMPLE_KEYS`, finite placeholders where undefined).

    Raises:
        ValueError: neither or both of ``server_url`` and ``model``, an unknown keyword argument, or one that does
            not apply in the mode used (`SERVER_KWARGS` with ``model``; ``media_root`` with ``server_url``; with
            ``model``, a ``media_root`` for a model that reads no media is refused where the model is opened,
            `emoreward.models.loading.open_reward_model`).
        RuntimeError: a server answered an error, or did not answer after ``retries`` attempts.
    """
    request = _Request.build(descriptions, ground_truths, extra_infos, kwargs)
    if not request.descriptions:  # an empty shard: nothing to score (the options are checked above)
        return []
    if request.model is not None:
        batcher, job = _local_job(request)
        try:
            reply = batcher.score(job)
        except Exception as err:
            raise _scoring_failed(err) from None
        out = request.results(reply)
    else:
        client = _client(request)
        chunks = request.split(client.limits()) if len(request.descriptions) > 1 else [range(1)]
        if len(chunks) == 1:
            out = request.results(client.post(Rewards.path, request.payload()))
        else:
            workers = min(len(chunks), 2 * len(client.urls))
            with ThreadPoolExecutor(workers, thread_name_prefix="emoreward-verl") as pool:
                replies = list(pool.map(lambda part: client.post(Rewards.path, request.payload(part)), chunks))
            out = []
            for part, reply in zip(chunks, replies):
                out += request.results(reply, part)
    return _monitored(request, out)


def _monitored(request: _Request, out: list[dict[str, float]]) -> list[dict[str, float]]:
    """The results with this worker's length-monitor figures after adding the call's rewards (every route), under the
    same fixed keys in every result (`sample_record`: verl builds its columns from the first sample's dict)."""
    monitor = _length_monitor(request.options["length_window"], request.options["length_threshold"])
    figures = sample_record(monitor.update([r["score"] for r in out], request.descriptions))
    return [{**r, **figures} for r in out]


_MONITORS: dict[tuple[int, float], StreamLengthMonitor] = {}
_MONITORS_LOCK = threading.Lock()


def _length_monitor(window: int, threshold: float) -> StreamLengthMonitor:
    """This worker process's length monitor (one per setting; shared by verl's threads and tasks)."""
    with _MONITORS_LOCK:
        key = (int(window), float(threshold))
        if key not in _MONITORS:
            _MONITORS[key] = StreamLengthMonitor(*key)
        return _MONITORS[key]


# ---------------------------------------------------------------------------------------------- one call's request
class _Request:
    """The descriptions, contexts and options of one call."""

    def __init__(self, descriptions, contexts, options):
        self.descriptions: list[str] = descriptions
        self.contexts: list[RewardContext] = contexts
        self.model = options["model"]
        self.media_root = options["media_root"]
        self.options = options

    @classmethod
    def build(cls, descriptions, ground_truths, extra_infos, kwargs: dict) -> _Request:
        options = {
            "server_url": None,
            "model": None,
            "vllm_url": None,
            "media_root": None,
            "subtitle_key": "subtitle",
            "video_key": "video",
            "audio_key": "audio",
            "sample_key": "sample_id",
            "token_env": TOKEN_ENV,
            "timeout": None,
            "retries": None,
            "length_window": 512,
            "length_threshold": 0.5,
            "merge_samples": MERGE_SAMPLES,
        }
        unknown = sorted(set(kwargs) - set(options) - VERL_KWARGS)
        if unknown:
            raise ValueError(f"unknown reward_kwargs {unknown} for emoreward.export.verl")
        options.update({k: v for k, v in kwargs.items() if k in options})
        if (options["server_url"] is None) == (options["model"] is None):
            raise ValueError("give exactly one of reward_kwargs 'server_url' (running emoreward servers) or 'model'")
        if options["vllm_url"] is not None and options["model"] is None:
            raise ValueError("reward_kwargs 'vllm_url' needs 'model': the export folder the vLLM server serves")
        given = {k for k, v in kwargs.items() if v is not None}
        if options["model"] is not None and (wrong := sorted(given & SERVER_KWARGS)):
            raise ValueError(
                f"reward_kwargs {wrong} are for emoreward servers (server_url); with 'model' the reward model scores "
                "in this process"
                + (" through the vLLM server at 'vllm_url' (its client reads $EMOREWARD_ENGINE_TIMEOUT)"
                   if options["vllm_url"] is not None else "")
            )  # fmt: skip
        if options["server_url"] is not None and "media_root" in given:
            raise ValueError(
                "reward_kwargs 'media_root' is for 'model' (a model in this process); the servers at 'server_url' "
                "resolve media paths in their own --media-root"
            )
        if options["model"] is not None:
            options["model"] = str(options["model"])
        for k, description in enumerate(descriptions):  # never the text "None" scored as a description
            if not isinstance(description, str):
                where = "solution_str" if len(descriptions) == 1 else f"solution_strs[{k}]"
                raise ValueError(
                    f"emoreward.export.verl: {where} must be a string (the decoded response), got "
                    f"{type(description).__name__}"
                )
        keys = {k: options[k] for k in ("subtitle_key", "video_key", "audio_key", "sample_key")}
        contexts = [  # the one context rule for a verl sample
            verl_context(info, truth, **keys, row=k + 1)
            for k, (truth, info) in enumerate(zip(ground_truths, extra_infos))
        ]
        return cls(list(descriptions), contexts, options)

    def payload(self, part: range | None = None) -> dict:
        part = part or range(len(self.descriptions))
        media = [
            {k: v for k, v in (("subtitle", c.subtitle), ("video", c.video), ("audio", c.audio)) if v}
            for c in (self.contexts[i] for i in part)
        ]
        return {"descriptions": [self.descriptions[i] for i in part], "media": media}

    def split(self, limits: dict) -> list[range]:
        """Consecutive parts of at most ``max_items`` descriptions and about ``max_body_bytes / 2`` bytes of JSON."""
        n = len(self.descriptions)
        most = max(1, int(limits.get("max_items") or n))
        budget = max(1024, int(limits.get("max_body_bytes") or 2**62) // 2)
        parts, start, size = [], 0, 0
        for i in range(n):
            c = self.contexts[i]
            item = 64 + sum(len(s or "") for s in (self.descriptions[i], c.subtitle, c.video, c.audio)) * 6
            if i > start and (i - start >= most or size + item > budget):
                parts.append(range(start, i))
                start, size = i, 0
            size += item
        parts.append(range(start, n))
        return parts

    def results(self, reply: dict, part: range | None = None) -> list[dict[str, float]]:
        part = part or range(len(self.descriptions))
        rewards, truncated = reply["rewards"], reply["truncated"]
        if len(rewards) != len(part):
            raise RuntimeError(f"the server returned {len(rewards)} rewards for {len(part)} descriptions")
        return [
            {"score": float(r), "truncated": float(bool(t)), "empty": float(not self.descriptions[i].strip())}
            for r, t, i in zip(rewards, truncated, part)
        ]


# ---------------------------------------------------------------------------------------------- local model
def _local_job(request: _Request):
    """The process's in-process scorer of the request's ``model`` (`serve.local.shared_batcher`: loaded once, no
    request limits, media paths confined to ``media_root``) and the request's job, validated with the server's own
    rules. Raises ValueError: a description or media path the server would refuse (the message names the field)."""
    from emoreward.export.serve.local import UNLIMITED, shared_batcher
    from emoreward.export.serve.protocol import RequestError

    o = request.options
    batcher = shared_batcher(
        request.model, media_root=request.media_root, vllm_url=o["vllm_url"], limits=UNLIMITED, allow_unused_media=True
    )
    service = batcher.service
    warn_text_media(
        service.facts, [(f"sample {k + 1}", c.media_ref()) for k, c in enumerate(request.contexts)], "verl extra_info"
    )
    try:
        return batcher, service.parse(Rewards.name, request.payload())
    except RequestError as err:
        raise ValueError(f"emoreward.export.verl (model={service.name}): {err.message}") from None


def _scoring_failed(err: Exception) -> RuntimeError:
    return RuntimeError(f"scoring failed: {getattr(err, 'message', err)}")


# ---------------------------------------------------------------------------------------------- HTTP client
def server_urls(server_url: Any) -> tuple[str, ...]:
    """The base URLs of ``server_url``: one URL, comma-separated URLs, or a list (an OmegaConf ``ListConfig``
    too), trailing slashes removed.

    Raises:
        ValueError: no URL, or one that is not ``http://`` / ``https://``.
    """
    items = server_url.split(",") if isinstance(server_url, str) else list(server_url)
    urls = tuple(str(u).strip().rstrip("/") for u in items if str(u).strip())
    if not urls:
        raise ValueError("reward_kwargs 'server_url' names no server")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward_kwargs 'server_url': {url!r} is not an http:// or https:// URL")
    return urls


_CLIENTS: dict[tuple, RewardClient] = {}
_CLIENTS_LOCK = threading.Lock()


def close_pools() -> None:
    """Close this process's connection pools (their keep-alive connections); the next call opens new ones. For a
    worker that shuts down, and tests."""
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
        _MERGERS.clear()
    for client in clients:
        client.close()


def _client(request: _Request) -> RewardClient:
    """The process's client for these servers and options (one connection pool per worker process)."""
    o = request.options
    try:
        policy = RetryPolicy.resolve(o["timeout"], o["retries"])
    except ValueError as err:
        raise ValueError(f"reward_kwargs 'timeout' / 'retries': {err}") from None
    key = (server_urls(o["server_url"]), os.environ.get(o["token_env"]) or None, policy)
    client = _CLIENTS.get(key)
    if client is None:
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key) or _CLIENTS.setdefault(key, RewardClient(*key))
    return client


class _Merger:
    """The `compute_score_async` calls of one event loop and one client, sent together.

    A call queues its request and the merger sends what is queued on the loop's next turn (``call_soon``: no timer,
    no added wait): the tasks verl's reward loop starts in one turn share requests of at most ``most`` samples, split
    evenly and at least one per server URL (so that several servers, or the replicas behind a Ray Serve URL, all
    get work). The reply is cut back into one reply per call, in order. A merged request refused with a 4xx is sent
    again call by call (only the refused call raises); any other failure (after the client's retries) is raised by
    every call of the request.
    """

    def __init__(self, client: RewardClient, most: int):
        self.client, self.most = client, most
        self.pending: list[tuple[_Request, asyncio.Future]] = []
        self.handle: asyncio.Handle | None = None
        self.sending: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def submit(self, request: _Request) -> asyncio.Future:
        """A future of ``request``'s reply dict (``rewards``, ``truncated``, ... for its descriptions)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((request, future))
        if self.handle is None:
            self.handle = loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self.handle = None
        calls, self.pending = self.pending, []
        n = len(calls)
        parts = max(-(-n // self.most), min(len(self.client.urls), n))
        size = -(-n // parts)
        for start in range(0, n, size):
            task = asyncio.ensure_future(self._send(calls[start : start + size]))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, calls: list[tuple[_Request, asyncio.Future]]) -> None:
        try:
            replies = await self._post([request for request, _ in calls])
        except ServerError as err:
            if len(calls) > 1 and 400 <= err.status < 500:  # a sample the server refuses: find whose
                await asyncio.gather(*(self._send([call]) for call in calls))
                return
            self._fail(calls, err)
        except asyncio.CancelledError:
            for _, future in calls:
                future.cancel()
            raise
        except Exception as err:
            self._fail(calls, err)
        else:
            for (_, future), reply in zip(calls, replies):
                if not future.done():  # its task was cancelled meanwhile
                    future.set_result(reply)

    @staticmethod
    def _fail(calls: list[tuple[_Request, asyncio.Future]], err: Exception) -> None:
        for _, future in calls:
            if not future.done():
                future.set_exception(err)

    async def _post(self, requests: list[_Request]) -> list[dict]:
        """One request's reply per request, from one POST of them all."""
        if len(requests) == 1:
            return [await self.client.apost(Rewards.path, requests[0].payload())]
        payloads = [request.payload() for request in requests]
        merged = {key: [item for p in payloads for item in p[key]] for key in ("descriptions", "media")}
        reply = await self.client.apost(Rewards.path, merged)
        total = len(merged["descriptions"])
        if len(reply.get("rewards", ())) != total:
            raise RuntimeError(f"the server returned {len(reply.get('rewards', ()))} rewards for {total} descriptions")
        out, start = [], 0
        for p in payloads:
            stop = start + len(p["descriptions"])
            out.append({k: v[start:stop] if isinstance(v, list) and len(v) == total else v for k, v in reply.items()})
            start = stop
        return out


_MERGERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> {(client, most): _Merger}


def _merger(request: _Request) -> _Merger:
    """This event loop's merger for ``request``'s client and ``merge_samples`` (used from the loop's own thread).

    Raises:
        ValueError: ``merge_samples`` is not a positive integer.
    """
    most = request.options["merge_samples"]
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"reward_kwargs 'merge_samples' must be a positive integer, got {most!r}")
    client = _client(request)
    loop = asyncio.get_running_loop()
    with _CLIENTS_LOCK:  # threads with event loops of their own share the table
        mergers = _MERGERS.setdefault(loop, {})
        merger = mergers.get((client, most))
        if merger is None:
            merger = mergers[(client, most)] = _Merger(client, most)
    return merger


__all__ = [
    "MERGE_SAMPLES",
    "RewardClient",
    "ServerError",
    "compute_score",
    "compute_score_async",
    "close_pools",
    "compute_score_batch",
    "score_descriptions",
    "server_urls",
]
