"""A ranking rerun from a full score cache loads no weights: `SavedRewardModel` keys every description as the loaded
model does (same key parts in every precision, the keys of earlier caches unchanged), `score_table` loads the network
only for a miss, and the CLI's rerun gives the cold run's report without importing transformers, torch or sklearn."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_rank_cli import write_table

from emoreward.data.context import RewardContext
from emoreward.data.tables import load_description_table
from emoreward.models import load_reward_model
from emoreward.models.precision import dtype_name
from emoreward.models.saved import SavedRewardModel
from emoreward.ranking.score_cache import ScoreCache, model_key_parts, score_key
from emoreward.ranking.scoring import score_table


@pytest.mark.parametrize("pinned", ["float32", "bfloat16", None])
def test_the_folder_keys_descriptions_as_the_loaded_model_does(tiny_rm_dir, monkeypatch, pinned):
    if pinned is None:
        monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    else:
        monkeypatch.setenv("EMOREWARD_DTYPE", pinned)
    saved, loaded = SavedRewardModel(tiny_rm_dir), load_reward_model(tiny_rm_dir)
    assert saved.precision_name == dtype_name(loaded.scoring_precision)
    if pinned is not None:
        assert saved.precision_name == pinned
    parts = model_key_parts(saved)
    assert parts == model_key_parts(loaded)
    for context in (
        RewardContext(),
        RewardContext(subtitle=" Hello there. "),
        RewardContext(subtitle="x", video="v.mp4"),
    ):
        assert saved.context_key(context) == loaded.context_key(context)
        assert score_key(saved, "A calm voice.", context, parts) == score_key(loaded, "A calm voice.", context)


def test_a_recorded_low_bf16_agreement_keeps_the_folder_in_float32(tiny_rm_dir, tmp_path, monkeypatch):
    import shutil

    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    folder = tmp_path / "low"
    shutil.copytree(tiny_rm_dir, folder)
    config = json.loads((folder / "emoreward_config.json").read_text())
    config["extra"] = {**(config.get("extra") or {}), "bf16_agreement": 0.9}
    (folder / "emoreward_config.json").write_text(json.dumps(config))
    saved, loaded = SavedRewardModel(folder), load_reward_model(folder)
    assert saved.precision_name == dtype_name(loaded.scoring_precision) == "float32"
    assert model_key_parts(saved) == model_key_parts(loaded)


def test_score_table_loads_the_weights_only_for_a_miss(tiny_rm_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    table = load_description_table(write_table(tmp_path / "table.jsonl"))
    path = tmp_path / "scores.jsonl"
    cold = score_table(load_reward_model(tiny_rm_dir), table, ScoreCache(path))
    distinct = cold.n_scored  # distinct (description, context) items of the 48 descriptions
    assert 30 < distinct <= 48 and len(path.read_text().splitlines()) == distinct

    saved = SavedRewardModel(tiny_rm_dir)
    rerun = score_table(saved, table, ScoreCache(path))
    assert saved._loaded is None  # every description from the cache: no weights read
    assert rerun.n_scored == 0 and np.array_equal(rerun.scores, cold.scores)

    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:30]) + "\n")  # the rest of the scores lost
    partial = score_table(saved, table, ScoreCache(path))
    assert saved._loaded is not None and partial.n_scored == distinct - 30
    np.testing.assert_allclose(partial.scores, cold.scores, atol=1e-6)


def test_a_folder_of_a_media_model_is_refused(tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "emoreward_config.json").write_text(json.dumps({"kind": "media", "backbone": "qwen2.5-omni"}))
    with pytest.raises(ValueError, match="holds a media reward model"):
        SavedRewardModel(folder)


# today's keys (2026-12-07: the precision part is `precision_identity`, the dtype and the kernels, here pinned to the
# "default" CPU kind, which the kernel selection gives on every machine); existing caches of these kernels must hit.
# The keys before (2026-12-01, the dtype alone) miss by design: they do not say which CPU kind computed the scores.
PINNED_KEYS = {
    "float32": "9254844cb22f7c123c288021afc4288c8dde51041cc003a6afba7134300f824e",
    "bfloat16": "45b01f1f140637498e4e44cc920caa4cc0943abfa7c46c2fdc93095e917722dd",
}


@pytest.mark.parametrize("dtype", sorted(PINNED_KEYS))
def test_a_saved_model_keys_its_scores_as_before(tmp_path, dtype, monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    folder = tmp_path / "m"
    folder.mkdir()
    config = {"kind": "text", "backbone": "minilm", "model_name_or_path": "minilm", "max_length": 512}
    config.update(tie_threshold=0.25, input_format="pair")
    (folder / "emoreward_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4)
    saved = SavedRewardModel(folder, dtype=dtype)
    parts = model_key_parts(saved)
    assert parts["model"] == "80d06c65578183c7"
    assert parts["precision"] == {"dtype": dtype, "kernels": "cpu:default"}
    assert score_key(saved, "A calm voice.", RewardContext(subtitle="Hello.")) == PINNED_KEYS[dtype]


@pytest.mark.parametrize("method", ["full", "bpa"])
def test_the_cli_rerun_from_a_full_cache_imports_no_torch(tiny_rm_dir, tmp_path, method):
    """Cold run, then rerun, in "auto" precision (whatever this machine picks: the rerun reads the cold run's
    record of torch's bf16 answer under $XDG_CACHE_HOME instead of importing torch); both methods load the
    weights only when a description misses the cache."""
    data = write_table(tmp_path / "table.jsonl")
    options = ["--n-boot", "20"] if method == "full" else ["--method", "bpa", "--budget", "40"]
    argv = ["rank", "--judge", str(tiny_rm_dir), "--data", str(data), *options, "--quiet"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    heavy = ("transformers", "torch", "sklearn")
    code = (
        "import sys; from emoreward.cli.main import main; code = main(sys.argv[1:]); "
        f"print([m in sys.modules for m in {heavy!r}], file=sys.stderr); sys.exit(code)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "home")}
    env.pop("EMOREWARD_DTYPE", None)
    runs = []
    for name in ("cold.json", "rerun.json"):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv, "--output", str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stderr.strip().splitlines()[-1].lower()))
    assert runs[0][:2] == [True, True]  # the cold run loads the model
    assert runs[1] == [False, False, False], dict(zip(heavy, runs[1]))  # the rerun needs none of them
    cold, rerun = (json.loads((tmp_path / n).read_text()) for n in ("cold.json", "rerun.json"))
    assert rerun["cost"]["n_scored"] == 0 and cold["cost"]["n_scored"] > 0
    # both methods count distinct descriptions: the full method every one in the table, BPA those its queries asked for
    assert rerun["cost"]["n_cached"] == cold["cost"]["n_scored"]
    timings = ("cost", "seconds", "loop_seconds")
    assert {k: v for k, v in rerun.items() if k not in timings} == {k: v for k, v in cold.items() if k not in timings}


def test_a_warning_of_the_command_prints_as_one_line(tiny_rm_dir, tmp_path):
    """`emoreward rank` (any command, `emoreward.cli.main.guarded`) prints the project's warnings as its errors, one
    line ``emoreward rank: warning: ...``: not Python's ``annotators.py:116: UserWarning: ...`` and the source line,
    which named the caller of the score cache. In a fresh process (pytest records warnings instead of printing)."""
    data = write_table(tmp_path / "table.jsonl")
    argv = ["rank", "--judge", str(tiny_rm_dir), "--data", str(data), "--method", "bpa", "--budget", "6", "--quiet"]
    argv = [sys.executable, "-m", "emoreward.cli", *argv, "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "home")}
    errs = []
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        errs.append(done.stderr)
        (path,) = (tmp_path / "cache").rglob("scores-*.jsonl")
        lines = path.read_text().splitlines()
        path.write_text("\n".join([lines[0], '{"key": "torn', *lines[1:]]) + "\n")  # line 2 unreadable
    assert "warning" not in errs[0]
    said = f"{path}: 1 unreadable line(s) skipped (line 2); their descriptions are scored again"
    assert errs[1] == f"emoreward rank: warning: {said}\n"


def test_a_damaged_cache_line_is_skipped_with_a_warning_naming_it(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(
        '{"key": "a", "score": 1.0}\n{"key": "garbage", "score": \n{"key": "b", "score": 2.0}\n{"key": "c"'
    )
    with pytest.warns(UserWarning, match=r"scores.jsonl: 1 unreadable line\(s\) skipped \(line 2\)"):
        cache = ScoreCache(path)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1.0, 2.0, None, 2)
    path.write_text('{"key": "a", "score": 1.0}\n{"key": "c"')  # only a torn last line: a killed run, no warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ScoreCache(path)) == 1
