"""Relation: content identity. Changing any content a result depends on (a row, a model's weights under the same
path, a backbone's weights, a result-changing recipe field) reruns exactly the changed work, or refuses to resume
another run; changing nothing reuses everything, and the counts in the report say so.

Owners: `emoreward.utils.cache_key` (`cache_key`, `content_fingerprint`, `source_fingerprint`,
`current_fingerprint`: the content of a folder or file), `emoreward.models.loading` (`content_identity`,
`model_identity`, `source_identity`: everything a reward model reads, a referenced backbone included, for every cache,
the vLLM served name, a model kept loaded for a path and run identity; `weights_identity`: a judge model's, never its
path), `emoreward.models.precision`
(`precision_identity`: the dtype and the CPU kind of every cache key), `emoreward.ranking.score_cache` (scores by
content key), `zero_shot.cache` (calls keyed by their input), `emoreward.training.run_identity` (data, labels,
backbone content and recipe of a run; a judge's prompt set and the media files by content: the media relations are in
tests/multimodal, beside their tiny models).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _identity_inputs import change_weights, model_copy
from _inputs import pair_rows, read_json, run_cli, run_ok, table_rows, write_jsonl
from test_training_run import tiny_recipe

from emoreward.training.run_identity import NOT_RESULT_FIELDS


COVERS: dict[str, tuple[str, ...]] = {
    "train": ("*", "@result-fields", "@not-result-fields", "--eval_file"),
    "evaluate": ("--model",),
    "judge": ("--judge",),
    "rank": ("--judge", "--cache-dir", "--no-cache"),
    "serve": ("--model",),
    "grpo": ("model",),
}


# ------------------------------------------------------------------------------------------- caches: rank, judge
def _rank(capsys, judge, table, out, *extra):
    run_ok(capsys, ["rank", "--judge", judge, "--data", table, "--output", out, "--n-boot", "5", *extra])
    return read_json(out)


def test_rank_reruns_exactly_the_changed_descriptions(rm_dir, tmp_path, capsys):
    model = model_copy(rm_dir, tmp_path / "model")
    rows = table_rows()
    table = write_jsonl(tmp_path / "table.jsonl", rows)
    cache = ["--cache-dir", tmp_path / "cache"]
    distinct = len({r["description"] for r in rows})

    first = _rank(capsys, model, table, tmp_path / "r1.json", *cache)
    assert (first["cost"]["n_scored"], first["cost"]["n_cached"]) == (distinct, 0)
    same = _rank(capsys, model, table, tmp_path / "r2.json", *cache)  # nothing changed: everything reused
    assert (same["cost"]["n_scored"], same["cost"]["n_cached"]) == (0, distinct)
    assert same["mean_reward"] == first["mean_reward"]

    rows[5] = {**rows[5], "description": rows[5]["description"] + " and then she laughs"}  # one corrected row
    write_jsonl(table, rows)
    one = _rank(capsys, model, table, tmp_path / "r3.json", *cache)
    assert (one["cost"]["n_scored"], one["cost"]["n_cached"]) == (1, distinct - 1)

    change_weights(model)  # retrained in place: same path, other weights
    changed = _rank(capsys, model, table, tmp_path / "r4.json", *cache)
    assert changed["cost"]["n_scored"] == distinct  # every score depends on the weights
    fresh = _rank(capsys, model, table, tmp_path / "r5.json", "--no-cache")  # the changed model, no cache at all
    assert changed["mean_reward"] == fresh["mean_reward"] != one["mean_reward"]
    assert not (tmp_path / "r5.json").with_name("r5.json").read_text().count('score_cache": "/')  # no cache path
    again = _rank(capsys, model, table, tmp_path / "r6.json", *cache)
    assert again["cost"]["n_scored"] == 0 and again["mean_reward"] == fresh["mean_reward"]


def test_rank_rescores_a_model_whose_local_backbone_was_retrained_in_place(tiny_bert_dir, tmp_path, capsys):
    """A LoRA reward model reads its local backbone folder: the backbone retrained in place (same path, other
    weights) is another model for the score cache (`emoreward.models.loading.content_identity`), as it is for run
    identity: nothing comes from the cache and the rewards are those of a fresh scoring."""
    import torch
    from peft import LoraConfig

    from emoreward.models import TextRewardModel

    backbone = model_copy(tiny_bert_dir, tmp_path / "backbone")
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"])
    rm = TextRewardModel.from_backbone(str(backbone), max_length=64, lora_config=lora)
    with torch.no_grad():
        for name, p in rm.model.named_parameters():
            if "classifier" in name and name.endswith("weight"):
                p.normal_(0, 1.0)
    model = rm.save_pretrained(tmp_path / "model")
    rows = table_rows(n_samples=2)
    table = write_jsonl(tmp_path / "table.jsonl", rows)
    cache = ["--cache-dir", tmp_path / "cache"]
    distinct = len({r["description"] for r in rows})

    first = _rank(capsys, model, table, tmp_path / "r1.json", *cache)
    assert (first["cost"]["n_scored"], first["cost"]["n_cached"]) == (distinct, 0)
    change_weights(backbone, scale=0.5)  # the backbone retrained in place; the model folder is untouched
    rerun = _rank(capsys, model, table, tmp_path / "r2.json", *cache)
    assert (rerun["cost"]["n_scored"], rerun["cost"]["n_cached"]) == (distinct, 0)
    fresh = _rank(capsys, model, table, tmp_path / "r3.json", "--no-cache")
    assert rerun["mean_reward"] == fresh["mean_reward"] != first["mean_reward"]
    again = _rank(capsys, model, table, tmp_path / "r4.json", *cache)  # the new backbone's scores are reused
    assert (again["cost"]["n_scored"], again["cost"]["n_cached"]) == (0, distinct)


def test_rank_cache_is_keyed_by_the_precision_and_the_cpu_kind(rm_dir, tmp_path, capsys, monkeypatch):
    """The score cache's precision part is `emoreward.models.precision.precision_identity` (the dtype and the kernels
    that compute in it): another `$EMOREWARD_DTYPE` or another CPU kind (the kernel selection of `cpu_kind`, or MKL's
    cap) scores everything again; the same precision on the same kind, whatever names it, reuses everything."""
    from emoreward.models.precision import cpu_kind

    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    model = model_copy(rm_dir, tmp_path / "model")
    rows = table_rows()
    table = write_jsonl(tmp_path / "table.jsonl", rows)
    cache = ["--cache-dir", tmp_path / "cache"]
    distinct = len({r["description"] for r in rows})

    def counts(out: str) -> tuple[int, int]:
        report = _rank(capsys, model, table, tmp_path / out, *cache)
        return report["cost"]["n_scored"], report["cost"]["n_cached"]

    assert counts("f32.json") == (distinct, 0)
    assert counts("f32-again.json") == (0, distinct)
    monkeypatch.setenv("EMOREWARD_DTYPE", "bfloat16")
    assert counts("bf16.json") == (distinct, 0)
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # a cap that leaves this CPU's kind: the same kernels
    assert counts("f32-all.json") == (0, distinct)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    if cpu_kind() != "default":  # the kernels of another CPU kind (`make test-avx2` runs this machine as AVX2-only)
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
        assert cpu_kind() == "default" and counts("f32-default.json") == (distinct, 0)
        monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")  # MKL's own cap: other sgemm kernels
    assert counts("f32-mkl.json") == (distinct, 0)
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    assert counts("f32-last.json") == (0, distinct)  # back on this kind: the first run's scores


def test_judge_reruns_exactly_the_changed_pairs(length_judge_yaml, tmp_path, capsys):
    rows = pair_rows(8)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "judge"
    argv = [
        "judge",
        "--judge",
        length_judge_yaml,
        "--strategy",
        "S1",
        "--data",
        data,
        "--output",
        out,
        "--no-progress",
    ]

    run_ok(capsys, argv)
    first = read_json(out / "report.json")
    n = len(rows) + first["controlled_errors"]["S1"]["n_negatives"]  # the pairs and their controlled negatives
    assert (first["calls"]["made"], first["calls"]["cached"]) == (2 * n, 0)  # normal and swapped order per pair
    run_ok(capsys, argv)
    same = read_json(out / "report.json")["calls"]
    assert (same["made"], same["cached"]) == (0, 2 * n)

    before = negative_contents(rows)
    side = "description_1" if rows[3]["label"] == "1" else "description_2"  # the preferred side: new negatives too
    rows[3] = {**rows[3], side: rows[3][side] + " She sighs."}  # a corrected row
    write_jsonl(data, rows)
    run_ok(capsys, argv)  # redone, not refused
    report = read_json(out / "report.json")
    one, n_now = report["calls"], len(rows) + report["controlled_errors"]["S1"]["n_negatives"]
    after = negative_contents(rows)
    changed = 1 + len(after - before)  # the pair and the negatives of its new text
    assert len(after - before) >= 1
    assert (one["made"], one["cached"]) == (2 * changed, 2 * (n_now - changed))


def negative_contents(rows) -> set:
    from emoreward.data import pairs_from_records
    from emoreward.data.negatives import generate_negatives

    pairs = pairs_from_records(enumerate(rows, start=1), "rows")
    return {(n.original, n.negative) for n in generate_negatives(pairs).negatives}


@pytest.mark.parametrize("backend", ["transformers-text", "transformers-mllm"])
def test_a_judge_model_folder_changed_in_place_is_another_judge(backend, tiny_llama_dir, tmp_path):
    """The call cache's model part is the local model's content (`weights_identity`), not its path: a copy elsewhere
    is the same model, the folder retrained in place another, for the text and the multimodal backend alike."""
    from zero_shot.config import ModelConfig, backend_identity

    family = "qwen2.5-vl" if backend == "transformers-mllm" else None
    folder = model_copy(tiny_llama_dir, tmp_path / "llm")
    cfg = ModelConfig(backend=backend, model=str(folder), family=family)
    before = backend_identity(cfg)
    assert backend_identity(cfg) == before
    copy = ModelConfig(
        backend=backend, model=str(model_copy(folder, tmp_path / "elsewhere" / "other name")), family=family
    )
    assert backend_identity(copy) == before and str(tmp_path) not in before
    change_weights(folder)
    assert backend_identity(cfg) != before


def _judge_folder(model_dir, folder):
    """A judge folder as `emoreward train` leaves one: the weights and `judge.yaml` with the model ``.``."""
    import yaml

    model_copy(model_dir, folder)
    mllm = {"backend": "transformers-text", "model": ".", "dtype": "float32", "device": "cpu"}
    definition = {"name": "tiny-folder", "prompts": "emoprefer_v1", "mllm": mllm, "verdict": "logits"}
    definition["sampling"] = {"do_sample": False, "max_new_tokens": 2, "seed": 0}
    (folder / "judge.yaml").write_text(yaml.safe_dump(definition), encoding="utf-8")
    return folder


def test_a_copied_or_moved_judge_folder_finds_its_calls_and_a_changed_weight_makes_them_again(
    tiny_llama_dir, tmp_path, capsys
):
    """A local judge model is named by its content in every judge identity (`emoreward.models.loading.
    weights_identity`: the call cache file, each call's input hash, the committee's `judge_identity`), never by its
    path: a byte-identical copy or a move of a judge folder makes 0 calls through `judge` and `rank`; one changed
    weight makes every call again."""
    from emoreward.judges import judge_identity

    first = _judge_folder(tiny_llama_dir, tmp_path / "judge")
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(3))
    table = write_jsonl(tmp_path / "table.jsonl", table_rows(2, ("alpha", "beta")))
    cache = ["--cache-dir", tmp_path / "rank-cache"]

    def judge(folder) -> tuple[int, int]:
        out = tmp_path / "out"
        run_ok(capsys, ["judge", "--judge", folder, "--data", data, "--output", out, "--no-progress"])
        calls = read_json(out / "report.json")["calls"]
        return calls["made"], calls["cached"]

    def rank(folder) -> int:
        report = _rank(capsys, folder, table, tmp_path / "rank.json", "--no-length-control", *cache)
        return report["cost"]["n_judge_calls"]

    n = judge(first)[0]
    n_rank = rank(first)
    assert n > 0 and n_rank > 0
    copy = model_copy(first, tmp_path / "copy of the judge")
    assert judge(copy) == (0, n) and rank(copy) == 0
    assert judge_identity(copy) == judge_identity(first)
    (tmp_path / "moved").mkdir()
    moved = shutil.move(first, tmp_path / "moved" / "renamed")
    assert judge(moved) == (0, n) and rank(moved) == 0
    change_weights(copy)  # one folder retrained in place: every call is new
    assert judge(copy) == (n, 0) and rank(copy) == n_rank
    assert judge(moved) == (0, n)  # the unchanged one still finds its calls


def test_judge_call_cache_is_keyed_by_the_precision_the_lazy_model_will_load_in(
    tiny_llama_dir, tmp_path, capsys, monkeypatch
):
    """A local judge with `dtype: auto` behind `emoreward judge`'s `LazyBackend` (no model loaded when the cache
    answers): its calls are keyed by the precision the model WILL compute in (`zero_shot.config.backend_precision`,
    the loader's own rule): another `$EMOREWARD_DTYPE` or another CPU kind's kernels makes every call again, the
    same precision on the same kind reuses every call."""
    import yaml

    from emoreward.models.precision import cpu_kind

    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    judge = tmp_path / "judge.yaml"
    model = {"backend": "transformers-text", "model": str(tiny_llama_dir), "dtype": "auto", "device": "cpu"}
    sampling = {"do_sample": False, "max_new_tokens": 2, "seed": 0}
    judge.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-auto",
                "prompts": "emoprefer_v1",
                "mllm": model,
                "llm": None,
                "sampling": sampling,
                "verdict": "text",
            }
        )
    )
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(2))
    argv = ["judge", "--judge", judge, "--strategy", "S1", "--data", data, "--output", tmp_path / "out"]

    def calls() -> tuple[int, int]:
        run_ok(capsys, [*argv, "--no-progress"])
        report = read_json(tmp_path / "out" / "report.json")["calls"]
        return report["made"], report["cached"]

    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    n = calls()[0]
    assert n > 0 and calls() == (0, n)
    monkeypatch.setenv("EMOREWARD_DTYPE", "bfloat16")
    assert calls() == (n, 0)
    monkeypatch.setenv("EMOREWARD_DTYPE", "bf16")  # the same precision by another name
    assert calls() == (0, n)
    if cpu_kind() != "default":  # the kernels of another CPU kind
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
        assert calls() == (n, 0)
        monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    assert calls() == (0, n)  # back to the first run's precision and kernels


# ------------------------------------------------------------------------------------------- routes without a cache
def _evaluate(model, tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(6))
    out = tmp_path / f"eval-{len(list(tmp_path.glob('eval-*')))}.json"
    run_ok(capsys, ["evaluate", "--model", model, "--data", data, "--output", out])
    rewards = read_json(out)["pair_rewards"]
    return np.asarray(rewards["reward_1"] + rewards["reward_2"], dtype=float)


def _grpo(model, tmp_path, capsys):
    from emoreward.export.grpo import EmotionReward

    reward = EmotionReward(model, length_monitor=False)
    return np.asarray(reward(prompts=["p", "p"], completions=["calm and smiling", "gloomy, eyes downcast"]))


def _serve_local(model, tmp_path, capsys):
    """The in-process server of OpenRLHF's reward file and verl (`shared_batcher`: one loaded model per process)."""
    from emoreward.export.serve.local import score_request, shared_batcher

    reply = score_request("rewards", {"descriptions": ["calm and smiling", "gloomy"]}, shared_batcher(model))
    return np.asarray(reply["rewards"])


@pytest.mark.parametrize("route", [_evaluate, _grpo, _serve_local], ids=["evaluate", "grpo", "serve"])
def test_a_model_changed_in_place_gives_its_new_numbers(route, lora_dir, tmp_path, capsys):
    """The same path, other weights: every route answers with the new model's numbers (no loaded model or cache
    kept for the path), equal to a fresh copy of the changed folder's."""
    model = model_copy(lora_dir, tmp_path / "model")
    before = route(model, tmp_path, capsys)
    change_weights(model, scale=3.0)
    after = route(model, tmp_path, capsys)
    fresh = route(model_copy(model, tmp_path / "fresh"), tmp_path, capsys)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, fresh, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------- train: resume
def test_train_resumes_only_the_same_content(tiny_bert_dir, tmp_path, capsys):
    backbone = model_copy(tiny_bert_dir, tmp_path / "backbone")
    recipe = tiny_recipe(tmp_path, backbone, num_train_epochs=1)
    out = tmp_path / "out"
    run_ok(capsys, ["train", "--config", recipe])
    first = read_json(out / "report.json")

    text = run_ok(capsys, ["train", "--config", recipe])  # nothing changed: every fold and the final fit reused
    assert "fold 1/2: finished earlier" in text and "fold 2/2: finished earlier" in text
    assert "final model: finished earlier" in text
    assert read_json(out / "report.json")["cross_validation"] == first["cross_validation"]

    # a result-changing recipe field: another run
    code, _, err = run_cli(capsys, ["train", "--config", recipe, "--learning-rate", "0.02"])
    assert code == 2 and "recipe field learning_rate" in err, err

    # the backbone's weights changed under the same path: another run, refused with what differs
    change_weights(backbone)
    code, _, err = run_cli(capsys, ["train", "--config", recipe])
    assert code == 2 and "the backbone's weights" in err and "--overwrite_output_dir" in err, err
    text = run_ok(capsys, ["train", "--config", recipe, "--overwrite_output_dir", "true"])
    assert "finished earlier" not in text  # everything retrained on the new backbone
    assert read_json(out / "report.json")["cross_validation"] != first["cross_validation"]
    shutil.rmtree(out)


def test_changed_training_data_is_another_run(tiny_bert_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, num_train_epochs=1, cv_folds=1)
    run_ok(capsys, ["train", "--config", recipe])
    train = tmp_path / "train.csv"
    lines = train.read_text().splitlines()
    lines[1] = lines[1].replace("the woman", "the man", 1)  # one corrected row, same file name
    train.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, ["train", "--config", recipe])
    assert code == 2 and "the training data" in err, err
    assert json.loads((tmp_path / "out" / "run_identity.json").read_text())["n_pairs"] == 24


