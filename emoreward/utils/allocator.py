"""Keeping freed memory in the process for reuse (`keep_freed_memory`): glibc's allocator settings for CPU scoring,
so batches stop paying page faults on fresh pages. See docs/speed.md.
"""

from __future__ import annotations

import ctypes
import logging
import platform


logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest (64-bit): tensors below it come from the reusable heap
TRIM_THRESHOLD = 256 * 1024 * 1024  # free memory at the top of the heap kept up to this (a MiniLM pass: ~100 MiB)

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the system (see the module docstring):
    `mallopt(M_MMAP_THRESHOLD, 32 MiB)` and `mallopt(M_TRIM_THRESHOLD, 256 MiB)`, for the rest of the process.
    Applied once per process; a no-op on other C libraries (macOS, musl).

    Returns:
        `bool`: whether the settings are in effect.
    """
    global _applied
    if _applied is None:
        _applied = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                libc = ctypes.CDLL("libc.so.6")
                _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                )
            except (OSError, AttributeError) as err:
                logger.debug("mallopt unavailable: %s", err)
    return _applied


__all__ = ["keep_freed_memory"]
