"""Relation: output closure. A run writes exactly the files it reports, never one output over another or over an
input or a cache, and a rerun into the same place leaves nothing stale.

Owners: `emoreward.utils.io.OutputFiles` (the files of one run, claimed before any work; stale optional outputs
removed), used by `rank` (`emoreward.ranking.api.plan_outputs`), `evaluate` and `judge`; `utils.io.replace_dir` for a
folder output (`export`); the caches append only (`utils.io.locked_append`); one writer per output
(`utils.io.hold_output`: a second run writing the same output is refused before any work, exit 2).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _inputs import n_boot, pair_rows, run_cli, run_ok, table_rows, train_recipe, write_jsonl


COVERS: dict[str, tuple[str, ...]] = {
    "evaluate": ("--output",),
    "judge": ("--output", "--dataset"),
    "rank": ("--output", "--dataset"),
    "export": ("--output",),
    "train": ("--output_dir",),
    "augment": ("--output",),
}

ROOT = Path(__file__).resolve().parents[2]


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
    return ["rank", "--judge", *extra, "--data", table, "--output", out, *n_boot("5", extra), "--cache-dir", cache]


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


# ------------------------------------------------------------------------------------------- one writer per output
def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _holder(target: Path) -> subprocess.Popen:
    """Another process writing `target`: it takes the output's lock (`hold_output`, what every command takes before
    its work) and keeps it until killed."""
    code = "import sys, time\nfrom emoreward.utils.io import hold_output\nhold_output(sys.argv[1], 'x')\nprint('held', flush=True)\ntime.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def _refused_while_written(capsys, argv, target: Path, holder_pid: int, before: dict) -> None:
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"{target} is being written by another emoreward run (process {holder_pid})" in lines[0]
    assert {p: p.read_bytes() for p in files_under(target.parent)} == before  # nothing written, nothing removed


@pytest.mark.parametrize("command", ["rank", "evaluate", "judge", "export", "train"])
def test_a_second_writer_of_one_output_is_refused_before_any_work(
    command, rm_dir, lora_dir, tiny_bert_dir, length_judge_yaml, tmp_path, capsys
):
    table = write_jsonl(tmp_path / "table.jsonl", table_rows())
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(6))
    out = tmp_path / "out"
    target, argv = {
        "rank": (out / "r.json", _rank_argv(table, out / "r.json", tmp_path / "cache", rm_dir)),
        "evaluate": (out / "r.json", ["evaluate", "--model", rm_dir, "--data", pairs, "--output", out / "r.json"]),
        "judge": (out / "j", ["judge", "--judge", length_judge_yaml, "--data", pairs, "--output", out / "j"]),
        "export": (out / "e", ["export", "--model", lora_dir, "--output", out / "e"]),
        "train": (out / "t", ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, pairs), "--output_dir", out / "t"]),
    }[command]  # fmt: skip
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier run's file")
    before = {p: p.read_bytes() for p in files_under(out)}
    holder = _holder(target)
    try:
        _refused_while_written(capsys, argv, target, holder.pid, {**before, **_lock_files(out)})
        assert not (tmp_path / "cache").exists()  # rank scored nothing
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # a crash: the kernel drops its lock
        holder.wait(timeout=60)
    if command in ("rank", "evaluate"):  # the lock went with the crashed writer: the next run writes
        run_ok(capsys, argv)
        assert target.exists() and (out / "earlier.txt").exists()
        assert not [p for p in out.iterdir() if p.name.endswith(".lock") and p.name != f".{target.name}.lock"]


def _lock_files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.glob(".*.lock")}


def test_two_train_runs_into_one_folder_one_is_refused_and_the_other_completes(tiny_bert_dir, tmp_path, capsys):
    """The case of issue 41: two `emoreward train` runs into one folder both exited 0 and one's results vanished."""
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(12))
    recipe = train_recipe(tmp_path, tiny_bert_dir, pairs)
    out = tmp_path / "out"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        [sys.executable, "-m", "emoreward.cli", "train", "--config", str(recipe), "--no-wandb"],
        cwd=ROOT, env=_env(), stdout=log, stderr=log,
    )  # fmt: skip
    lock = tmp_path / ".out.lock"
    deadline = time.monotonic() + 300
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.exists(), (tmp_path / "first.log").read_text()[-3000:]
    code, _, err = run_cli(capsys, ["train", "--config", recipe, "--no-wandb"])
    assert code == 2 and f"--output-dir {out} is being written by another emoreward run (process {first.pid})" in err
    assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert (out / "report.json").exists() and not lock.exists()  # the first run's results, its lock gone


