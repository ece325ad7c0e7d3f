"""Atomic outputs: a reader (or a rerun after kill -9) sees the old output or the new one, never half: whole files
(`atomic_write_bytes`), folders swapped in (`replace_dir`, `recover_dir`) and append-only JSON-lines caches under a
file lock (`locked_append`, `locked_read`); one writer per output (`hold_output`: a lock the kernel drops when its
process ends). See docs/development.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set back at once (at import, before any thread of ours runs)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temporary file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file owner-only (0600): give it the mode an ordinary write would (the target's, else
        # 0666 less the umask), so that a report is as readable as the plots beside it
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def ordinary_weight_modes(directory: str | Path) -> None:
    """Give the safetensors files of a saved model the mode an ordinary write would (0666 less the umask):
    safetensors writes them owner-only (0600) through a temporary file, so a server or worker running as another
    user could not read weights whose folder it can read."""
    for path in Path(directory).rglob("*.safetensors"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600:
            os.chmod(path, 0o666 & ~_UMASK)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, *, indent: int = 2) -> Path:
    """Write `obj` as JSON to `path` atomically (numpy scalars and arrays, paths converted)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json_or_none(path: str | Path, *, what: str = "file") -> Any | None:
    """The JSON content of `path`, or None when it is missing, empty or not valid JSON (what a kill between
    truncate and write leaves behind, from a writer that was not atomic); a broken file is named in a warning."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
        logger.warning("%s %s is empty or unreadable (%s): treating it as absent", what, path, err)
        return None


# ------------------------------------------------------------------------------------------- folders
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names of `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where the platform or
    the file system has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def _previous(target: Path) -> Path:
    return target.with_name(f".{target.name}.previous")


def recover_dir(target: str | Path) -> None:
    """Finish what a writer killed inside `replace_dir` left: the old folder set aside with no new one in its place
    is put back; a set-aside old folder beside a complete new one is removed. Nothing to do otherwise."""
    target = Path(target)
    previous = _previous(target)
    if not previous.exists():
        return
    if target.exists():
        shutil.rmtree(previous, ignore_errors=True)
    else:
        os.replace(previous, target)


def replace_dir(new: str | Path, target: str | Path) -> Path:
    """Move the complete folder `new` (written beside `target`, on the same file system) to `target`, replacing
    what `target` held, so that `target` names the old folder or the new one at every moment (after a kill too:
    `recover_dir`, which this calls first, completes an interrupted replacement).

    Raises:
        OSError: a rename failed (nothing is lost: the old folder is `target` or `.<name>.previous` beside it).
    """
    new, target = Path(new), Path(target)
    recover_dir(target)
    if not target.exists():
        os.replace(new, target)
        return target
    if _exchange(new, target):  # `new` now names the old folder
        shutil.rmtree(new, ignore_errors=True)
        return target
    previous = _previous(target)
    os.replace(target, previous)  # a kill here: recover_dir puts `previous` back
    os.replace(new, target)
    shutil.rmtree(previous, ignore_errors=True)
    return target


# ------------------------------------------------------------------------------------------- JSON-lines caches
@contextlib.contextmanager
def _locked(path: Path, mode: str, shared: bool) -> Iterator:
    import fcntl

    with path.open(mode) as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield fh
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def locked_append(path: str | Path, data: bytes) -> None:
    """Append whole lines `data` (ending in a newline) to `path` under an exclusive lock, flushed and fsynced; when
    the file ends inside a line (a writer killed mid-line) the append starts on a fresh line, and the torn one is
    left where it is (lines of other writers may follow it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path, "a+b", shared=False) as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                data = b"\n" + data
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def locked_read(path: str | Path) -> bytes:
    """The bytes of `path` read under a shared lock (no writer is halfway through a `locked_append`); b"" when it
    does not exist."""
    path = Path(path)
    if not path.exists():
        return b""
    with _locked(path, "rb", shared=True) as fh:
        return fh.read()


# ------------------------------------------------------------------------------------------- one writer per output
class OutputBusyError(ValueError):
    """An output (file or folder) another running process is writing; the message names the option, the path and
    that process."""


_HELD: dict[str, tuple[int, int, list[Path]]] = {}  # lock file -> (descriptor, owning pid, folders created for it)


def _lock_file(target: str | Path) -> Path:
    """The lock of an output: ``.<name>.lock`` beside it, in its folder's real path (two spellings of one output,
    through a symlinked folder, are one lock; beside, not inside, so a folder swapped in whole keeps it)."""
    target = Path(os.path.abspath(Path(target).expanduser()))
    return Path(os.path.realpath(target.parent)) / f".{target.name}.lock"


