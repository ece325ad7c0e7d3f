"""The controlled-error section of every report (issue 38): per kind of controlled negative, the share where a judge
prefers the original, with a Wilson interval, in both orders with swap consistency, beside the length judge (prefers
the longer) and random (50%). Reward models and zero-shot judges alike (judged by `harness.controlled_errors`). See
docs/evaluation.md, "Controlled errors".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from emoreward.data.negatives.records import KINDS, Negative
from emoreward.data.text import description_length, markdown_cell
from emoreward.evaluation import metrics


Z95 = 1.959963984540054  # the two-sided 95% normal quantile
TIES_RULE = "strict: a tie or an invalid verdict does not prefer the original (it stays in the denominator, counted)"


class ControlledSet(NamedTuple):
    """The negatives of one controlled-error section: `negatives`, `source` (where they come from, in words) and
    `in_sample` (per negative, whether the judge trained on it or on its original's sample:
    `training.provenance.in_sample_flags`; None: unknown, a judge with no training-data record). A plain
    `(negatives, source)` tuple is one with `in_sample` None."""

    negatives: Sequence[Negative]
    source: str
    in_sample: Sequence[bool] | None = None


def wilson_interval(k: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a proportion k / n, in percent (Wilson 1927; Agresti and Coull 1998, eq. 2).
    Returns None for n = 0."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def _share(verdicts: Sequence[str]) -> dict:
    n = len(verdicts)
    k = sum(v == "1" for v in verdicts)
    ci = wilson_interval(k, n)
    return {"n": n, "prefers_original": k, "ties": sum(v == "tie" for v in verdicts),
            "invalid": sum(v == "invalid" for v in verdicts), "rate": 100.0 * k / n if n else None,
            "ci95": list(ci) if ci else None}  # fmt: skip


def length_verdict(neg: Negative) -> str:
    """The length judge on (original, negative): ``"1"`` when the original is longer, ``"2"`` shorter, else tie."""
    a, b = description_length(neg.original), description_length(neg.negative)
    return "1" if a > b else "2" if a < b else "tie"


def _section_for(indices: list[int], negatives: Sequence[Negative], normal, swapped, in_sample) -> dict:
    """The figures of one kind (or all) from run-wise verdict lists (`normal[r][i]`, `swapped[r][i]`)."""
    judge = _share([normal[0][i] for i in indices])
    n_in = None if in_sample is None else sum(bool(in_sample[i]) for i in indices)
    out: dict = {"n": len(indices), "n_in_sample": n_in, "judge": judge}
    if swapped:
        judge["swapped_order"] = _share([swapped[0][i] for i in indices])
        both = [normal[0][i] if normal[0][i] == swapped[0][i] else "inconsistent" for i in indices]
        judge["both_orders"] = _share(both)
        per_run = [metrics.swap_consistency([n[i] for i in indices], [s[i] for i in indices])
                   for n, s in zip(normal, swapped)] if indices else []  # fmt: skip
        judge["swap_consistency"] = sum(per_run) / len(per_run) if per_run else None
    out["length_judge"] = _share([length_verdict(negatives[i]) for i in indices])
    lengths = [negatives[i].length_change for i in indices]
    out["length_change_mean"] = sum(lengths) / len(lengths) if lengths else None
    out["random"] = 50.0
    return out


def controlled_section(
    negatives: Sequence[Negative],
    normal: list[list[str]],
    swapped: list[list[str]],
    source: str,
    in_sample: Sequence[bool] | None = None,
) -> dict:
    """The section from verdicts already made: `normal[r]` / `swapped[r]` hold run r's verdicts (``"1"``, ``"2"``,
    ``"tie"``, ``"invalid"``, original order) on `negatives[i].pair()`; `swapped` may be empty; `in_sample[i]`:
    the judge trained on negative i or on its original's sample (None: unknown).

    Returns a JSON-safe dict: `source`, `ties` (the rule), `n_negatives`, `n_in_sample` (None when unknown), `runs`,
    `kinds` (kind -> figures: `n`, `n_in_sample`, `judge` {`rate`, `ci95`, `prefers_original`, `ties`, `invalid`,
    and with swaps `swapped_order`, `both_orders`, `swap_consistency`}, `length_judge`, `length_change_mean`,
    `random`), `all` (the same over every kind). Rates and intervals in percent (Wilson, 95%).

    Raises:
        ValueError: `in_sample` not one flag per negative."""
    if in_sample is not None and len(in_sample) != len(negatives):
        raise ValueError(f"in_sample: {len(in_sample)} flags for {len(negatives)} negatives")
    kinds = {k: [i for i, n in enumerate(negatives) if n.kind == k] for k in KINDS}
    every = _section_for(list(range(len(negatives))), negatives, normal, swapped, in_sample)
    return {
        "source": source,
        "ties": TIES_RULE,
        "n_negatives": len(negatives),
        "n_in_sample": every["n_in_sample"],
        "runs": len(normal),
        "kinds": {k: _section_for(idx, negatives, normal, swapped, in_sample) for k, idx in kinds.items()},
        "all": every,
    }


def _pool_share(cells: list[dict]) -> dict:
    n = sum(c["n"] for c in cells)
    k = sum(c["prefers_original"] for c in cells)
    ci = wilson_interval(k, n)
    return {"n": n, "prefers_original": k, "ties": sum(c["ties"] for c in cells),
            "invalid": sum(c["invalid"] for c in cells), "rate": 100.0 * k / n if n else None,
            "ci95": list(ci) if ci else None}  # fmt: skip


def _weighted(rows: list[dict], value) -> float | None:
    pairs = [(r["n"], value(r)) for r in rows if r["n"] and value(r) is not None]
    total = sum(n for n, _ in pairs)
    return sum(n * v for n, v in pairs) / total if total else None


def _sum_known(counts: list[int | None]) -> int | None:
    return None if any(c is None for c in counts) else sum(counts)  # type: ignore[arg-type]


def _pool_row(rows: list[dict]) -> dict:
    judge = {**_pool_share([r["judge"] for r in rows])}
    if "swapped_order" in rows[0]["judge"]:
        judge["swapped_order"] = _pool_share([r["judge"]["swapped_order"] for r in rows])
        judge["both_orders"] = _pool_share([r["judge"]["both_orders"] for r in rows])
        judge["swap_consistency"] = _weighted(rows, lambda r: r["judge"]["swap_consistency"])
    return {"n": sum(r["n"] for r in rows), "n_in_sample": _sum_known([r.get("n_in_sample") for r in rows]),
            "judge": judge,
            "length_judge": _pool_share([r["length_judge"] for r in rows]),
            "length_change_mean": _weighted(rows, lambda r: r["length_change_mean"]), "random": 50.0}  # fmt: skip


def pool_sections(sections: Sequence[dict], source: str) -> dict:
    """One section from several over disjoint negatives (the held-out folds of a cross-validation): counts summed,
    rates and Wilson intervals recomputed on the sums, swap consistency and mean length change weighted by n."""
    return {
        "source": source,
        "ties": TIES_RULE,
        "n_negatives": sum(s["n_negatives"] for s in sections),
        "n_in_sample": _sum_known([s.get("n_in_sample") for s in sections]),
        "runs": sections[0]["runs"],
        "n_sections": len(sections),
        "kinds": {k: _pool_row([s["kinds"][k] for s in sections]) for k in KINDS},
        "all": _pool_row([s["all"] for s in sections]),
    }


def _pct(cell: dict | None) -> str:
    if not cell or cell.get("rate") is None:
        return "-"
    lo, hi = cell["ci95"]
    return f"{cell['rate']:.1f} [{lo:.1f}, {hi:.1f}]"


def controlled_markdown(section: dict, title: str = "Controlled errors") -> str:
    """The section as a Markdown table (the same values as its JSON): per kind, n, this judge's share preferring the
    original [95% Wilson interval], ties, the swapped order, both orders and swap consistency, the length judge, random,
    the in-sample count ("-": unknown); a line above the table when some negatives are in-sample."""
    swaps = "swapped_order" in section["all"]["judge"]
    n_in = section.get("n_in_sample")
    lines = [f"### {title}", "",
             f"{section['n_negatives']} negatives ({markdown_cell(section['source'])}); share where the judge prefers "
             f"the original, %, [95% Wilson interval]; ties {section['ties']}.", ""]  # fmt: skip
    if n_in:
        lines[-1:] = [f"**IN-SAMPLE: {n_in} of {section['n_negatives']} negatives** are ones the judge was trained "
                      "on, or edits of descriptions it was trained on: their shares overstate how it does on new "
                      "descriptions.", ""]  # fmt: skip
    head = ["kind", "n", "this judge", "ties (invalid)"]
    head += ["swapped order", "both orders", "swap consistency"] if swaps else []
    head += ["length judge", "mean length change (chars)", "random", "in-sample"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in [*section["kinds"].items(), ("all kinds", section["all"])]:
        j = row["judge"]
        cells = [name, str(row["n"]), _pct(j), f"{j['ties']} ({j['invalid']})"]
        if swaps:
            sc = j.get("swap_consistency")
            cells += [_pct(j["swapped_order"]), _pct(j["both_orders"]), "-" if sc is None else f"{sc:.1f}"]
        change = row["length_change_mean"]
        cells += [_pct(row["length_judge"]), "-" if change is None else f"{change:+.1f}", f"{row['random']:.0f}"]
        cells.append("-" if row.get("n_in_sample") is None else str(row["n_in_sample"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["TIES_RULE", "ControlledSet", "controlled_markdown", "controlled_section", "length_verdict",
           "pool_sections", "wilson_interval"]  # fmt: skip
