"""Names and description text: the one normal form of a name (`normal_name`: NFC, whitespace runs collapsed, none
at either end), the one form of a description (`normal_text`: NFC, whitespace kept) and its length, and how
reports write names (Markdown cells, column headings that never collide). See docs/data.md.
"""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Sequence
from typing import Literal


LengthUnit = Literal["chars", "words"]


def normal_name(name: str) -> str:
    """The normal form of a name: NFC, whitespace runs collapsed to one space, stripped (module docstring)."""
    return " ".join(unicodedata.normalize("NFC", name).split())


class NameNormaliser:
    """Normalises the names of one kind in one source and warns, once per name, when two spellings meet.

    Args:
        what (`str`): what the names are (``"model name"``, ``"sample id"``), for the warning.
        source (`str`): the data file or dataset, for the warning.

    Calling it with ``(name, where)`` returns `normal_name(name)`; the first time a second spelling of an already
    seen normal form appears (e.g. ``"GPT-4o"`` on line 2 and ``"GPT-4o "`` on line 9) it warns (`UserWarning`)
    naming both places; both then count as the one name.
    """

    def __init__(self, what: str, source: str):
        self.what, self.source = what, source
        self.first: dict[str, tuple[str, str]] = {}  # normal form -> (first spelling, where)
        self.warned: set[str] = set()

    def __call__(self, name: str, where: str) -> str:
        normal = normal_name(name)
        seen = self.first.setdefault(normal, (name, where))
        if seen[0] != name and normal not in self.warned:
            self.warned.add(normal)
            warnings.warn(
                f"{self.source}: {self.what}s {seen[0]!r} ({seen[1]}) and {name!r} ({where}) differ only in "
                f"whitespace or Unicode form; both are read as {normal!r}",
                UserWarning,
                stacklevel=3,
            )
        return normal


def normal_text(text: str) -> str:
    """THE normal form of a description or any text a model reads: Unicode NFC, whitespace kept (module docstring)."""
    return unicodedata.normalize("NFC", text)


def identity_text(text: str) -> str:
    """The form in which two texts are one text for identity (a repeated pair, an in-sample pair): `normal_text`
    with line endings as ``\n`` and no outer whitespace, so a file re-encoded with CRLF or padded cells names the
    same pair. Scoring reads `normal_text`, as written."""
    return normal_text(text).replace("\r\n", "\n").replace("\r", "\n").strip()


def same_text(a: str | None, b: str | None) -> bool:
    """Two optional texts are one text (`identity_text`): a subtitle given in NFC in one place and in NFD or with
    CRLF in another is one subtitle, as the model reads it."""
    return a == b or (a is not None and b is not None and identity_text(a) == identity_text(b))


def description_length(text: str, unit: LengthUnit = "chars") -> int:
    """THE length of a description (the length baseline, length-bias figures, table statistics): characters
    (default, as in the EmoPrefer-Data facts) or whitespace-separated words, of its normal form (`normal_text`).

    Raises:
        ValueError: an unknown unit.
    """
    text = normal_text(text)
    if unit == "chars":
        return len(text)
    if unit == "words":
        return len(text.split())
    raise ValueError(f"unknown length unit {unit!r}; available: ['chars', 'words']")


def markdown_cell(text: str) -> str:
    """`text` safe inside a Markdown table cell: `|` and backslashes escaped, line breaks as spaces."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").splitlines())


def short_names(names: Sequence[str], width: int = 10) -> list[str]:
    """Column headings for `names`: each longer than `width` cut to `width - 1` characters and an ellipsis
    (`Video-Cha…` for Video-ChatGPT: visibly cut, never mistaken for a shorter name such as VideoChat) where that
    keeps every heading distinct, the full name otherwise (a report never shows two columns under one heading)."""
    short = [n if len(n) <= width else n[: width - 1] + "…" for n in names]
    counts: dict[str, int] = {}
    for s in short:
        counts[s] = counts.get(s, 0) + 1
    return [s if counts[s] == 1 else n for s, n in zip(short, names)]


__all__ = [
    "NameNormaliser",
    "description_length",
    "identity_text",
    "markdown_cell",
    "normal_name",
    "normal_text",
    "short_names",
]
