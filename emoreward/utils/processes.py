"""Child processes end when their parent dies: the one mechanism every process this project starts calls
(`die_with_parent`: Linux's parent-death signal plus a watcher thread; `popen_with_parent` for programs started with
`subprocess`; a `Reaper` for processes a library starts). See docs/development.md.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


# seconds between two checks of the watching thread: a child outlives its parent by at most about this
WATCH_INTERVAL_S = 0.5
# exit status of a child that ended because its parent had gone
ORPHAN_EXIT = 70
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_identity() -> tuple[int, bool]:
    """What a child needs to watch its parent, taken in the parent where it starts the child: its pid, and whether
    it is the parent's main thread that starts it (the kernel's parent-death signal follows that thread)."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


def die_with_parent(parent: tuple[int, bool]) -> None:
    """End this process when its parent ``parent`` (`parent_identity`, taken in the parent) ends; call it first
    thing in the child. Ends at once (``os._exit(ORPHAN_EXIT)``) when the parent is already gone."""
    parent_pid, from_main_thread = parent
    if from_main_thread and sys.platform.startswith("linux"):
        _kernel_death_signal()
    if os.getppid() != parent_pid:  # it died before the child got here
        os._exit(ORPHAN_EXIT)
    threading.Thread(target=_watch, args=(parent_pid,), name="emoreward-parent-watch", daemon=True).start()


def _prctl():
    """libc's ``prctl``, or None where it is not available."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _kernel_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where libc or prctl is not available."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def popen_with_parent(sig: int = signal.SIGTERM) -> dict:
    """Keyword arguments of `subprocess.Popen` / `subprocess.run` that end the program it starts with ``sig`` when
    this process ends (Linux: ``prctl(PR_SET_PDEATHSIG)`` between fork and exec; call it from the thread that
    starts the program, e.g. the main thread). SIGTERM by default, so that a server still answers what it has
    queued. Elsewhere: no arguments (the program is not tied to this process)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return {}
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return {}

    def tie() -> None:  # in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(ORPHAN_EXIT)

    return {"preexec_fn": tie}


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(ORPHAN_EXIT)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        out += below
        todo += below
    return out


_REAPER = """import os, signal, sys
pids = [int(p) for p in sys.argv[1:]]
if sys.stdin.read() != "done":  # end of stream without "done": the parent has gone
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


class Reaper:
    """A watcher process that SIGKILLs ``pids`` once this process has ended without calling `release` (killed,
    crashed): it reads a pipe only this process writes, and the kernel closes that pipe however this process ends.

    Args:
        pids: the processes to end with this one (e.g. `descendants(os.getpid())` after a library started them).
    """

    def __init__(self, pids: list[int]):
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, "-c", _REAPER, *map(str, pids)], stdin=subprocess.PIPE, start_new_session=True
        )

    def release(self) -> None:
        """This process ends normally (it has stopped those processes itself): the reaper leaves without a kill."""
        try:
            self.process.stdin.write(b"done")
            self.process.stdin.close()
        except OSError:
            pass
        self.process.wait(timeout=10)


__all__ = [
    "ORPHAN_EXIT",
    "WATCH_INTERVAL_S",
    "Reaper",
    "descendants",
    "die_with_parent",
    "parent_identity",
    "popen_with_parent",
]