def test_augment_writes_what_it_reports(tmp_path, capsys):
    out = tmp_path / "out"
    data = write_jsonl(out / "pairs.jsonl", pair_rows(6))
    argv = ["augment", "--data", data, "--output", out / "neg.csv"]
    assert {p.name for p in closure(capsys, argv, out, {data})} == {"neg.csv", "neg.csv.counts.json"}
    assert {p.name for p in closure(capsys, argv, out, {data})} == {"neg.csv", "neg.csv.counts.json"}  # a rerun
    code, _, err = run_cli(capsys, ["augment", "--data", data, "--output", data])
    assert code == 2 and "error:" in err


# ------------------------------------------------------------------------------------------- an output folder's place
def _snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in files_under(folder)}


def _refused(capsys, argv, phrase: str, watched: Path) -> None:
    """`argv` is refused in one line naming `phrase`, exit 2, and nothing under `watched` changed or appeared."""
    before = _snapshot(watched)
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and phrase in lines[0], err
    assert _snapshot(watched) == before


@pytest.mark.parametrize("command", ["evaluate", "judge", "judge-rm", "export", "train"])
def test_an_output_folder_is_never_an_input_inside_one_or_around_one(
    command, rm_dir, lora_dir, tiny_bert_dir, length_judge_yaml, tmp_path, capsys
):
    """`check_output_dir(inputs=...)`: the folder a command writes is not, does not lie inside and does not contain
    a file or folder it reads (a model or judge folder, the data, a media root)."""
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(6))
    media = tmp_path / "media"
    media.mkdir()
    (media / "keep.txt").write_text("a user's file")
    zero_shot = ["--judge" if command == "judge" else "--model", length_judge_yaml, "--data", pairs]
    # --media-root applies to a judge that reads media: a served video judge (refused before any call)
    seeing = tmp_path / "seeing.yaml"
    seeing.write_text("name: seeing\nmllm:\n  backend: openai\n  model: m\n  base_url: http://127.0.0.1:9/v1\n"
                      "  modalities: [text, video]\n")  # fmt: skip
    by_media = ["--judge" if command == "judge" else "--model", seeing, "--data", pairs, "--media-root", media]
    cases = {
        "evaluate": [
            ([command, *by_media, "--output", media / "out"], "lies inside --media-root", media),
            ([command, *zero_shot, "--output", tmp_path], "contains --data", tmp_path),
        ],
        "judge": [
            ([command, *by_media, "--output", media], "is --media-root", media),
            ([command, *zero_shot, "--output", tmp_path], "contains --", tmp_path),
        ],
        "judge-rm": [
            (["judge", "--judge", rm_dir, "--data", pairs, "--output", rm_dir], "is --judge", rm_dir),
            (["judge", "--judge", rm_dir, "--data", pairs, "--output", rm_dir / "out"], "lies inside --judge", rm_dir),
        ],
        "export": [
            (["export", "--model", lora_dir, "--output", lora_dir / "export"], "lies inside --model", lora_dir),
        ],
        "train": [
            (
                ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, pairs), "--output_dir", tiny_bert_dir / "t"],
                "lies inside --model_name_or_path",
                tiny_bert_dir,
            ),
            (["train", "--config", train_recipe(tmp_path, tiny_bert_dir, pairs), "--output_dir", tmp_path], "contains --", tmp_path),
        ],
    }[command]  # fmt: skip
    for argv, phrase, watched in cases:
        _refused(capsys, argv, phrase, watched)


