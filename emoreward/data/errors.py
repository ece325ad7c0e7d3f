"""The one error type of preference-data loading: every message names the source, the row or line, and the field."""

from __future__ import annotations


class DataError(ValueError):
    """Invalid preference data; the message names the source file (or dataset), the row or line, and the field.

    The message reads ``"<source>, row <n>, field '<name>': <problem>"``; parts that do not apply are left out
    (``"<source>, line <n>: ..."`` for problems found before rows exist, such as an unclosed quote or undecodable
    bytes; ``"<source>, header, field '<name>': ..."`` for a column problem; ``"<source>: ..."`` for the whole
    source). It is one line: the CLI prints it as is, without a traceback.

    Attributes:
        source (`str`): the file path, `hf://` dataset id or `<dataset ...>` label.
        row (`int`, `"header"` or `None`): 1-based data row (the header row is not counted); 0 or None when the
            problem is not in one row.
        field_name (`str` or `None`): the column or JSON key, named as the source names it.
        problem (`str`): what is wrong.
        line (`int` or `None`): 1-based physical line in the file, when known and useful.
    """

    def __init__(
        self, source: str, row: int | str | None, field_name: str | None, problem: str, *, line: int | None = None
    ):
        self.source, self.row, self.field_name, self.problem, self.line = source, row, field_name, problem, line
        parts = [str(source)]
        if row == "header":
            parts.append("header")
        elif row:
            parts.append(f"row {row}")
        if line is not None:
            parts.append(f"line {line}")
        if field_name:
            parts.append(f"field {field_name!r}")
        one_line = problem.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
        super().__init__(f"{', '.join(parts)}: {one_line}")


__all__ = ["DataError"]
