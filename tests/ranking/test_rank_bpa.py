"""`emoreward rank --method bpa`: BPA with the judge in the loop on synthetic description tables."""

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from _helpers import StubRewardModel
from scipy.stats import spearmanr

from emoreward.cli import main
from emoreward.cli.rank import add_arguments as add_rank_arguments
from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import Judgement, Verdict
from emoreward.ranking.active import RewardModelPairs, rank_with_bpa
from emoreward.ranking.bpa import PAPER_SCHEDULING, BPAConfig, SchedulerConfig
from emoreward.ranking.judging import JudgePairs


STRENGTHS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def strength_table(strengths=STRENGTHS, n_samples=40, seed=0):
    """Model m writes "m<k> q<x>" where x = strength + N(0, 1) per sample: the judges below read x."""
    rng = np.random.default_rng(seed)
    rows = [
        {"sample": f"s{s:03d}", "model": f"m{k}", "description": f"m{k} q{v + rng.normal(0, 1.0):.3f}"}
        for s in range(n_samples)
        for k, v in enumerate(strengths)
    ]
    return DescriptionTable.from_rows(rows)


def quality(text):
    return float(text.split(" q")[1])


class QualityModel(StubRewardModel):
    """Stand-in reward model: reward = the quality written in the description; counts what it scores."""

    def __init__(self, tie_threshold=0.1):
        super().__init__(tie_threshold)

    def reward(self, description, subtitle):
        return quality(description)


class NoisyJudge:
    """Generative stand-in: prefers the higher quality with probability sigmoid(2 * gap); counts calls."""

    name = "noisy"

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.n_calls = 0

    def judge(self, pairs, *, run=0):
        self.n_calls += len(pairs)
        out = []
        for p in pairs:
            gap = quality(p.description_1) - quality(p.description_2)
            first = self.rng.random() < 1.0 / (1.0 + np.exp(-2.0 * gap))
            out.append(Judgement(p.sample_id, Verdict.FIRST if first else Verdict.SECOND, run=run))
        return out


def spearman(report):
    return spearmanr([report.fit.scores[f"m{k}"] for k in range(len(STRENGTHS))], STRENGTHS).statistic


def test_reward_model_bpa_recovers_order_within_budget():
    table = strength_table()
    model = QualityModel()
    answer = RewardModelPairs(model, table)
    config = BPAConfig(sigma_tau=1e-3)  # never converges: the budget stops it
    report = rank_with_bpa(answer, table, budget=150, config=config, scheduler_config=SchedulerConfig(seed=1))
    assert report.n_pairs == 150 and report.stopped_by == "budget"
    assert report.full_pairs == 15 * 40
    assert spearman(report) >= 0.94 and report.ranking[0] == "m5"
    # one verdict per query; only descriptions the queries touched were scored, each once
    assert len(report.records) == 150 and report.cost["n_queries"] == 150
    touched = {(r.sample, m) for r in report.records for m in (r.item_a, r.item_b)}
    assert model.n_scored == report.cost["n_scored"] == len(touched) < 6 * 40
    text = report.to_markdown()
    assert "150 pairs asked of the 600 a full ranking asks (25.0%)" in text and "Stopped by budget" in text
    assert " ± " in text and report.to_dict()["ranking"] == report.ranking


def test_bpa_warns_about_tied_verdicts_as_the_full_method_does():
    # a tie threshold wider than every quality gap: every verdict BPA asks for is a tie
    table = strength_table(n_samples=10)
    report = rank_with_bpa(RewardModelPairs(QualityModel(tie_threshold=100.0), table), table, budget=30)
    n = len(report.records)
    expected = (
        f"100.0% of the {n} verdicts are ties below the tie threshold |r1 - r2| < 100 (calibrated on the reward "
        "model's training pairs, whose rewards may differ more than these descriptions'): the thresholded fits rest "
        "on 0 decisive verdicts; lower the threshold (--tie-threshold) to use more."
    )
    assert report.warnings == [expected] and report.to_dict()["warnings"] == [expected]
    assert report.to_dict()["tie_threshold"] == 100.0 and f"Warnings (1):\n\n- {expected}" in report.to_markdown()
    decisive = rank_with_bpa(RewardModelPairs(QualityModel(tie_threshold=0.0), table), table, budget=30)
    assert decisive.warnings == [] and "Warnings" not in decisive.to_markdown()


def test_sigma_tau_stops_before_the_budget():
    table = strength_table()
    config = BPAConfig(sigma_tau=0.6)
    sconfig = SchedulerConfig(refit_every=5, seed=0)
    report = rank_with_bpa(
        RewardModelPairs(QualityModel(), table), table, budget=600, config=config, scheduler_config=sconfig
    )
    assert report.stopped_by == "sigma_tau" and report.n_pairs < 600
    assert report.fit.mean_sigma < 0.6
    assert all(s >= 0.6 for _, s in report.history[:-1])  # not earlier than the rule says
    assert spearman(report) >= 0.8


