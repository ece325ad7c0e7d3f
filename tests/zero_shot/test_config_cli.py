import importlib
import json
import subprocess
import sys

import pytest

from emoreward.cli import main as emoreward
from zero_shot.config import (
    BACKENDS,
    available_judges,
    backend_identity,
    backend_precision,
    build_backend,
    judge_config_from_dict,
    load_judge_config,
)
from zero_shot.prompts import PROMPT_DIR, load_prompts
from zero_shot.testing import ScriptedBackend


@pytest.fixture
def fast_random_baseline(monkeypatch):
    """The harness's random baseline averages 200 sklearn scorings; these tests do not read it."""
    from emoreward.evaluation import metrics

    monkeypatch.setattr(metrics, "random_baseline", lambda y_true, setting="two-class", **kw: {"waf": 0.0, "acc": 0.0})


def test_every_judge_yaml_parses_with_the_real_parser():
    judges = available_judges()
    assert {"smollm2-135m-text", "qwen2.5-omni-7b", "qwen2.5-vl-7b", "qwen2-audio-7b"} <= set(judges)
    for name in judges:
        cfg = load_judge_config(name)
        assert cfg.name == name
        load_prompts(cfg.prompts)


def test_unknown_judge_lists_the_available_ones():
    with pytest.raises(ValueError, match=r"unknown judge 'nope'; available: \[.*smollm2-135m-text"):
        load_judge_config("nope")


def test_invalid_definitions_name_the_field():
    base = {"name": "x", "mllm": {"backend": "transformers-text", "model": "m"}}
    with pytest.raises(ValueError, match="backend: unknown 'vllm'"):
        judge_config_from_dict({**base, "mllm": {"backend": "vllm", "model": "m"}})
    with pytest.raises(ValueError, match="temperature: unknown key"):
        judge_config_from_dict({**base, "temperature": 0.7})
    with pytest.raises(ValueError, match="family: unknown"):
        judge_config_from_dict({**base, "mllm": {"backend": "transformers-mllm", "model": "m", "family": "llava"}})
    with pytest.raises(ValueError, match="base_url"):
        build_backend(judge_config_from_dict({**base, "mllm": {"backend": "openai", "model": "m"}}).mllm)
    mllm = {"backend": "transformers-mllm", "model": "m", "family": "qwen2.5-vl"}
    with pytest.raises(ValueError, match="min_pixels, max_pixels: give both or neither"):
        judge_config_from_dict({**base, "mllm": {**mllm, "max_pixels": 1000}})
    scripted = judge_config_from_dict({**base, "mllm": {"backend": "scripted", "model": "fake", "delay_s": 0.5}})
    backend = build_backend(scripted.mllm)
    assert backend.identity == backend_identity(scripted.mllm) == "scripted:fake" and backend.delay_s == 0.5


def test_prompt_sets_are_versioned_and_checked(tmp_path):
    prompts = load_prompts("emoprefer_v1")
    assert prompts.tag == "emoprefer-v1" and len(prompts.digest) == 12
    text = prompts.render("compare_media", media="text", subtitle=None, description_1="A", description_2="B")
    assert "Description 1: A" in text and "The person says" not in text and "alone" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text((PROMPT_DIR / "emoprefer_v1.yaml").read_text().replace("{reasoning}", "{secret}"))
    with pytest.raises(ValueError, match="unknown placeholders"):
        load_prompts(bad)


