"""Trained generative judges: a chat LM (SmolLM2, any causal LM; LoRA through peft) learns to answer S1's question
(`zero_shot.strategies.compare_prompt`, the template it is judged with) with the verdict, by TRL's `SFTTrainer` and
then, optionally, `DPOTrainer` (the right verdict preferred to a wrong one); every pair in both orders. A trained
judge is a folder (merged weights + `judge.yaml`, logit verdicts) that every command loads as a judge.
See docs/judges.md#trained-judges.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from emoreward.data import PreferencePair
from emoreward.training.config import public_config, with_fields
from emoreward.training.distributed import distributed_setup, wait_for_everyone
from emoreward.training.judge_config import JudgeTrainConfig
from emoreward.training.provenance import write_training_data
from emoreward.utils.io import atomic_write_json, atomic_write_text


logger = logging.getLogger(__name__)
JUDGE_FILE = "judge.yaml"  # a trained judge's definition, in its folder
PROMPTS_FILE = "prompts.yaml"  # the prompt set it was trained with, beside it
WRONG = {"1": ("2",), "2": ("1",), "tie": ("1", "2")}  # DPO: the verdicts a label's right one is preferred to


def verdict_examples(
    pairs: list[PreferencePair], prompts: Any, tokenizer: Any, *, ties: str = "train"
) -> tuple[list[dict[str, str]], int]:
    """SFT rows ``{"prompt", "completion"}``: each labelled pair in both orders, the prompt the chat text the judge
    reads up to its answer (`zero_shot.backends.transformers_text.chat_prompt_text` + the prompt set's answer
    prefix), the completion the verdict label as logit scoring reads it (`answer_separator` + label).

    Returns:
        (rows, number of gold ties dropped with ``ties="drop"``).

    Raises:
        ValueError: an unlabelled pair (names its row)."""
    rows, dropped = [], 0
    for pair in pairs:
        if pair.label is None:
            raise ValueError(f"row {pair.row}: pair {pair.sample_id!r} has no label; a judge trains on labelled pairs")
        if pair.label == "tie" and ties == "drop":
            dropped += 1
            continue
        for ordered in (pair, pair.swapped()):
            prompt, sep = judge_prompt(ordered, prompts, tokenizer)
            rows.append({"prompt": prompt, "completion": sep + ordered.label})  # "1" / "2" / "tie": the parser's
    return rows, dropped


def preference_examples(pairs: list[PreferencePair], prompts: Any, tokenizer: Any, *, ties: str = "train") -> list:
    """DPO rows ``{"prompt", "chosen", "rejected"}``: the right verdict against each wrong one, both orders."""
    rows = []
    for pair in pairs:
        if pair.label is None or (pair.label == "tie" and ties == "drop"):
            continue
        for ordered in (pair, pair.swapped()):
            prompt, sep = judge_prompt(ordered, prompts, tokenizer)
            for wrong in WRONG[ordered.label]:
                rows.append({"prompt": prompt, "chosen": sep + ordered.label, "rejected": sep + wrong})
    return rows


def judge_prompt(pair: PreferencePair, prompts: Any, tokenizer: Any) -> tuple[str, str]:
    """(the chat text up to the verdict label, the separator before the label): the logit-verdict request of S1
    for a text judge, built by the functions the judge uses."""
    from zero_shot.backends.base import ChatRequest
    from zero_shot.backends.transformers_text import answer_separator, chat_prompt_text
    from zero_shot.strategies import compare_prompt

    request = ChatRequest(
        prompt=compare_prompt(prompts, pair), system=prompts.system, answer_prefix=prompts.logit_answer_prefix
    )
    return chat_prompt_text(tokenizer, request) + request.answer_prefix, answer_separator(request.answer_prefix)


def load_chat_model(config: JudgeTrainConfig):
    """(causal LM in float32, tokenizer) of the recipe's model (a GGUF file is dequantised by transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zero_shot.backends.hf_common import resolve_model_path

    path = resolve_model_path(config.model_name_or_path)
    extra = {"gguf_file": config.gguf_file} if config.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=config.trust_remote_code, **extra)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, trust_remote_code=config.trust_remote_code, **extra
    )
    return model, tokenizer


def _peft_config(config: JudgeTrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules or "all-linear",
        task_type="CAUSAL_LM",
    )


