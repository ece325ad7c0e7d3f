"""The ranking API (`emoreward.ranking.api.rank`) and its two one-file extension points: a toy annotator and a toy
method, each one class registered here, ranked through the API and through `emoreward rank`; the command's report
equals the API's on a reward model, a generative judge and a committee, and the library's front doors (table, judges,
committee) open what the command opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from relations._inputs import assert_same_numbers

from emoreward.cli.main import main
from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import Verdict
from emoreward.ranking.annotators import ANNOTATORS, Annotator, register_annotator
from emoreward.ranking.api import rank
from emoreward.ranking.methods import METHODS, Method, rank_queries, register_method
from emoreward.ranking.records import PairwiseRecord


MODELS = ("alpha", "beta", "gamma")
N_SAMPLES = 4
FIT = {"n_boot": 20, "length_control": False}


def table_rows() -> list[dict]:
    """Model k writes 2 + 2k words on every sample, except that on s0 alpha writes the longest (9 words)."""
    rows = []
    for s in range(N_SAMPLES):
        for k, model in enumerate(MODELS):
            words = 9 if (s, model) == (0, "alpha") else 2 + 2 * k
            rows.append({"sample": f"s{s}", "model": model, "description": " ".join(["calm"] * words)})
    return rows


class LengthAnswer:
    """The toy annotator's answers: the longer description wins; one call per query, counted."""

    name = "toy-length"

    def __init__(self, table: DescriptionTable):
        self.table, self.n_calls = table, 0

    def __call__(self, sample: str, a: str, b: str) -> list[PairwiseRecord]:
        self.n_calls += 1
        la, lb = (len(self.table.descriptions[sample, m].split()) for m in (a, b))
        verdict = Verdict.FIRST if la > lb else Verdict.SECOND if lb > la else Verdict.TIE
        return [PairwiseRecord(a, b, verdict, self.name, sample)]

    def cost(self) -> dict:
        return {"judge": self.name, "n_calls": self.n_calls}


class ToyLengthAnnotator(Annotator):
    """A new annotator in one class: only `pairs` written, the rest from `Annotator`."""

    kind = "toy-length"

    def __init__(self, judge=None):
        self.answers: list[LengthAnswer] = []

    def pairs(self, table):
        self.answers.append(LengthAnswer(table))
        return self.answers[-1]


class Neighbours(Method):
    """A new method in one class: only the model pairs adjacent in table order, on every sample both described."""

    name = "neighbours"

    def run(self, table, annotator, fit):
        queries = [
            (s, a, b)
            for a, b in zip(table.models, table.models[1:])
            for s in table.samples
            if (s, a) in table.descriptions and (s, b) in table.descriptions
        ]
        return rank_queries(table, annotator.pairs(table), queries, fit)


@pytest.fixture
def toys():
    register_annotator(ToyLengthAnnotator)
    register_method(Neighbours)
    yield
    ANNOTATORS.pop(ToyLengthAnnotator.kind)
    METHODS.pop(Neighbours.name)


@pytest.fixture
def table() -> DescriptionTable:
    return DescriptionTable.from_rows(table_rows())


def wins(report, a: str, b: str) -> int:
    items = report.counts.items
    return int(report.counts.wins[items.index(a), items.index(b)])


def test_a_toy_annotator_ranks_by_every_method_through_the_api(toys, table):
    toy = ToyLengthAnnotator()
    report = rank(table, toy, "full", FIT)
    # by hand: gamma beats beta on all 4 samples and alpha on 3; beta beats alpha on 3; alpha wins s0 twice
    assert report.ties.estimate.ranking == ["gamma", "beta", "alpha"]
    assert (wins(report, "gamma", "beta"), wins(report, "gamma", "alpha"), wins(report, "beta", "alpha")) == (4, 3, 3)
    assert (wins(report, "alpha", "gamma"), wins(report, "alpha", "beta")) == (1, 1)
    assert report.cost["n_judge_calls"] == toy.answers[-1].n_calls == report.cost["n_pairs"] == 3 * N_SAMPLES
    bpa = rank(table, toy, "bpa")  # the default budget: every query once
    assert bpa.n_pairs == toy.answers[-1].n_calls == bpa.cost["n_calls"] == 3 * N_SAMPLES
    # hierarchical, by hand: the group {beta, gamma} asks its one pair on the 4 samples (gamma longer on all), then
    # the winners alpha and gamma meet on the 4 (gamma longer on 3, alpha on s0): 8 queries, not the 12 of all pairs
    hierarchical = rank(table, toy, METHODS["hierarchical"]([["alpha"], ["beta", "gamma"]]), FIT)
    assert toy.answers[-1].n_calls == 2 * N_SAMPLES == hierarchical.cost["n_judge_calls"]
    assert hierarchical.cost["n_pairs"] == hierarchical.cost["n_records"] == 2 * N_SAMPLES
    assert (
        hierarchical.hierarchical.group_winners == ["alpha", "gamma"] and hierarchical.hierarchical.winner == "gamma"
    )
    assert hierarchical.hierarchical.n_comparisons == 2 * N_SAMPLES
    assert hierarchical.models == ["alpha", "gamma"]
    assert (wins(hierarchical, "gamma", "alpha"), wins(hierarchical, "alpha", "gamma")) == (3, 1)
    assert f"Judge calls: {2 * N_SAMPLES} ({2 * N_SAMPLES} pairs x orders x runs" in hierarchical.to_markdown()