def hold_output(target: str | Path, option: str) -> bool:
    """Take the one writer's lock of output ``target`` (a file or a folder) before any work: an `fcntl` lock on
    ``.<name>.lock`` beside it, held until `release_outputs` or until the process ends (a crash or kill -9 too: the
    kernel drops it), so a second run writing the same output is refused instead of both exiting 0 with one run's
    results lost. The folders it creates for the lock are removed again on release when left empty.

    Returns:
        True when this call took the lock; False when this process already held it.

    Raises:
        OutputBusyError: another process holds it (naming ``option``, the path and that process's id).
    """
    import fcntl

    target = Path(target)
    created = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_file(target)
    held = _HELD.get(str(lock))
    if held is not None and held[1] == os.getpid():
        return False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            process = f" (process {holder})" if holder.isdigit() else ""
            raise OutputBusyError(
                f"{option} {target} is being written by another emoreward run{process}: wait for it to finish or "
                "write elsewhere"
            ) from None
        try:  # the holder may have released (removed the file) between our open and our lock: lock what is there now
            now = os.stat(lock)
            mine = os.fstat(fd)
            same = (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    _HELD[str(lock)] = (fd, os.getpid(), created)
    return True


def release_output(target: str | Path) -> None:
    """Release this process's lock of output ``target`` (`hold_output`): its lock file removed, then unlocked."""
    _release(str(_lock_file(target)))


def release_outputs() -> None:
    """Release every output lock this process holds (the end of a command; a forked child releases none)."""
    for lock in list(_HELD):
        _release(lock)


def _release(lock: str) -> None:
    held = _HELD.get(lock)
    if held is None or held[1] != os.getpid():
        return
    del _HELD[lock]
    fd, _, created = held
    with contextlib.suppress(OSError):
        os.unlink(lock)
    os.close(fd)
    for folder in created:  # deepest first: only the folders the lock made and nothing else filled
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def output_lock(target: str | Path, option: str) -> Iterator[None]:
    """`hold_output` for the body of a ``with`` block; released at its end when this block took it."""
    took = hold_output(target, option)
    try:
        yield
    finally:
        if took:
            release_output(target)


# ------------------------------------------------------------------------------------------- one run's files
class OutputFiles:
    """The files one run writes, claimed before any work: no two outputs of the run share a path, none is a file
    the run reads (its data, its cache), no other running process writes one (`hold_output`, released by
    `finish` or `release_outputs`), and what an earlier run into the same place wrote and this run does not
    (an optional plot) is removed at the end, so the folder holds exactly the files this run reports.

    `claim(path, what)` an output (`optional`: written only in some runs); `guard(path, what)` an input or a cache;
    `written(path)` after writing it; `finish()` removes stale optional outputs and returns the written paths.

    Raises (`claim`, `guard`):
        ValueError: two of them share a path, naming both and the path; `OutputBusyError` (`claim`): another
            process is writing that output.
    """

    def __init__(self) -> None:
        self._roles: dict[Any, tuple[str, Path]] = {}
        self._optional: dict[str, Path] = {}  # real path -> the path as given
        self._written: list[Path] = []
        self._locked: list[Path] = []

    @staticmethod
    def _key(path: str | Path) -> Any:
        """What a path names: the file itself (device and inode) when it exists, so that a hard link is the same
        file; else its real path (symbolic links in its folders resolved)."""
        real = Path(os.path.realpath(Path(path).expanduser()))
        try:
            st = real.stat()
        except OSError:
            return real
        return (st.st_dev, st.st_ino)

    def _add(self, path: str | Path, what: str) -> Path:
        key = self._key(path)
        if key in self._roles:
            other, first = self._roles[key]
            same = first if str(first) == str(path) else f"{first} and {path}, one file"
            raise ValueError(f"{what} and {other} would both be {same}: give them different paths")
        self._roles[key] = (what, Path(path))
        return Path(path)

    def claim(self, path: str | Path, what: str, *, optional: bool = False) -> Path:
        out = self._add(path, what)
        if hold_output(path, what):
            self._locked.append(Path(path))
        if optional:
            self._optional[os.path.realpath(Path(path).expanduser())] = Path(path)
        return out

    def guard(self, path: str | Path | None, what: str) -> None:
        if path is not None:
            self._add(path, what)

    def written(self, path: str | Path) -> Path:
        self._written.append(Path(path))
        return Path(path)

    def finish(self) -> list[Path]:
        done = {os.path.realpath(Path(p).expanduser()) for p in self._written}
        for key in self._optional.keys() - done:
            self._optional[key].unlink(missing_ok=True)
        for path in self._locked:
            release_output(path)
        return list(self._written)
