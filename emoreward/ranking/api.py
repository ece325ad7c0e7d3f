"""Ranking in Python: `rank(table, annotator, method, fit)`, what `emoreward rank` runs after parsing its options.

Annotators (who judges, what it costs) are `emoreward.ranking.annotators`; methods (which pairs to ask) are
`emoreward.ranking.methods`. See docs/ranking.md ("Ranking in Python").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from emoreward.data.tables import DescriptionTable


def rank(table: DescriptionTable, annotator: Any, method: Any = None, fit: Mapping[str, Any] | None = None) -> Any:
    """Rank the table's models with an annotator by a method.

    Args:
        table (`DescriptionTable`): the descriptions (select subsets first: `DescriptionTable.select`).
        annotator: a registered annotator (`RewardModelAnnotator`, `JudgeAnnotator`, `Committee`, or one of yours).
        method: a method object (`AllPairs`, `Hierarchical`, `BPA`, ...) or a registered name; default all pairs.
        fit (`Mapping`, *optional*): passed as given to the fits (today `fit_ranking`'s keyword arguments:
            ``fit`` (a `FitSpec`), ``n_boot``, ``alpha``, ``seed``, ``progress``, ``length_control``); only for a
            method whose ``uses_fit`` is true (not BPA, which fits its own model).

    Returns:
        `RankingReport` (all pairs, hierarchical) or `BPARankingReport` (BPA); ``cost`` is the annotator's ledger.

    Raises:
        ValueError: an unknown method name, a ``fit`` for a method that fits its own model (as `emoreward rank`
            refuses its fit options with ``--method bpa``), a table the annotator refuses (`check`, before any work), no records
            or a disconnected comparison graph. `MediaError` naming the table's line and field.
    """
    from emoreward.ranking.methods import AllPairs, method_for

    method = AllPairs() if method is None else method_for(method) if isinstance(method, str) else method
    if fit and not getattr(method, "uses_fit", True):
        raise ValueError(
            f"fit {sorted(fit)} given to the ranking method {getattr(method, 'name', method)!r}, which fits its own "
            "model and reads no fit settings"
        )
    annotator.check(table)
    with media_errors_located(table):
        return method.run(table, annotator, dict(fit or {}))


@contextlib.contextmanager
def media_errors_located(table: DescriptionTable) -> Iterator[None]:
    """A media file that does not decode while judging: the error names the table, the line and the field."""
    from emoreward.data.media import MediaError
    from emoreward.data.media_check import locate_table_media_error

    try:
        yield
    except MediaError as err:
        raise locate_table_media_error(err, table) from None


# the plots beside a report: written or not by each run (a BPA report draws none; the length-controlled scores only
# when that fit is identified), and never left over from an earlier run into the same place
PLOT_SUFFIXES = ("_scores.png", "_scores_length_controlled.png", "_W.png")


def report_files(out: str | Path) -> list[tuple[Path, str, bool]]:
    """The files a report written to ``out`` may take, ``(path, what, optional)``: the JSON, the Markdown beside it
    (``.md``) and the plots (`PLOT_SUFFIXES`, optional), for claiming before any work (`utils.io.OutputFiles`)."""
    out = Path(out)
    files = [(out, "--output", False), (out.with_suffix(".md"), "the report's Markdown (--output with .md)", False)]
    return files + [(out.with_name(out.stem + s), f"the plot {out.stem + s}", True) for s in PLOT_SUFFIXES]


def write_report(report: Any, out: str | Path, written: Callable[[Path], Path] = Path) -> bool:
    """Write a ranking report to ``out`` (JSON, atomically), its Markdown beside it and, for a report with a W
    matrix, the scores and W plots (`report_files`); each path goes through ``written`` (e.g.
    `OutputFiles.written`). Returns whether plots were drawn."""
    from emoreward.utils.io import atomic_write_json, atomic_write_text

    out = Path(out)
    written(atomic_write_json(out, report.to_dict()))
    written(atomic_write_text(out.with_suffix(".md"), report.to_markdown()))
    if getattr(report, "counts", None) is None:  # BPA: no W matrix, no bootstrap fits
        return False
    from emoreward.ranking.plots import plot_scores, plot_win_matrix

    scores, controlled, w = (path for path, _, optional in report_files(out) if optional)
    plot_scores(report.ties.estimate, written(scores))
    if report.controlled is not None and report.controlled.identified:
        plot_scores(report.controlled.as_bt_result(), written(controlled))
    plot_win_matrix(report.counts, written(w))
    return True


def plan_outputs(
    output: str | Path | None,
    dataset: str | Path | None,
    inputs: Iterable[tuple[str, str | Path]] = (),
    caches: Mapping[str, Path | None] | None = None,
) -> Any:
    """Every file a ranking may write (``output`` with `report_files` beside it, the ``dataset`` table), claimed
    before any work against each other, the ``inputs`` (``(option, path)``: the table, a sample-id list...) and the
    score ``caches`` (what -> file, ``None``: in memory).

    Returns:
        `emoreward.utils.io.OutputFiles`, for `write_outputs`. Raises ValueError when two share a path.
    """
    from emoreward.utils.io import OutputFiles

    files = OutputFiles()
    for option, path in inputs:
        files.guard(path, option)
    for what, path in (caches or {}).items():
        files.guard(path, what)
    if output:
        for path, what, optional in report_files(output):
            files.claim(path, what, optional=optional)
    if dataset:
        files.claim(dataset, "--dataset")
    return files


def write_outputs(
    report: Any,
    files: Any,
    output: str | Path | None = None,
    dataset: str | Path | None = None,
    push_to_hub: str | None = None,
    echo: Callable[[str], None] = lambda line: None,
) -> None:
    """Write a ranking report (`write_report`: JSON, Markdown, plots) to ``output``, its `dataset_rows` to ``dataset``
    (`write_records`), remove what an earlier run into the same places wrote and this one did not (``files``, from
    `plan_outputs`), then push the rows to the Hub dataset ``push_to_hub`` (last: the one step that can fail for
    reasons outside this machine). ``echo`` gets one line per step. Raises as `write_records` and
    `push_records_to_hub`."""
    if output:
        plots = write_report(report, output, files.written)
        echo(f"report: {output} ({'Markdown, scores and W plots' if plots else 'Markdown'} beside it)")
    if dataset or push_to_hub:
        from emoreward.data import push_records_to_hub, write_records

        rows = report.dataset_rows()
        if dataset:
            echo(f"ranking dataset: {files.written(write_records(rows, dataset))}")
    written = files.finish()
    if written:
        echo(f"wrote {len(written)} file(s): {', '.join(map(str, written))}")
    if push_to_hub:
        push_records_to_hub(rows, push_to_hub, commit_message=f"emoreward rank {report.meta.get('data', '')}")
        echo(f"ranking pushed to the Hub dataset {push_to_hub}")


__all__ = [
    "PLOT_SUFFIXES",
    "media_errors_located",
    "plan_outputs",
    "rank",
    "report_files",
    "write_outputs",
    "write_report",
]