def test_a_run_under_another_process_count_or_accumulation_is_another_run(tiny_bert_dir, tmp_path, capsys):
    """Every result-changing execution parameter is in the run identity (`run_identity.execution_parameters`): a run
    whose work was done by a 2-process launch (its `run_identity.json` as that launch records it) is not resumed by
    a 1-process run, nor by one with another gradient accumulation; the same run is."""
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, num_train_epochs=1, cv_folds=1)
    out = tmp_path / "out"
    run_ok(capsys, ["train", "--config", recipe])
    saved = read_json(out / "run_identity.json")
    assert saved["execution"] == {"world_size": 1}
    code, _, err = run_cli(capsys, ["train", "--config", recipe, "--gradient_accumulation_steps", "2"])
    assert code == 2 and "recipe field gradient_accumulation_steps (1 -> 2)" in err, err
    (out / "run_identity.json").write_text(json.dumps({**saved, "execution": {"world_size": 2}}))
    code, _, err = run_cli(capsys, ["train", "--config", recipe])
    assert code == 2 and "execution parameter world_size (2 -> 1)" in err and "--overwrite_output_dir" in err, err
    (out / "run_identity.json").write_text(json.dumps(saved))
    assert "final model: finished earlier" in run_ok(capsys, ["train", "--config", recipe])


