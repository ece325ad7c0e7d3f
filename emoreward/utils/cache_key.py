"""Cache keys: one function (`cache_key`) builds the key of every cache that holds model outputs, the sha256 of named
parts that must all be given (`purpose`, `model`, `precision`, `length_limit`, `layout`, `context`, `prompt`,
`extra`), so no cache leaves one out by accident. See docs/ranking.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


KEY_VERSION = 1


def _canonical(value: Any) -> Any:
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # torch dtypes, enums: their names


def cache_key(
    *,
    purpose: str,
    model: Any,
    precision: dict | None,
    length_limit: int | None,
    layout: Any,
    context: Any,
    prompt: Any,
    extra: Any = None,
) -> str:
    """The cache key of one model output (see the module docstring for the parts).

    Args:
        purpose: the cache's name (`"score"`, `"media-prefix"`, `"judge-call"`).
        model, layout, context, prompt, extra: JSON-serialisable values (paths, dtypes and other objects are
            written as strings; dict keys sorted).
        precision: `emoreward.models.precision.precision_identity`'s record (the dtype and the kernels that
            compute in it), or None where the output does not depend on it.
        length_limit: tokens, or None where nothing is cut.

    Returns:
        64 hex characters (sha256).

    Raises:
        TypeError: `precision` is not `precision_identity`'s record (a bare dtype: the kernels left out).
    """
    if precision is not None and (not isinstance(precision, dict) or set(precision) != {"dtype", "kernels"}):
        raise TypeError(
            f"cache_key: precision {precision!r} is not a precision record; pass "
            "emoreward.models.precision.precision_identity(...) (the dtype and the kernels that compute in it)"
        )
    document = {
        "version": KEY_VERSION,
        "purpose": purpose,
        "model": model,
        "precision": precision,
        "length_limit": length_limit,
        "layout": layout,
        "context": context,
        "prompt": prompt,
        "extra": extra,
    }
    blob = json.dumps(_canonical(document), sort_keys=True, ensure_ascii=False, allow_nan=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def content_fingerprint(directory: str | Path) -> str:
    """A content fingerprint of a folder (a saved model), 16 hex characters: every file's relative name, size and
    whole content (sha256), so a change anywhere in any file gives a new fingerprint.

    Raises:
        FileNotFoundError: `directory` is not a directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        _hash_file(h, path, path.relative_to(directory).as_posix())
    return h.hexdigest()[:16]


def _hash_file(h, path: Path, name: str, block: int = 8 << 20) -> None:
    """Add a file's name, size and whole content to `h` (read in blocks of `block` bytes)."""
    with path.open("rb") as fh:
        h.update(f"{name}\0{os.fstat(fh.fileno()).st_size}\0".encode())
        while data := fh.read(block):
            h.update(data)


def source_fingerprint(name_or_path: str | Path | None) -> str | None:
    """The content of a model named by a path or a Hub id, for identities built before (or without) loading it:
    `content_fingerprint` of a local folder; of a local file (a GGUF), the same hash over that file alone; None for
    anything else (a Hub id: its name and revision are its identity)."""
    if name_or_path is None:
        return None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return content_fingerprint(path)
    if path.is_file():
        return _file_fingerprint(path)
    return None


_CURRENT: dict[str, tuple[tuple, str | None]] = {}


def current_fingerprint(name_or_path: str | Path | None) -> str | None:
    """`source_fingerprint` for keys of objects kept in memory for a path: hashed again only when a file's inode, size,
    modification or inode-change time changed since the last call."""
    if name_or_path is None:
        return None
    path = Path(name_or_path).expanduser()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
    # the inode change time moves with every write, even one whose modification time was set back (touch -d)
    stamp = tuple(
        (p.as_posix(), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for p in files for st in [p.stat()]
    )
    cached = _CURRENT.get(str(path))
    if cached is None or cached[0] != stamp:
        cached = _CURRENT[str(path)] = (stamp, source_fingerprint(path))
    return cached[1]


def _file_fingerprint(path: Path) -> str:
    """A file's content (its size and bytes, not its name: a copy or a link under another name is the same file)."""
    h = hashlib.sha256()
    _hash_file(h, path, "")
    return h.hexdigest()[:16]


def weights_fingerprint(module) -> str:
    """A content fingerprint of a torch module's parameters and buffers in memory (names, shapes, dtypes, values),
    16 hex characters; remembered on the module until a parameter changes in place (version counters)."""
    import torch

    tensors = [(n, t) for n, t in module.state_dict().items() if isinstance(t, torch.Tensor)]
    versions = tuple(t._version for _, t in tensors)
    cached = getattr(module, "_emoreward_fingerprint", None)
    if cached is not None and cached[0] == versions:
        return cached[1]
    h = hashlib.sha256()
    for name, t in tensors:
        h.update(f"{name}\0{tuple(t.shape)}\0{t.dtype}\0".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digest = h.hexdigest()[:16]
    try:
        module._emoreward_fingerprint = (versions, digest)
    except AttributeError:
        pass
    return digest


__all__ = [
    "KEY_VERSION",
    "cache_key",
    "content_fingerprint",
    "current_fingerprint",
    "source_fingerprint",
    "weights_fingerprint",
]
