"""Permutation: shuffled rows, models and samples give the same numbers. Applied to `rank` (both methods, with the
options that change the fit; a committee's members in any order, its calibration pairs shuffled), `evaluate` and
`judge` on shuffled pair files, `train`'s cross-validation on a
shuffled training file, and the `score` route on shuffled descriptions.

Owners: `emoreward.data.tables.DescriptionTable` (samples and models in canonical order), `emoreward.data.pairs`
(`canonical_pairs`: the order a pair file is processed in), `emoreward.training.pipeline.stratified_folds`.
"""

from __future__ import annotations

import pytest
from _helpers import assert_same_rewards
from _inputs import (
    assert_same_numbers,
    n_boot,
    pair_rows,
    read_json,
    run_ok,
    shuffled,
    table_rows,
    train_recipe,
    write_jsonl,
)


COVERS = {
    "rank": (
        "*",
        "--data",
        "--method",
        "--samples",
        "--hierarchical",
        "--tie-model",
        "--judge",
        "--committee-calibration",
    ),
    "evaluate": ("*", "--data", "--controlled-negatives"),
    "judge": ("*", "--data"),
    "train": ("*", "--train_file"),
    "score": ("*", "descriptions"),
    "augment": ("*", "--data"),
    "pairwise_grpo": ("*", "prompts", "completions"),
}

RANK_VARIANTS = {
    "full": [],
    "bpa": ["--method", "bpa", "--budget", "30"],
    "samples": ["--samples", "5"],
    "hierarchical": ["--hierarchical", "alpha,beta|gamma,delta"],
    "rao-kupper": ["--tie-model", "rao-kupper"],
}


def rank_report(capsys, judge, rows, folder, extra=()) -> dict:
    table = write_jsonl(folder / "table.jsonl", rows)
    out = folder / "rank.json"
    run_ok(capsys, ["rank", "--judge", judge, "--data", table, "--output", out, *n_boot(30, extra), "--no-cache", "--quiet",
                    *extra])  # fmt: skip
    return read_json(out)


@pytest.mark.parametrize("variant", list(RANK_VARIANTS))
@pytest.mark.parametrize("judge", ["reward-model", "length-judge"])
def test_rank_is_invariant_to_row_order(variant, judge, rm_dir, length_judge_yaml, tmp_path, capsys):
    spec = rm_dir if judge == "reward-model" else length_judge_yaml
    rows = table_rows(n_samples=8)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = rank_report(capsys, spec, rows, tmp_path / "a", RANK_VARIANTS[variant])
    b = rank_report(capsys, spec, shuffled(rows, seed=3), tmp_path / "b", RANK_VARIANTS[variant])
    assert_same_numbers(a, b)


@pytest.mark.parametrize("method", ["full", "bpa"])
def test_rank_committee_is_invariant_to_member_order(method, rm_dir, length_judge_yaml, tmp_path, capsys):
    """A committee (`--judge` given more than once, E3mo-Score): its members in another order, its rows and its
    calibration pairs shuffled, give the same numbers (members are read in the order of their names)."""
    rows, pairs = table_rows(n_samples=6), pair_rows(12)
    reports = []
    for folder, judges, order in (("a", (rm_dir, length_judge_yaml), 0), ("b", (length_judge_yaml, rm_dir), 1)):
        (tmp_path / folder).mkdir()
        calibration = write_jsonl(tmp_path / folder / "pairs.jsonl", shuffled(pairs, seed=7) if order else pairs)
        extra = [arg for judge in judges for arg in ("--judge", judge)][2:]
        extra += ["--committee-calibration", calibration]
        if method == "bpa":
            extra += ["--method", "bpa", "--budget", "20"]
        table_rows_in = shuffled(rows, seed=3) if order else rows
        reports.append(rank_report(capsys, judges[0], table_rows_in, tmp_path / folder, extra))
    assert_same_numbers(*reports, ignore=(r"committee/calibration$",))  # where the calibration file is
    assert reports[0]["committee"]["members"][0]["weight"] > 0


def pairs_report(capsys, command, judge, rows, folder) -> dict:
    data = write_jsonl(folder / "pairs.jsonl", rows)
    if command == "evaluate":
        out = folder / "eval.json"
        run_ok(capsys, ["evaluate", "--model", judge, "--data", data, "--output", out])
        return read_json(out)
    out = folder / "judged"
    run_ok(capsys, ["judge", "--judge", judge, "--data", data, "--output", out, "--no-progress"])
    return read_json(out / "report.json")