def test_a_bf16_run_rerun_in_float32_is_refused_naming_the_precision_not_a_derived_field(
    tiny_bert_dir, tmp_path, capsys, monkeypatch
):
    """`bf16: auto` trains in bf16 on a CPU with bf16 matrix units, and the rule turns `use_cpu` on there itself
    (`training.bf16.apply_training_bf16`): the run identity holds `use_cpu` as the recipe gave it. A rerun under
    `EMOREWARD_DTYPE=float32` (float32 training) is another run, refused naming the precision, never `use_cpu`."""
    import torch

    from emoreward.models.precision import has_bf16_matrix_units

    if torch.cuda.is_available() or not has_bf16_matrix_units("cpu"):
        pytest.skip("bf16: auto trains in bf16 on a CPU with bf16 matrix units only")
    monkeypatch.delenv("EMOREWARD_DTYPE", raising=False)
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, num_train_epochs=1, cv_folds=1)
    run_ok(capsys, ["train", "--config", recipe])
    saved = read_json(tmp_path / "out" / "run_identity.json")["recipe"]
    assert (saved["bf16"], saved["use_cpu"]) == (True, False)  # trained in bf16; use_cpu as the recipe gave it
    monkeypatch.setenv("EMOREWARD_DTYPE", "float32")
    code, _, err = run_cli(capsys, ["train", "--config", recipe])
    assert code == 2 and "the training precision (recipe field bf16 (True -> False)" in err, err
    assert "use_cpu" not in err, err
    monkeypatch.delenv("EMOREWARD_DTYPE")
    assert "final model: finished earlier" in run_ok(capsys, ["train", "--config", recipe])


