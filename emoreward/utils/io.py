"""Atomic file writes: a reader (or a rerun after kill -9) sees the old file or the new one, never half of one.

Whole-file outputs (reports, `finished.json` markers, settings) are written to a temporary file in the same
folder, flushed to disk and renamed over the target (`os.replace` is atomic on POSIX and Windows).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
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
