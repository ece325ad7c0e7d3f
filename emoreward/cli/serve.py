"""`emoreward serve`: the command (its options, loading the model, serving until SIGTERM / Ctrl-C, the summary).

    emoreward serve --model DIR [--host 127.0.0.1] [--port 8000] [--media-root DIR] [--no-model-process]

The endpoints and their schemas: `emoreward.export.serve.protocol`; the server: `emoreward.export.serve.http`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import fields

from emoreward.cli.options import ALWAYS, EXIT_FAILED_CALLS, EXIT_OK, check_applicable
from emoreward.export.serve import http as serve_http
from emoreward.export.serve import routes
from emoreward.export.serve.http import RewardServer
from emoreward.export.serve.protocol import LOOPBACK, TOKEN_ENV, ServerLimits
from emoreward.export.serve.service import RewardService


logger = logging.getLogger("emoreward.export.serve")
RAY_OPTIONS = ("replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "ray_address", "num_cpus",
               "num_gpus")  # fmt: skip


def applicability() -> dict[str, str]:
    """Every option of `serve` -> when it applies (`check_applicable`, before any work): the engine's options to
    that engine, the text models' batching and media tolerance to text models, the rest always (the server limits
    and each route's options are read from their owners); ``--insecure-no-auth`` to a non-loopback host served
    without a token (with a token set the server demands it; a loopback host never asks)."""
    table = dict.fromkeys(["model", "host", "port", "token_env", "batch_size", "overlong", "length_window",
                           "length_threshold", "threads", "log_every", "engine"],
                          ALWAYS)  # fmt: skip
    table["insecure_no_auth"] = "open"  # waives the token only where one would be asked for
    table.update(dict.fromkeys([f.name for f in fields(ServerLimits)], ALWAYS))
    table.update(dict.fromkeys(routes.options(), ALWAYS))  # each route is served on every engine
    table.update(dict.fromkeys(["forward_tokens", "allow_unused_media"], "text"))
    table["media_root"] = "media"  # a multimodal model reads media files; a text model none
    table.update(dict.fromkeys(["model_process"], "single"))
    table.update(dict.fromkeys(RAY_OPTIONS, "ray"))
    return table


APPLIES = applicability()

MAX_THREADS = 1024  # torch CPU threads at most (more than any machine's cores; torch overflows on huge counts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward serve`."""
    from emoreward.cli.options import (
        bounded_int,
        correlation,
        nonnegative_float,
        nonnegative_int,
        port_number,
        positive_float,
        positive_int,
    )
    from emoreward.export.length_monitor import MAX_WINDOW

    p.add_argument("--model", required=True, help="a reward-model directory (emoreward train, or a merged export)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help=f"environment variable holding the bearer token clients must send (default {TOKEN_ENV}; unset: none)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve on a non-loopback --host without a token and without asking",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="most sequences per forward pass (default 64)")
    p.add_argument(
        "--forward-tokens",
        type=positive_int,
        help="text models: about this many tokens per forward pass (default: 1024 on CPU, 16384 on a GPU)",
    )
    for f in fields(ServerLimits):  # --max-body-bytes, ...: the limits' own fields, help and defaults
        number = positive_float if "float" in str(f.type) else positive_int
        default = (
            ""
            if f.default is None
            else f" (default {f.default:g})"
            if number is positive_float
            else f" (default {f.default})"
        )
        flag = f"--{f.name.replace('_', '-')}"
        p.add_argument(flag, type=number, default=f.default, help=f.metadata["help"] + default)
    p.add_argument(
        "--overlong",
        choices=["flag", "refuse"],
        default="flag",
        help="a description over the model's max_length tokens: cut to fit and flagged in 'truncated' (default), "
        "or refused with 413",
    )
    for option in routes.options().values():  # each route's own options (OpenRLHF: --openrlhf-labels, ...)
        kind = {"action": "append", "default": []} if option.repeat else {"default": option.default}
        metavar = None if option.choices else option.flag.lstrip("-").replace("-", "_").upper()
        p.add_argument(
            option.flag, dest=option.name, choices=option.choices, metavar=metavar, help=option.help, **kind
        )
    p.add_argument(
        "--length-window",
        type=bounded_int(3, MAX_WINDOW),
        default=512,
        help="RL length-hacking monitor: the last N rewarded descriptions its figures cover (OpenRLHF extra_logs, "
        "/health; default 512)",
    )
    p.add_argument(
        "--length-threshold",
        type=correlation,
        default=0.5,
        help="warn when the reward-length Spearman correlation over --length-window exceeds this (default 0.5)",
    )
    p.add_argument("--allow-unused-media", action="store_true", help="text models: accept (and ignore) media paths")
    p.add_argument(
        "--media-root",
        help="multimodal models: the only folder request media paths may point into (relative paths); without it "
        "media paths are refused",
    )
    p.add_argument("--threads", type=bounded_int(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)")
    p.add_argument("--log-every", type=positive_float, default=60.0, help="seconds between counter lines in the log")
    p.add_argument(
        "--model-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--engine single: load the model and score in a process of its own (default), so that the HTTP "
        "event loop and the model do not share one interpreter lock (the server process loads no weights); "
        "--no-model-process: load and score in the server process",
    )
    ray = p.add_argument_group("Ray Serve (--engine ray; needs the ray extra: pip install 'emoreward[ray]')")
    ray.add_argument(
        "--engine",
        choices=["single", "ray"],
        default="single",
        help="single: one process, one model (default); ray: one model per Ray Serve replica",
    )
    ray.add_argument("--replicas", type=positive_int, default=1, help="replicas (default 1; autoscaling: initial)")
    ray.add_argument("--min-replicas", type=nonnegative_int, help="autoscaling: fewest replicas (0 allowed)")
    ray.add_argument("--max-replicas", type=positive_int, help="autoscaling: most replicas")
    ray.add_argument(
        "--target-ongoing-requests",
        type=positive_float,
        default=64.0,
        help="autoscaling: requests in flight per replica it aims at (default 64)",
    )
    ray.add_argument(
        "--ray-address",
        help="'auto' or an address: attach to a running Ray cluster (verl's, OpenRLHF's); default: start a local one",
    )
    ray.add_argument("--num-cpus", type=positive_float, default=1.0, help="CPUs per replica (default 1)")
    ray.add_argument(
        "--num-gpus", type=nonnegative_float, default=0.0, help="GPUs per replica (default 0; 1: a GPU each)"
    )


# what Ctrl-C outside the server's own shutdown prints (a second Ctrl-C while it stops): a server has nothing to
# resume, unlike the commands that keep finished work
INTERRUPTED = "{prog}: interrupted"


def _confirm_no_auth(args: argparse.Namespace) -> bool:
    if args.host in LOOPBACK or args.insecure_no_auth:
        return True
    if not sys.stdin.isatty():
        return False
    answer = input(f"Serve on {args.host} WITHOUT authentication (anyone who reaches it can use it)? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    """Load the model and serve until SIGTERM or Ctrl-C; then finish the queued requests and print a summary.

    ``--engine single`` loads the model in a process of its own (`ModelProcess`) unless ``--no-model-process``:
    the server process validates requests from the model's `ServedModelFacts` and loads no weights. Measured on CPU
    (docs/speed.md#what-to-expect), the only device `load_reward_model` puts a model on, so the default has no device
    rule."""
    from emoreward.cli.options import quiet_libraries

    quiet_libraries(deepspeed=False)  # serving never trains (and the server process imports no torch)
    import warnings

    from emoreward.export.length_monitor import LengthHackingWarning

    # the server's log has the length monitor's alarm once, as its logger's WARNING line (a library caller gets
    # the Python warning too)
    warnings.filterwarnings("ignore", category=LengthHackingWarning)
    token = os.environ.get(args.token_env) or None
    if token is None and not _confirm_no_auth(args):
        raise ValueError(
            f"refusing to serve on {args.host} without authentication: set the environment variable "
            f"{args.token_env} to a token (clients send 'Authorization: Bearer <token>'), bind 127.0.0.1, or pass "
            "--insecure-no-auth"
        )
    if args.media_root:
        from emoreward.cli.options import check_media_root

        check_media_root(args.media_root)  # before the model loads
    if args.max_items > args.max_queue:
        raise ValueError(
            f"--max-items {args.max_items} exceeds --max-queue {args.max_queue}: no request that large fits"
        )
    limits = ServerLimits(**{f.name: getattr(args, f.name) for f in fields(ServerLimits)})
    options = dict(  # RewardService's options, for this process or for every Ray Serve replica
        limits=limits,
        batch_size=args.batch_size,
        allow_unused_media=args.allow_unused_media,
        name=str(args.model),
        media_root=args.media_root,
        overlong=args.overlong,
        forward_tokens=args.forward_tokens,
        length_window=args.length_window,
        length_threshold=args.length_threshold,
        **{name: getattr(args, name) for name in routes.options()},
    )
    from emoreward.judges import reads_media
    from emoreward.models import load_settings

    # before any work (a model process, a Ray cluster): a directory that is not a model, an option that cannot
    # apply, a port already taken
    kind = load_settings(args.model).kind
    check_applicable(
        args,
        APPLIES,
        {
            "single": (args.engine == "single", "{first} is for --engine single (each Ray Serve replica is a process "
                                                "already)"),
            "ray": (args.engine == "ray", "{options} {verb} to --engine ray (Ray Serve replicas); add --engine ray"),
            "text": (kind == "text", f"{{options}} {{verb}} to text models; {args.model} is a multimodal model"),
            "media": (reads_media(args.model) is not False, f"{{options}} {{verb}} to multimodal models; {args.model} is a text model"),
            "open": (token is None and args.host not in LOOPBACK,
                     "{first} waives the token of a non-loopback --host; "
                     + (f"{args.token_env} is set, so clients must send its token: unset it to serve without one"
                        if token is not None else f"{args.host} is a loopback address, served without a token")),
        },
    )  # fmt: skip
    # a route option's value that only a model reading media can use (--openrlhf-labels clip), by the route's rule
    routes.settings({name: options[name] for name in routes.options()},
                    reads_media=False if reads_media(args.model) is False else None)  # fmt: skip
    serve_http.check_bind(args.host, args.port)
    if args.engine == "ray":
        from emoreward.export.serve.ray import run_ray_serve

        return run_ray_serve(args, options, token)
    worker = None
    try:
        if args.model_process is False:  # --no-model-process: the model loads and scores in this process
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            from emoreward.models.loading import open_reward_model

            service = RewardService(open_reward_model(args.model, media_root=args.media_root), **options)
        else:  # the default: the model loads and scores in a process of its own; this one reads its facts
            from emoreward.export.serve.worker import ModelProcess

            worker = ModelProcess(args.model, media_root=args.media_root, threads=args.threads)
            service = RewardService(
                worker.facts, **options, scorer=worker.score_info, scorer_alive=worker.process.is_alive
            )
        logger.setLevel(logging.INFO)  # counters and refused requests; never bodies or the token
        server = RewardServer(service, args.host, args.port, token=token)
        start = time.time()
        finished = serve_http.run(_serve_until_signal(server, args, token is not None))
        died = worker is not None and not worker.alive  # before close(), which ends a live one
    finally:
        if worker is not None:
            worker.close()
    stats = service.stats
    _echo(f"served {stats.line()} in {time.time() - start:.0f} s")
    if not finished:  # a service manager must not read lost rewards as a clean stop
        _echo(
            f"error: {server.unanswered} request(s) in flight were not answered within --drain-timeout "
            f"{limits.drain_timeout:g} s (the queue still held {server.batcher.pending} descriptions)"
        )
        return EXIT_FAILED_CALLS
    if died:  # a service manager must not read this as a clean stop
        _echo(
            f"error: the model process had stopped while serving (exit code {worker.process.exitcode}); the model "
            "calls after it failed"
        )
        return EXIT_FAILED_CALLS
    return EXIT_OK


async def _serve_until_signal(server: RewardServer, args: argparse.Namespace, auth: bool) -> bool:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.open()
    s = server.service
    _echo(
        f"emoreward serve: {args.model} on {server.url}  ({routes.endpoints()}; "
        f"{'bearer token required' if auth else 'no authentication'}; max_length {s.max_length} tokens, "
        f"queue {s.limits.max_queue} descriptions)"
    )
    stats_task = asyncio.create_task(server.log_stats(args.log_every))
    await stop.wait()
    _echo(f"shutting down: finishing {server.batcher.pending} queued descriptions")
    stats_task.cancel()
    return await server.shutdown()


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_arguments", "run"]