def test_train_eval_file_of_its_own_training_pairs_is_in_sample_as_evaluate_says(tiny_bert_dir, tmp_path, capsys):
    """`train --eval_file` naming the training pairs in another layout (TRL chosen / rejected rows): the in-sample
    check is `training.provenance.check_in_sample` on what the final model trains on, the check `evaluate` makes on
    the saved model: the same count (24 of 24), the same warning lines, the same flags of the controlled negatives,
    the section marked IN-SAMPLE. An eval file of other pairs (other texts) is held out: 0, no warning."""
    rows = pair_rows(24)
    recipe = tiny_recipe(
        tmp_path,
        tiny_bert_dir,
        num_train_epochs=1,
        cv_folds=1,
        train_file=str(write_jsonl(tmp_path / "t.jsonl", rows)),
    )
    chosen = [(r["description_1"], r["description_2"])[:: 1 if r["label"] == "1" else -1] for r in rows]
    trl = write_jsonl(tmp_path / "trl.jsonl", [{"chosen": c, "rejected": r} for c, r in chosen])
    code, out, err = run_cli(capsys, ["train", "--config", recipe, "--eval_file", trl])
    assert code == 0, err
    section = read_json(tmp_path / "out" / "report.json")["eval_file"]
    assert section["evaluation"]["n_in_sample_pairs"] == 24 and section["in_sample"].startswith("IN-SAMPLE: 24 of 24")
    assert f"eval_file {trl} (24 pairs, IN-SAMPLE)" in (tmp_path / "out" / "report.md").read_text()
    model = tmp_path / "out" / "model"
    code, _, eval_err = run_cli(capsys, ["evaluate", "--model", model, "--data", trl, "--output", tmp_path / "e.json"])
    assert code == 0, eval_err
    evaluation = read_json(tmp_path / "e.json")

    def warnings(text):
        return [line.split(": warning: ", 1)[1] for line in text.splitlines() if ": warning: " in line]

    assert warnings(err) == warnings(eval_err) and warnings(err)[0].startswith("24 of 24 pairs in"), (err, eval_err)
    assert evaluation["n_in_sample_pairs"] == section["evaluation"]["n_in_sample_pairs"] == 24
    assert evaluation["controlled_errors"]["n_in_sample"] == section["evaluation"]["controlled_errors"]["n_in_sample"]
    other = write_jsonl(tmp_path / "other.jsonl", [{k: v.replace("woman", "man") for k, v in r.items()} for r in rows])
    code, _, err = run_cli(capsys, ["train", "--config", recipe, "--eval_file", other, "--output_dir", tmp_path / "o"])
    assert code == 0 and "warning" not in err, err
    assert read_json(tmp_path / "o" / "report.json")["eval_file"]["evaluation"]["n_in_sample_pairs"] == 0
    assert f"held-out file {other}" in (tmp_path / "o" / "report.md").read_text()


