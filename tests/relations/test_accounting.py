"""Accounting: every count a report prints equals the work done. The judge calls `rank` and `judge` print equal
the requests the scripted judge answered (it writes one line per request to ``calls_log``), for every order and
run option; the comparisons per model equal the verdicts in W; the BPA budget is what was asked, in distinct (sample,
model pair) queries, each asked once at the default budget; the hierarchical scheme asks its stages' pairs only
(judge calls and reward-model scorings as the report counts them); a reward model's
scored descriptions are the distinct texts; `train`'s folds hold every pair exactly once.

Owners: `emoreward.ranking.report` (`_cost_line`, the report's counts), `emoreward.ranking.judging` and
`zero_shot.runner` (the calls they count), `emoreward.ranking.methods.queries_report` (a method's queries),
`emoreward.ranking.active.rank_with_bpa` with
`BPAScheduler.next_pair(open_pairs)` (distinct queries), `emoreward.training.pipeline.stratified_folds`.
"""

from __future__ import annotations

import math

import pytest
from _inputs import annotated_pair_rows, n_boot, pair_rows, read_json, run_ok, table_rows, train_recipe, write_jsonl


COVERS = {
    "rank": (
        "*",
        "--runs",
        "--no-swap",
        "--budget",
        "--policy",
        "--exploration",
        "--committee-calibration",
        "--hierarchical",
    ),
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
    "hierarchical": ["--hierarchical", "2"],
}


@pytest.mark.parametrize("options", list(RANK_OPTIONS))
def test_rank_counts_equal_the_judge_calls_made(options, tmp_path, capsys):
    spec, log = counting_judge(tmp_path)
    rows = table_rows(n_samples=6)
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    printed = run_ok(capsys, ["rank", "--judge", spec, "--data", table, "--output", out, *n_boot(20, RANK_OPTIONS[options]), "--no-cache",
                              "--quiet", *RANK_OPTIONS[options]])  # fmt: skip
    report = read_json(out)
    cost = report["cost"]
    made = calls(log)
    if options == "bpa":
        assert cost["n_calls"] == made and cost["n_queries"] == report["n_pairs"] <= 25
        assert cost["n_calls"] + cost["n_reused"] == 2 * cost["n_queries"]
        assert f"{cost['n_queries']} pairs, {made} judge calls" in printed
        return
    if options == "hierarchical":  # two groups of two: each group's pair, then the winners' pair, on the 6 samples
        n_pairs = 3 * 6
        assert cost["n_pairs"] == n_pairs and cost["n_judge_calls"] == made
        assert made + cost["n_reused"] == 2 * n_pairs
        assert cost["n_records"] == 2 * n_pairs - cost["n_invalid"] == report["hierarchical"]["n_comparisons"]
        assert f"Judge calls: {made} ({n_pairs} pairs x orders x runs" in printed
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


def test_hierarchical_scores_only_the_texts_of_the_pairs_it_asks(rm_dir, tmp_path, capsys):
    """A reward model under the hierarchical scheme: the texts scored are those of the queries asked (a one-model
    group's model only meets the other winner), the pair queries those of the stages, and the cost line says both."""
    rows = table_rows(n_samples=5)
    models = sorted({r["model"] for r in rows})
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    groups = f"{models[0]}|{','.join(models[1:])}"  # {m0} and {m1, m2, m3}: C(3,2) pairs, then the winners' pair
    printed = run_ok(capsys, ["rank", "--judge", rm_dir, "--data", table, "--hierarchical", groups, "--no-cache",
                              *n_boot(20, []), "--quiet", "--output", out])  # fmt: skip
    report = read_json(out)
    cost = report["cost"]
    asked = {r["description"] for r in rows}  # every model is in a pair of some stage: every text, once
    assert cost["annotator"]["n_scored"] == cost["n_judge_calls"] == len(asked)
    assert cost["n_pairs"] == cost["n_records"] == (3 + 1) * 5 == report["hierarchical"]["n_comparisons"]
    assert f"Judge calls: {len(asked)} reward-model scorings (distinct texts scored; 0 more from cache" in printed
    assert f"answering {(3 + 1) * 5} pair queries" in printed


