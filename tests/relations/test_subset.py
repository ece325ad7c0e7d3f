"""Subset commutation: every option that selects a subset gives what running on the filtered input gives, alone
and composed with the others, in any order the selection is written. Applied to `rank`'s ``--models``,
``--sample-ids`` and ``--samples`` (and their compositions) and `judge`'s ``--limit`` (the first N pairs in
content order: `emoreward.data.pairs.first_pairs`).

Owners: `emoreward.data.tables.DescriptionTable.subset` and `sample_subset` (the order of what is kept:
`canonical_order`; a sample no kept model described is gone), `DescriptionTable.select` (the one order the
selections apply in: models, then samples, then a random N).
"""

from __future__ import annotations

import pytest
from _inputs import (
    WORDS,
    assert_same_numbers,
    n_boot,
    pair_rows,
    read_json,
    run_cli,
    run_ok,
    shuffled,
    table_rows,
    write_jsonl,
)


COVERS = {"rank": ("--models", "--samples", "--sample-ids", "--cache-dir"), "judge": ("--limit",)}

MODELS = ["delta", "alpha", "gamma"]  # not in table order
SAMPLES = ["s6", "s1", "s4", "s3", "s7"]


def rank(capsys, judge, rows, folder, extra=()):
    folder.mkdir(parents=True, exist_ok=True)
    table = write_jsonl(folder / "table.jsonl", rows)
    out = folder / "r.json"
    run_ok(capsys, ["rank", "--judge", judge, "--data", table, "--output", out, *n_boot(30, extra), "--no-cache", "--quiet",
                    *[str(e).replace("{folder}", str(folder)) for e in extra]])  # fmt: skip
    return read_json(out)


SELECTIONS = {
    "--models": (["--models", ",".join(MODELS)], lambda r: r["model"] in MODELS),
    "--sample-ids": (["--sample-ids", "{folder}/ids.txt"], lambda r: r["sample"] in SAMPLES),
    "--models --sample-ids": (
        ["--sample-ids", "{folder}/ids.txt", "--models", ",".join(MODELS)],
        lambda r: r["sample"] in SAMPLES and r["model"] in MODELS,
    ),
}


@pytest.mark.parametrize("selection", list(SELECTIONS))
@pytest.mark.parametrize("method", ["full", "bpa"])
def test_a_selection_equals_ranking_the_filtered_table(selection, method, rm_dir, tmp_path, capsys):
    rows = table_rows(n_samples=8)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ids.txt").write_text("\n".join(SAMPLES) + "\n", encoding="utf-8")
    options, keep = SELECTIONS[selection]
    extra = ["--method", "bpa", "--budget", "20"] if method == "bpa" else []
    a = rank(capsys, rm_dir, rows, tmp_path / "a", [*options, *extra])
    b = rank(capsys, rm_dir, [r for r in rows if keep(r)], tmp_path / "b", extra)
    assert_same_numbers(a, b)


@pytest.mark.parametrize("also", [[], ["--models", ",".join(MODELS)]])
def test_samples_n_equals_ranking_the_table_filtered_to_the_chosen_samples(also, rm_dir, tmp_path, capsys):
    from emoreward.data.tables import load_description_table

    rows = table_rows(n_samples=8)
    a = rank(capsys, rm_dir, rows, tmp_path / "a", ["--samples", 5, *also])
    filtered = [r for r in rows if not also or r["model"] in MODELS]
    # the samples --samples chose: those of the filtered table's own draw
    table = load_description_table(write_jsonl(tmp_path / "f.jsonl", filtered)).sample_subset(5, seed=0)
    b = rank(capsys, rm_dir, [r for r in filtered if r["sample"] in table.samples], tmp_path / "b")
    assert_same_numbers(a, b)