# ------------------------------------------------------------------------------------------- train: result or not
# fields of `run_identity.NOT_RESULT_FIELDS` (where a run writes and logs, how fast it loads data) with values other
# than the recipes' own: a rerun that differs in them all is the same run (the Hub fields apply only with a push, a
# judge's checkpoint fields never: `applicability`, refused there)
NOT_RESULT_CHANGES = [
    "--set", "logging_steps=3", "--set", "log_level=info", "--set", "project=elsewhere",
    "--set", "dataloader_num_workers=2", "--set", "disable_tqdm=true",
]  # fmt: skip


def test_a_reward_run_resumes_across_non_result_fields_and_refuses_a_result_field(tiny_bert_dir, tmp_path, capsys):
    """Through `emoreward train` on a reward recipe: a rerun differing only in fields that change no result
    (`run_identity.NOT_RESULT_FIELDS`) reuses the finished run; one differing in a result field (the seed, the
    length limit) is refused, exit 2, naming the field and both values."""
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, num_train_epochs=1, cv_folds=1)
    run_ok(capsys, ["train", "--config", recipe])
    text = run_ok(capsys, ["train", "--config", recipe, *NOT_RESULT_CHANGES, "--set", "save_total_limit=2"])
    assert "final model: finished earlier" in text
    for option, words in (("--seed=7", "recipe field seed (42 -> 7)"), ("--max_length=32", "max_length (64 -> 32)")):
        code, _, err = run_cli(capsys, ["train", "--config", recipe, option])
        assert code == 2 and words in err and "--overwrite_output_dir" in err, (option, err)