@pytest.mark.parametrize("policy", ["exploration", "paper", "random"])
def test_bpa_at_its_default_budget_asks_every_pair_of_every_sample_once(policy, rm_dir, tmp_path, capsys):
    """Counts of distinct work (public report V01): the default budget is C(M,2) x N, and the report's queries are
    distinct (sample, model pair) comparisons: each model compared (M-1) x N times, no pair asked twice."""
    table = write_jsonl(tmp_path / "t.jsonl", table_rows(n_samples=5))
    out = tmp_path / "r.json"
    printed = run_ok(capsys, ["rank", "--judge", rm_dir, "--data", table, "--method", "bpa", "--sigma-tau", "1e-9",
                              "--tie-threshold", "0", "--policy", policy, "--no-cache", "--quiet", "--output", out])  # fmt: skip
    report = read_json(out)
    assert report["budget"] == report["n_pairs"] == report["full_pairs"] == math.comb(4, 2) * 5
    assert report["n_comparisons"] == dict.fromkeys(report["models"], 3 * 5)
    assert "Comparisons: 30 pairs asked of the 30 a full ranking asks (100.0%)" in printed


def test_bpa_names_the_exploration_rule_that_picked_its_pairs_under_every_policy(rm_dir, tmp_path, capsys):
    """`--exploration` where the policy reads it (`BPA.reads_exploration`): the report names the rule and some pairs
    were picked by exploration; where it reads none (`--policy random`), the option is one line, exit 2, before any
    work, and the report's rule is null (it once said match_quality beside 0 exploration pairs, exit 0)."""
    from _inputs import run_cli

    from emoreward.ranking.methods import BPA

    table = write_jsonl(tmp_path / "t.jsonl", table_rows(n_samples=4))
    reading = []
    for policy in BPA.POLICIES:
        out = tmp_path / policy / "r.json"
        argv = ["rank", "--judge", rm_dir, "--data", table, "--method", "bpa", "--budget", 12, "--policy", policy,
                "--no-cache", "--quiet", "--output", out]  # fmt: skip
        code, _, err = run_cli(capsys, [*argv, "--exploration", "match_quality"])
        if code == 0:
            reading.append(policy)
            report = read_json(out)
            assert report["exploration_rule"] == "match_quality" and report["strategy_counts"]["exploration"] > 0
            continue
        assert code == 2 and err.count("\n") == 1 and "--exploration is the exploration rule of" in err
        assert not out.parent.exists()
        run_ok(capsys, argv)
        report = read_json(out)
        assert report["exploration_rule"] is None and report["strategy_counts"]["exploration"] == 0, policy
        assert sum(report["strategy_counts"].values()) == report["n_pairs"] == 12
    assert reading == ["exploration", "paper", "bpa"]  # random picks uniformly: no rule to name


@pytest.mark.parametrize("budget", [7, 20, 30])
@pytest.mark.parametrize("policy", ["exploration", "paper", "random"])
def test_bpa_queries_are_distinct_at_every_budget(policy, budget):
    """`rank_with_bpa` never asks a (sample, model pair) twice: its ``n_pairs`` is the number of distinct queries
    the annotator answered (a length annotator of the test's own, one record per query)."""
    from emoreward.data.tables import DescriptionTable
    from emoreward.data.verdicts import Verdict
    from emoreward.ranking.active import rank_with_bpa
    from emoreward.ranking.bpa import SchedulerConfig
    from emoreward.ranking.records import PairwiseRecord

    table = DescriptionTable.from_rows(table_rows(n_samples=5))
    asked = []

    def answer(sample, a, b):
        asked.append((sample, frozenset((a, b))))
        la, lb = (len(table.descriptions[sample, m]) for m in (a, b))
        verdict = Verdict.FIRST if la > lb else Verdict.SECOND if lb > la else Verdict.TIE
        return [PairwiseRecord(a, b, verdict, "length", sample)]

    policy_config = {"paper": {"policy": "bpa", "exploration_rule": "match_quality"}}.get(policy, {"policy": policy})
    report = rank_with_bpa(answer, table, budget=budget, scheduler_config=SchedulerConfig(**policy_config))
    assert len(asked) == len(set(asked)) == report.n_pairs == budget


