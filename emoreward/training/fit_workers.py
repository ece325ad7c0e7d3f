"""Independent fits side by side on a CPU: the cross-validation folds of one run in spawned worker processes
(`resolve_fit_workers`), each computed by the same function and seed as in the main process.
See docs/training.md ("Folds side by side").
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from emoreward.utils.processes import parent_identity


# what one fit of a text backbone may need at its peak (the default recipe: about 2.4 GiB): more workers than the
# available memory holds at this size are not started
FIT_MEMORY_BYTES = 4 * 2**30


@dataclass(frozen=True)
class FitWorkers:
    """How a run's independent fits are spread: `workers` processes (1: in the main process, one after another) of
    `threads` torch threads each, and why (`reason`, for the log)."""

    workers: int
    threads: int
    reason: str

    @property
    def parallel(self) -> bool:
        return self.workers > 1


def parse_fit_workers(value) -> int | str:
    """`"auto"` or an integer >= 1, from a recipe value.

    Raises:
        ValueError: anything else, naming the field.
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or str(number) != str(value).strip() or number < 1:
        raise ValueError(f"fit_workers must be 'auto' or an integer >= 1, got {value!r}")
    return number


def thread_budget() -> int:
    """The CPU threads this process may use: torch's intra-op thread count (which follows `OMP_NUM_THREADS`, else
    the cores this process may run on)."""
    import torch

    return max(1, torch.get_num_threads())


def available_memory() -> int | None:
    """Bytes of memory available to start new processes (`MemAvailable` of /proc/meminfo); None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resolve_fit_workers(
    requested: int | str,
    *,
    jobs: int,
    kind: str,
    device: str,
    world_size: int,
    threads: int | None = None,
    memory: int | None = None,
) -> FitWorkers:
    """How many fits of a run train at once (`FitWorkers`: workers, threads each, reason).

    `"auto"`: on a CPU, for a text backbone, in a single-process run with at least 2 threads and 2 fits,
    `min(jobs, threads, memory // FIT_MEMORY_BYTES)` workers of `threads // workers` threads; otherwise 1. An integer:
    that many workers (at most `jobs`). `threads` and `memory` default to `thread_budget()` and `available_memory()`.

    Raises:
        ValueError: an integer > 1 on a GPU or in an `accelerate launch` run (use `accelerate launch` for GPUs)."""
    threads = thread_budget() if threads is None else threads
    requested = parse_fit_workers(requested)
    if requested != "auto":
        if requested > 1 and (device != "cpu" or world_size > 1):
            where = f"an accelerate launch run of {world_size} processes" if world_size > 1 else f"device {device}"
            raise ValueError(
                f"fit_workers={requested}: folds in worker processes run on a CPU in one process; {where} trains one "
                "fold at a time (set fit_workers: 1 or auto; spread a GPU run with accelerate launch)"
            )
        workers = max(1, min(requested, jobs))
        reason = f"fit_workers={requested}"
        memory = available_memory() if memory is None else memory
        if workers > threads:
            reason += f"; warning: more workers than the {threads} CPU threads, they slow each other down"
        if memory is not None and workers > 1 and workers * FIT_MEMORY_BYTES > memory:
            reason += f"; warning: {workers} fits may need more than the {memory / 2**30:.1f} GiB available"
        return FitWorkers(workers, max(1, threads // workers), reason)
    if device != "cpu" or world_size > 1 or kind != "text" or jobs < 2 or threads < 2:
        return FitWorkers(1, threads, "one fit at a time")
    memory = available_memory() if memory is None else memory
    by_memory = jobs if memory is None else max(1, memory // FIT_MEMORY_BYTES)
    workers = max(1, min(jobs, threads, by_memory))
    if workers == 1:
        return FitWorkers(1, threads, "one fit at a time (memory)")
    return FitWorkers(workers, threads // workers, f"fit_workers=auto on {threads} CPU threads")


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the body with `threads` torch intra-op threads (this thread's setting), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _start_worker(threads: int, warning_filters: list, parent: tuple[int, bool]) -> None:
    """A worker's set-up: it dies with the main process (`die_with_parent`), takes its torch threads and the parent's
    warning filters, and drops standard output (the main process prints what a fold reports)."""
    from emoreward.utils.processes import die_with_parent

    die_with_parent(parent)
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    warnings.filters[:] = warning_filters
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C between fits: the main process ends the pool (`_run`)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the worker's stdout for its lifetime)


def _run(fn: Callable, *args):
    """One fit in a worker, interruptible by Ctrl-C while it runs; an idle worker ignores Ctrl-C and leaves when the pool
    shuts down."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(*args)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class FitPool:
    """Spawned worker processes for independent fits: `submit(fn, *args)` runs a module-level function in a worker and
    returns its `Future`. Leaving the `with` block waits for the fits; an error or Ctrl-C cancels those not started.
    A future's `result()` raises the fit's own exception, or `RuntimeError` when a worker died."""

    def __init__(self, workers: int, threads: int):
        self.workers, self.threads = workers, threads
        self._executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(threads, list(warnings.filters), parent_identity()),
        )

    def submit(self, fn: Callable, *args) -> Future:
        return self._executor.submit(_run, fn, *args)

    def __enter__(self) -> FitPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._executor.shutdown(wait=True, cancel_futures=exc_type is not None)


def fit_result(future: Future):
    """A submitted fit's result, with a dead worker explained.

    Raises:
        RuntimeError: the worker process died before returning (`BrokenProcessPool`).
    """
    try:
        return future.result()
    except BrokenProcessPool as err:
        raise RuntimeError(
            "a fold's worker process died before it finished (killed for memory?); rerun: finished folds are "
            "reused; `--set fit_workers=1` trains one fold at a time"
        ) from err


__all__ = [
    "FIT_MEMORY_BYTES",
    "FitPool",
    "FitWorkers",
    "available_memory",
    "fit_result",
    "parse_fit_workers",
    "resolve_fit_workers",
    "thread_budget",
    "torch_threads",
]