def test_a_toy_method_asks_only_its_pairs_of_any_annotator(toys, table, tiny_rm_dir):
    from emoreward.models.base import load_reward_model
    from emoreward.ranking.annotators import RewardModelAnnotator

    toy = ToyLengthAnnotator()
    report = rank(table, toy, "neighbours", FIT)
    assert report.cost["n_pairs"] == report.cost["n_judge_calls"] == toy.answers[-1].n_calls == 2 * N_SAMPLES
    order = table.models
    assert wins(report, order[0], order[2]) == wins(report, order[2], order[0]) == 0  # never asked
    model = RewardModelAnnotator(load_reward_model(tiny_rm_dir))
    neighbours, full = rank(table, model, Neighbours(), FIT), rank(table, model, "full", FIT)
    assert neighbours.cost["n_pairs"] == neighbours.cost["annotator"]["n_queries"] == neighbours.cost["n_records"] == 8
    for a, b in zip(order, order[1:]):  # the same verdicts as the full method's on the pairs it asked
        assert (wins(neighbours, a, b), wins(neighbours, b, a)) == (wins(full, a, b), wins(full, b, a))


def run_rank(capsys, *argv) -> dict:
    full = ["--n-boot", "20", "--no-length-control"] if "bpa" not in argv else []  # the full method's options
    code = main(["rank", *map(str, argv), *full, "--no-cache", "--quiet"])
    capsys.readouterr()
    assert code == 0
    return json.loads(Path(argv[argv.index("--output") + 1]).read_text(encoding="utf-8"))


def test_a_toy_method_through_the_command(toys, tiny_rm_dir, tmp_path, capsys):
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in table_rows()), encoding="utf-8")
    report = run_rank(
        capsys, "--judge", tiny_rm_dir, "--data", data, "--method", "neighbours", "--output", tmp_path / "r.json"
    )
    assert report["cost"]["n_pairs"] == report["cost"]["n_records"] == 2 * N_SAMPLES


def test_the_command_ranks_as_the_api(tiny_rm_dir, tmp_path, capsys):
    from emoreward.models.saved import SavedRewardModel
    from emoreward.ranking.annotators import Committee, JudgeAnnotator, RewardModelAnnotator
    from zero_shot import load_judge

    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in table_rows()), encoding="utf-8")
    spec = tmp_path / "len.yaml"
    spec.write_text("name: lengthjudge\nmllm:\n  backend: scripted\n  model: length\n", encoding="utf-8")
    table = DescriptionTable.from_rows(table_rows(), source=str(data))
    fit = {"n_boot": 20, "length_control": False, "seed": 0}
    cases = {
        "reward model": (["--judge", tiny_rm_dir], lambda: RewardModelAnnotator(SavedRewardModel(tiny_rm_dir))),
        "judge": (["--judge", spec], lambda: JudgeAnnotator(load_judge(spec))),
        "committee": (
            ["--judge", tiny_rm_dir, "--judge", spec],
            lambda: Committee(
                {
                    str(tiny_rm_dir): RewardModelAnnotator(SavedRewardModel(tiny_rm_dir)),
                    str(spec): JudgeAnnotator(load_judge(spec)),
                }
            ),
        ),
    }
    for name, (judges, annotator) in cases.items():
        for method in ("full", "bpa"):
            out = tmp_path / f"{name}-{method}.json"
            command = run_rank(capsys, *judges, "--data", data, "--method", method, "--output", out)
            api = rank(table, annotator(), method, fit if method == "full" else None).to_dict()  # BPA: no fit
            ignore = [r"/committee/", r"/warnings/", r"^/judge/"] if name == "committee" else []
            assert_same_numbers(command, api, ignore=ignore)


