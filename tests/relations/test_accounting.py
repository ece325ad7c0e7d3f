"""Accounting: every count a report prints equals the work done. The judge calls `rank` and `judge` print equal
the requests the scripted judge answered (it writes one line per request to ``calls_log``), for every order and
run option; the comparisons per model equal the verdicts in W; the BPA budget is what was asked; a reward model's
scored descriptions are the distinct texts; `train`'s folds hold every pair exactly once.

Owners: `emoreward.ranking.report` (`_cost_line`, the report's counts), `emoreward.ranking.judging` and
`zero_shot.runner` (the calls they count), `emoreward.training.pipeline.stratified_folds`.
"""

from __future__ import annotations

import math

import pytest
from _inputs import pair_rows, read_json, run_ok, table_rows, train_recipe, write_jsonl


COVERS = {
    "rank": ("*", "--runs", "--no-swap", "--budget"),
    "judge": ("*", "--runs", "--no-swap"),
    "evaluate": ("*",),
    "train": ("*", "--train_file", "--cv_folds"),
}


def counting_judge(folder) -> tuple:
    log = folder / "calls.log"
    spec = folder / "judge.yaml"
    spec.write_text(
        f"name: counted\nmllm:\n  backend: scripted\n  model: length\n  calls_log: {log}\n", encoding="utf-8"
    )
    return spec, log


def calls(log) -> int:
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


RANK_OPTIONS = {
    "default": [],
    "no-swap": ["--no-swap"],
    "runs 2": ["--runs", "2"],
    "bpa": ["--method", "bpa", "--budget", "25"],
}


@pytest.mark.parametrize("options", list(RANK_OPTIONS))
def test_rank_counts_equal_the_judge_calls_made(options, tmp_path, capsys):
    spec, log = counting_judge(tmp_path)
    rows = table_rows(n_samples=6)
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    printed = run_ok(capsys, ["rank", "--judge", spec, "--data", table, "--output", out, "--n-boot", 20, "--no-cache",
                              "--quiet", *RANK_OPTIONS[options]])  # fmt: skip
    report = read_json(out)
    cost = report["cost"]
    made = calls(log)
    if options == "bpa":
        assert cost["n_calls"] == made and cost["n_queries"] == report["n_pairs"] <= 25
        assert cost["n_calls"] + cost["n_reused"] == 2 * cost["n_queries"]
        assert f"{cost['n_queries']} pairs, {made} judge calls" in printed
        return
    orders = 1 if options == "no-swap" else 2
    runs = 2 if options == "runs 2" else 1
    n_pairs = math.comb(4, 2) * 6
    assert cost["n_pairs"] == n_pairs and cost["n_judge_calls"] == made
    assert made + cost["n_reused"] == n_pairs * orders * runs  # a greedy second run repeats the first's calls
    assert cost["n_records"] == n_pairs * orders * runs - cost["n_invalid"]
    assert f"Judge calls: {made} ({n_pairs} pairs x orders x runs" in printed
    if cost["n_reused"]:
        assert f"; {cost['n_reused']} more verdicts from the call cache or an identical greedy run)" in printed
    # comparisons per model = the verdicts W holds for it
    w = report["W"]
    fit = report["bradley_terry_ties"]
    for k, model in enumerate(w["items"]):
        verdicts = sum(w["wins"][k]) + sum(row[k] for row in w["wins"]) + sum(w["ties"][k])
        assert fit["samples_compared"][fit["items"].index(model)] == 6
        assert verdicts == cost["n_records"] * 2 / 4  # every record involves 2 of the 4 models, evenly here


@pytest.mark.parametrize("options", [[], ["--no-swap"], ["--runs", "3"]])
def test_judge_counts_equal_the_calls_made(options, tmp_path, capsys):
    spec, log = counting_judge(tmp_path)
    data = write_jsonl(tmp_path / "p.jsonl", pair_rows(12))
    out = tmp_path / "j"
    printed = run_ok(capsys, ["judge", "--judge", spec, "--data", data, "--output", out, "--no-progress", *options])
    report = read_json(out / "report.json")
    made = calls(log)
    assert report["n_pairs"] == 12
    assert f"calls: {made} made" in printed
    runs = 3 if "--runs" in options else 2
    orders = 1 if "--no-swap" in options else 2
    total = report["calls"]
    assert total["made"] == made and total["cached"] == 0 and total["failed"] == 0
    # the controlled-error section's negatives are judged in the same orders and runs, and counted with them
    n_negatives = report["controlled_errors"]["S1"]["n_negatives"]
    assert n_negatives > 12
    assert made + total["reused_greedy"] == (12 + n_negatives) * orders * runs, total


def test_evaluate_counts_the_descriptions_it_scored(rm_dir, tmp_path, capsys):
    rows = pair_rows(12)
    out = tmp_path / "e.json"
    run_ok(capsys, ["evaluate", "--model", rm_dir, "--data", write_jsonl(tmp_path / "p.jsonl", rows), "--output", out])
    report = read_json(out)
    distinct = {t for r in rows for t in (r["description_1"], r["description_2"])}
    assert report["n_descriptions_scored"] == len(distinct)
    controlled = report["controlled_errors"]  # its own count: the originals were scored with the pairs, only the
    negatives = {negative for _, negative in controlled_texts(rows)}  # negatives are new work
    assert controlled["n_descriptions_scored"] == len(negatives) and controlled["n_negatives"] == len(negatives)
    assert sum(map(sum, report["judge"]["three_class"]["confusion"])) == len(rows)


def test_train_folds_hold_every_pair_once(tiny_bert_dir, tmp_path, capsys):
    rows = pair_rows(24)
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    run_ok(capsys, ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, data), "--cv_folds", "3"])
    report = read_json(tmp_path / "out" / "report.json")
    folds = report["cross_validation"]["folds"]
    assert len(folds) == 3 and report["n_pairs"] == 24
    assert sum(f["n_pairs"] for f in folds) == 24, [f.get("n_pairs") for f in folds]
    assert all(f["n_train"] + f["n_pairs"] == 24 for f in folds)
    # the controlled-error section: each fold judges the negatives of its held-out pairs; pooled, every negative once
    pooled = report["cross_validation"]["controlled_errors"]
    assert [f["controlled_errors"]["n_negatives"] for f in folds] == [
        len(controlled_texts([r for r in rows if r["sample_id"] in held_out(f)])) for f in folds
    ]
    assert pooled["n_negatives"] == len(controlled_texts(rows)) == sum(r["n"] for r in pooled["kinds"].values())
    assert pooled["all"]["judge"]["prefers_original"] == sum(
        f["controlled_errors"]["all"]["judge"]["prefers_original"] for f in folds
    )
    assert "### Controlled errors (held-out folds)" in (tmp_path / "out" / "report.md").read_text()


def held_out(fold: dict) -> set[str]:
    return set(fold["pair_rewards"]["sample_id"])


def controlled_texts(rows) -> list[tuple[str, str]]:
    """(original, negative) of the negatives `evaluate` generates from `rows` (the rules engine, as it runs it)."""
    from emoreward.data import pairs_from_records
    from emoreward.data.negatives import generate_negatives

    pairs = pairs_from_records(enumerate(rows, start=1), "rows")
    return [(n.original, n.negative) for n in generate_negatives(pairs).negatives]
