"""`ModelProcess`: a reward model loaded and scoring in a process of its own (``emoreward serve``'s default), so
that the event loop and the model do not share one interpreter lock. The server process sends it one model call
at a time over a pipe and gets the `ScoreInfo` back (model exceptions come back as the same class); the queue,
validation, replies and the length monitor stay in the server process, which loads no weights
(`ServedModelFacts`). See docs/serving.md#reward-server-emoreward-serve; figures: docs/speed.md#what-to-expect.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emoreward.utils.processes import parent_identity


logger = logging.getLogger(__name__)

# seconds the model process gets to load the model before `ModelProcess` gives up
START_TIMEOUT_S = 600.0


class ModelProcessError(RuntimeError):
    """The model process failed to start, or has stopped (its model calls are answered 500)."""


def _pack_error(err: BaseException) -> tuple[type, tuple, dict] | tuple[None, str, str]:
    """An exception as (class, args, attributes), rebuilt by `_unpack_error` (an exception whose ``__init__`` takes
    other arguments than its ``args``, like `MediaError`, does not survive plain pickling)."""
    import pickle

    packed = (type(err), err.args, dict(vars(err)))
    try:
        pickle.dumps(packed)
    except Exception:  # an attribute or the class cannot travel: its name and message do
        return None, type(err).__name__, str(err)
    return packed


def _unpack_error(packed: tuple) -> BaseException:
    cls, args, attributes = packed
    if cls is None:
        return ModelProcessError(f"the model process raised {args}: {attributes}")
    err = cls.__new__(cls)
    BaseException.__init__(err, *args)
    vars(err).update(attributes)
    return err


def _serve(
    directory: str, media_root: str | None, threads: int | None, conn: Any, warning_filters: list, parent: tuple
) -> None:
    """The model process: load the model, send its facts, then answer ``(descriptions, contexts, batch_size)``
    requests until ``None`` or the pipe closes. It ignores SIGINT and SIGTERM (the server ends it after its queued
    requests, `ModelProcess.close`) and dies with the server (`die_with_parent`)."""
    import signal

    from emoreward.utils.processes import die_with_parent

    die_with_parent(parent)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    warnings.filters[:] = warning_filters  # the server's (the CLI's quiet libraries): the same log as one process
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        from emoreward.export.serve.facts import served_model_facts
        from emoreward.models.loading import open_reward_model

        model = open_reward_model(directory, media_root=media_root)
        facts = served_model_facts(model)
    except BaseException as err:
        conn.send(("failed", _pack_error(err)))
        return
    conn.send(("ready", facts))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the server process has gone
            return
        if request is None:
            return
        descriptions, contexts, batch_size = request
        try:
            reply = ("ok", model.score_info(descriptions, contexts, batch_size=batch_size))
        except Exception as err:
            reply = ("error", _pack_error(err))
        conn.send(reply)


class ModelProcess:
    """A reward model loaded in a child process (``spawn``), scoring one call at a time.

    ``facts`` (`ServedModelFacts`): the loaded model's facts, built in the child by `served_model_facts`:
    ``RewardService(process.facts, scorer=process.score_info, scorer_alive=process.process.is_alive)`` serves it.

    Args:
        directory (`str` or `Path`): the reward-model directory (`open_reward_model`).
        media_root (`str` or `Path`, *optional*): where a multimodal model's relative media paths resolve.
        threads (`int`, *optional*): torch CPU threads of the model process.

    Raises:
        ModelProcessError: the model process did not start (its error is in the message), or did not load the model
            within `START_TIMEOUT_S`; the error the loader raised (e.g. `FileNotFoundError`) is re-raised as is.
    """

    def __init__(self, directory: str | Path, media_root: str | Path | None = None, threads: int | None = None):
        context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads or a GPU
        self._conn, child = context.Pipe()
        self._lock = threading.Lock()  # one model call at a time (the Batcher has one scoring thread anyway)
        root = None if media_root is None else str(media_root)
        self.process = context.Process(
            target=_serve,
            args=(str(directory), root, threads, child, list(warnings.filters), parent_identity()),
            name="emoreward-model",
            daemon=True,
        )
        self.process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise ModelProcessError(f"the model process did not load {directory} within {START_TIMEOUT_S:g} s")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            self.close()
            raise ModelProcessError(
                f"the model process exited with code {self.process.exitcode} while loading {directory}"
            ) from None
        if status != "ready":
            self.close()
            raise _unpack_error(payload)
        self.facts = payload

    def score_info(
        self, descriptions: Sequence[str], contexts: Sequence[Any] | None = None, *, batch_size: int | None = None
    ) -> Any:
        """`RewardModel.score_info` in the model process (same arguments, same result, same exceptions).

        Raises:
            ModelProcessError: the model process has stopped.
        """
        with self._lock:
            try:
                self._conn.send((list(descriptions), None if contexts is None else list(contexts), batch_size))
                status, payload = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self.process.join(1.0)  # reaped, so that its exit code (a signal: negative) is known
                raise ModelProcessError(
                    f"the model process has stopped (exit code {self.process.exitcode}); restart the server"
                ) from None
        if status == "ok":
            return payload
        raise _unpack_error(payload)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the model process (after its current call); killed if it has not ended within ``timeout`` s."""
        with self._lock:
            try:
                self._conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self._conn.close()


__all__ = ["ModelProcess", "ModelProcessError"]