@pytest.mark.parametrize(
    "case, method, fit, argv",
    [
        ("a fit with BPA", {"budget": 4}, {"n_boot": 5}, ["--budget", "4", "--n-boot", "5"]),
        ("exploration with policy random", {"policy": "random", "exploration": "match_quality"}, None,
         ["--policy", "random", "--exploration", "match_quality"]),
        ("a misspelt option", {"budgit": 4}, None, ["--budgit", "4"]),
    ],
)  # fmt: skip
def test_the_api_refuses_what_the_command_refuses(case, method, fit, argv, table, tiny_rm_dir, tmp_path, capsys):
    """rtG2 g09: BPA options that cannot apply are one ValueError through the API (`BPA.from_options`,
    `Method.check_options`, `BPA.reads_exploration`; `rank` for a ``fit`` with a method that fits its own model,
    `Method.uses_fit`), as `emoreward rank --method bpa` refuses each in one line, exit 2, before any work."""
    from emoreward.ranking.methods import BPA

    toy = ToyLengthAnnotator()
    with pytest.raises(ValueError) as refused:
        rank(table, toy, BPA.from_options(method), fit)
    assert str(refused.value).count("\n") == 0 and not toy.answers  # refused before any pair was asked
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in table_rows()), encoding="utf-8")
    with pytest.raises(SystemExit) as exited:  # argparse refuses an unknown option itself
        code = main(["rank", "--judge", str(tiny_rm_dir), "--data", str(data), "--method", "bpa", *argv, "--no-cache"])
        raise SystemExit(code)
    assert exited.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) <= 2  # one line (argparse adds its usage line)


def test_method_hierarchical_is_the_hierarchical_option(tiny_rm_dir, tmp_path, capsys):
    """``--method hierarchical`` (a registered method) ranks as ``--hierarchical`` alone always did."""
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in table_rows()), encoding="utf-8")
    common = ["--judge", tiny_rm_dir, "--data", data, "--hierarchical", "alpha|beta,gamma"]
    a = run_rank(capsys, *common, "--output", tmp_path / "a.json")
    b = run_rank(capsys, *common, "--method", "hierarchical", "--output", tmp_path / "b.json")
    assert_same_numbers(a, b)
    assert a["hierarchical"]["group_winners"] and len(a["hierarchical"]["group_winners"]) == 2


def test_a_committee_opened_by_the_library_ranks_as_the_command(tiny_rm_dir, tmp_path, capsys):
    """The command's steps are the library's front doors: a calibrated committee on a model subset, opened by
    `load_selection`, `open_annotator`, `distinct_judges`, `calibration_pairs` and `open_committee`, ranked by `rank`,
    gives the command's report (the committee's weights and members included) and its warnings."""
    from emoreward.data.tables import load_selection
    from emoreward.judges import distinct_judges, open_annotator, open_committee
    from emoreward.ranking.committee import calibration_pairs

    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in table_rows()), encoding="utf-8")
    spec = tmp_path / "len.yaml"
    spec.write_text("name: lengthjudge\nmllm:\n  backend: scripted\n  model: length\n", encoding="utf-8")
    # the length judge agrees with both labels (the longer description), in both orders: 4 of 4
    pairs = [{"sample_id": "s1", "description_1": "calm " * 6, "description_2": "calm", "label": "1"},
             {"sample_id": "s2", "description_1": "calm calm", "description_2": "calm " * 8, "label": "2"}]  # fmt: skip
    labelled = tmp_path / "pairs.jsonl"
    labelled.write_text("".join(json.dumps(r) + "\n" for r in pairs), encoding="utf-8")
    judges = [str(tiny_rm_dir), str(spec)]
    out = tmp_path / "c.json"
    argv = ["--judge", judges[0], "--judge", judges[1], "--data", str(data), "--models", "gamma,alpha"]
    argv += ["--committee-calibration", str(labelled), "--n-boot", "20", "--no-length-control", "--no-cache"]
    capsys.readouterr()
    assert main(["rank", *argv, "--output", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    command = json.loads(out.read_text(encoding="utf-8"))

    table = load_selection(data, "gamma,alpha")
    assert sorted(table.models) == ["alpha", "gamma"] and table.n_samples == N_SAMPLES
    members = {s: open_annotator(s, {"no_cache": True}, table) for s in judges}
    warnings: list[str] = []
    committee = open_committee(
        members, distinct_judges(judges), calibration_pairs(str(labelled)), str(labelled), warn=warnings.append
    )
    api = rank(table, committee, "full", {"n_boot": 20, "length_control": False, "seed": 0}).to_dict()
    assert_same_numbers(command, api, ignore=[r"^/judge/", r"^/data/", r"^/score_cache/"])
    assert command["committee"]["weighting"] == "log_odds" and command["committee"]["n_calibration_pairs"] == 2
    assert not warnings and "warning" not in err
    open_committee(members, distinct_judges(judges), warn=warnings.append)  # no calibration: equal weights, said
    assert warnings == [
        "no --committee-calibration: the 2 committee members vote with equal weights (E3mo-Bench's ablation without "
        "confidence weights)"
    ]
