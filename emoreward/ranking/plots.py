"""Plots for rankings: fitted scores with bootstrap intervals, and the win matrix W (EMER-Ranker, figure 11)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from emoreward.ranking.bradley_terry import BTResult
from emoreward.ranking.counts import PairwiseCounts


def _figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas; pyplot and the global backend are left alone (safe in notebooks, headless)."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def plot_scores(result: BTResult, path: str | Path, title: str | None = None) -> Path:
    """Horizontal bar chart of the fitted scores, best at the top, with the bootstrap interval as error bars when
    set; written to ``path`` (format from the suffix, parents created), which is returned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    order = np.argsort(result.scores, kind="stable")  # ascending: barh draws bottom-up, so best ends on top
    scores = result.scores[order]
    labels = [result.items[k] for k in order]
    xerr = None
    if result.ci_lower is not None and result.ci_upper is not None:
        xerr = np.vstack([scores - result.ci_lower[order], result.ci_upper[order] - scores]).clip(min=0)
    fig = _figure(6.0, 0.4 * len(labels) + 1.2)
    ax = fig.subplots()
    ax.barh(range(len(labels)), scores, xerr=xerr, capsize=3, color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(labels)), labels)
    ax.axvline(0.0, color="black", linewidth=0.8)
    level = f", {100 * result.ci_level:g}% bootstrap CI" if xerr is not None and result.ci_level else ""
    ax.set_xlabel(f"log-strength (centred){level}")
    ax.set_title(title or f"{result.model} scores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_win_matrix(counts: PairwiseCounts, path: str | Path, title: str | None = None) -> Path:
    """Heat map of the win matrix W with its numbers (EMER-Ranker, figure 11).

    Cell ``(i, j)`` shows ``wins[i, j]`` (row item beat column item) and, when there are ties, ``/ties[i, j]``;
    pairs never compared and the diagonal show ``-`` (the paper's -1). Works for raw counts and for the binarized
    W of :meth:`PairwiseCounts.binarized`.

    Args:
        counts (`PairwiseCounts`): counts over M items.
        path (`str` or `Path`): output image file; parents are created.
        title (`str`, *optional*): figure title.

    Returns:
        `Path`: ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    m = counts.n_items
    compared = counts.totals > 0
    shown = np.where(compared, counts.wins, np.nan)
    has_ties = bool(np.any(counts.ties > 0))
    size = 0.6 * m + 2.0
    fig = _figure(size, size * 0.85)
    ax = fig.subplots()
    image = ax.imshow(shown, cmap="viridis")
    fig.colorbar(image, ax=ax, label="wins of row over column")
    ax.set_xticks(range(m), counts.items, rotation=45, ha="right")
    ax.set_yticks(range(m), counts.items)
    finite = shown[np.isfinite(shown)]
    middle = float(finite.min() + finite.max()) / 2 if finite.size else 0.0
    for r in range(m):
        for c in range(m):
            if not compared[r, c]:
                text, color = "-", "gray"
            else:
                text = f"{counts.wins[r, c]:g}" + (f"/{counts.ties[r, c]:g}" if has_ties else "")
                color = "black" if counts.wins[r, c] > middle else "white"
            ax.text(c, r, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_title(title or ("W: wins/ties of row vs column" if has_ties else "W: wins of row vs column"))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
