"""`emoreward.judges.load_judge` and `emoreward rank --judge JUDGE.yaml` end to end: the real CLI in a subprocess,
the real `zero_shot` package (the `scripted` backend of `zero_shot.testing`), its call cache, a SIGKILL and a
resume; and the seam in the other direction (reward-model directories)."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emoreward.cli import main as emoreward_main
from emoreward.evaluation.harness import run_judge
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.judges import judge_kind, load_judge


MODELS = ("alpha", "beta", "gamma", "delta")
N_SAMPLES = 6
N_PAIRS = N_SAMPLES * len(list(itertools.combinations(MODELS, 2)))  # C(4, 2) model pairs per sample


def write_table(path: Path) -> Path:
    """A description table where model m writes 2 + 3m words: the scripted judge prefers the longer description,
    so the true order is delta > gamma > beta > alpha."""
    words = ["happy", "sad", "angry", "calm", "voice", "smile", "frown", "tears", "loud", "quiet", "tense"]
    rows = [
        {
            "sample": f"s{s}",
            "model": name,
            "description": " ".join(words[(s + k) % len(words)] for k in range(2 + 3 * m)),
        }
        for s in range(N_SAMPLES)
        for m, name in enumerate(MODELS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_judge(path: Path, calls_log: Path, delay_s: float = 0.0) -> Path:
    path.write_text(
        "name: scripted-ranker\n"
        "prompts: emoprefer_v1\n"
        "sampling: {do_sample: false, max_new_tokens: 16, seed: 0}\n"
        f"mllm: {{backend: scripted, model: longer-wins, batch_size: 2, delay_s: {delay_s}, calls_log: '{calls_log}'}}\n"
    )
    return path


def n_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def rank_cmd(judge: Path, table: Path, report: Path) -> list[str]:
    return [sys.executable, "-m", "emoreward.cli", "rank", "--judge", str(judge), "--data", str(table),
            "--output", str(report), "--n-boot", "20"]  # fmt: skip


def test_rank_with_a_judge_yaml_through_the_cli_kill_and_resume(tmp_path, monkeypatch, capsys):
    table = write_table(tmp_path / "table.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}

    # 1. an uninterrupted ranking (in process, through the CLI's entry point): every pair in both orders through
    # the cached harness
    log = tmp_path / "calls-full.log"
    judge = write_judge(tmp_path / "judge.yaml", log)
    monkeypatch.setenv("EMOREWARD_CACHE", str(tmp_path / "cache-full"))
    assert emoreward_main(rank_cmd(judge, table, tmp_path / "full.json")[3:]) == 0
    report = json.loads((tmp_path / "full.json").read_text())
    assert report["ranking"] == ["delta", "gamma", "beta", "alpha"]
    assert report["cost"]["n_judge_calls"] == 2 * N_PAIRS and report["cost"]["n_invalid"] == 0
    assert n_lines(log) == 2 * N_PAIRS  # the model answered each pair once per order, nothing more
    [cache] = (tmp_path / "cache-full" / "judges" / "zero-shot").glob("scripted-ranker-*.jsonl")
    rows = [json.loads(line) for line in cache.read_bytes().splitlines()]
    assert len(rows) == 2 * N_PAIRS and {r["order"] for r in rows} == {"normal", "swapped"}
    assert len({(r["sample"], r["order"]) for r in rows}) == 2 * N_PAIRS  # one key per (sample, model pair, order)
    assert all(r["sample"].count("|") == 2 for r in rows)

    # 2. the same ranking killed with SIGKILL midway, then resumed
    log_kill = tmp_path / "calls-killed.log"
    slow = write_judge(tmp_path / "slow.yaml", log_kill, delay_s=0.03)
    env_kill = {**env, "EMOREWARD_CACHE": str(tmp_path / "cache-killed")}
    proc = subprocess.Popen(rank_cmd(slow, table, tmp_path / "killed.json"), env=env_kill,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    cache_dir, deadline = tmp_path / "cache-killed" / "judges" / "zero-shot", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        files = list(cache_dir.glob("*.jsonl")) if cache_dir.exists() else []
        if files and n_lines(files[0]) >= 12:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the ranking ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stderr.close()
    [killed_cache] = cache_dir.glob("*.jsonl")
    cached = sum(1 for line in killed_cache.read_bytes().splitlines() if line.endswith(b"}"))
    assert 12 <= cached < 2 * N_PAIRS and not (tmp_path / "killed.json").exists()
    with killed_cache.open("ab") as fh:  # a kill inside a write, in the middle of a multi-byte character
        fh.write('{"judge": "scripted-ranker", "output": "描述'.encode()[:-1])
    calls_before = n_lines(log_kill)

    monkeypatch.setenv("EMOREWARD_CACHE", str(tmp_path / "cache-killed"))
    assert emoreward_main(rank_cmd(slow, table, tmp_path / "killed.json")[3:]) == 0  # the same command again
    new_calls = n_lines(log_kill) - calls_before
    assert new_calls == 2 * N_PAIRS - cached  # only the missing calls were made
    again = json.loads((tmp_path / "killed.json").read_text())
    assert again["ranking"] == report["ranking"]
    assert again["bradley_terry_ties"]["scores"] == pytest.approx(report["bradley_terry_ties"]["scores"])
    assert again["W"] == report["W"]

    # a third run is answered by the cache alone
    assert emoreward_main(rank_cmd(slow, table, tmp_path / "third.json")[3:]) == 0
    assert n_lines(log_kill) == calls_before + new_calls
    assert json.loads((tmp_path / "third.json").read_text())["ranking"] == report["ranking"]
    assert "delta" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- load_judge
def test_a_reward_model_directory_becomes_a_reward_model_judge(tmp_path, tiny_bert_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from emoreward.models import TextRewardModel, TextSettings
    from zero_shot.testing import demo_pairs

    settings = TextSettings(backbone="minilm", input_format="pair", max_length=64, tie_threshold=0.25)
    model = TextRewardModel(
        AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir).eval(),
        AutoTokenizer.from_pretrained(tiny_bert_dir),
        settings,
    )
    model.save_pretrained(tmp_path / "rm")
    judge = load_judge(tmp_path / "rm", tie_threshold=0.0)
    assert isinstance(judge, RewardModelJudge) and judge.tie_threshold == 0.0
    pairs = demo_pairs()
    result = run_judge(judge, pairs, swap=True, runs=1)
    r1, r2 = judge.pair_rewards(pairs)
    assert result.verdicts("normal", 0) == ["1" if a > b else "2" if b > a else "tie" for a, b in zip(r1, r2)]
    assert load_judge(tmp_path / "rm").tie_threshold == 0.25  # the model's calibrated threshold by default
    assert (
        judge_kind(tmp_path / "rm") == "reward-model"
        and load_judge(tmp_path / "rm").model.settings.tie_threshold == 0.25
    )
    with pytest.raises(ValueError, match=r"options \['strategy'\] do not apply"):
        load_judge(tmp_path / "rm", strategy="S2")


def test_names_yaml_paths_and_bad_specs(tmp_path):
    from zero_shot.strategies import ZeroShotJudge

    judge = load_judge("smollm2-135m-text", cache_dir=tmp_path)
    assert isinstance(judge, ZeroShotJudge) and judge.name == "smollm2-135m-text/S1"
    assert not judge.mllm.loaded  # models load on the first call the cache cannot answer
    assert judge.cache_path.parent == tmp_path / "zero-shot" and judge.cache_path.name.startswith("smollm2-135m-text-")
    by_path = load_judge("configs/judges/smollm2-135m-text.yaml", strategy="S4", cache_dir=tmp_path)
    assert by_path.name == "smollm2-135m-text/S4" and by_path.cache_path == judge.cache_path  # one cache per judge
    with pytest.raises(ValueError, match="unknown judge 'no-such-judge'; available: .*smollm2-135m-text"):
        load_judge("no-such-judge")
    with pytest.raises(FileNotFoundError, match="judge definition not found"):
        load_judge(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_judge(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="emoreward_config.json is missing"):
        load_judge(tmp_path / "empty")
    (tmp_path / "judge.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a model directory or a .yaml judge definition"):
        load_judge(tmp_path / "judge.txt")
    assert judge_kind("smollm2-135m-text") == judge_kind(tmp_path / "missing.yaml") == "zero-shot"
    with pytest.raises(ValueError, match=r"options \['tie_threshold'\] do not apply"):
        load_judge("smollm2-135m-text", tie_threshold=0.1)
    with pytest.raises(ValueError, match="unknown strategy 'S9'"):
        load_judge("smollm2-135m-text", strategy="S9")


def test_a_failed_call_stops_a_ranking_judge_after_caching_the_others(tmp_path):
    import zero_shot
    from zero_shot.config import backend_identity, load_judge_config
    from zero_shot.strategies import JudgeCallError
    from zero_shot.testing import ScriptedBackend, demo_pairs

    config = load_judge_config("smollm2-135m-text")
    flaky = ScriptedBackend(backend_identity(config.mllm), fail_if="Neutral face.")
    judge = zero_shot.load_judge(config, cache_dir=tmp_path, backends={"mllm": flaky})
    with pytest.raises(JudgeCallError, match=r"1 of 6 judge calls failed \(e\.g\. sample 's4': HTTP 500"):
        judge.judge(demo_pairs())
    assert len(zero_shot.CallCache(judge.cache_path)) == 5  # the finished calls are kept for the rerun


@pytest.mark.slow
def test_a_wheel_ships_the_registered_judges_and_prompts(tmp_path):
    """`pip wheel` the project, unpack it away from the checkout, and list the judges from there."""
    import zipfile

    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(root), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("emoreward-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    judges = sorted(p.name for p in (root / "configs" / "judges").glob("*.yaml"))
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("zero_shot/configs/judges/")) == judges
    assert "zero_shot/configs/prompts/emoprefer_v1.yaml" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    listed = subprocess.run(
        [sys.executable, "-m", "emoreward.cli", "judge", "--list"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(listed.splitlines()) == len(judges) and str(tmp_path / "site" / "zero_shot" / "configs") in listed


def test_evaluate_and_judge_take_either_kind_of_judge(tmp_path, tiny_bert_dir, capsys):
    """`evaluate --model <judge YAML>` runs the zero-shot harness (the same report as `judge`), and `judge --judge
    <reward-model directory>` the reward model's (the same report as `evaluate`): one code path, no argv rebuilt."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from emoreward.models import TextRewardModel, TextSettings

    judge = tmp_path / "judge.yaml"
    judge.write_text(
        "name: scripted-judge\nprompts: emoprefer_v1\nsampling: {do_sample: false, max_new_tokens: 16, seed: 0}\n"
        "mllm: {backend: scripted, model: longer-wins}\n"
    )
    assert emoreward_main(["evaluate", "--model", str(judge), "--data", "emoprefer",
                           "--output", str(tmp_path / "ev" / "zs.json")]) == 0  # fmt: skip
    assert "emoreward evaluate: scripted-judge (" in (out := capsys.readouterr().out) and "is a zero-shot judge" in out
    assert (
        emoreward_main(["judge", "--judge", str(judge), "--data", "emoprefer", "--output", str(tmp_path / "j")]) == 0
    )
    via_evaluate = json.loads((tmp_path / "ev" / "zs" / "report.json").read_text())
    via_judge = json.loads((tmp_path / "j" / "report.json").read_text())
    assert via_evaluate["n_pairs"] == 459 and via_evaluate["strategies"] == via_judge["strategies"]
    # the scripted judge prefers the longer description: the length baseline's 2-class accuracy
    assert via_evaluate["strategies"]["S1"]["per_run"]["2c_acc"]["mean"] == pytest.approx(79.56, abs=0.01)
    with pytest.raises(SystemExit):  # argparse: not a dtype choice
        emoreward_main(["evaluate", "--model", str(judge), "--data", "emoprefer", "--dtype", "float16"])
    assert emoreward_main(["evaluate", "--model", str(judge), "--data", "emoprefer", "--dtype", "float32"]) == 2
    assert f"--dtype applies to reward models; {judge} is a zero-shot judge" in capsys.readouterr().err

    settings = TextSettings(backbone="minilm", input_format="pair", max_length=64, tie_threshold=0.05)
    TextRewardModel(
        AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir).eval(),
        AutoTokenizer.from_pretrained(tiny_bert_dir),
        settings,
    ).save_pretrained(tmp_path / "rm")
    rm = str(tmp_path / "rm")
    assert emoreward_main(["judge", "--judge", rm, "--data", "emoprefer", "--output", str(tmp_path / "jr")]) == 0
    assert f"emoreward judge: {rm} is a reward model: one deterministic run" in capsys.readouterr().out
    assert (
        emoreward_main(["evaluate", "--model", rm, "--data", "emoprefer", "--output", str(tmp_path / "er.json")]) == 0
    )
    via_judge = json.loads((tmp_path / "jr" / "report.json").read_text())
    via_evaluate = json.loads((tmp_path / "er.json").read_text())
    assert via_judge["judge"] == via_evaluate["judge"] and via_judge["pair_rewards"] == via_evaluate["pair_rewards"]
    assert emoreward_main(["judge", "--judge", rm, "--data", "emoprefer", "--strategy", "S2", "--runs", "3"]) == 2
    assert "is a reward model; --strategy, --runs apply to zero-shot judges only" in capsys.readouterr().err


def test_judge_draws_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, capsys):
    # as `rank` and `train`: a bar only on a terminal, so logs and CI output hold no tqdm lines
    judge = tmp_path / "judge.yaml"
    judge.write_text(
        "name: scripted-judge\nprompts: emoprefer_v1\nsampling: {do_sample: false, max_new_tokens: 16, seed: 0}\n"
        "mllm: {backend: scripted, model: longer-wins}\n"
    )
    argv = ["judge", "--judge", str(judge), "--data", "emoprefer", "--output", str(tmp_path / "j")]
    assert emoreward_main(argv) == 0
    err = capsys.readouterr().err
    assert "judge scripted-judge" not in err and "call/s" not in err and "%|" not in err