def test_cli_help_and_list(capsys):
    command = [sys.executable, "-m", "emoreward.cli", "judge", "--help"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "--strategy" in out.stdout and "--references" in out.stdout
    assert emoreward(["judge", "--list"]) == 0
    assert "smollm2-135m-text\t" in capsys.readouterr().out
    # the old entry point points at the new one
    old = subprocess.run([sys.executable, "-m", "zero_shot", "--list"], capture_output=True, text=True)
    assert old.returncode == 2 and "`emoreward judge`" in old.stderr and old.stdout == ""


def test_cli_s2_without_references_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(
        BACKENDS,
        "transformers-text",
        lambda cfg: ScriptedBackend(backend_identity(cfg), precision=backend_precision(cfg)),
    )
    argv = ["judge", "--judge", "smollm2-135m-text", "--strategy", "S2", "--limit", "3", "--output", str(tmp_path)]
    assert emoreward([*argv, "--no-progress"]) == 2
    assert "reference-description file" in capsys.readouterr().err


def test_cli_runs_s1_on_the_bundled_pairs(tmp_path, capsys, monkeypatch, fast_random_baseline):
    monkeypatch.setitem(
        BACKENDS,
        "transformers-text",
        lambda cfg: ScriptedBackend(backend_identity(cfg), precision=backend_precision(cfg)),
    )
    argv = ["judge", "--judge", "configs/judges/smollm2-135m-text.yaml", "--strategy", "S1", "--data", "emoprefer"]
    assert emoreward([*argv, "--limit", "40", "--output", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| smollm2-135m-text | S1 |" in out and "length baseline" in out
    assert (tmp_path / "report.json").exists() and (tmp_path / "calls.jsonl").exists()


def test_benchmark_script_help():
    out = subprocess.run(
        [sys.executable, "benchmarks/benchmark_zero_shot.py", "--help"], capture_output=True, text=True, check=True
    )
    assert "--n" in out.stdout and "prefill" in out.stdout and "Cached rerun" in out.stdout


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys):
    judge = importlib.import_module("emoreward.cli.judge")  # the dispatcher runs `judge.run` (evaluate's run)

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(judge, "run", interrupted)
    assert emoreward(["judge", "--judge", "smollm2-135m-text", "--data", "emoprefer", "--output", "x"]) == 130
    err = capsys.readouterr().err
    assert "emoreward judge: interrupted" in err and "run the same command again to resume" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("option", [["--limit", "0"], ["--limit", "-3"], ["--runs", "0"]])
def test_counts_below_one_are_usage_errors(option, capsys):
    with pytest.raises(SystemExit) as exc:
        emoreward(["judge", "--judge", "smollm2-135m-text", "--output", "x", *option])
    assert exc.value.code == 2
    assert f"argument {option[0]}: expected an integer >= 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- bad input, early
def test_invalid_yaml_is_one_line_with_file_line_and_column(tmp_path, capsys):
    from emoreward.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: broken\ndescription: a judge\nprompts: emoprefer_v1: x\nmllm: {backend: scripted, model: m}\n"
    )
    assert main(["judge", "--judge", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"emoreward judge: error: {bad}, line 3, column 22: invalid YAML: mapping values are not allowed here"
    ]
    with pytest.raises(ValueError, match=r"bad\.yaml, line 3, column 22"):
        load_judge_config(bad)


def test_broken_references_line_names_file_and_line(tmp_path, capsys):
    from emoreward.cli import main
    from zero_shot.strategies import load_references

    refs = tmp_path / "refs.jsonl"
    refs.write_text('{"sample_id": "s1", "description": "calm"}\n\n{"sample_id": "s2", "description": \n')
    with pytest.raises(ValueError, match=rf"{refs}, line 3: malformed JSON"):
        load_references(refs)
    csv_refs = tmp_path / "refs.csv"
    csv_refs.write_text("sample_id,description\ns1,calm\ns2,\n")
    with pytest.raises(ValueError, match=rf"{csv_refs}, line 3, field 'description': missing"):
        load_references(csv_refs)
    judge = tmp_path / "j.yaml"
    judge.write_text("name: j\nmllm: {backend: scripted, model: m}\n")
    assert main(["judge", "--judge", str(judge), "--strategy", "S2", "--references", str(refs), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{refs}, line 3: malformed JSON" in err[0]


def test_a_cache_line_torn_inside_a_multibyte_character_is_skipped(tmp_path):
    from zero_shot.cache import CallCache, CallKey

    path = tmp_path / "calls.jsonl"
    cache = CallCache(path)
    cache.put(CallKey("j", "S1", "compare", "s1", "normal", 0), "h1", "描述2更好。答案：2")
    with path.open("ab") as fh:  # a SIGKILL in the middle of writing "描述" (3 bytes per character)
        fh.write('{"judge": "j", "strategy": "S1", "output": "描述'.encode()[:-2])
    reloaded = CallCache(path)
    assert len(reloaded) == 1 and reloaded.n_corrupt == 1
    reloaded.put(CallKey("j", "S1", "compare", "s2", "normal", 0), "h2", "答案：1")
    again = CallCache(path)
    assert len(again) == 2 and again.n_corrupt == 1
    assert again.get(CallKey("j", "S1", "compare", "s1", "normal", 0), "h1")["output"] == "描述2更好。答案：2"


def test_judgements_are_written_as_one_dataset_table(tmp_path, capsys):
    import datasets

    from emoreward.cli import main

    judge = tmp_path / "scripted.yaml"
    judge.write_text("name: scripted-judge\nmllm: {backend: scripted, model: m}\n")
    out = tmp_path / "out"
    table = tmp_path / "judgements.parquet"
    argv = ["judge", "--judge", str(judge), "--strategy", "S1", "--data", "emoprefer", "--limit", "6"]
    argv += ["--runs", "2", "--output", str(out), "--no-progress", "--dataset", str(table)]
    assert main(argv) == 0
    assert f"judgements dataset: {table} (24 rows)" in capsys.readouterr().out  # 6 pairs x 2 orders x 2 runs
    rows = datasets.load_dataset("parquet", data_files=str(table), split="train").to_list()
    assert len(rows) == 24 and {r["strategy"] for r in rows} == {"S1"}
    assert {r["order"] for r in rows} == {"normal", "swapped"} and {r["run"] for r in rows} == {0, 1}
    # the JSONL the run writes reads back as a dataset as well
    again = datasets.load_dataset("json", data_files=str(out / "judgements_S1.jsonl"), split="train")
    assert again.num_rows == 24


# ---------------------------------------------------------------------------------------------- remote code
def test_a_judge_file_cannot_turn_on_remote_code_only_the_command_line_can(tmp_path, capsys, caplog):
    """The one rule (`emoreward.utils.remote_code`) for every configuration file: a judge YAML with
    ``trust_remote_code: true`` is refused, naming file, line and the option that asks; the option itself turns it
    on for the judge's models and the output says so."""
    from emoreward.cli import main

    judge = tmp_path / "j.yaml"
    judge.write_text("name: j\nmllm:\n  backend: scripted\n  model: m\n  trust_remote_code: true\n")
    argv = ["judge", "--judge", str(judge), "--limit", "2", "--runs", "1", "--no-progress"]
    assert main([*argv, "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"emoreward judge: error: {judge}, line 5: mllm: trust_remote_code: true would run Python code from the "
        "model repository 'm'; a configuration file cannot turn it on. If you trust that code, ask for it on the "
        "command line: emoreward judge --trust-remote-code"
    ]
    assert not (tmp_path / "a").exists()
    judge.write_text("name: j\nmllm: {backend: scripted, model: m}\n")
    assert load_judge_config(judge).mllm.trust_remote_code is False
    with caplog.at_level("WARNING", logger="emoreward"):
        assert main([*argv, "--output", str(tmp_path / "b"), "--trust-remote-code"]) == 0
    assert "trust_remote_code: Python code from the model repository 'm' may run (asked for by the user)" in [
        record.getMessage() for record in caplog.records
    ]
    assert load_judge_config(judge, trust_remote_code=True).mllm.trust_remote_code is True
    # a definition built in Python is the user's own: allowed, and said
    assert judge_config_from_dict(
        {"name": "j", "mllm": {"backend": "scripted", "model": "m", "trust_remote_code": True}}
    )


def test_no_bundled_configuration_turns_on_remote_code():
    from pathlib import Path

    from emoreward.training.config import default_recipe_path, load_config

    for path in available_judges().values():
        config = load_judge_config(path)
        assert not any(m.trust_remote_code for m in (config.mllm, config.llm) if m is not None), path
    recipes = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*/rm/*.yaml"))
    assert recipes
    for recipe in [default_recipe_path(), *recipes]:
        assert "trust_remote_code: true" not in recipe.read_text().lower(), recipe
    assert load_config().trust_remote_code is False


def test_a_strategy_given_twice_is_refused_before_any_call(tmp_path, capsys):
    """`--strategy S1 S1` would give two rows of the same numbers and count the second's calls again: one line,
    exit 2, no output folder."""
    from emoreward.cli import main

    judge = tmp_path / "scripted.yaml"
    judge.write_text("name: scripted-judge\nmllm: {backend: scripted, model: m}\n")
    out = tmp_path / "out"
    argv = ["judge", "--judge", str(judge), "--strategy", "S1", "S1", "--data", "emoprefer", "--limit", "4"]
    assert main([*argv, "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--strategy: ['S1'] given more than once" in err[0], err
    assert not (out / "report.json").exists()


def test_reference_sample_ids_are_read_in_their_normal_form(tmp_path):
    """A references file written in NFD, or with a double space, names the samples the pairs name (their ids are
    read in the normal form, `normal_name`)."""
    import unicodedata

    from zero_shot.strategies import load_references

    refs = tmp_path / "refs.jsonl"
    nfd = unicodedata.normalize("NFD", "Zoë  clip 1")
    refs.write_text(json.dumps({"sample_id": nfd, "description": "calm"}) + "\n", encoding="utf-8")
    assert load_references(refs) == {"Zoë clip 1": "calm"}
