"""Processed media prefixes kept so that a clip's media cost is paid once per clip, across the calls of a run and,
with a cache folder, across runs: an LRU bounded by bytes, and one safetensors file per prefix on disk, keyed by the
media content, the processing settings and the subtitle. See docs/multimodal.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from emoreward.models.media.processing import EncodedPrefix
from emoreward.utils.cache_key import cache_key


logger = logging.getLogger(__name__)

CACHE_FORMAT = 1
ENV_VAR = "EMOREWARD_MEDIA_CACHE"  # a folder: the default disk cache of every MediaRewardModel
DEFAULT_MAX_BYTES = 2 * 1024**3


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """sha256 of a file's content, remembered per (path, size, modification time) so a file is read once."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        with open(path, "rb") as fh:
            _DIGESTS[key] = hashlib.file_digest(fh, "sha256").hexdigest()
    return _DIGESTS[key]


@dataclass
class CacheStats:
    """Lookups so far: `memory_hits`, `disk_hits`, `misses` (prefixes processed), `disk_errors` (unreadable
    cache files, processed again)."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    disk_errors: int = 0


def _nbytes(prefix: EncodedPrefix) -> int:
    return sum(v.numel() * v.element_size() for v in prefix.media.values() if torch.is_tensor(v))


class MediaPrefixCache:
    """Processed media prefixes in memory (LRU, at most `max_bytes` of tensors) and optionally on disk.

    Args:
        max_bytes: memory bound (0 keeps nothing in memory).
        directory: a folder for the disk cache (created on first write), or None (memory only).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, directory: str | Path | None = None):
        self.max_bytes = max_bytes
        self.directory = None if directory is None else Path(directory)
        self.stats = CacheStats()
        self._items: OrderedDict[str, EncodedPrefix] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def key(files: Sequence[str | Path | None], settings: str, subtitle: str | None) -> str:
        """The cache key (`emoreward.utils.cache_key.cache_key`): the files' content digests and the subtitle (the
        context), the processing settings (the layout: backbone, frame sampling, pixel bounds, audio options,
        instruction, tokenizer, processor, transformers version). A prefix holds the processor's output, before
        any weights: no model content, no precision (its tensors are cast when the network reads them) and no
        length limit (a media prefix is never cut) enter it."""
        return cache_key(
            purpose="media-prefix",
            model=None,
            precision=None,
            length_limit=None,
            layout=settings,
            context=[[None if f is None else file_digest(f) for f in files], subtitle or None],
            prompt=None,
            extra=CACHE_FORMAT,
        )

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> EncodedPrefix | None:
        """The cached prefix (memory, then disk), or None."""
        if key in self._items:
            self._items.move_to_end(key)
            self.stats.memory_hits += 1
            return self._items[key]
        prefix = self._read(key)
        if prefix is not None:
            self.stats.disk_hits += 1
            self._remember(key, prefix)
        return prefix

    def put(self, key: str, prefix: EncodedPrefix) -> None:
        """Keep a freshly processed prefix (counted as a miss) in memory and, with a folder, on disk."""
        self.stats.misses += 1
        self._remember(key, prefix)
        self._write(key, prefix)

    def clear(self) -> None:
        """Forget the prefixes held in memory (the disk cache stays)."""
        self._items.clear()
        self._bytes = 0

    # ------------------------------------------------------------------ memory
    def _remember(self, key: str, prefix: EncodedPrefix) -> None:
        size = _nbytes(prefix)
        if size > self.max_bytes:
            return
        self._items[key] = prefix
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= _nbytes(old)

    # ------------------------------------------------------------------ disk
    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.safetensors"

    def _write(self, key: str, prefix: EncodedPrefix) -> None:
        if self.directory is None:
            return
        from safetensors.torch import save_file

        tensors = {k: v.contiguous() for k, v in prefix.media.items() if torch.is_tensor(v)}
        others = {k: v for k, v in prefix.media.items() if not torch.is_tensor(v)}
        try:
            meta = {
                "input_ids": json.dumps(prefix.input_ids),
                "n_media_tokens": str(prefix.n_media_tokens),
                "others": json.dumps(others),
            }
        except TypeError:  # a non-tensor processor output that JSON cannot hold: keep it in memory only
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)

    def _read(self, key: str) -> EncodedPrefix | None:
        if self.directory is None:
            return None
        path = self._path(key)
        if not path.exists():
            return None
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata()
                media = {k: fh.get_tensor(k) for k in fh.keys()}
            media.update(json.loads(meta.get("others", "{}")))
            return EncodedPrefix(json.loads(meta["input_ids"]), media, int(meta["n_media_tokens"]))
        except Exception as err:  # a damaged cache file: process the media again
            self.stats.disk_errors += 1
            logger.warning(
                "media cache: %s is unreadable (%s: %s); processing the media again", path, type(err).__name__, err
            )
            return None


__all__ = ["CACHE_FORMAT", "DEFAULT_MAX_BYTES", "ENV_VAR", "CacheStats", "MediaPrefixCache", "file_digest"]
