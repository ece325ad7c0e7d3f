"""An append-only JSONL cache of model calls, so a killed run resumes without redoing finished calls.

A call is keyed by (judge, strategy, step, sample, order, run) and its `input_hash` (prompt, media, model content
and sampling: `call_input_hash`). Step-1 descriptions are stored once under strategy `shared` and order `-`, so S2,
S3 and S4 read the same description of a sample for a given run. A call whose input changed (a model retrained in
place, a corrected row, another prompt) is a miss and is made again; the earlier answer stays in the file for the
earlier input. `CallCache` gives the line format and how a half-written line is read. Whole-file writes next to the
cache (reports, judgements) go through `emoreward.utils.io.atomic_write_text`. See docs/judges.md.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallKey:
    """Identity of one model call (see the module docstring)."""

    judge: str
    strategy: str
    step: str
    sample: str
    order: str
    run: int

    def as_tuple(self) -> tuple:
        return (self.judge, self.strategy, self.step, self.sample, self.order, self.run)


def media_array_digest(array) -> str | None:
    """sha256 of an in-memory media array's dtype, shape and every value (its `repr` shows only the corners, so two
    different clips could share it), or None without one."""
    if array is None:
        return None
    import hashlib

    import numpy as np

    a = np.ascontiguousarray(array)
    return hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()


def call_input_hash(
    *,
    backend,
    step: str,
    system: str | None,
    prompt: str,
    media: list | None,
    sampling: dict,
    score_labels=None,
    answer_prefix: str | None = None,
    prompts_tag: str | None = None,
) -> str:
    """The `input_hash` of one model call (`emoreward.utils.cache_key.cache_key`, 16 hex characters): the backend's
    identity (weights and media settings) as the model, its `precision` (the dtype its local weights compute in and
    the kernels that compute it, `emoreward.models.precision.precision_identity`, which a `LazyBackend` knows
    before loading; None for a remote server, whose precision is its own), the length limit (`sampling["max_new_tokens"]` cuts the answer), the prompt template tag as the layout,
    the media (`media`: content digests) as the context, the system and user prompt as the prompt, and the
    sampling, the scored labels and the answer prefix."""
    from emoreward.utils.cache_key import cache_key

    return cache_key(
        purpose="judge-call",
        model=backend.identity,
        precision=backend.precision,
        length_limit=sampling.get("max_new_tokens"),
        layout=prompts_tag,
        context=media,
        prompt=[step, system, prompt],
        extra=[sampling, score_labels, answer_prefix],
    )[:16]


class CallCache:
    """Append-only JSONL call cache. Each line is one finished call::

        {"judge": ..., "strategy": "S1" | "shared", "step": "compare" | "describe" | ..., "sample": ..., "order":
         "normal" | "swapped" | "-", "run": 0, "input_hash": ..., "output": "...", "probs": {...} | null, "meta": {...}}

    Lines are appended whole under a file lock (`emoreward.utils.io.locked_append`), so two runs on one cache lose
    nothing. A SIGKILL can leave a half-written line, cut anywhere, also inside a multi-byte UTF-8 character: each
    line is decoded on its own, an undecodable or unparseable one is counted (`n_corrupt`) and skipped, never cut
    away, and the next append starts a new line. Failed calls are never written, so a rerun retries them.

    Args:
        path: the JSONL file (created with its folder when missing); None keeps the cache in memory only.

    Attributes:
        n_corrupt: lines that could not be read on load (a half-written last line after a kill).
        n_duplicates: lines whose key was already present on load (the first one is kept).
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self._rows: dict[tuple, dict[str, Any]] = {}  # (key tuple, input hash) -> row
        self._lock = threading.Lock()
        self.n_corrupt = 0
        self.n_duplicates = 0
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        from emoreward.utils.io import locked_read

        try:
            data = locked_read(self.path)
        except OSError as err:
            raise OSError(f"call cache {self.path}: cannot be read ({err.strerror or err})") from err
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))  # strict: a line cut inside a character is corrupt
                key = CallKey(
                    row["judge"], row["strategy"], row["step"], row["sample"], row["order"], int(row["run"])
                ).as_tuple() + (row["input_hash"],)
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
                self.n_corrupt += 1
                continue
            if key in self._rows:
                self.n_duplicates += 1
                continue
            self._rows[key] = row
        if self.n_corrupt:
            logger.warning(
                "call cache %s: skipped %d corrupt line(s) (a killed write); those calls are redone",
                self.path,
                self.n_corrupt,
            )

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: CallKey) -> bool:
        """Whether the call `key` was made with any input."""
        return any(k[:-1] == key.as_tuple() for k in self._rows)

    def get(self, key: CallKey, input_hash: str) -> dict[str, Any] | None:
        """The cached row of the call `key` made with input `input_hash`, or None (never made, or made with another
        input: another prompt, media, model content or sampling)."""
        return self._rows.get(key.as_tuple() + (input_hash,))

    def put(
        self, key: CallKey, input_hash: str, output: str, probs: dict | None = None, meta: dict | None = None
    ) -> None:
        """Append one finished call (flushed and fsynced, so a kill right after loses nothing)."""
        row = {
            "judge": key.judge,
            "strategy": key.strategy,
            "step": key.step,
            "sample": key.sample,
            "order": key.order,
            "run": key.run,
            "input_hash": input_hash,
            "output": output,
            "probs": probs,
            "meta": meta or {},
        }
        with self._lock:
            if key.as_tuple() + (input_hash,) in self._rows:
                return
            self._rows[key.as_tuple() + (input_hash,)] = row
            if self.path is None:
                return
            from emoreward.utils.io import locked_append

            locked_append(self.path, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