def test_a_judge_run_resumes_across_non_result_fields_and_refuses_a_result_field(tmp_path, capsys):
    """Through `emoreward train` on a judge recipe (SFT then DPO): a rerun differing only in non-result fields (SFT's
    `dataset_text_field`, which a judge's prompt / completion rows never read, the log level, ...) reuses the
    finished judge; one differing in a result field of either stage (`dpo_beta`, `max_length`, the seed, the
    learning rate) is refused, exit 2, naming the field and both values."""
    from test_trained_judge import build_chat_model, recipe, write_pairs

    base = build_chat_model(tmp_path / "base")
    path = recipe(tmp_path, base, cv_folds=0, max_steps=1, dpo_epochs=1.0, train_file=str(write_pairs(tmp_path)))
    run_ok(capsys, ["train", "--config", path])
    assert read_json(tmp_path / "out" / "report.json")["final"]["dpo_rows"] > 0
    text = run_ok(capsys, ["train", "--config", path, "--set", "dataset_text_field=other", *NOT_RESULT_CHANGES])
    assert "final model: finished earlier" in text
    for option, words in (
        ("--dpo_beta=0.2", "recipe field dpo_beta (0.1 -> 0.2)"),
        ("--max_length=1000", "recipe field max_length (2048 -> 1000)"),
        ("--seed=3", "recipe field seed (0 -> 3)"),
        ("--learning_rate=0.01", "recipe field learning_rate (0.03 -> 0.01)"),
    ):
        code, _, err = run_cli(capsys, ["train", "--config", path, option])
        assert code == 2 and words in err and "--overwrite_output_dir" in err, (option, err)


# ------------------------------------------------------------------------------------------- train: fields that apply
# a value other than each table field's default (every entry of both recipe classes' `FIELD_APPLIES` has one)
VARIED = {
    "lora_r": 8,
    "lora_alpha": 7,
    "lora_dropout": 0.25,
    "lora_target_modules": ["query"],
    "tie_parameter": 5.0,
    "controlled_negatives_file": "negatives.jsonl",
    "odin_length_weight": 2.0,
    "odin_orthogonal_weight": 0.5,
    "dpo_beta": 0.3,
    "dpo_learning_rate": 1e-6,
    "two_class_tie_policy": "first",
    "fit_workers": 2,  # folds side by side: no part of the identity, applying or not
    "use_audio_in_video": True,
    "fps": 1.0,
    "max_frames": 8,
    "min_pixels": 2000,
    "max_pixels": 200000,
    "media_root": "media",
    "wandb_project": "other",  # where a run logs: no part of the identity, applying or not
    "wandb_log_model": True,
    # the Hub fields (with push_to_hub) and the fields a pipeline overrides (never apply): where output goes
    "hub_model_id": "me/other",
    "hub_strategy": "end",
    "hub_token": "token",
    "hub_private_repo": True,
    "hub_always_push": True,
    "hub_revision": "dev",
    "resume_from_checkpoint": "checkpoint-3",
    "save_strategy": "epoch",
    "save_steps": 3,
    "save_total_limit": 2,
    "save_only_model": True,
    "save_on_each_node": True,
    # a judge's evaluation-during-training fields and chat template path (never apply to a judge recipe)
    "eval_strategy": "steps",
    "eval_steps": 7.0,
    "eval_delay": 3.0,
    "eval_accumulation_steps": 2,
    "eval_on_start": True,
    "include_for_metrics": ["loss"],
    "metric_for_best_model": "loss",
    "greater_is_better": True,
    "load_best_model_at_end": True,
    "per_device_eval_batch_size": 3,
    "prediction_loss_only": True,
    "eval_do_concat_batches": False,
    "batch_eval_metrics": True,
    "eval_use_gather_object": True,
    "eval_packing": False,
    "chat_template_path": "template",
    # a judge's sampler fields (apply with orders_together: false)
    "train_sampling_strategy": "sequential",
    "packing": True,
}
NOT_RESULT = NOT_RESULT_FIELDS & set(VARIED)  # the one classification (wandb_project, wandb_log_model)
# a folder counted by the content of the files read from it (`run_identity.media_content`): another folder holding no
# file the pairs read (as "media" here) is the same run; the media relations (tests/multimodal) vary the content
BY_CONTENT = {"media_root"}


