"""Writing result records (judgements, rankings, per-pair scores) as datasets: JSON lines, parquet or the Hub.

`write_records` writes one file that `datasets.load_dataset` reads back equal to the rows (columns: the union of
the rows' keys, in first-seen order); `push_records_to_hub` uploads the same table. See docs/data.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal


FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class HubPushError(RuntimeError):
    """A push to the Hub failed; the one-line message names the repository."""


def check_hub_push(repo_id: str, repo_type: Literal["dataset", "model"] = "dataset", token: str | None = None) -> None:
    """Refuse a Hub push that cannot succeed before the command's work: offline mode, or no token.

    Raises:
        HubPushError: naming the repository and the reason (one line)."""
    from huggingface_hub import constants, get_token

    offline = constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE
    if offline:
        raise HubPushError(f"cannot push to the Hub {repo_type} {repo_id!r}: offline mode is on (HF_HUB_OFFLINE=1)")
    if token is None and get_token() is None:
        raise HubPushError(
            f"cannot push to the Hub {repo_type} {repo_id!r}: no Hub token (set HF_TOKEN or run `hf auth login`)"
        )


def records_to_dataset(rows: Iterable[Mapping[str, Any]]) -> Any:
    """The rows as a `datasets.Dataset` (columns: union of the rows' keys in first-seen order; missing: None).

    Raises:
        ValueError: no rows, a row that is not a mapping, or a column whose values do not share one type (names the
            column and the first row that disagrees)."""
    import datasets

    rows = list(rows)
    if not rows:
        raise ValueError("no records to write")
    columns: dict[str, None] = {}
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise ValueError(f"record {i} is a {type(row).__name__}, expected a mapping of column names to values")
        columns.update(dict.fromkeys(row))
    table = {name: [row.get(name) for row in rows] for name in columns}
    try:
        return datasets.Dataset.from_dict(table)
    except Exception as err:  # pyarrow's type errors do not say which column
        raise ValueError(_column_problem(table) or f"records do not form a table: {err}") from None


def _column_problem(table: dict[str, list[Any]]) -> str | None:
    import pyarrow as pa

    for name, values in table.items():
        try:
            pa.array(values)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
            for i in range(1, len(values) + 1):
                try:
                    pa.array(values[:i])
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    return f"column {name!r}: record {i} ({values[i - 1]!r:.60}) does not match the type of the earlier records ({err})"
    return None


def check_records_path(path: str | Path, option: str | None = None) -> Path:
    """Refuse a records path whose suffix `write_records` cannot write (checked before a run, not after it).

    Raises:
        ValueError: naming the option (when given), the path and the suffixes that work.
    """
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        where = f"{option} {path}" if option else str(path)
        raise ValueError(f"{where}: unknown suffix {path.suffix!r}; use one of {sorted(FORMATS)}")
    return path


def write_records(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows (mappings of column name to JSON-like values) as JSON lines (`.jsonl`, `.json`) or parquet, by the
    path's suffix, atomically; returns the `Path` written.

    Raises:
        ValueError: unknown suffix, no rows, mixed types in a column, or NaN / infinity in a JSON file (names the
            record and column; parquet keeps them)."""
    path = Path(path)
    kind = FORMATS[check_records_path(path).suffix.lower()]
    dataset = records_to_dataset(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if kind == "json":
            with open(tmp, "w", encoding="utf-8") as handle:
                for i, row in enumerate(dataset.to_list(), start=1):
                    handle.write(_json_line(row, i, path) + "\n")
        else:
            import pyarrow.parquet as pq

            pq.write_table(dataset.data.table, tmp)  # the schema carries the `datasets` features
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _json_line(row: dict[str, Any], index: int, path: Path) -> str:
    try:
        return json.dumps(row, ensure_ascii=False, allow_nan=False)
    except ValueError:
        bad = next((k for k, v in row.items() if _has_non_finite(v)), "?")
        raise ValueError(
            f"{path}: record {index}, column {bad!r}: NaN or infinity cannot be written to JSON; "
            "use None, or write parquet"
        ) from None


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def push_records_to_hub(
    rows: Iterable[Mapping[str, Any]],
    repo_id: str,
    *,
    split: str = "train",
    config_name: str = "default",
    revision: str | None = None,
    private: bool = True,
    token: str | None = None,
    commit_message: str | None = None,
) -> Any:
    """Upload rows as one split of a Hub dataset (`datasets.Dataset.push_to_hub`), private unless `private=False`;
    `token` None: the logged-in user's (never logged). Returns the `huggingface_hub.CommitInfo`.

    Raises:
        ValueError: bad rows (see `records_to_dataset`).
        HubPushError: offline, no token (`check_hub_push`), or the Hub refused or could not be reached (one line)."""
    dataset = records_to_dataset(rows)
    check_hub_push(repo_id, "dataset", token)
    try:
        return dataset.push_to_hub(
            repo_id,
            config_name=config_name,
            split=split,
            revision=revision,
            private=private,
            token=token,
            commit_message=commit_message,
        )
    except Exception as err:  # transport and Hub errors of several libraries: one line, no traceback
        text = " ".join(str(err).split())[:300]
        raise HubPushError(f"cannot push to the Hub dataset {repo_id!r}: {type(err).__name__}: {text}") from None


__all__ = [
    "FORMATS",
    "HubPushError",
    "check_hub_push",
    "check_records_path",
    "push_records_to_hub",
    "records_to_dataset",
    "write_records",
]
