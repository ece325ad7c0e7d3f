"""Cross-validation folds side by side in worker processes (`fit_workers`): the plan, and the same figures as one
fold after another through the real `emoreward train`."""

from __future__ import annotations

import json
import os

import pytest
from test_training_run import tiny_recipe

from emoreward.cli import main
from emoreward.training.fit_workers import (
    FIT_MEMORY_BYTES,
    FitPool,
    fit_result,
    parse_fit_workers,
    resolve_fit_workers,
)


def plan(requested="auto", *, jobs=5, kind="text", device="cpu", world_size=1, threads=2, memory=None):
    memory = 64 * 2**30 if memory is None else memory
    p = resolve_fit_workers(
        requested, jobs=jobs, kind=kind, device=device, world_size=world_size, threads=threads, memory=memory
    )
    return p.workers, p.threads


def test_auto_runs_one_single_threaded_fold_per_core_on_a_cpu_only():
    assert plan() == (2, 1)  # 2 cores: two folds of one thread each
    assert plan(threads=16) == (5, 3)  # at most one worker per fold still to train
    assert plan(threads=16, jobs=2) == (2, 8)
    assert plan(threads=1) == (1, 1)  # OMP_NUM_THREADS=1 (the test suite, one pytest worker per core)
    assert plan(jobs=1) == (1, 2)  # one fold left (a resumed run)
    assert plan(device="cuda") == (1, 2)
    assert plan(world_size=2) == (1, 2)  # accelerate launch spreads every fit over its processes
    assert plan(kind="media") == (1, 2)
    assert plan(threads=16, memory=3 * FIT_MEMORY_BYTES) == (3, 5)  # no more workers than memory holds
    assert plan(memory=FIT_MEMORY_BYTES) == (1, 2)


def test_an_explicit_count_is_kept_on_a_cpu_and_refused_where_folds_cannot_share():
    assert plan(3, threads=2) == (3, 1)  # asked for: oversubscribed, one thread each
    assert plan(4, jobs=2, threads=8) == (2, 4)
    assert plan(1, threads=8) == (1, 8)
    crowded = resolve_fit_workers(4, jobs=5, kind="text", device="cpu", world_size=1, threads=2, memory=8 * 2**30)
    assert crowded.reason == (
        "fit_workers=4; warning: more workers than the 2 CPU threads, they slow each other down; "
        "warning: 4 fits may need more than the 8.0 GiB available"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device": "cuda"}, "device cuda trains one fold at a time"),
        ({"world_size": 2}, "an accelerate launch run of 2 processes"),
    ],
)
def test_workers_on_a_gpu_or_under_accelerate_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        plan(2, **change)


@pytest.mark.parametrize("value", ["0", 0, -1, "two", "1.5", True, None])
def test_bad_fit_workers_values_are_refused(value):
    with pytest.raises(ValueError, match="fit_workers must be 'auto' or an integer >= 1"):
        parse_fit_workers(value)


def test_a_dead_worker_is_named_not_hung():
    with FitPool(1, 1) as pool:
        future = pool.submit(os._exit, 3)
        with pytest.raises(RuntimeError, match="worker process died.*fit_workers=1"):
            fit_result(future)


def test_folds_in_workers_give_the_figures_of_one_fold_after_another(tiny_bert_dir, tmp_path, capsys):
    reports = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        recipe = tiny_recipe(tmp_path, tiny_bert_dir, output_dir=str(out), num_train_epochs=1, seed=5)
        assert main(["train", "--config", str(recipe), "--set", f"fit_workers={workers}"]) == 0
        printed = capsys.readouterr().out
        assert printed.count("fold 1/2: 2-class WAF") == 1 and printed.count("fold 2/2: 2-class WAF") == 1
        assert printed.index("fold 1/2: 2-class WAF") < printed.index("fold 2/2: 2-class WAF")  # in fold order
        assert ("2 folds at a time" in printed) == (workers == 2)
        reports[workers] = json.loads((out / "report.json").read_text())
        assert json.loads((out / "cv" / "fold1" / "finished.json").read_text())["evaluation"]["fold"] == 1
    one, two = (reports[w]["cross_validation"] for w in (1, 2))
    for a, b in zip(one["folds"], two["folds"], strict=True):
        assert _without_durations(a) == _without_durations(b)
    assert one["summary"] == two["summary"]
    assert reports[1]["final"]["tie_threshold"] == reports[2]["final"]["tie_threshold"]
    # the worker count is not part of the run: a rerun with another value reuses every finished fold
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, output_dir=str(tmp_path / "out2"), num_train_epochs=1, seed=5)
    assert main(["train", "--config", str(recipe), "--set", "fit_workers=1"]) == 0
    assert capsys.readouterr().out.count("finished earlier") == 3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fit_workers", "two", "fit_workers: cannot read 'two' as an integer or 'auto'"),
        ("bf16", "maybe", "bf16: cannot read 'maybe' as true or false or 'auto' or null"),
    ],
)
def test_a_value_no_member_of_a_union_reads_names_what_the_field_takes(field, value, message, capsys):
    assert main(["train", "--set", f"{field}={value}"]) == 2
    assert message in capsys.readouterr().err


def _without_durations(value):
    """A report without its durations (any key naming seconds, at any depth: a fold's and its cost ledger's)."""
    if isinstance(value, dict):
        return {k: _without_durations(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_without_durations(v) for v in value]
    return value