@pytest.mark.parametrize("case", ["rank", "rank-dataset", "rank-media", "evaluate", "judge-dataset", "augment"])
def test_an_output_file_never_lies_inside_an_input_folder(case, rm_dir, length_judge_yaml, tmp_path, capsys):
    """`check_output_file(inputs=named_input_paths(...))`, the one rule of every output file: a report, a records file
    or negatives written into the model folder (or a media root) the command reads changed that folder's content
    identity, and the next rank rescored every description (issue 41, F6); refused, exit 2, before any work."""
    from shutil import copytree

    model = copytree(rm_dir, tmp_path / "model")
    table = write_jsonl(tmp_path / "table.jsonl", table_rows())
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(6))
    media = tmp_path / "media"
    media.mkdir()
    seeing = tmp_path / "seeing.yaml"  # a judge that reads media (refused before any call)
    seeing.write_text("name: seeing\nmllm:\n  backend: openai\n  model: m\n  base_url: http://127.0.0.1:9/v1\n"
                      "  modalities: [text, video]\n")  # fmt: skip
    rank = ["rank", "--judge", model, "--data", table, "--n-boot", "5", "--no-cache"]
    argv, phrase, watched = {
        "rank": ([*rank, "--output", model / "report.json"], "lies inside --judge", model),
        "rank-dataset": ([*rank, "--dataset", model / "sub" / "v.jsonl"], "lies inside --judge", model),
        "rank-media": (["rank", "--judge", seeing, "--data", table, "--media-root", media, "--no-cache", "--output",
                        media / "r.json"], "lies inside --media-root", media),
        "evaluate": (["evaluate", "--model", model, "--data", pairs, "--output", model / "ev.json"],
                     "lies inside --model", model),
        "judge-dataset": (["judge", "--judge", seeing, "--data", pairs, "--media-root", media, "--dataset",
                           media / "v.jsonl"], "lies inside --media-root", media),
        "augment": (["augment", "--data", pairs, "--media-root", media, "--output", media / "neg.jsonl"],
                    "lies inside --media-root", media),
    }[case]  # fmt: skip
    _refused(capsys, argv, phrase, watched)


@pytest.mark.parametrize("command", ["evaluate", "judge", "judge-rm"])
def test_an_output_folder_holds_only_this_commands_earlier_outputs(
    command, rm_dir, length_judge_yaml, tmp_path, capsys
):
    """`check_output_dir(own=...)`: evaluate / judge write their folder only when it is new, empty or holds their own
    earlier outputs, so a judge recipe's run folder (its cross-validation report.json beside the trained judge) is
    refused, and a rerun into the command's own folder is not."""
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(6))
    spec = rm_dir if command == "judge-rm" else length_judge_yaml
    name = "judge" if command.startswith("judge") else "evaluate"
    run = tmp_path / "run"  # a trained judge's run folder: its report and the judge beside it
    (run / "model").mkdir(parents=True)
    (run / "model" / "judge.yaml").write_text("name: trained\n")
    (run / "report.json").write_text('{"cross_validation": {"waf": 61.5}}\n')
    (run / "report.md").write_text("| fold | WAF |\n")
    argv = [name, "--judge" if name == "judge" else "--model", spec, "--data", pairs]
    _refused(capsys, [*argv, "--output", run], "holds files this command does not write (model)", run)
    out = tmp_path / "own"
    if command == "evaluate":
        run_ok(capsys, [*argv, "--output", out])
        written = {p.name for p in out.iterdir()}
        assert written == {"calls.jsonl", "judgements_S1.jsonl", "report.json", "report.md"}
        run_ok(capsys, [*argv, "--output", out])  # its own earlier outputs: a rerun writes there
        (out / "notes.txt").write_text("mine")
        _refused(capsys, [*argv, "--output", out], "holds files this command does not write (notes.txt)", out)
    else:
        run_ok(capsys, [*argv, "--output", out])
        run_ok(capsys, [*argv, "--output", out])
        assert not {p.name for p in out.iterdir()} - {
            "calls.jsonl",
            "judgements_S1.jsonl",
            "report.json",
            "report.md",
            "report.png",
        }


def test_the_default_judge_folder_is_checked_as_a_given_one(length_judge_yaml, tmp_path, capsys, monkeypatch):
    """Without --output a zero-shot run writes `outputs/judge-<name>`: the same `check_output_dir`, before any call."""
    monkeypatch.chdir(tmp_path)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(4))
    folder = Path("outputs") / "judge-lengthjudge"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("a user's file")
    phrase = f"the output folder {folder} holds files this command does not write (notes.txt)"
    _refused(capsys, ["judge", "--judge", length_judge_yaml, "--data", pairs], phrase, tmp_path / folder)
    (folder / "notes.txt").unlink()
    run_ok(capsys, ["judge", "--judge", length_judge_yaml, "--data", pairs])
    assert sorted(p.name for p in folder.iterdir()) == [
        "calls.jsonl",
        "judgements_S1.jsonl",
        "report.json",
        "report.md",
    ]