def _recipes(tmp_path):
    """Each recipe class where every table condition holds (but `applicability.NEVER`'s), and where none does."""
    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.judge_config import JudgeTrainConfig

    (tmp_path / "negatives.jsonl").write_text('{"sample": "s0"}\n')
    common = {"output_dir": str(tmp_path / "out"), "bf16": False}
    applies = {
        "push_to_hub": True,
        "ties": "davidson",
        "controlled_negatives": ["all"],
        "length_debias": "disentangled",
        "report_to": ["wandb"],
    }
    return [
        (EmoRewardConfig(**common, **applies), EmoRewardConfig(**common, use_peft=False, cv_folds=0, report_to=[])),
        (JudgeTrainConfig(**common, model_name_or_path="org/chat", dpo_epochs=1.0, report_to=["wandb"], push_to_hub=True,
                          family="qwen2.5-omni-thinker", min_pixels=1000, max_pixels=100000, orders_together=False),
         JudgeTrainConfig(**common, model_name_or_path="org/chat", use_peft=False, report_to=[])),
    ]  # fmt: skip


def test_the_run_identity_holds_the_recipe_fields_that_apply(tmp_path, monkeypatch):
    """The run identity is built from the recipe fields that apply under the recipe's settings (the recipe tables,
    `emoreward.training.applicability.inapplicable_fields`): each table field changes the identity where its
    condition holds, and leaves it unchanged where it does not (a recipe default of LoRA rank under use_peft false
    or of the tie parameter under ties drop computes nothing), for both recipe kinds."""
    from emoreward.data import PreferencePair
    from emoreward.training.applicability import inapplicable_fields
    from emoreward.training.config import with_fields
    from emoreward.training.run_identity import run_identity

    monkeypatch.chdir(tmp_path)  # the negatives file by its relative name
    pairs = [PreferencePair("s0", "happy", "calm", "1"), PreferencePair("s1", "sad", "angry", "tie")]
    for applies, unused in _recipes(tmp_path):
        assert set(type(applies).FIELD_APPLIES.fields) <= set(VARIED)
        for name in type(applies).FIELD_APPLIES.fields:
            base = run_identity(applies, pairs)["fingerprint"]
            changed = run_identity(with_fields(applies, **{name: VARIED[name]}), pairs)["fingerprint"]
            never = name in inapplicable_fields(applies)  # `applicability.NEVER`: no recipe of the class reads it
            assert (changed == base) is (name in NOT_RESULT | BY_CONTENT or never), name
            base = run_identity(unused, pairs)["fingerprint"]
            assert run_identity(with_fields(unused, **{name: VARIED[name]}), pairs)["fingerprint"] == base, name


def test_a_rerun_that_differs_in_a_field_that_does_not_apply_is_the_same_run(tiny_bert_dir, tmp_path, capsys):
    """Through `emoreward train`: the recipe's LoRA rank under --no_use_peft is no part of the run, so a rerun whose
    recipe has another rank resumes the finished run (its weights would be byte-identical); the rank given on the
    command line with --no_use_peft is refused, exit 2, before any work."""
    recipe = tiny_recipe(tmp_path, tiny_bert_dir, num_train_epochs=1, cv_folds=1)
    run_ok(capsys, ["train", "--config", recipe, "--no_use_peft"])
    recipe.write_text(recipe.read_text().replace("lora_r: 4", "lora_r: 8"))
    assert "final model: finished earlier" in run_ok(capsys, ["train", "--config", recipe, "--no_use_peft"])
    assert "lora_r" not in read_json(tmp_path / "out" / "run_identity.json")["recipe"]
    code, _, err = run_cli(capsys, ["train", "--config", recipe, "--no_use_peft", "--lora_r", "8"])
    assert code == 2 and "lora_r=8 does not apply with use_peft=False" in err, err