@pytest.mark.parametrize("command", ["evaluate", "judge"])
def test_pair_commands_are_invariant_to_row_order(command, rm_dir, length_judge_yaml, tmp_path, capsys):
    judge = rm_dir if command == "evaluate" else length_judge_yaml
    rows = pair_rows(24)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = pairs_report(capsys, command, judge, rows, tmp_path / "a")
    b = pairs_report(capsys, command, judge, shuffled(rows, seed=5), tmp_path / "b")
    assert_same_numbers(a, b, ignore=(r"markdown$", r"/calls/", r"seconds"))


def test_train_is_invariant_to_row_order(tiny_bert_dir, tmp_path, capsys):
    rows = pair_rows(24)
    reports = []
    for name, ordered in (("a", rows), ("b", shuffled(rows, seed=2))):
        folder = tmp_path / name
        data = write_jsonl(folder / "train.jsonl", ordered)
        run_ok(capsys, ["train", "--config", train_recipe(folder, tiny_bert_dir, data)])
        reports.append(read_json(folder / "out" / "report.json"))
    a, b = (r["cross_validation"] for r in reports)
    assert_same_numbers(a, b, ignore=(r"markdown$", r"train_seconds", r"/threads"))


def test_score_is_invariant_to_the_order_of_descriptions(rm_dir):
    import numpy as np

    from emoreward.models import load_reward_model

    texts = [r["description"] for r in table_rows(n_samples=6)]
    order = np.random.default_rng(0).permutation(len(texts))
    model = load_reward_model(rm_dir)
    a = model.score(texts)
    b = model.score([texts[i] for i in order])
    assert_same_rewards(b, a[order])


def test_augment_is_invariant_to_row_order(tmp_path, capsys):
    """Controlled negatives of shuffled pairs: the same file, byte for byte (rows in the order of their content)."""
    rows = pair_rows(24)
    out = []
    for name, given in (("a", rows), ("b", shuffled(rows, seed=5))):
        data = write_jsonl(tmp_path / name / "pairs.jsonl", given)
        run_ok(capsys, ["augment", "--data", data, "--output", tmp_path / name / "neg.jsonl"])
        out.append((tmp_path / name / "neg.jsonl").read_bytes())
    assert out[0] == out[1] and out[0].count(b"\n") > 10


def test_evaluate_is_invariant_to_the_order_of_a_negatives_file(rm_dir, tmp_path, capsys):
    """`--controlled-negatives FILE` with its rows shuffled: the same controlled-error section."""
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(12))
    run_ok(capsys, ["augment", "--data", data, "--output", tmp_path / "neg.jsonl"])
    lines = (tmp_path / "neg.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "shuffled.jsonl").write_text("".join(shuffled(lines, seed=2)), encoding="utf-8")
    reports = []
    for name in ("neg", "shuffled"):
        out = tmp_path / f"{name}.json"
        run_ok(capsys, ["evaluate", "--model", rm_dir, "--data", data, "--output", out, "--controlled-negatives",
                        tmp_path / f"{name}.jsonl"])  # fmt: skip
        reports.append(read_json(out)["controlled_errors"])
    assert reports[0]["n_negatives"] > 12
    assert_same_numbers(*reports, ignore=(r"source$",))


@pytest.mark.parametrize("kind", ["reward-model", "length-judge"])
def test_pairwise_group_rewards_follow_each_completion_not_its_place(kind, rm_dir, length_judge_yaml):
    """The pairwise GRPO route: a batch of two prompts' groups, shuffled (prompts interleaved): every completion
    keeps its reward; the judge is a reward model (through its verdicts) or the scripted zero-shot judge, loaded by
    the one resolver."""
    import random

    from emoreward.export.pairwise import PairwiseGroupReward
    from emoreward.judges import load_judge

    judge = load_judge(str(rm_dir if kind == "reward-model" else length_judge_yaml))
    prompts = ["Describe it. Subtitle: I won!"] * 4 + ["Describe it. Subtitle: Go away."] * 4
    completions = ["Joy, a wide smile.", "Calm.", "Elated and loud laughter.", "Mild surprise.",
                   "Anger in a raised voice.", "Tired.", "Cold contempt, arms crossed.", "Neutral face."]  # fmt: skip
    base = PairwiseGroupReward(judge, length_monitor=False)(prompts, completions)
    by_completion = dict(zip(zip(prompts, completions), base))
    order = list(range(8))
    random.Random(0).shuffle(order)
    got = PairwiseGroupReward(judge, length_monitor=False)(
        [prompts[k] for k in order], [completions[k] for k in order]
    )
    assert got == [by_completion[(prompts[k], completions[k])] for k in order]
    if kind == "length-judge":  # the longer description wins: win rates by hand
        for group in (completions[:4], completions[4:]):
            for text in group:
                others = [len(o) for o in group if o != text]
                hand = sum(len(text) > o for o in others) / 3
                assert by_completion[(prompts[completions.index(text)], text)] == hand
