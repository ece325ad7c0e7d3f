"""kill -9 and concurrent writers: every output is the old one or the new one, and the rerun equals an uninterrupted
run (issue 34, items 1 and 3).

The real entry points run as subprocesses (`python -m emoreward.cli ...`) and are killed with SIGKILL at a sweep
of moments across their run (a kill lands before, inside and after each stage: loading, writing the staging folder,
swapping it in, scoring chunks, appending cache lines); then the folder holds a complete earlier or new output and
the same command again gives what an uninterrupted run gives. Two `rank` runs on one score cache (with a torn line
of a killed run in it) lose no score of each other's. A training run interrupted while its folds train in worker
processes resumes to the adapter, fold figures and tie threshold of the uninterrupted run, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import synthetic_pairs
from test_training_run import tiny_recipe, write_pairs_csv


ROOT = Path(__file__).resolve().parents[1]
SWEEP = (0.3, 1.0, 1.8, 2.6, 3.4, 4.5)  # seconds after the start: the stages of a tiny model's run


def start(argv, log: Path, threads: int = 1) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "emoreward.cli", *map(str, argv)], cwd=ROOT, env=env, stdout=out, stderr=out
        )


def run(argv, log: Path, threads: int = 1) -> None:
    process = start(argv, log, threads)
    assert process.wait(timeout=900) == 0, log.read_text()[-4000:]


def killed_after(argv, seconds: float, log: Path) -> bool:
    """Start `argv`, SIGKILL it after `seconds` (True), or let it finish first (False)."""
    process = start(argv, log)
    try:
        process.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        return True


def timeless(value):
    """A report without its timings (`train_seconds`, `scoring_seconds`, ...): every figure else must be equal."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------------------------------- export
def test_export_killed_at_any_moment_leaves_the_old_or_the_new_export(lora_dir, tmp_path):
    """A kill while the new export is written (a real SIGKILL late in the run) and a kill between the two renames
    of the swap (what it leaves, made on disk: the earlier export set aside, no folder in its place, a staging
    folder beside it): the folder is the earlier export or the new one, and the rerun ends with the new one."""
    from relations._identity_inputs import change_weights, model_copy

    other = change_weights(model_copy(lora_dir, tmp_path / "other"), scale=2.0)
    log = tmp_path / "log.txt"
    target = tmp_path / "exports" / "model"
    began = time.monotonic()
    run(["export", "--model", other, "--output", tmp_path / "ref-new"], log)
    seconds = time.monotonic() - began
    new = folder_digest(tmp_path / "ref-new")
    run(["export", "--model", lora_dir, "--output", target], log)  # the earlier export
    old = folder_digest(target)
    assert old != new
    killed_after(["export", "--model", other, "--output", target], 0.85 * seconds, log)  # late: writing, checking
    assert folder_digest(target) in (old, new)
    run(["export", "--model", lora_dir, "--output", target], log)
    # a kill between the swap's two renames (file systems without an atomic exchange)
    target.rename(target.with_name(".model.previous"))
    (target.with_name(".model.exporting")).mkdir()
    (target.with_name(".model.exporting") / "model.safetensors").write_bytes(b"\0" * 10)
    run(["export", "--model", other, "--output", target], log)  # the rerun accepts what the kill left
    assert folder_digest(target) == new
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]