@pytest.mark.parametrize("method", ["full", "bpa"])
def test_models_then_samples_equals_ranking_the_rows_of_the_kept_models(method, rm_dir, tmp_path, capsys):
    """Two models that described only some samples (public report V14): ``--models`` + ``--samples`` draws among the
    samples the kept models described, as on the table filtered to their rows (`DescriptionTable.select`)."""
    from emoreward.data.tables import load_description_table

    kept, others = ["alpha", "beta"], ["gamma", "delta"]
    rows = table_rows(n_samples=4, models=kept)  # s0-s3; the other two models: t0-t5 only
    rows += [{**r, "sample": f"t{r['sample']}"} for r in table_rows(n_samples=6, models=others, seed=2)]
    extra = ["--method", "bpa"] if method == "bpa" else []
    a = rank(capsys, rm_dir, rows, tmp_path / "a", ["--models", ",".join(kept), "--samples", 3, *extra])
    filtered = [r for r in rows if r["model"] in kept]
    table = load_description_table(write_jsonl(tmp_path / "f.jsonl", filtered)).sample_subset(3, seed=0)
    b = rank(capsys, rm_dir, [r for r in filtered if r["sample"] in table.samples], tmp_path / "b", extra)
    assert_same_numbers(a, b)
    assert a["n_samples"] == 3 and len(a["models"]) == 2
    if method == "bpa":  # every query on a sample both models described: 3 of 3 at the default budget
        assert (a["n_pairs"], a["full_pairs"], sorted(a["n_comparisons"].values())) == (3, 3, [3, 3])
    else:
        assert sum(map(sum, a["W"]["wins"])) + sum(map(sum, a["W"]["ties"])) // 2 == 3


@pytest.mark.parametrize("method", ["full", "bpa"])
def test_models_then_samples_draws_among_the_samples_the_kept_models_share(method, rm_dir, tmp_path, capsys):
    """Partial overlap (rtG2 g03): alpha described s0-s3, beta s2-s7, so the two share s2 and s3 only; a sample one
    kept model described gives no comparison. ``--models alpha,beta --samples 2`` draws among the 2 shared samples
    whatever the seed (`DescriptionTable.comparable_samples`), so every draw equals ranking the rows of alpha and
    beta on s2, s3; ``--samples 3`` is one line naming the 2 there are, exit 2, before any scoring."""
    rows = [r for r in table_rows(n_samples=8) if not (r["model"] == "alpha" and int(r["sample"][1:]) >= 4)]
    rows = [r for r in rows if not (r["model"] == "beta" and int(r["sample"][1:]) < 2)]
    extra = ["--method", "bpa"] if method == "bpa" else []
    shared = [r for r in rows if r["model"] in ("alpha", "beta") and r["sample"] in ("s2", "s3")]
    for seed in (1, 2):  # --seed seeds the bootstrap too: the same on both sides
        a = rank(capsys, rm_dir, rows, tmp_path / f"a{seed}", ["--models", "alpha,beta", "--samples", 2, "--seed", seed,
                                                              *extra])  # fmt: skip
        assert_same_numbers(a, rank(capsys, rm_dir, shared, tmp_path / f"b{seed}", ["--seed", seed, *extra]))
        assert a["n_samples"] == 2
        if method == "bpa":  # the one model pair on each shared sample: 2 of 2 at the default budget
            assert (a["n_pairs"], a["full_pairs"]) == (2, 2)
        else:
            assert sum(map(sum, a["W"]["wins"])) + sum(map(sum, a["W"]["ties"])) // 2 == 2
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    code, out, err = run_cli(capsys, ["rank", "--judge", rm_dir, "--data", table, "--models", "alpha,beta",
                                      "--samples", 3, "--no-cache", "--quiet", *extra])  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--samples 3" in err and "has 2 samples on which two of the selected 2 models can be compared" in err


