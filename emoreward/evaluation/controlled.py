"""The controlled-error section of every report (issue 38): per kind of controlled negative, the share where a judge
prefers the original, with a Wilson interval, in both orders with swap consistency, beside the length judge (prefers
the longer) and random (50%); for a reward model also its reward's own order (no tie threshold), and for a judge
trained on negatives the same over the edits none of them made. Reward models and zero-shot judges alike (judged by
`harness.controlled_errors`). See docs/evaluation.md, "Controlled errors".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import NamedTuple

from emoreward.data.negatives.records import KINDS, Negative
from emoreward.data.text import description_length, markdown_cell
from emoreward.evaluation import metrics


Z95 = 1.959963984540054  # the two-sided 95% normal quantile
TIES_RULE = "strict: a tie or an invalid verdict does not prefer the original (it stays in the denominator, counted)"


class ControlledSet(NamedTuple):
    """The negatives of one controlled-error section: `negatives`, `source` (where they come from, in words),
    `in_sample` (per negative, whether the judge trained on it or on its original's sample:
    `training.provenance.in_sample_flags`; None: unknown, a judge with no training-data record) and `new_edit` (per
    negative, whether no negative the judge trained on made its edit: `new_edit_flags`; None: the judge trained on
    none, or unknown). A plain `(negatives, source)` tuple is one with both None."""

    negatives: Sequence[Negative]
    source: str
    in_sample: Sequence[bool] | None = None
    new_edit: Sequence[bool] | None = None


def new_edit_flags(negatives: Sequence[Negative], trained_edits: Collection[str] | None,
                   trained: Sequence[bool] | None = None) -> list[bool] | None:  # fmt: skip
    """Per negative, whether its edit (`Negative.edit`: the same words replaced by the same words, case aside) is
    none of `trained_edits` (the `Negative.edit_key`s of the negatives a judge trained on: `training.negatives.
    TrainingPairs.edits`, a training-data record's `negative_edits`) and, with `trained` (per negative, whether the
    judge trained on that very pair), a negative it trained on never is; None when it trained on no negatives
    (`trained_edits` None). A judge trained on one lexicon's edits may have learned its words, not the errors: its
    share on new edits is the nearer guide to edits another process writes (docs/evaluation.md)."""
    if trained_edits is None:
        return None
    if trained is not None and len(trained) != len(negatives):
        raise ValueError(f"trained: {len(trained)} flags for {len(negatives)} negatives")
    made = set(trained_edits)
    return [n.edit_key() not in made and not (trained is not None and trained[i]) for i, n in enumerate(negatives)]


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


def margin_verdict(margin: float) -> str:
    """A reward model's verdict on (original, negative) with no tie threshold, from r(original) - r(negative):
    ``"1"`` above 0, ``"2"`` below, ``"tie"`` at 0, ``"invalid"`` for NaN (a sample whose media could not be read)."""
    return "invalid" if math.isnan(margin) else "1" if margin > 0 else "2" if margin < 0 else "tie"


def _judge_shares(indices: list[int], normal, margins) -> dict:
    judge = _share([normal[0][i] for i in indices])
    if margins is not None:
        judge["no_tie_threshold"] = _share([margin_verdict(margins[i]) for i in indices])
    return judge


def _section_for(indices: list[int], negatives: Sequence[Negative], normal, swapped, in_sample, margins,
                 new_edit) -> dict:  # fmt: skip
    """The figures of one kind (or all) from run-wise verdict lists (`normal[r][i]`, `swapped[r][i]`)."""
    judge = _judge_shares(indices, normal, margins)
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
    if new_edit is not None:
        new = [i for i in indices if new_edit[i]]
        out["new_edits"] = {"n": len(new), "judge": _judge_shares(new, normal, margins),
                            "length_judge": _share([length_verdict(negatives[i]) for i in new])}  # fmt: skip
    return out


def controlled_section(
    negatives: Sequence[Negative],
    normal: list[list[str]],
    swapped: list[list[str]],
    source: str,
    in_sample: Sequence[bool] | None = None,
    margins: Sequence[float] | None = None,
    new_edit: Sequence[bool] | None = None,
) -> dict:
    """The section from verdicts already made: `normal[r]` / `swapped[r]` hold run r's verdicts (``"1"``, ``"2"``,
    ``"tie"``, ``"invalid"``, original order) on `negatives[i].pair()`; `swapped` may be empty; `in_sample[i]`:
    the judge trained on negative i or on its original's sample (None: unknown); `margins[i]`: a reward model's
    r(original) - r(negative) in run 0 (reward units; None: a judge without rewards); `new_edit[i]`: no negative the
    judge trained on made negative i's edit (`new_edit_flags`; None: it trained on none).

    Returns a JSON-safe dict: `source`, `ties` (the rule), `n_negatives`, `n_in_sample` (None when unknown), `runs`,
    `kinds` (kind -> figures: `n`, `n_in_sample`, `judge` {`rate`, `ci95`, `prefers_original`, `ties`, `invalid`,
    with swaps `swapped_order`, `both_orders`, `swap_consistency`, with margins `no_tie_threshold` (the same
    figures for `margin_verdict`: the reward's order, which is what a policy trained on it sees)}, `length_judge`,
    `length_change_mean`, `random`, with `new_edit` `new_edits` {`n`, `judge`, `length_judge`} over the new edits
    alone), `all` (the same over every kind). Rates and intervals in percent (Wilson, 95%).

    Raises:
        ValueError: `in_sample`, `margins` or `new_edit` not one per negative."""
    for name, values in (("in_sample", in_sample), ("margins", margins), ("new_edit", new_edit)):
        if values is not None and len(values) != len(negatives):
            raise ValueError(f"{name}: {len(values)} values for {len(negatives)} negatives")
    kinds = {k: [i for i, n in enumerate(negatives) if n.kind == k] for k in KINDS}
    every = _section_for(list(range(len(negatives))), negatives, normal, swapped, in_sample, margins, new_edit)
    return {
        "source": source,
        "ties": TIES_RULE,
        "n_negatives": len(negatives),
        "n_in_sample": every["n_in_sample"],
        "runs": len(normal),
        "kinds": {
            k: _section_for(idx, negatives, normal, swapped, in_sample, margins, new_edit) for k, idx in kinds.items()
        },
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


def _pool_judge(judges: list[dict]) -> dict:
    judge = {**_pool_share(judges)}
    if all("no_tie_threshold" in j for j in judges):  # one judge's sections: all of a reward model's have it
        judge["no_tie_threshold"] = _pool_share([j["no_tie_threshold"] for j in judges])
    return judge


def _pool_row(rows: list[dict]) -> dict:
    judge = _pool_judge([r["judge"] for r in rows])
    if "swapped_order" in rows[0]["judge"]:
        judge["swapped_order"] = _pool_share([r["judge"]["swapped_order"] for r in rows])
        judge["both_orders"] = _pool_share([r["judge"]["both_orders"] for r in rows])
        judge["swap_consistency"] = _weighted(rows, lambda r: r["judge"]["swap_consistency"])
    pooled = {"n": sum(r["n"] for r in rows), "n_in_sample": _sum_known([r.get("n_in_sample") for r in rows]),
              "judge": judge,
              "length_judge": _pool_share([r["length_judge"] for r in rows]),
              "length_change_mean": _weighted(rows, lambda r: r["length_change_mean"]), "random": 50.0}  # fmt: skip
    if all("new_edits" in r for r in rows):  # each part's judge trained on negatives
        new = [r["new_edits"] for r in rows]
        pooled["new_edits"] = {"n": sum(e["n"] for e in new), "judge": _pool_judge([e["judge"] for e in new]),
                               "length_judge": _pool_share([e["length_judge"] for e in new])}  # fmt: skip
    return pooled


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
    original [95% Wilson interval], ties, for a reward model the share with no tie threshold, the swapped order, both
    orders and swap consistency, the length judge, random, the in-sample count ("-": unknown); a line above the table
    when some negatives are in-sample; with `new_edits` a second table of the same shares over the new edits alone."""
    swaps = "swapped_order" in section["all"]["judge"]
    ordered = "no_tie_threshold" in section["all"]["judge"]
    n_in = section.get("n_in_sample")
    lines = [f"### {title}", "",
             f"{section['n_negatives']} negatives ({markdown_cell(section['source'])}); share where the judge prefers "
             f"the original, %, [95% Wilson interval]; ties {section['ties']}.", ""]  # fmt: skip
    if ordered:
        lines[2] += (
            " No tie threshold: the share where the original's reward is above the negative's (the reward's "
            "own order, which a policy trained on it follows)."
        )
    if n_in:
        lines[-1:] = [f"**IN-SAMPLE: {n_in} of {section['n_negatives']} negatives** are ones the judge was trained "
                      "on, or edits of descriptions it was trained on: their shares overstate how it does on new "
                      "descriptions.", ""]  # fmt: skip
    head = ["kind", "n", "this judge", "ties (invalid)"]
    head += ["no tie threshold"] if ordered else []
    head += ["swapped order", "both orders", "swap consistency"] if swaps else []
    head += ["length judge", "mean length change (chars)", "random", "in-sample"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, row in [*section["kinds"].items(), ("all kinds", section["all"])]:
        j = row["judge"]
        cells = [name, str(row["n"]), _pct(j), f"{j['ties']} ({j['invalid']})"]
        cells += [_pct(j["no_tie_threshold"])] if ordered else []
        if swaps:
            sc = j.get("swap_consistency")
            cells += [_pct(j["swapped_order"]), _pct(j["both_orders"]), "-" if sc is None else f"{sc:.1f}"]
        change = row["length_change_mean"]
        cells += [_pct(row["length_judge"]), "-" if change is None else f"{change:+.1f}", f"{row['random']:.0f}"]
        cells.append("-" if row.get("n_in_sample") is None else str(row["n_in_sample"]))
        lines.append("| " + " | ".join(cells) + " |")
    if "new_edits" in section["all"]:
        lines += ["", "Edits no negative the judge trained on made (another word put in, or another word replaced; "
                  "the nearer guide to edits another process writes):", "",
                  "| kind | new edits | this judge | ties (invalid) |" + (" no tie threshold |" if ordered else "")
                  + " length judge |", "|---|" + "---:|" * (4 + ordered)]  # fmt: skip
        for name, row in [*section["kinds"].items(), ("all kinds", section["all"])]:
            new = row["new_edits"]
            j = new["judge"]
            cells = [name, str(new["n"]), _pct(j), f"{j['ties']} ({j['invalid']})"]
            cells += [_pct(j["no_tie_threshold"])] if ordered else []
            lines.append("| " + " | ".join([*cells, _pct(new["length_judge"])]) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["TIES_RULE", "ControlledSet", "controlled_markdown", "controlled_section", "length_verdict",
           "margin_verdict", "new_edit_flags", "pool_sections", "wilson_interval"]  # fmt: skip