@pytest.mark.parametrize("method", ["full", "bpa"])
def test_a_committee_ledger_counts_every_call_the_command_made(method, rm_dir, tmp_path, capsys):
    """One ledger per command: a committee's cost holds each member's calls and those its calibration made, and
    together they are every request the judge answered (its own log)."""
    spec, log = counting_judge(tmp_path)
    table = write_jsonl(tmp_path / "t.jsonl", table_rows(n_samples=4))
    calibration = write_jsonl(tmp_path / "c.jsonl", [{**r, "label": "1"} for r in pair_rows(6)])
    out = tmp_path / "r.json"
    extra = ["--method", "bpa", "--budget", "10"] if method == "bpa" else []
    full = [] if method == "bpa" else ["--n-boot", 20]  # the full method's option (refused with BPA)
    printed = run_ok(capsys, ["rank", "--judge", spec, "--judge", rm_dir, "--data", table, "--committee-calibration",
                              calibration, "--output", out, "--no-cache", "--quiet", *extra, *full])  # fmt: skip
    cost = read_json(out)["cost"]
    spent = cost["calibration"][str(spec)]
    member = cost["members"][str(spec)]
    assert member.get("n_calls", member.get("n_judge_calls")) + spent["n_calls"] == calls(log)
    assert spent["n_verdicts"] == 6 * 2 and cost["calibration"][str(rm_dir)]["n_verdicts"] == 6 * 2
    assert f"- calibration of {spec}: {spent['n_calls']} judge calls" in printed


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
    # one ledger: the printed line and the JSON from the same values, the parts adding up to the calls made
    cost = report["cost"]
    parts = cost["parts"]
    assert cost["total"]["made"] == made and parts["pairs"]["made"] + parts["controlled_negatives"]["made"] == made
    assert parts["pairs"]["made"] + parts["pairs"]["reused_greedy"] == 12 * orders * runs
    pairs_made, negatives_made = parts["pairs"]["made"], parts["controlled_negatives"]["made"]
    assert f"(pairs: {pairs_made} made" in printed and f"; controlled negatives: {negatives_made} made" in printed
    # the sentence under the table says what ran (`runner.table_note`), never swapped runs that were not made
    markdown = (out / "report.md").read_text()
    assert f"Mean ± std over {runs} run(s); " in markdown
    if orders == 1:
        assert "normal order only (--no-swap): swap consistency and N+S not measured" in markdown
        assert "swapped runs" not in markdown and "run r swapped" not in markdown
    else:
        assert "N+S = majority over 2 normal + 2 swapped runs, split votes -> tie." in markdown


def test_evaluate_counts_the_descriptions_it_scored(rm_dir, tmp_path, capsys):
    rows = pair_rows(12)
    out = tmp_path / "e.json"
    printed = run_ok(capsys, ["evaluate", "--model", rm_dir, "--data", write_jsonl(tmp_path / "p.jsonl", rows),
                              "--output", out])  # fmt: skip
    report = read_json(out)
    distinct = {t for r in rows for t in (r["description_1"], r["description_2"])}
    assert report["n_descriptions_scored"] == len(distinct)
    controlled = report["controlled_errors"]  # its own count: the originals were scored with the pairs, only the
    negatives = {negative for _, negative in controlled_texts(rows)}  # negatives are new work
    assert controlled["n_descriptions_scored"] == len(negatives) and controlled["n_negatives"] == len(negatives)
    assert sum(map(sum, report["judge"]["three_class"]["confusion"])) == len(rows)
    # the cost line counts everything the command scored, from the JSON's ledger: the pairs and the negatives
    cost = report["cost"]
    assert cost["parts"]["pairs"]["scored"] == len(distinct) and cost["parts"]["controlled_negatives"]["scored"] == (
        len(negatives)
    )
    assert cost["total"]["scored"] == len(distinct) + len(negatives)
    assert (
        cost["total"]["seconds"]
        == cost["parts"]["pairs"]["seconds"] + cost["parts"]["controlled_negatives"]["seconds"]
    )
    assert (
        f"scored {len(distinct) + len(negatives)} descriptions in {cost['total']['seconds']:.1f} s (pairs: " in printed
    )


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