@pytest.mark.parametrize(
    "scheme, per_sample",
    [([], 6 * 2), (["--hierarchical", "alpha,beta|gamma,delta"], 3 * 2)],
    ids=["full", "hierarchical"],
)
def test_a_subset_after_a_run_makes_no_judge_call(scheme, per_sample, length_judge_yaml, tmp_path, capsys):
    """Every call of ``--samples N`` (or ``--models``) was made by the run on the whole table: the call cache finds
    it by its content (`zero_shot.cache.CallKey.content`), whatever order the pair was first asked in, so 0 calls
    are made and the report counts each one reused. Hierarchical: 2 group pairs + the winners' pair per sample (the
    length judge's winners, beta and delta, on any subset: model k writes 3 + 3k words)."""
    import random

    rows = [{"sample": f"s{s}", "model": m, "description": " ".join(random.Random(s).choices(WORDS, k=3 + 3 * k))}
            for s in range(5) for k, m in enumerate(("alpha", "beta", "gamma", "delta"))]  # fmt: skip
    cache = tmp_path / "cache"

    def cost(name, *extra):
        folder = tmp_path / name
        folder.mkdir()
        table = write_jsonl(folder / "table.jsonl", rows)
        run_ok(capsys, ["rank", "--judge", length_judge_yaml, "--data", table, "--output", folder / "r.json",
                        "--n-boot", 20, "--cache-dir", cache, "--quiet", *scheme, *extra])  # fmt: skip
        return read_json(folder / "r.json")["cost"]

    whole = cost("whole")
    assert (whole["n_judge_calls"], whole["n_reused"]) == (5 * per_sample, 0)
    part = cost("part", "--samples", 2)
    assert (part["n_judge_calls"], part["n_reused"]) == (0, 2 * per_sample)
    if not scheme:  # two of the four models: their one pair on each sample, both orders
        kept = cost("kept", "--models", "delta,alpha")
        assert (kept["n_judge_calls"], kept["n_reused"]) == (0, 5 * 2)


def test_judge_limit_keeps_the_same_pairs_whatever_the_rows_order(length_judge_yaml, tmp_path, capsys):
    """`judge --limit 10` judges the first 10 pairs in content order (`data.pairs.first_pairs`): the file shuffled
    with renamed samples gives the same figures, and so does judging a file of just the pairs it judged. Before, it
    took the first 10 rows, so a shuffled file judged other pairs."""
    import json

    rows = pair_rows(24)
    renamed = shuffled([{**r, "sample_id": f"clip-{r['sample_id']}"} for r in rows], seed=4)

    def judge(name, data, extra):
        out = tmp_path / name
        run_ok(capsys, ["judge", "--judge", length_judge_yaml, "--data", write_jsonl(tmp_path / f"{name}.jsonl", data),
                        "--output", out, "--no-progress", *extra])  # fmt: skip
        lines = (out / "judgements_S1.jsonl").read_text().splitlines()
        return read_json(out / "report.json"), sorted({json.loads(line)["sample_id"] for line in lines})

    limited, ids = judge("a", rows, ["--limit", "10"])
    again, renamed_ids = judge("b", renamed, ["--limit", "10"])
    alone, _ = judge("c", [r for r in rows if r["sample_id"] in ids], [])
    assert len(ids) == 10 and renamed_ids == sorted(f"clip-{i}" for i in ids)
    assert ids != sorted(r["sample_id"] for r in rows[:10])  # not the file's first rows
    for other in (again, alone):
        assert_same_numbers(limited, other, ignore=(r"markdown$", r"/calls/", r"/notes/"))


def test_a_selection_spelled_as_written_in_the_file_selects_the_same(rm_dir, tmp_path, capsys):
    """The table reads its names in their normal form (`normal_name`: NFC, one space); `--models` and the
    `--sample-ids` file are read the same way, so a name copied from the file (a double space, an NFD accent)
    selects what its normal form selects."""
    import unicodedata

    spelled = {"alpha": "Alpha  Zéro", "delta": "Delta One", "gamma": "Gamma Dé"}
    rows = [{**r, "model": spelled.get(r["model"], r["model"])} for r in table_rows(n_samples=8)]
    rows = [{**r, "sample": unicodedata.normalize("NFD", f"é{r['sample']}")} for r in rows]  # NFD in the file
    ids = [unicodedata.normalize("NFD", f"é{s}") for s in SAMPLES]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    (tmp_path / "a" / "ids.txt").write_text("\n".join(ids) + "\n", encoding="utf-8")
    (tmp_path / "b" / "ids.txt").write_text(
        "\n".join(unicodedata.normalize("NFC", s) for s in ids) + "\n", encoding="utf-8"
    )
    as_written = ",".join(spelled[m] for m in MODELS)
    normal = ",".join(" ".join(unicodedata.normalize("NFC", spelled[m]).split()) for m in MODELS)
    a = rank(capsys, rm_dir, rows, tmp_path / "a", ["--models", as_written, "--sample-ids", "{folder}/ids.txt"])
    b = rank(capsys, rm_dir, rows, tmp_path / "b", ["--models", normal, "--sample-ids", "{folder}/ids.txt"])
    assert_same_numbers(a, b)
    assert len(a["models"]) == 3
