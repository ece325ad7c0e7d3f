"""`emoreward serve --engine ray`: the reward server as a Ray Serve application, one reward model per replica
(`RewardReplica`: the shared `RewardService` and `Batcher`), same endpoints, schemas and error codes as the
single-process server. ``--ray-address auto`` attaches to a running cluster; without it a local one is started.
See docs/serving.md#ray-serve-emoreward-serve---engine-ray.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
import threading
import time
from http import HTTPStatus
from typing import Any


logger = logging.getLogger(__name__)

APP_NAME = "emoreward"
DEPLOYMENT_NAME = "EmoRewardReplica"
# concurrent requests a replica takes from the proxy: many, so that its batcher can merge them (Ray's default is 5)
MAX_ONGOING_REQUESTS = 512
# no access-log line per request (at RL rates it costs CPU the replicas need); warnings and errors still logged
QUIET_LOGS = {"enable_access_log": False, "log_level": "WARNING"}


def _import_serve():
    """ray and ray.serve, or an ImportError that says how to install them (the ``ray`` extra)."""
    try:
        import ray
        from ray import serve
    except ImportError as err:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            "--engine ray needs Ray Serve: pip install 'emoreward[ray]' (or pip install 'ray[serve]>=2.40')"
        ) from err
    return ray, serve


class RewardReplica:
    """One Ray Serve replica: the reward model, the shared request validation and the shared batcher.

    Source: Ray Serve deployments (``@serve.deployment``, ``ray_actor_options``, ``autoscaling_config``,
    ``max_ongoing_requests``, a user ``check_health`` method; a deployment without ``@serve.ingress`` receives raw
    Starlette requests), https://docs.ray.io/en/latest/serve/ (Ray 2.40-2.60).

    Args:
        model_path (`str`): the reward-model directory (loaded once, in the replica's process).
        service_options (`dict`): keyword arguments of `RewardService` (limits included, as a `ServerLimits`).
        token (`str`, *optional*): the bearer token every request must carry.
        threads (`int`, *optional*): torch CPU threads of this replica.
    """

    def __init__(self, model_path: str, service_options: dict[str, Any], token: str | None, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        from emoreward.export.serve.batching import Batcher
        from emoreward.export.serve.service import RewardService
        from emoreward.models.loading import open_reward_model

        options = dict(service_options)
        model = open_reward_model(model_path, media_root=options.get("media_root"))
        self.service = RewardService(model, **options)
        self.batcher = Batcher(self.service)
        self.batcher.start()
        self.token = token or None
        self.replica = os.getpid()

    async def __call__(self, request: Any) -> Any:
        """An HTTP request (a Starlette ``Request`` from Ray Serve's proxy) -> a JSON ``Response``."""
        from starlette.responses import JSONResponse

        status, payload, headers = await self.handle(
            request.method, request.url.path, dict(request.headers), request.body
        )
        return JSONResponse(payload, status_code=int(status), headers={"Server": "emoreward-serve", **dict(headers)})

    async def handle(self, method: str, path: str, headers: dict[str, str], read_body) -> tuple[int, dict, list]:
        """(status, JSON payload, extra headers) of one request, as the single-process server answers it."""
        from emoreward.export.serve import routes
        from emoreward.export.serve.protocol import RequestError, parse_json

        service = self.service
        headers = {k.lower(): v for k, v in headers.items()}
        path = path.rstrip("/") or "/"
        try:
            route = routes.admit(method, path, headers, self.token, service.limits)
            if route == "health":
                health = {**service.health(), "queue": self.batcher.pending, "engine": "ray", "replica": self.replica}
                return HTTPStatus.OK, health, []
            if self.batcher.full():
                raise self.batcher.busy("the replica is shutting down; retry later")
            raw = await read_body()
            if len(raw) > service.limits.max_body_bytes:
                raise RequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"body of {len(raw)} bytes; the limit is {service.limits.max_body_bytes}",
                )
            if len(raw) > 1024 * 1024:  # a large body is parsed off the event loop
                body = await asyncio.get_running_loop().run_in_executor(None, parse_json, raw)
            else:
                body = parse_json(raw)
            job = service.parse(route, body)
            return HTTPStatus.OK, await self.batcher.run(job), []
        except Exception as err:
            return service.error_reply(err, method, path)

    def check_health(self) -> None:
        """Ray Serve's health check (every ``health_check_period_s``): raises when the scoring thread has died, so
        that Ray replaces the replica."""
        if not self.batcher._thread.is_alive():  # noqa: SLF001 - the Batcher has no public liveness yet
            raise RuntimeError("the scoring thread of this replica has stopped")


def deployment_options(args: argparse.Namespace) -> dict[str, Any]:
    """``@serve.deployment`` options from the command line: fixed ``--replicas`` or autoscaling bounds, and each
    replica's ``ray_actor_options`` (``num_cpus`` / ``num_gpus``).

    Raises:
        ValueError: ``--min-replicas`` above ``--max-replicas``.
    """
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "ray_actor_options": {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus},
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "health_check_period_s": 10.0,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": args.drain_timeout,  # a replica scaled down or deleted drains first
    }
    if args.min_replicas is not None or args.max_replicas is not None:
        low = args.min_replicas if args.min_replicas is not None else 1
        high = args.max_replicas if args.max_replicas is not None else max(low, args.replicas)
        if low < 0 or low > high:
            raise ValueError(f"--min-replicas {low} must be between 0 and --max-replicas {high}")
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": min(max(args.replicas, low), high),
            "target_ongoing_requests": args.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = args.replicas
    return options


