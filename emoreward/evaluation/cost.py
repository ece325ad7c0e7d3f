"""One cost ledger per command (issue 41): the work an `evaluate` or `judge` run did, in total and by part (the
evaluated pairs, the controlled negatives), one record that the printed cost line and the report's JSON (`cost`) are
both rendered from, so the line never leaves out work the command did. See docs/evaluation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field


UNITS = ("descriptions", "calls")  # a reward model scores descriptions; a generative judge makes calls
PART_NAMES = {"pairs": "pairs", "controlled_negatives": "controlled negatives"}


@dataclass
class CostLedger:
    """The work of one command by part (``"pairs"``, ``"controlled_negatives"``), in one unit (`UNITS`).

    Each part holds counts (`descriptions`: ``scored``; `calls`: ``made``, ``cached``, ``reused_greedy``,
    ``failed``) and ``seconds`` (wall clock); the total is their sum, part by part, key by key.

    Raises:
        ValueError: an unknown unit or part."""

    unit: str
    parts: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unknown cost unit {self.unit!r}; available: {list(UNITS)}")

    def add(self, part: str, **counts: float) -> None:
        """Add `counts` to `part` (created at its first addition)."""
        if part not in PART_NAMES:
            raise ValueError(f"unknown cost part {part!r}; available: {list(PART_NAMES)}")
        into = self.parts.setdefault(part, {})
        for key, value in counts.items():
            into[key] = into.get(key, 0) + value

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for counts in self.parts.values():
            for key, value in counts.items():
                out[key] = out.get(key, 0) + value
        return out

    def record(self) -> dict:
        """The JSON-safe record (the report's `cost`): `unit`, `total`, `parts` (part -> counts)."""
        return {"unit": self.unit, "total": self.total(), "parts": {k: dict(v) for k, v in self.parts.items()}}


def _counts(unit: str, c: dict) -> str:
    if unit == "descriptions":
        return f"{c['scored']:g} descriptions in {c['seconds']:.1f} s"
    reused = f", {c['reused_greedy']:g} reused from run 1 (greedy)" if c.get("reused_greedy") else ""
    return f"{c['made']:g} made, {c['cached']:g} from cache{reused}, {c['failed']:g} failed, {c['seconds']:.1f} s"


def cost_line(record: dict) -> str:
    """The printed line of a ledger's `record`: the total, then each part, from the same values as the JSON, e.g.
    ``scored 37 descriptions in 1.2 s (pairs: 24 descriptions in 0.8 s; controlled negatives: 13 descriptions in
    0.4 s)`` or ``calls: 40 made, 0 from cache, 0 failed, 3.1 s (pairs: ...; controlled negatives: ...)``."""
    unit = record["unit"]
    head = ("scored " if unit == "descriptions" else "calls: ") + _counts(unit, record["total"])
    if len(record["parts"]) < 2:
        return head
    parts = "; ".join(f"{PART_NAMES[name]}: {_counts(unit, c)}" for name, c in record["parts"].items())
    return f"{head} ({parts})"


__all__ = ["PART_NAMES", "UNITS", "CostLedger", "cost_line"]
