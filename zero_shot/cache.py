"""An append-only JSONL cache of model calls, so a killed run resumes without redoing finished calls.

A call is found by its content only (`CallKey.content`): strategy, step, run and `input_hash` (the prompt with the
descriptions in the order shown, media, model content, precision, sampling: `call_input_hash`); the names it was made
for (judge, sample, order) are written for logs, never looked up, so renamed models and a subset of an earlier run
reuse its calls. Step-1 descriptions are stored under strategy `shared`. A changed input is a miss, made again; the
earlier answer stays for the earlier input. `CallCache` gives the line format and how a half-written line is read.
Whole-file writes next to the cache go through `emoreward.utils.io.atomic_write_text`. See docs/judges.md.
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
    """Names of one model call (judge, strategy, step, sample, order, run), written with it for logs; the cache looks
    a call up by `content` only (see the module docstring)."""

    judge: str
    strategy: str
    step: str
    sample: str
    order: str
    run: int

    def as_tuple(self) -> tuple:
        return (self.judge, self.strategy, self.step, self.sample, self.order, self.run)

    def content(self, input_hash: str) -> tuple:
        """The call's identity in the cache: `(strategy, step, run, input_hash)`, no name of a judge, sample, model or
        order (an order is in the prompt, so in `input_hash`). `run` is 0 for every run of a greedy judge."""
        return (self.strategy, self.step, self.run, input_hash)


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
        n_duplicates: lines whose content (`CallKey.content`) was already present on load (the first one is kept).
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self._rows: dict[tuple, dict[str, Any]] = {}  # CallKey.content -> row
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
                ).content(row["input_hash"])
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
        """Whether a call with the names of `key` was made with any input (logs and tests; lookups go by content)."""
        names = key.as_tuple()
        return any((r["judge"], r["strategy"], r["step"], r["sample"], r["order"], r["run"]) == names
                   for r in self._rows.values())  # fmt: skip

    def get(self, key: CallKey, input_hash: str) -> dict[str, Any] | None:
        """The cached row of a call with the content of `key` (strategy, step, run) and input `input_hash`, whatever
        the judge, sample, models or order it was made for; None when never made with that input (another prompt,
        media, model content or sampling)."""
        return self._rows.get(key.content(input_hash))

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
            if key.content(input_hash) in self._rows:
                return
            self._rows[key.content(input_hash)] = row
            if self.path is None:
                return
            from emoreward.utils.io import locked_append

            locked_append(self.path, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
