"""The score cache of a reward-model ranking: reward scores on disk keyed by (the model's content identity,
description, context), appended as they are computed (`ScoreCache`, `score_key`, `cache_path_for`,
`default_cache_dir`)."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from emoreward.models.base import RewardContext, RewardModel


class ScoreCache:
    """Reward scores on disk, one JSON line ``{"key": score_key(model, description, context), "score": float,
    "truncated": bool}`` each (``truncated``: the description was cut to fit the model's length limit).

    The file belongs to one model (its name carries the model's identity); scores are appended as computed, whole lines
    under a file lock, so an interrupted run keeps what it scored and concurrent runs lose nothing. A torn line is
    skipped and counted (`n_skipped`), never cut away; another unreadable line, or one whose score is not finite (a
    NaN from a broken engine, written before scores were checked), is skipped with a warning and scored again; no
    non-finite score reaches `put` (a model's scoring refuses it: `emoreward.models.base.check_finite_rewards`).
    ``path`` ``None`` keeps scores in memory only.
    """

    def __init__(self, path: str | Path | None):
        from emoreward.utils.io import locked_read

        self.path = None if path is None else Path(path)
        self._scores: dict[str, float] = {}
        self._truncated: dict[str, bool] = {}
        self.n_skipped = 0  # unreadable lines on load (torn by a killed run, or damaged)
        if self.path is None:
            return
        lines = locked_read(self.path).split(b"\n")
        unreadable: list[int] = []
        non_finite: list[int] = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line.decode("utf-8"))
                score = float(entry["score"])
                if not math.isfinite(score):
                    non_finite.append(number)
                    continue
                self._scores[entry["key"]] = score
                if "truncated" in entry:
                    self._truncated[entry["key"]] = bool(entry["truncated"])
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
                unreadable.append(number)
        self.n_skipped = len(unreadable) + len(non_finite)
        torn_last = bool(unreadable) and unreadable[-1] == len(lines)  # no newline after it: a killed run's
        damaged = unreadable[:-1] if torn_last else unreadable
        if damaged:
            warnings.warn(
                f"{self.path}: {len(damaged)} unreadable line(s) skipped (line {_shown(damaged)}); "
                "their descriptions are scored again",
                stacklevel=2,
            )
        if non_finite:
            warnings.warn(
                f"{self.path}: {len(non_finite)} line(s) with a non-finite score (NaN or infinity) refused (line "
                f"{_shown(non_finite)}); their descriptions are scored again",
                stacklevel=2,
            )

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: str) -> float | None:
        return self._scores.get(key)

    def truncated(self, key: str) -> bool | None:
        """Whether the cached score's description was cut to fit (None: not recorded)."""
        return self._truncated.get(key)

    def put(self, items: dict[str, float], truncated: dict[str, bool] | None = None) -> None:
        """Add scores (and, when known, truncation flags) and append them to the file. The scores come from a
        model's scoring, which never answers a NaN or an infinity (`emoreward.models.base.check_finite_rewards`)."""
        truncated = truncated or {}
        self._scores.update(items)
        self._truncated.update(truncated)

        def line(key: str, value: float) -> str:
            entry = {"key": key, "score": value}
            if key in truncated:
                entry["truncated"] = bool(truncated[key])
            return json.dumps(entry) + "\n"

        if self.path is not None and items:
            from emoreward.utils.io import locked_append

            locked_append(self.path, "".join(line(k, v) for k, v in items.items()).encode("utf-8"))


def _shown(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")


def default_cache_dir() -> Path:
    """``$EMOREWARD_CACHE`` or ``$XDG_CACHE_HOME/emoreward/rank`` (default ``~/.cache/emoreward/rank``)."""
    if os.environ.get("EMOREWARD_CACHE"):
        return Path(os.environ["EMOREWARD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "emoreward" / "rank"


def model_key_parts(model: RewardModel) -> dict:
    """The parts of every score-cache key that belong to the model, not to one description: its content
    (`emoreward.models.loading.model_identity`: everything it reads, a referenced backbone included), the precision
    it scores in and the kernels that compute it (`model_precision_identity`: a CPU kind's bf16 is not another's), its length limit and its input layout (settings without the tie threshold). Computed once per scoring pass (`score_key`'s ``parts``): they read every weight's version."""
    from emoreward.models.loading import model_identity
    from emoreward.models.precision import model_precision_identity  # torch-free: a rerun from the cache needs none

    return {
        "model": model_identity(model),
        "precision": model_precision_identity(model),
        "length_limit": model.settings.max_length,
        "layout": {k: v for k, v in asdict(model.settings).items() if k not in ("tie_threshold", "extra")},
    }


def score_key(model: RewardModel, description: str, context: RewardContext, parts: dict | None = None) -> str:
    """The score-cache key of one (description, context): `emoreward.utils.cache_key.cache_key` over everything
    that changes the score: the model's parts (`model_key_parts`; pass ``parts`` to reuse them over a table), the
    part of the context the model reads (for a multimodal model the media files' content digests too, so a file
    replaced under the same name is scored again) and the description, each text in the form the model reads
    (`emoreward.data.text.normal_text`: a table re-encoded in NFD or NFC is one set of keys)."""
    from emoreward.data.text import normal_text
    from emoreward.utils.cache_key import cache_key

    stamps = []
    if model.kind != "text":
        from emoreward.models.media.cache import file_digest

        for path in (context.video, context.audio):
            root = getattr(model, "media_root", None)
            full = Path(path) if path and (Path(path).is_absolute() or not root) else None
            if path and full is None:
                full = Path(root) / path
            stamps.append(file_digest(full) if full is not None and full.is_file() else None)
    return cache_key(
        purpose="score",
        **(parts if parts is not None else model_key_parts(model)),
        context=[[str(k) for k in model.context_key(context)], stamps],
        prompt=normal_text(description),  # as `emoreward.models.layout` reads it
    )


def cache_path_for(model_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The score-cache file of a reward model: ``<cache_dir>/scores-<identity>.jsonl``
    (`emoreward.models.loading.content_identity` of the folder: a backbone it reads included).

    Raises:
        FileNotFoundError: `model_dir` is not a directory."""
    from emoreward.models.loading import content_identity

    return Path(cache_dir or default_cache_dir()) / f"scores-{content_identity(model_dir)}.jsonl"