def build_app(args: argparse.Namespace, service_options: dict[str, Any], token: str | None, options=None):
    """The Ray Serve application: `RewardReplica` bound to the model path and the service options (``options``:
    the `deployment_options`)."""
    _, serve = _import_serve()
    deployment = serve.deployment(RewardReplica).options(**(options or deployment_options(args)))
    threads = args.threads or max(1, int(args.num_cpus))
    return deployment.bind(str(args.model), service_options, token, threads)


def connect(address: str | None, num_cpus: int) -> bool:
    """Attach to a running Ray cluster (``address``: ``"auto"`` or ``host:port`` / ``ray://...``) or start a local
    one with ``num_cpus`` CPUs and no dashboard. True when this process started the cluster."""
    ray, _ = _import_serve()
    if ray.is_initialized():
        return False
    if address:  # run_ray_serve has checked that something answers there (_check_reachable)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as err:  # e.g. 'auto' and no cluster on this machine
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"--ray-address {address}: cannot attach to a Ray cluster: {first}") from None
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine unless asked
    # a local cluster on loopback only (its own services included), sized for the replicas and Serve's proxy
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING, _node_ip_address="127.0.0.1")
    return True


def _check_reachable(address: str) -> None:
    """Refuse at once a ``host:port`` (or ``ray://host:port``) address where nothing listens (Ray itself retries
    for a minute, printing a line every 5 s).

    Raises:
        ValueError: naming ``--ray-address``.
    """
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' (or a form Ray reads itself)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
    except OSError as err:
        raise ValueError(
            f"--ray-address {address}: no Ray cluster answers there ({err.strerror or err}); start one with "
            "`ray start --head`, or leave --ray-address out to start a local one"
        ) from None


def check_resources(ray: Any, args: argparse.Namespace) -> None:
    """Refuse replicas the cluster cannot place (Ray Serve would wait for them forever): their CPUs and GPUs
    against the cluster's totals.

    Raises:
        ValueError: naming ``--num-cpus`` / ``--num-gpus`` and the replica count.
    """
    fewest = args.min_replicas if args.min_replicas is not None else args.replicas
    fewest = max(1, min(fewest, args.max_replicas or fewest))
    total = ray.cluster_resources()
    for option, key, each in (("--num-cpus", "CPU", args.num_cpus), ("--num-gpus", "GPU", args.num_gpus)):
        have = float(total.get(key, 0.0))
        if each * fewest > have + 1e-9:
            raise ValueError(
                f"{option} {each:g} x {fewest} replica(s) needs {each * fewest:g} {key}s; the Ray cluster has {have:g}"
            )


def run_ray_serve(args: argparse.Namespace, service_options: dict[str, Any], token: str | None) -> int:
    """Deploy the replicas on Ray Serve and serve until SIGTERM or Ctrl-C; then delete the application (and stop
    the local cluster when this process started it) and print a summary.

    Args:
        args: the parsed ``emoreward serve`` arguments (``--engine ray`` options included).
        service_options (`dict`): keyword arguments of `RewardService` (picklable: they travel to every replica).
        token (`str`, *optional*): the bearer token.
    """
    if args.port == 0:
        raise ValueError("--engine ray needs a fixed --port (Ray Serve's proxy binds it; 0 cannot be read back)")
    options = deployment_options(args)  # bad bounds fail before Ray starts
    if args.ray_address:
        _check_reachable(args.ray_address)  # a socket check: refused before Ray is imported (or found missing)
    ray, serve = _import_serve()
    most = max(args.replicas, args.max_replicas or 0, args.min_replicas or 0)
    started = connect(args.ray_address, num_cpus=math.ceil(args.num_cpus * most) + 1)
    try:
        check_resources(ray, args)
    except ValueError:
        if started:
            ray.shutdown()
        raise
    serve.start(http_options={"host": args.host, "port": args.port}, logging_config=QUIET_LOGS)
    reaper = None
    try:
        app = build_app(args, service_options, token, options)
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config=QUIET_LOGS)
        if started:  # the local cluster's processes end with this one, even killed (Ray's agents outlive it)
            from emoreward.utils.processes import Reaper, descendants

            reaper = Reaper(descendants(os.getpid()))
        host = f"[{args.host}]" if ":" in args.host else args.host
        replicas = (
            f"{args.replicas} replicas"
            if args.min_replicas is None and args.max_replicas is None
            else f"{args.min_replicas or 1}-{args.max_replicas or args.replicas} replicas (autoscaling)"
        )
        from emoreward.export.serve.routes import endpoints

        _echo(
            f"emoreward serve (ray, {replicas}, {args.num_cpus:g} CPU / {args.num_gpus:g} GPU each): {args.model} "
            f"on http://{host}:{args.port}  ({endpoints()}; {'bearer token required' if token else 'no authentication'})"
        )
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
        _echo("shutting down: the replicas finish their queued requests")
    finally:
        start = time.time()
        try:
            serve.delete(APP_NAME)
            if started:
                serve.shutdown()
        finally:
            if started:
                ray.shutdown()
            if reaper is not None:
                reaper.release()
        _echo(f"stopped in {time.time() - start:.0f} s")
    return 0


def _echo(text: str) -> None:
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["APP_NAME", "RewardReplica", "build_app", "connect", "deployment_options", "run_ray_serve"]
