"""Reports: flatten evaluations into headline metrics, aggregate folds (mean ± std), render Markdown, plot. Every
table puts the judge beside the length baseline and random verdicts, with its bias figures. See docs/evaluation.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from emoreward.data.text import markdown_cell


# (key, label) of the headline metrics, in table order
HEADLINE: list[tuple[str, str]] = [
    ("two_class_waf", "2-class WAF"),
    ("two_class_acc", "2-class ACC"),
    ("three_class_waf", "3-class WAF"),
    ("three_class_acc", "3-class ACC"),
    ("two_class_waf_per_sample", "2-class WAF, each sample once"),
    ("two_class_acc_per_sample", "2-class ACC, each sample once"),
    ("three_class_waf_per_sample", "3-class WAF, each sample once"),
    ("three_class_acc_per_sample", "3-class ACC, each sample once"),
    ("swap_consistency", "swap consistency"),
    ("acc_aligned", "ACC, length-aligned pairs"),
    ("acc_counter", "ACC, length-counter pairs"),
    ("length_debiased_acc", "length-debiased ACC"),
    ("prefers_longer_rate", "prefers the longer description"),
    ("human_prefers_longer_rate", "humans prefer the longer description (same pairs)"),
    ("prefer_first_rate", "prefers the description shown first"),
    ("prefer_second_rate", "prefers the description shown second"),
    ("invalid_rate", "invalid answers"),
    ("first_wins_both", "swap-inconsistent: first shown wins both"),
    ("second_wins_both", "swap-inconsistent: second shown wins both"),
    ("delta_bias", "delta bias: first minus second wins both, absolute"),
    ("reward_length_spearman", "reward-length Spearman"),
    ("lc_coef_judge", "length-controlled logit: judge coef."),
    ("lc_coef_length", "length-controlled logit: length coef."),
    ("lc_separated", "length-controlled logit separated (Firth-penalised), % of fits"),
]
POSITION_KEYS = ("prefer_first_rate", "prefer_second_rate", "invalid_rate", "first_wins_both", "second_wins_both",
                 "delta_bias")  # fmt: skip
"""JudgeLM's position-bias figures (`metrics.position_bias`) shown in the headline table."""
COLUMNS = ("judge", "length_baseline", "random_baseline")
COLUMN_TITLES = {"judge": "this judge", "length_baseline": "length baseline", "random_baseline": "random"}


def headline(evaluation: dict) -> dict[str, dict[str, float | None]]:
    """The headline metrics of one evaluation (from `harness.evaluate_judgements`), per column. The per-sample
    figures (each sample weighed once) are there only where some sample has several pairs (else they equal the
    per-pair ones)."""
    out: dict[str, dict[str, float | None]] = {}
    weighting = evaluation.get("weighting") or {}
    several = weighting.get("max_pairs_per_sample", 1) > 1
    for column in COLUMNS:
        part = evaluation.get(column, {})
        row: dict[str, float | None] = {}
        for setting in ("two_class", "three_class"):
            if setting in part:
                row[f"{setting}_waf"] = part[setting]["waf"]
                row[f"{setting}_acc"] = part[setting]["acc"]
            if several and f"{setting}_per_sample" in part:
                row[f"{setting}_waf_per_sample"] = part[f"{setting}_per_sample"]["waf"]
                row[f"{setting}_acc_per_sample"] = part[f"{setting}_per_sample"]["acc"]
        if column == "judge":
            row["swap_consistency"] = part.get("swap_consistency")
            row["reward_length_spearman"] = part.get("reward_length_spearman")
            bias = part.get("position_bias") or {}
            for key in POSITION_KEYS:
                row[key] = bias.get(key)
            lcp = part.get("length_controlled")
            if lcp:
                row["lc_coef_judge"], row["lc_coef_length"] = lcp["coef_judge"], lcp["coef_length"]
                row["lc_separated"] = 100.0 if lcp.get("separation") else 0.0
        elif column == "length_baseline":
            row["swap_consistency"] = 100.0  # pointwise by construction
        lc = part.get("length_control")
        if lc:
            for key in ("acc_aligned", "acc_counter", "length_debiased_acc", "prefers_longer_rate"):
                row[key] = lc[key]
            if column == "judge":
                row["human_prefers_longer_rate"] = lc.get("human_prefers_longer_rate")
        out[column] = row
    return out


