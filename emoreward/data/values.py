"""Cell values of a data source: what counts as missing, NumPy values as Python ones, optional text fields."""

from __future__ import annotations

import math
from typing import Any

from emoreward.data.errors import DataError


def is_missing(value: Any) -> bool:
    """Whether a cell holds a missing value: `None`, float NaN (also NumPy's), `pandas.NA` or `NaT`."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, (str, bool, int, list, dict, tuple)):
        return False
    if type(value).__name__ in ("NAType", "NaTType"):
        return True
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        return is_missing(item())
    return False


def plain(value: Any) -> Any:
    """NumPy scalars and 1-d arrays as Python values, also inside lists and dicts (pandas hands list columns out
    as object arrays, e.g. conversational `chosen` read with `pandas.read_parquet`)."""
    if type(value).__module__ == "numpy" and hasattr(value, "ndim"):
        if value.ndim == 0:
            return value.item()
        if value.ndim == 1:
            return [plain(v) for v in value.tolist()]
        return value
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def optional_text(value: Any, source: str, row: int | None, name: str) -> str | None:
    """An optional text field: missing (see `is_missing`), empty or whitespace-only -> None; else the text with
    surrounding whitespace removed (an integer is its decimal text).

    Raises:
        DataError: a value that is not text or an integer (named by source, row and field).
    """
    value = plain(value)
    if is_missing(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(source, row, name, f"expected text, got {type(value).__name__}")
    return str(value).strip() or None


__all__ = ["is_missing", "optional_text", "plain"]