def fit_judge(config: JudgeTrainConfig, pairs: list[PreferencePair], output_dir: str | Path) -> dict:
    """Train one judge on `pairs` (SFT, then DPO when ``dpo_epochs > 0``) and save it to `output_dir` (merged
    weights, tokenizer, `training_data.json`: the in-sample check of evaluate / judge / rank, `judge.yaml`).

    Returns:
        ``{"sft_rows", "dpo_rows", "ties_dropped", "train_seconds", "train_log"}``.

    Raises:
        ValueError: no pair to train on (all dropped) or an unlabelled pair."""
    from transformers import set_seed
    from trl import DPOConfig, DPOTrainer, SFTTrainer

    from zero_shot.prompts import load_prompts

    set_seed(config.seed)
    out = Path(output_dir)
    prompts = load_prompts(config.prompts)
    model, tokenizer = load_chat_model(config)
    rows, dropped = verdict_examples(pairs, prompts, tokenizer, ties=config.ties)
    if not rows:
        raise ValueError(f"no pair to train the judge on ({dropped} gold ties dropped with ties: drop)")
    start = time.perf_counter()
    dpo_rows = preference_examples(pairs, prompts, tokenizer, ties=config.ties) if config.dpo_epochs > 0 else []
    with tempfile.TemporaryDirectory(prefix="emoreward-judge-") as scratch:  # the trainers save nothing themselves
        args = with_fields(config, output_dir=str(Path(scratch) / "sft"), save_strategy="no")
        model, log = _stage(SFTTrainer, model, args, rows, tokenizer, config)
        if dpo_rows:
            dpo_args = DPOConfig(
                output_dir=str(Path(scratch) / "dpo"),
                num_train_epochs=config.dpo_epochs,
                learning_rate=config.dpo_learning_rate,
                beta=config.dpo_beta,
                per_device_train_batch_size=config.per_device_train_batch_size,
                gradient_accumulation_steps=config.gradient_accumulation_steps,
                max_length=config.max_length,
                max_steps=config.max_steps,
                logging_steps=config.logging_steps,
                save_strategy="no",
                report_to=config.report_to,
                seed=config.seed,
                bf16=config.bf16,
                use_cpu=config.use_cpu,
            )
            model, dpo_log = _stage(DPOTrainer, model, dpo_args, dpo_rows, tokenizer, config)
            log += [{**entry, "stage": "dpo"} for entry in dpo_log]
    seconds = time.perf_counter() - start
    if config.process_index == 0:  # under `accelerate launch` every process holds the same weights: one writes
        write_training_data(out, config.train_file, pairs)  # before judge.yaml: a whole judge always has its record
        save_judge(model, tokenizer, config, out)
    wait_for_everyone(config)  # the folder is whole before any process reads it
    return {
        "sft_rows": len(rows),
        "dpo_rows": len(dpo_rows),
        "ties_dropped": dropped,
        "train_seconds": seconds,
        "train_log": log,
    }


def _stage(trainer_class, model, args, rows: list[dict], tokenizer, config: JudgeTrainConfig) -> tuple[Any, list]:
    """One TRL stage (`SFTTrainer` or `DPOTrainer`) on ``rows`` with a fresh LoRA (merged into the weights after, so
    the next stage, or the saved judge, is a plain causal LM): (the model, the stage's log history)."""
    from datasets import Dataset

    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=_peft_config(config) if config.use_peft else None,
    )
    trainer.train()
    model = trainer.model.merge_and_unload() if config.use_peft else trainer.model
    return model, list(trainer.state.log_history)


def save_judge(model, tokenizer, config: JudgeTrainConfig, out: Path) -> None:
    """Merged weights (safetensors), tokenizer and the prompt set (`prompts.yaml`) in `out`, then `judge.yaml`
    (written last: a folder with it is a whole judge): logit verdicts, greedy decoding, the model ``.``; the folder
    moves whole."""
    import shutil

    from zero_shot.prompts import load_prompts

    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    shutil.copyfile(load_prompts(config.prompts).source, out / PROMPTS_FILE)  # the questions it learned, kept
    definition = {
        "name": config.run_name or out.name,
        "description": f"trained judge ({config.model_name_or_path}, LoRA via TRL SFT"
        + (" + DPO" if config.dpo_epochs > 0 else "")
        + ")",
        "prompts": f"./{PROMPTS_FILE}",
        "verdict": "logits",
        "sampling": {"do_sample": False, "max_new_tokens": 8, "seed": 0},
        "mllm": {"backend": "transformers-text", "model": ".", "dtype": "float32", "device": "auto", "batch_size": 8},
    }
    tmp = out / (JUDGE_FILE + ".tmp")
    tmp.write_text(yaml.safe_dump(definition, sort_keys=False), encoding="utf-8")
    tmp.replace(out / JUDGE_FILE)


def evaluate_trained_judge(
    folder: str | Path, pairs: list[PreferencePair], *, tie_policy: str = "wrong", controlled: tuple | None = None
) -> dict:
    """Every metric of the shared harness for the judge saved in `folder` on `pairs` (both orders, one run, INVALID
    counted), as `emoreward evaluate` computes it; with `controlled` (``(negatives, where they come from)``) the
    controlled-error section too (`emoreward.evaluation.harness.controlled_errors`: each negative against its
    original in both orders, swap consistency included)."""
    from emoreward.evaluation.harness import controlled_errors, evaluate_judgements, run_judge
    from zero_shot import load_judge

    judge = load_judge(Path(folder) / JUDGE_FILE)
    result = run_judge(judge, pairs, swap=True, runs=1)
    evaluation = evaluate_judgements(result, tie_policy=tie_policy)
    if controlled is not None:
        evaluation["controlled_errors"] = controlled_errors(judge, controlled[0], source=controlled[1])
    return evaluation