def aggregate(evaluations: Sequence[dict]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Mean and standard deviation (population, ddof=0, as numpy) over folds or runs, per column and metric.

    Returns `{column: {metric: {"mean": m, "std": s, "n": k}}}`; a metric missing in some fold is averaged
    over the folds that have it (`n` says how many).
    """
    heads = [headline(e) for e in evaluations]
    out: dict = {}
    for column in COLUMNS:
        out[column] = {}
        for key, _ in HEADLINE:
            values = [h[column][key] for h in heads if h.get(column, {}).get(key) is not None]
            if values:
                out[column][key] = {"mean": float(np.mean(values)), "std": float(np.std(values)), "n": len(values)}
    return out


def weighting_note(evaluations: Sequence[dict], *, rows: bool = True) -> str:
    """The sentence under a table saying how its figures weigh samples with many pairs, from the evaluations'
    `weighting` records (summed over held-out folds: each pair and sample is in one), and, for one evaluation of
    pairs with several annotators, their agreement (`Agreement.summary`); empty when none has a record. ``rows``:
    the table has the per-sample rows of `headline` (else the sentence points at the JSON's per-sample figures)."""
    records = [e["weighting"] for e in evaluations if e.get("weighting")]
    if not records:
        return ""
    n_pairs, n_samples = sum(r["n_pairs"] for r in records), sum(r["n_samples"] for r in records)
    most = max(r["max_pairs_per_sample"] for r in records)
    where = (
        "the rows 'each sample once'" if rows else "the report's `two_class_per_sample` and `three_class_per_sample`"
    )
    per_sample = f"; {where} weigh each sample once" if most > 1 else ""
    spread = f"at most {most} pairs per sample" if most > 1 else "one pair per sample"
    note = f"Each figure weighs each pair once ({n_pairs} pairs of {n_samples} samples, {spread}){per_sample}."
    if len(evaluations) == 1 and evaluations[0].get("annotators"):
        from emoreward.data.annotators import Agreement

        agreed = Agreement(**evaluations[0]["annotators"]).summary()
        note += f" Labels: {agreed}." if agreed else ""
    return note


def _fmt(cell, folds: int | None = None) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, dict):
        text = f"{cell['mean']:.2f} ± {cell['std']:.2f}" if cell["n"] > 1 else f"{cell['mean']:.2f}"
        # a metric some folds could not give (`aggregate`'s n): say over how many, from the record's own n
        return text + (f" ({cell['n']} of {folds} folds)" if folds is not None and cell["n"] < folds else "")
    if isinstance(cell, float) and math.isnan(cell):
        return "-"
    return f"{cell:.2f}"


def markdown_table(summary: dict, title: str | None = None, note: str = "", *, folds: int | None = None) -> str:
    """A Markdown table of headline metrics: rows = metrics, columns = judge / length baseline / random.

    `summary` is either `aggregate(...)` output (cells mean ± std over their `n` folds) or `headline(...)` output
    (single values); `note` (`weighting_note`), a sentence under the table; `folds`: the number of folds of the
    run (the cross-validation record's `k`), so a cell averaged over fewer (`n < folds`: a length-controlled logit
    one fold could not fit) says "(n of k folds)".
    Metrics are percent except the Spearman correlation and the logistic coefficients (per standard deviation).
    """
    lines = []
    if title:
        lines += [f"### {title}", ""]
    lines.append("| metric | " + " | ".join(COLUMN_TITLES[c] for c in COLUMNS) + " |")
    lines.append("|---|" + "---:|" * len(COLUMNS))
    for key, label in HEADLINE:
        cells = [summary.get(c, {}).get(key) for c in COLUMNS]
        if all(c is None for c in cells):
            continue
        lines.append(f"| {markdown_cell(label)} | " + " | ".join(_fmt(c, folds) for c in cells) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def plot_confusion(
    confusion: Sequence[Sequence[int]],
    labels: Sequence[str],
    pred_labels: Sequence[str],
    path: str | Path,
    title: str = "",
) -> Path:
    """Save a confusion-matrix heat map (rows: gold labels, columns: predictions) as PNG. Each count is written in
    white on dark cells and black on light ones (by the cell colour's luminance), so every number stays readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(confusion)
    fig, ax = plt.subplots(figsize=(1.2 * len(pred_labels) + 1.5, 1.1 * len(labels) + 1.2))
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(pred_labels)), [f"pred {p}" for p in pred_labels])
    ax.set_yticks(range(len(labels)), [f"gold {g}" for g in labels])
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            red, green, blue, _ = image.cmap(image.norm(matrix[i, j]))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # ITU-R BT.601 luma
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", color="white" if dark else "black")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