def test_replace_dir_leaves_the_old_or_the_new_folder_at_every_step(tmp_path):
    """`utils.io.replace_dir` and `recover_dir` over each state a kill can leave (the owner of every folder output)."""
    from emoreward.utils.io import recover_dir, replace_dir

    def folder(name, text):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(text)
        return tmp_path / name

    target = folder("out", "old")
    replace_dir(folder(".out.new", "new"), target)
    assert (target / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    target.rename(tmp_path / ".out.previous")  # killed between the renames: no folder, the old one set aside
    recover_dir(target)
    assert (target / "f").read_text() == "new" and not (tmp_path / ".out.previous").exists()
    folder(".out.previous", "older")  # killed after the swap, before the old one was removed
    recover_dir(target)
    assert (target / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    replace_dir(folder(".first.new", "first"), tmp_path / "first")  # no folder yet
    assert (tmp_path / "first" / "f").read_text() == "first"


# ------------------------------------------------------------------------------------------- rank
def _table(path: Path, n_samples: int, tag: str) -> Path:
    from relations._identity_inputs import table_rows, write_table

    rows = table_rows(n_samples, ("alpha", "beta", "gamma", "delta"))
    return write_table(path, [{**r, "description": f"{r['description']} {tag} {r['sample']}"} for r in rows])


@pytest.fixture(scope="module")
def rank_model(tmp_path_factory):
    """A tiny BERT reward model reading 128 tokens, hidden 64 (a few seconds of scoring for 2,000 descriptions)."""
    from _helpers import save_tiny_bert_rm

    return save_tiny_bert_rm(tmp_path_factory.mktemp("kill-rm") / "model", hidden=64, positions=128, max_length=128)


def _rank_argv(model, table, out, cache):
    return ["rank", "--judge", model, "--data", table, "--output", out, "--n-boot", "5", "--cache-dir", cache,
            "--quiet", "--batch-size", "64"]  # fmt: skip


def _scores(cache: Path) -> dict[str, float]:
    from emoreward.ranking.score_cache import ScoreCache

    (file,) = cache.glob("scores-*.jsonl")
    return dict(ScoreCache(file)._scores)


def test_rank_killed_at_any_moment_then_rerun_equals_an_uninterrupted_run(rank_model, tmp_path):
    table = _table(tmp_path / "table.jsonl", 100, "x")
    log = tmp_path / "log.txt"
    run(_rank_argv(rank_model, table, tmp_path / "ref.json", tmp_path / "ref-cache"), log)
    reference = json.loads((tmp_path / "ref.json").read_text())
    out, cache = tmp_path / "out" / "rank.json", tmp_path / "cache"
    for seconds in SWEEP[1:5]:
        killed_after(_rank_argv(rank_model, table, out, cache), seconds, log)
        if out.exists():  # the report is the old one or the new one, never a torn one
            json.loads(out.read_text())
    run(_rank_argv(rank_model, table, out, cache), log)
    again = json.loads(out.read_text())
    assert again["mean_reward"] == reference["mean_reward"] and again["ranking"] == reference["ranking"]
    assert _scores(cache) == _scores(tmp_path / "ref-cache")


def test_two_rank_runs_on_one_cache_lose_no_score(rank_model, tmp_path):
    cache = tmp_path / "cache"
    log = tmp_path / "log.txt"
    seed = _table(tmp_path / "seed.jsonl", 2, "seed")
    run(_rank_argv(rank_model, seed, tmp_path / "seed.json", cache), log)
    (file,) = cache.glob("scores-*.jsonl")
    with file.open("a") as fh:
        fh.write('{"key": "torn by a killed run", "sco')  # what a kill mid-line leaves
    seeded = _scores(cache)
    tables = [_table(tmp_path / f"t{i}.jsonl", 80, f"run{i}") for i in range(2)]
    runs = [start(_rank_argv(rank_model, t, tmp_path / f"r{i}.json", cache), log) for i, t in enumerate(tables)]
    assert [p.wait(timeout=900) for p in runs] == [0, 0], log.read_text()[-4000:]
    scores = _scores(cache)
    assert seeded.items() <= scores.items()
    assert len(scores) == len(seeded) + 2 * 80 * 4  # every description of both runs, none lost
    for i, t in enumerate(tables):  # and each run's scores are all there: its rerun scores nothing
        run(_rank_argv(rank_model, t, tmp_path / f"again{i}.json", cache), log)
        assert json.loads((tmp_path / f"again{i}.json").read_text())["cost"]["n_scored"] == 0


# ------------------------------------------------------------------------------------------- judge
def test_judge_killed_at_any_moment_then_rerun_equals_an_uninterrupted_run(tmp_path):
    from relations._inputs import length_judge, pair_rows, write_jsonl

    judge = length_judge(tmp_path / "length.yaml")
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(200))
    log = tmp_path / "log.txt"

    def argv(out):
        return ["judge", "--judge", judge, "--data", data, "--output", out, "--no-progress", "--runs", "2"]

    run(argv(tmp_path / "ref"), log)
    reference = json.loads((tmp_path / "ref" / "report.json").read_text())
    out = tmp_path / "out"
    for seconds in SWEEP[:4]:
        killed_after(argv(out), seconds, log)
        if (out / "report.json").exists():
            json.loads((out / "report.json").read_text())
    run(argv(out), log)
    again = json.loads((out / "report.json").read_text())
    assert again["strategies"] == reference["strategies"]
    assert again["calls"]["made"] + again["calls"]["cached"] == reference["calls"]["made"]


# ------------------------------------------------------------------------------------------- train
def test_a_resumed_run_equals_the_uninterrupted_run_bit_for_bit(tiny_bert_dir, tmp_path):
    """Folds in two worker processes of one thread each (`fit_workers: 2` on two threads): killed once a fold has
    finished and again during the final fit, the resumed run trains the remaining fold and the final fit on the
    threads of the uninterrupted run (the plan recorded in run_identity.json): the same adapter bytes, fold
    figures and tie threshold."""
    settings = {
        "train_file": str(write_pairs_csv(tmp_path / "train.csv", synthetic_pairs(16))),
        "cv_folds": 2,
        "num_train_epochs": 1,
        "per_device_train_batch_size": 2,  # folds: 4 steps; the final fit: 8, a checkpoint at step 4
        "save_strategy": "steps",
        "save_steps": 4,
        "fit_workers": 2,
    }
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    log = tmp_path / "log.txt"
    run(["train", "--config", tiny_recipe(tmp_path / "ref", tiny_bert_dir, **settings)], log, threads=2)
    reference = tmp_path / "ref" / "out"
    recipe = tiny_recipe(tmp_path / "run", tiny_bert_dir, **settings)
    out = tmp_path / "run" / "out"
    for ready in (out / "cv" / "fold0" / "finished.json", out / "checkpoints" / "checkpoint-4" / "trainer_state.json"):
        process = start(["train", "--config", recipe], log, threads=2)
        deadline = time.monotonic() + 600
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    run(["train", "--config", recipe], log, threads=2)
    ref_report = json.loads((reference / "report.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert timeless(report["cross_validation"]) == timeless(ref_report["cross_validation"])
    assert report["final"]["tie_threshold"] == ref_report["final"]["tie_threshold"]
    # the fits trained on the threads of the uninterrupted run (the plan recorded when the run began)
    assert [f["train_threads"] for f in report["cross_validation"]["folds"]] == [1, 1]
    assert report["final"]["train_threads"] == ref_report["final"]["train_threads"] == 1
    adapter = "model/adapter_model.safetensors"
    assert (out / adapter).read_bytes() == (reference / adapter).read_bytes()
    plan = json.loads((out / "run_identity.json").read_text())["fit_plan"]
    assert (
        plan == json.loads((reference / "run_identity.json").read_text())["fit_plan"] == {"workers": 2, "threads": 1}
    )