def test_several_pairs_per_sample_and_annotator_labels_split_by_sample_and_add_up(tiny_bert_dir, tmp_path, capsys):
    # 8 samples x 3 pairs, 7 rows per sample (one per annotator): trained, cross-validated, evaluated
    rows = annotated_pair_rows(8)
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    recipe = train_recipe(tmp_path, tiny_bert_dir, data, final_fit=True)
    printed = run_ok(capsys, ["train", "--config", recipe, "--cv_folds", "3"])
    assert "loaded 24 pairs of 8 samples from 56 records" in printed
    report = read_json(tmp_path / "out" / "report.json")
    assert (report["n_pairs"], report["n_samples"], report["n_records"]) == (24, 8, 56)
    votes = report["annotators"]
    assert (votes["n_repeated"], votes["n_labels"], votes["n_annotators"]) == (16, 56, 3)
    # alpha by hand: 8 units (1,1,1) and 8 (1,2,2), each also in the pair's other order ((2,2,2), (2,1,1)): with
    # m = 3, o11 = o22 = 8*3 + 8*1 = 32, o12 = o21 = 16; n = 96, n1 = n2 = 48:
    # ((n-1) * 64 - 2*48*47) / (n(n-1) - 2*48*47) = 1568 / 4608 = 49/144
    assert votes["majority_share"] == pytest.approx(100 * 40 / 48) and votes["alpha"] == pytest.approx(49 / 144)
    folds = report["cross_validation"]["folds"]
    held_out = [set(f["pair_rewards"]["sample_id"]) for f in folds]
    for k, samples in enumerate(held_out):  # a sample held out by fold k trains no other pair of fold k
        assert not samples & set().union(*(h for j, h in enumerate(held_out) if j != k))
    assert set().union(*held_out) == {f"s{s}" for s in range(8)}
    assert sum(f["n_pairs"] for f in folds) == 24 and all(f["n_train"] + f["n_pairs"] == 24 for f in folds)
    assert sum(f["weighting"]["n_samples"] for f in folds) == 8
    assert report["cross_validation"]["weighting"] == {"unit": "pair", "n_pairs": 24, "n_samples": 8}
    assert (
        "Each figure weighs each pair once (24 pairs of 8 samples, at most 3 pairs per sample)" in (report["markdown"])
    )

    out = tmp_path / "e.json"
    printed = run_ok(capsys, ["evaluate", "--model", tmp_path / "out" / "model", "--data", data, "--output", out])
    evaluation = read_json(out)
    assert evaluation["n_pairs"] == 24 and evaluation["n_in_sample_pairs"] == 24
    assert evaluation["weighting"] == {"unit": "pair", "n_pairs": 24, "n_samples": 8, "max_pairs_per_sample": 3}
    assert evaluation["annotators"] == votes
    # the Markdown is rendered from the JSON's values: the per-sample rows and the note
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    per_sample = evaluation["judge"]["two_class_per_sample"]
    assert per_sample["n"] == 24
    assert f"| 2-class ACC, each sample once | {per_sample['acc']:.2f} |" in markdown
    assert "56 labels from 3 annotators, 16 of 24 pairs labelled more than once" in markdown
    assert "83.3% of their labels agree with the pair's label, Krippendorff's alpha 0.340" in markdown
    # the in-sample check is by sample: a new pair sharing a trained sample's description is flagged, a new sample not
    new = [
        {
            "sample_id": "s0",
            "description_1": rows[0]["description_1"],
            "description_2": "She is furious.",
            "label": "1",
        },
        {"sample_id": "n1", "description_1": "He laughs.", "description_2": "He weeps.", "label": "1"},
    ]
    printed = run_ok(capsys, ["evaluate", "--model", tmp_path / "out" / "model", "--data",
                              write_jsonl(tmp_path / "new.jsonl", new), "--output", tmp_path / "n.json"])  # fmt: skip
    assert read_json(tmp_path / "n.json")["n_in_sample_pairs"] == 1 and "warning: 1 of 2 pairs" in printed


def test_a_zero_shot_report_says_how_it_weighs_samples(length_judge_yaml, tmp_path, capsys):
    data = write_jsonl(tmp_path / "t.jsonl", annotated_pair_rows(4))
    out = tmp_path / "j"
    run_ok(capsys, ["judge", "--judge", length_judge_yaml, "--data", data, "--output", out, "--no-progress"])
    report = read_json(out / "report.json")
    evaluation = report["strategies"]["S1"]["evaluation"]
    assert report["n_pairs"] == 12
    assert evaluation["weighting"] == {"unit": "pair", "n_pairs": 12, "n_samples": 4, "max_pairs_per_sample": 3}
    assert evaluation["annotators"]["n_labels"] == 28 and evaluation["judge"]["two_class_per_sample"]["n"] == 12
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "Each figure weighs each pair once (12 pairs of 4 samples, at most 3 pairs per sample)" in markdown
    assert "28 labels from 3 annotators, 8 of 12 pairs labelled more than once" in markdown