def test_generative_judge_through_the_harness_with_ranking_variance_exploration():
    table = strength_table(n_samples=30)
    judge = NoisyJudge()
    answer = JudgePairs(judge, table)  # normal + swapped order: two verdicts per query
    sconfig = SchedulerConfig(policy="exploration", exploration_rule="ranking_variance", seed=0)
    report = rank_with_bpa(answer, table, budget=120, config=BPAConfig(sigma_tau=1e-3), scheduler_config=sconfig)
    assert report.n_pairs == 120 and judge.n_calls == 240 == report.cost["n_calls"]
    assert len(report.records) == 240 and report.cost["n_invalid"] == 0
    assert spearman(report) >= 0.9


def test_pairs_cycle_through_samples_and_stop_when_exhausted():
    table = strength_table(strengths=[0.0, 0.5], n_samples=12)
    report = rank_with_bpa(
        RewardModelPairs(QualityModel(), table), table, budget=100, config=BPAConfig(sigma_tau=1e-3)
    )
    samples = [r.sample for r in report.records]
    assert sorted(samples) == sorted(table.samples)  # every sample once before any repeat
    assert report.stopped_by == "exhausted" and report.n_pairs == report.full_pairs == 12


def parser():
    p = argparse.ArgumentParser(prog="emoreward rank")
    add_rank_arguments(p)
    return p


def test_help_lists_bpa_options(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--method", "--budget", "--sigma-tau", "--refit-every", "--exploration", "--policy"):
        assert flag in out


def test_cli_method_bpa_defaults_to_ranking_variance_exploration(tmp_path, tiny_rm_dir, capsys):
    table = strength_table(n_samples=20)
    path = tmp_path / "table.jsonl"
    path.write_text(
        "".join(
            json.dumps({"sample": s, "model": m, "description": d}) + "\n" for (s, m), d in table.descriptions.items()
        )
    )
    out = tmp_path / "bpa.json"
    argv = ["rank", "--method", "bpa", "--judge", str(tiny_rm_dir), "--data", str(path), "--no-cache"]
    argv += ["--budget", "80", "--sigma-tau", "0.001", "--output", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "80 pairs asked of the 300 a full ranking asks" in captured.out and "Stopped by budget" in captured.out
    assert "BPA queries" not in captured.err  # no progress bar: stderr is not a terminal
    data = json.loads(out.read_text())
    assert data["method"] == "bpa" and data["n_pairs"] == 80 and sorted(data["ranking"]) == sorted(table.models)
    assert (data["policy"], data["exploration_rule"]) == ("exploration", "ranking_variance")
    assert data["strategy_counts"]["exploration"] == 80
    # the paper's scheduler stays one option away, named as such
    assert main([*argv, "--policy", "paper", "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert (data["policy"], data["exploration_rule"]) == ("bpa", "match_quality")
    assert data["strategy_counts"]["bridge"] > 0 and data["strategy_counts"]["anchor"] == 0
    assert main([*argv, "--hierarchical", "2"]) == 2
    assert "--hierarchical" in capsys.readouterr().err


def test_library_default_scheduling_on_refit_and_progress(capsys):
    table = strength_table(n_samples=20)
    seen = []
    report = rank_with_bpa(
        RewardModelPairs(QualityModel(), table),
        table,
        budget=45,
        config=BPAConfig(sigma_tau=1e-3),
        on_refit=lambda n, fit: seen.append((n, fit.mean_sigma)),
        progress=True,
    )
    assert (report.meta["policy"], report.meta["exploration_rule"]) == ("exploration", "ranking_variance")
    default = SchedulerConfig()
    assert (default.policy, default.exploration_rule) == ("exploration", "ranking_variance")
    paper = SchedulerConfig(**PAPER_SCHEDULING)
    assert (paper.policy, paper.exploration_rule, paper.exploration_share, paper.anchor_share) == (
        "bpa",
        "match_quality",
        0.5,
        0.3,
    )
    # SchedulerConfig's refit_every is 50 records: no periodic refit in 45 queries, one final refit
    assert [n for n, _ in seen] == [45] and seen[-1][1] == pytest.approx(report.fit.mean_sigma)
    assert "BPA queries" in capsys.readouterr().err
    sconfig = SchedulerConfig(refit_every=10)
    seen.clear()
    rank_with_bpa(
        RewardModelPairs(QualityModel(), table),
        table,
        budget=45,
        config=BPAConfig(sigma_tau=1e-3),
        scheduler_config=sconfig,
        on_refit=lambda n, fit: seen.append(n),
    )
    assert seen == [10, 20, 30, 40, 45]
    assert capsys.readouterr().err == ""


def test_ovmerd_benchmark_script_runs_on_a_subset(tiny_rm_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("benchmark_bpa", BENCHMARKS / "benchmark_bpa.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--judge", str(tiny_rm_dir), "--samples", "6", "--seeds", "2", "--budget", "60", "--target", "0.5"]
    script.main(["ovmerd", *argv, "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "OV-MERD: 10 models x 6 samples, 270 pair verdicts" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"random", "paper", "rv"} and "| 1.00, 1.00 |" in rows["random"]
    assert "the full ranking asks 270 pair queries" in out