def run_judge_training(config: JudgeTrainConfig, *, log=print) -> dict:
    """The judge recipe's job, on the reward-model pipeline's machinery (`emoreward.training.pipeline`): the pairs in
    content order, the run identity checked and recorded (`run_identity.check_resumable`: another run's work is
    refused, the same run's finished folds and final fit are reused), cross-validation over folds grouped by sample
    (`CrossValidation`: each fold's judge trained on the others, judged by the shared harness on its own pairs with
    the controlled-error section of their negatives, one W&B run per fold), then the final judge on every pair
    (`<output_dir>/model`, `finished.json` last) and `report.json` / `report.md`. Every process of an `accelerate
    launch` runs it; the main one writes.

    Returns:
        the report (also `<output_dir>/report.json`): `cross_validation` (`{"k", "seed", "summary", "folds",
        "controlled_errors", ...}`), `folds_trained` / `folds_reused` (work done by this call), `final`,
        `model_dir`, `markdown`.

    Raises:
        ValueError / DataError: bad data (file, row, field); RunIdentityError: the folder holds another run's work."""
    import torch

    from emoreward.data import read_pairs
    from emoreward.data.negatives import generate_negatives
    from emoreward.data.pairs import BUNDLED, bundled_dataset_path, canonical_pairs
    from emoreward.training.pipeline import (
        CONTROLLED_SOURCE,
        FINISHED_FILE,
        CrossValidation,
        FitResult,
        final_fingerprint,
        load_finished,
        wandb_group,
        wandb_line,
    )
    from emoreward.training.run_identity import check_resumable, run_identity
    from emoreward.training.tracking import configure_wandb, finish_wandb, start_wandb_run, wandb_enabled

    source = bundled_dataset_path(config.train_file) if config.train_file in BUNDLED else config.train_file
    loaded = read_pairs(source)
    pairs = canonical_pairs(loaded.pairs)  # the file's row order (and name) changes nothing
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    is_main = config.process_index == 0
    if not is_main:
        log = _silent
    check_resumable(config, run_identity(config, pairs), is_main=is_main)  # the scalar pipeline's rule and message
    wait_for_everyone(config)
    wandb_mode = configure_wandb(config)
    log(f"emoreward train: judge {config.model_name_or_path}, data {config.train_file}, output {out}")
    log(f"loaded {loaded.summary()}")
    if wandb_mode is not None:
        log(wandb_line(config, pairs, wandb_mode))
    report: dict = {
        "recipe": "judge",
        "config": public_config(config),
        "train_file": str(config.train_file),
        "n_pairs": len(pairs),
        "wandb_mode": wandb_mode,
        "distributed": distributed_setup(config),
    }

    def fit(train: list[PreferencePair], fold_dir: Path, name: str) -> FitResult:
        record = fit_judge(config, train, fold_dir / "judge")
        return FitResult(
            fold_dir / "judge", None, record["train_seconds"], record["train_log"], 0.0, torch.get_num_threads()
        )

    def evaluate(folder: Path, test: list[PreferencePair]) -> dict:
        negatives = generate_negatives(test).negatives  # of the held-out pairs only
        return evaluate_trained_judge(folder, test, controlled=(negatives, CONTROLLED_SOURCE))

    if config.cv_folds:
        with CrossValidation(config, pairs, fit=fit, evaluate=evaluate, log=log) as folds:
            report["folds_trained"] = len(folds.jobs)
            report["folds_reused"] = config.cv_folds - len(folds.jobs)
            report["cross_validation"], report["markdown"] = folds.result()
    if config.final_fit:
        model_dir, fingerprint = out / "model", final_fingerprint(config, pairs)
        report["final"] = load_finished(model_dir, fingerprint)
        if report["final"] is not None:
            log(f"final model: finished earlier, reusing {model_dir}")
        else:
            if wandb_enabled(config):
                start_wandb_run(
                    config, name=config.run_name or "emoreward-judge", job_type="final",
                    group=wandb_group(config, pairs), kind="final-fit",
                )  # fmt: skip
            report["final"] = fit_judge(config, pairs, model_dir)
            if is_main:  # written last: the folder is a whole judge of this run
                atomic_write_json(
                    model_dir / FINISHED_FILE, {"fingerprint": fingerprint, "evaluation": report["final"]}
                )
            seconds = report["final"]["train_seconds"]
            log(f"final judge (all {len(pairs)} pairs) saved to {model_dir}, trained {seconds:.0f}s")
        report["model_dir"] = str(model_dir)
    if is_main:
        atomic_write_json(out / "report.json", report)
        if report.get("markdown"):
            atomic_write_text(out / "report.md", report["markdown"] + "\n")
    finish_wandb()
    wait_for_everyone(config)
    return report


def _silent(*_args, **_kwargs) -> None:
    return None


__all__ = [
    "JUDGE_FILE",
    "JudgeTrainConfig",
    "evaluate_trained_judge",
    "fit_judge",
    "preference_examples",
    "run_judge_training",
    "save_judge",
    "verdict_examples",
]
