"""Relation: output closure. A run writes exactly the files it reports, never one output over another or over an
input or a cache, and a rerun into the same place leaves nothing stale.

Owners: `emoreward.utils.io.OutputFiles` (the files of one run, claimed before any work; stale optional outputs
removed), used by `rank` (`emoreward.cli.rank.output_files`), `evaluate` and `judge`; `utils.io.replace_dir` for a
folder output (`export`); the caches append only (`utils.io.locked_append`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _inputs import pair_rows, run_cli, run_ok, table_rows, write_jsonl


COVERS: dict[str, tuple[str, ...]] = {
    "evaluate": ("--output",),
    "judge": ("--output", "--dataset"),
    "rank": ("--output", "--dataset"),
    "export": ("--output",),
    "augment": ("--output",),
}


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


def reported(text: str) -> set[Path]:
    """The files a run says it wrote (its `wrote N file(s): a, b` line)."""
    lines = [m.group(2) for m in re.finditer(r"wrote (\d+) file\(s\): (.*)", text)]
    assert len(lines) == 1, text
    return {Path(p) for p in lines[0].split(", ")}


def closure(capsys, argv, out: Path, inputs: set[Path]) -> set[Path]:
    """THE relation, once: run `argv`; the files it created or changed under `out` are exactly the files it reports,
    and the inputs are untouched."""
    before = {p: p.read_bytes() for p in inputs}
    text = run_ok(capsys, argv)
    files = reported(text)
    assert files_under(out) - inputs == files, (files_under(out), files)
    assert all(p.read_bytes() == before[p] for p in inputs)
    return files


def _rank_argv(table, out, cache, *extra):
    return ["rank", "--judge", *extra, "--data", table, "--output", out, "--n-boot", "5", "--cache-dir", cache]


def test_rank_writes_what_it_reports_and_a_rerun_leaves_nothing_stale(rm_dir, tmp_path, capsys):
    out = tmp_path / "out"
    table = write_jsonl(out / "table.jsonl", table_rows())
    cache = tmp_path / "cache"
    report = out / "rank.json"
    full = closure(capsys, _rank_argv(table, report, cache, rm_dir, "--dataset", out / "rank.parquet"), out, {table})
    assert {p.name for p in full} >= {"rank.json", "rank.md", "rank_scores.png", "rank_W.png", "rank.parquet"}
    # the BPA route draws no plots: the full run's plots must not stay beside its report
    dataset = out / "rank.parquet"  # the first run's --dataset: not an output of this run, left as it is
    bpa = _rank_argv(table, report, cache, rm_dir, "--method", "bpa", "--budget", "20")
    assert {p.name for p in closure(capsys, bpa, out, {table, dataset})} == {"rank.json", "rank.md"}


@pytest.mark.parametrize(
    "collision",
    [
        "md",
        "cache",
        "dataset",
        "data",
        "data-through-a-symlink",
        "data-hard-link",
        "output-through-a-symlink",
        "output-on-sample-ids",
        "dataset-on-sample-ids",
    ],
)
def test_rank_refuses_two_outputs_on_one_path(collision, rm_dir, tmp_path, capsys):
    table = write_jsonl(tmp_path / "table.jsonl", table_rows())
    cache = tmp_path / "cache"
    run_ok(capsys, _rank_argv(table, tmp_path / "first.json", cache, rm_dir))  # the cache now exists
    cache_file = next(cache.glob("scores-*.jsonl"))
    kept = cache_file.read_bytes()
    argv = {
        "md": _rank_argv(table, tmp_path / "r.md", cache, rm_dir),  # the report's Markdown is r.md too
        "cache": _rank_argv(table, cache_file, cache, rm_dir),  # the report over the score cache
        "dataset": [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--dataset", tmp_path / "r.md"],
        "data": [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--dataset", table],
    }.get(collision)
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)  # one file, two spellings: the same file either way
    if collision == "data-through-a-symlink":
        argv = [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--dataset", link / "table.jsonl"]
    elif collision == "data-hard-link":
        (tmp_path / "hard.jsonl").hardlink_to(table)
        argv = [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--dataset", tmp_path / "hard.jsonl"]
    elif collision.endswith("on-sample-ids"):  # every file the command line names is an input, not only --data
        ids = tmp_path / "ids.json"
        ids.write_text("s0\ns1\ns2\n")
        option = "--output" if collision.startswith("output") else "--dataset"
        argv = [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--sample-ids", ids, option, ids]
    elif collision == "output-through-a-symlink":
        argv = [*_rank_argv(table, tmp_path / "r.json", cache, rm_dir), "--dataset", link / "r.json"]
    table_bytes = table.read_bytes()
    kept_ids = (tmp_path / "ids.json").read_bytes() if collision.endswith("on-sample-ids") else None
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    assert cache_file.read_bytes() == kept and not (tmp_path / "r.json").exists()
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r.json").exists()
    assert table.read_bytes() == table_bytes
    if kept_ids is not None:
        assert "ids.json" in err and (tmp_path / "ids.json").read_bytes() == kept_ids, err


def test_evaluate_writes_what_it_reports(rm_dir, tmp_path, capsys):
    out = tmp_path / "out"
    data = write_jsonl(out / "pairs.jsonl", pair_rows(6))
    argv = ["evaluate", "--model", rm_dir, "--data", data, "--output", out / "report.json"]
    assert {p.name for p in closure(capsys, argv, out, {data})} == {"report.json", "report.md", "report.png"}
    closure(capsys, argv, out, {data})  # the rerun: the same files, nothing else
    for bad in ("report.md", "report.png"):
        code, _, err = run_cli(capsys, ["evaluate", "--model", rm_dir, "--data", data, "--output", out / bad])
        assert code == 2 and "would both be" in err, err


def test_judge_dataset_never_overwrites_the_call_cache(length_judge_yaml, tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(4))
    out = tmp_path / "judge"
    argv = ["judge", "--judge", length_judge_yaml, "--data", data, "--output", out, "--no-progress"]
    run_ok(capsys, argv)
    cache = (out / "calls.jsonl").read_bytes()
    for target in (out / "calls.jsonl", out / "report.json"):
        code, _, err = run_cli(capsys, [*argv, "--dataset", target])
        assert code == 2 and "would both be" in err, err
    assert (out / "calls.jsonl").read_bytes() == cache


def test_export_rerun_replaces_the_folder_whole(lora_dir, tmp_path, capsys):
    out = tmp_path / "export"
    run_ok(capsys, ["export", "--model", lora_dir, "--output", out])
    first = {p.relative_to(out) for p in files_under(out)}
    (out / "stale-from-an-older-layout.bin").write_bytes(b"old")  # an earlier export's file this one does not write
    run_ok(capsys, ["export", "--model", lora_dir, "--output", out])
    assert {p.relative_to(out) for p in files_under(out)} == first
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging or set-aside folder left beside it


def test_augment_writes_what_it_reports(tmp_path, capsys):
    out = tmp_path / "out"
    data = write_jsonl(out / "pairs.jsonl", pair_rows(6))
    argv = ["augment", "--data", data, "--output", out / "neg.csv"]
    assert {p.name for p in closure(capsys, argv, out, {data})} == {"neg.csv", "neg.counts.json"}
    assert {p.name for p in closure(capsys, argv, out, {data})} == {"neg.csv", "neg.counts.json"}  # a rerun
    code, _, err = run_cli(capsys, ["augment", "--data", data, "--output", data])
    assert code == 2 and "error:" in err
