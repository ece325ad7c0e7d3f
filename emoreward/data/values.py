"""Cell values of a data source: what counts as missing (a text cell) or null (a numeric one), NumPy values as Python
ones, optional text fields."""

from __future__ import annotations

import math
from typing import Any

from emoreward.data.errors import DataError


def is_null(value: Any) -> bool:
    """Whether a cell is null: `None` (a JSON `null`, an absent key, a parquet or Arrow null), `pandas.NA` or `NaT`.

    What a numeric field (TRL's `margin`, `tie`, a numeric label) may take as missing. A float NaN is not null: in
    a file (a JSON `NaN`, a parquet NaN) it is a number that is not finite, which the field's reader refuses naming
    file, row and field; pandas' NaN for an empty cell is made null where a DataFrame is read
    (`emoreward.data.pairs`), before any field reader sees it."""
    if value is None:
        return True
    if isinstance(value, (str, bool, int, float, list, dict, tuple)):
        return False
    if type(value).__name__ in ("NAType", "NaTType"):
        return True
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        return is_null(item())
    return False


def is_missing(value: Any) -> bool:
    """Whether a text cell holds a missing value: null (`is_null`) or a float NaN (also NumPy's), pandas' marker of an
    empty cell in a text column (a text field can hold no number). Numeric fields use `is_null`."""
    if is_null(value):
        return True
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        value = item()  # a NumPy scalar as its Python value
    return isinstance(value, float) and math.isnan(value)


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


__all__ = ["is_missing", "is_null", "optional_text", "plain"]