# ------------------------------------------------------------------------------------------- train: judge recipes
def test_a_judge_recipe_resumes_only_the_same_content(tmp_path, capsys):
    """A judge recipe (`recipe: judge`) has the reward pipeline's run identity and resume (`run_identity`,
    `CrossValidation`'s finished folds, the final fit's `finished.json`): a rerun trains nothing (the report's
    counts: 0 folds trained), the same pairs renamed and shuffled are the same run, a result-changing field is
    another run (refused, then redone with --overwrite_output_dir), and a run that stopped after one fold trains
    only the rest."""
    from test_trained_judge import build_chat_model, recipe, write_pairs

    from emoreward.data import load_pairs

    base = build_chat_model(tmp_path / "base")
    data = write_pairs(tmp_path)
    path = recipe(tmp_path, base, cv_folds=2, max_steps=2, train_file=str(data))
    out = tmp_path / "out"
    run_ok(capsys, ["train", "--config", path])
    first = read_json(out / "report.json")
    assert (first["folds_trained"], first["folds_reused"]) == (2, 0)

    text = run_ok(capsys, ["train", "--config", path])  # nothing changed: 0 folds and no final fit retrained
    report = read_json(out / "report.json")
    assert (report["folds_trained"], report["folds_reused"]) == (0, 2)
    assert "fold 1/2: finished earlier" in text and "final model: finished earlier" in text
    assert report["cross_validation"] == first["cross_validation"] and report["final"] == first["final"]

    # the same pairs under another file name, rows shuffled: the same content, the same run
    rows = data.read_text().splitlines()
    moved = tmp_path / "renamed.jsonl"
    moved.write_text("\n".join(rows[::-1]) + "\n")
    assert len(load_pairs(moved)) == 16
    run_ok(capsys, ["train", "--config", path, "--set", f"train_file={moved}"])
    assert read_json(out / "report.json")["folds_trained"] == 0

    # a result-changing field: another run, refused with the reward pipeline's message, redone on request
    code, _, err = run_cli(capsys, ["train", "--config", path, "--learning_rate", "0.05"])
    assert code == 2 and "recipe field learning_rate" in err and "--overwrite_output_dir" in err, err
    run_ok(capsys, ["train", "--config", path, "--learning_rate", "0.05", "--overwrite_output_dir", "true"])
    assert read_json(out / "report.json")["folds_trained"] == 2

    # stopped after fold 1 (fold 2 and the final fit unfinished: no marker): only they train
    (out / "cv" / "fold1" / "finished.json").unlink()
    (out / "model" / "finished.json").unlink()
    text = run_ok(capsys, ["train", "--config", path, "--learning_rate", "0.05"])
    report = read_json(out / "report.json")
    assert (report["folds_trained"], report["folds_reused"]) == (1, 1)
    assert "fold 1/2: finished earlier" in text and "final model: finished earlier" not in text


def test_a_judge_recipe_counts_its_prompt_set_by_content(tmp_path, capsys):
    """A judge learns the text of its prompt set, so the set counts by content (`run_identity.prompt_content`, the
    file `zero_shot.prompts.prompt_file` resolves): the same prompts at another path are the same run (every fold
    reused); the file edited in place under the same path is another run (refused, naming the prompt set); a bundled
    set's name counts as its file's content."""
    from test_trained_judge import SHORT_PROMPTS, build_chat_model, recipe, write_pairs

    from emoreward.data import load_pairs
    from emoreward.training.config import resolve_config
    from emoreward.training.judge_config import JudgeTrainConfig
    from emoreward.training.run_identity import run_identity
    from zero_shot.prompts import prompt_file

    base = build_chat_model(tmp_path / "base")
    data = write_pairs(tmp_path)
    path = recipe(tmp_path, base, cv_folds=2, max_steps=2, train_file=str(data))
    out = tmp_path / "out"
    run_ok(capsys, ["train", "--config", path])
    report = read_json(out / "report.json")
    assert (report["folds_trained"], report["folds_reused"]) == (2, 0)

    moved = tmp_path / "elsewhere" / "prompts.yaml"  # the same questions under another path: the same run
    moved.parent.mkdir()
    shutil.copyfile(tmp_path / "tiny_prompts.yaml", moved)
    text = run_ok(capsys, ["train", "--config", path, "--set", f"prompts={moved}"])
    report = read_json(out / "report.json")
    assert (report["folds_trained"], report["folds_reused"]) == (0, 2) and "final model: finished earlier" in text

    edited = SHORT_PROMPTS.replace("{description_1}", "A) {description_1}", 1)  # another question, same path
    assert edited != SHORT_PROMPTS
    (tmp_path / "tiny_prompts.yaml").write_text(edited)
    code, _, err = run_cli(capsys, ["train", "--config", path])
    assert code == 2 and "the prompt set (" in err and "tiny_prompts.yaml: other content" in err, err
    assert "recipe field prompts" not in err

    # a registered name is its bundled file's content: the same identity as a copy of that file
    bundled = tmp_path / "bundled.yaml"
    shutil.copyfile(prompt_file("emoprefer_v1"), bundled)
    pairs = load_pairs(data)
    by_name = resolve_config(path, config_class=JudgeTrainConfig, overrides={"prompts": "emoprefer_v1"})
    by_file = resolve_config(path, config_class=JudgeTrainConfig, overrides={"prompts": str(bundled)})
    assert run_identity(by_name, pairs)["fingerprint"] == run_identity(by_file, pairs)["fingerprint"]
    bundled.write_text(bundled.read_text() + "\n# edited\n")
    assert run_identity(by_name, pairs)["fingerprint"] != run_identity(by_file, pairs)["fingerprint"]