def test_the_cost_line_counts_the_pairs_a_sparse_table_has_and_says_so(rm_dir, tmp_path, capsys):
    """One model without two samples: the pair calls a generative judge would make are the pairs of models that both
    described a sample (6 x 6 + 3 x 2 = 42 with 4 models, 8 samples), and the line says so (it read "C(M,2) x N",
    which is 48 here; issue 41 #4, minor)."""
    rows = table_rows()
    last = sorted({r["model"] for r in rows})[-1]
    rows = [r for r in rows if not (r["model"] == last and r["sample"] in ("s0", "s1"))]
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    printed = run_ok(capsys, ["rank", "--judge", rm_dir, "--data", table, "--no-cache", *n_boot(20, []), "--quiet",
                              "--no-length-control", "--output", out])  # fmt: skip
    cost = read_json(out)["cost"]
    assert cost["generative_pair_calls"] == cost["n_pair_verdicts"] == 6 * 6 + 3 * 2
    line = next(line for line in printed.splitlines() if line.startswith("Judge calls:"))
    assert "would need 42 pair calls (one per pair of models on each sample both described" in line
    assert "swapped order: 84)" in line


def test_bpa_counts_the_pairs_a_sparse_table_has_and_says_so(rm_dir, tmp_path, capsys):
    """The same sparse table under BPA at its default budget: a full ranking asks the 42 pairs of models that both
    described a sample, each once, and the line names that count, not C(M,2) x N = 48 (it read "of the full C(M,2) x
    N = 42")."""
    rows = table_rows()
    last = sorted({r["model"] for r in rows})[-1]
    rows = [r for r in rows if not (r["model"] == last and r["sample"] in ("s0", "s1"))]
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "r.json"
    printed = run_ok(capsys, ["rank", "--judge", rm_dir, "--data", table, "--method", "bpa", "--sigma-tau", "1e-9",
                              "--tie-threshold", "0", "--no-cache", "--quiet", "--output", out])  # fmt: skip
    report = read_json(out)
    assert report["budget"] == report["n_pairs"] == report["full_pairs"] == 6 * 6 + 3 * 2
    assert "Comparisons: 42 pairs asked of the 42 a full ranking asks (100.0%)" in printed
    assert "C(M,2) x N on a complete table" in printed


def test_a_cv_figure_some_folds_could_not_give_says_over_how_many(tiny_bert_dir, tmp_path, capsys):
    """22 pairs (3 ties) in 2 folds: one held-out fold has 10 decided pairs, the other 9, too few for the
    length-controlled logit (`metrics.length_controlled`), so its cells average one fold (`n: 1` in the JSON);
    report.md prints them with "(1 of 2 folds)", read from the JSON record's own n, and every other cell without."""
    from emoreward.evaluation.report import HEADLINE

    rows = pair_rows(22)
    for r in rows[:3]:
        r["label"] = "tie"
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    run_ok(capsys, ["train", "--config", train_recipe(tmp_path, tiny_bert_dir, data)])
    cv = read_json(tmp_path / "out" / "report.json")["cross_validation"]
    decided = sorted(f["label_counts"]["1"] + f["label_counts"]["2"] for f in cv["folds"])
    assert cv["k"] == 2 and decided == [9, 10]
    judge = cv["summary"]["judge"]
    short = {key for key, cell in judge.items() if cell["n"] < cv["k"]}
    assert "lc_coef_judge" in short and all(judge[key]["n"] == 1 for key in short)
    labels = dict(HEADLINE)
    markdown = (tmp_path / "out" / "report.md").read_text()
    for line in markdown.splitlines():
        row = next((key for key, label in labels.items() if line.startswith(f"| {label} |")), None)
        if row is not None and row in judge:
            assert ("(1 of 2 folds)" in line) == (row in short), line
    assert sum("(1 of 2 folds)" in line for line in markdown.splitlines()) >= len(short)
