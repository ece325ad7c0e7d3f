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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from emoreward.data import PreferencePair
from emoreward.training.config import with_fields
from emoreward.training.judge_config import JudgeTrainConfig
from emoreward.training.provenance import write_training_data
from emoreward.utils.io import atomic_write_json


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
    write_training_data(out, config.train_file, pairs)  # before judge.yaml: a whole judge always has its record
    save_judge(model, tokenizer, config, out)
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


def evaluate_trained_judge(folder: str | Path, pairs: list[PreferencePair], *, tie_policy: str = "wrong") -> dict:
    """Every metric of the shared harness for the judge saved in `folder` on `pairs` (both orders, one run, INVALID
    counted), as `emoreward evaluate` computes it."""
    from emoreward.evaluation.harness import evaluate_judgements, run_judge
    from zero_shot import load_judge

    judge = load_judge(Path(folder) / JUDGE_FILE)
    result = run_judge(judge, pairs, swap=True, runs=1)
    return evaluate_judgements(result, tie_policy=tie_policy)


@dataclass
class JudgeRun:
    """What `run_judge_training` did: the fold evaluations, the final fit, where the judge is."""

    folds: list[dict] = field(default_factory=list)
    final: dict | None = None
    model_dir: str | None = None


def run_judge_training(config: JudgeTrainConfig, *, log=print) -> dict:
    """The judge recipe's job: cross-validation over folds grouped by sample (each fold trained on the others and
    judged on its own pairs by the shared harness), then the final judge on every pair (`<output_dir>/model`), and
    `report.json` with the folds' mean and std beside the length baseline.

    Raises:
        ValueError / DataError: bad data (file, row, field)."""
    from emoreward.data import load_pairs
    from emoreward.data.pairs import BUNDLED, bundled_dataset_path
    from emoreward.evaluation.report import aggregate, headline, markdown_table
    from emoreward.training.pipeline import stratified_folds
    from emoreward.utils.io import hold_output

    source = bundled_dataset_path(config.train_file) if config.train_file in BUNDLED else config.train_file
    pairs = load_pairs(source)
    out = Path(config.output_dir)
    hold_output(out, "--output-dir")  # one writer
    if out.is_dir() and any(out.iterdir()):  # no resume yet: another run's judge or report is never mixed in
        raise ValueError(
            f"--output-dir {out} holds earlier work (a judge recipe does not resume): choose another folder or "
            "remove it"
        )
    out.mkdir(parents=True, exist_ok=True)
    run = JudgeRun()
    if config.cv_folds:
        for k, (train_idx, test_idx) in enumerate(stratified_folds(pairs, config.cv_folds, config.seed)):
            fold_dir = out / "cv" / f"fold{k}"
            fit = fit_judge(config, [pairs[i] for i in train_idx], fold_dir / "judge")
            evaluation = evaluate_trained_judge(fold_dir / "judge", [pairs[i] for i in test_idx])
            evaluation.update(fold=k, n_train=len(train_idx), **{key: fit[key] for key in ("sft_rows", "dpo_rows")})
            run.folds.append(evaluation)
            h = headline(evaluation)
            log(
                f"fold {k + 1}/{config.cv_folds}: 2-class WAF {h['judge'].get('two_class_waf')} (length baseline "
                f"{h['length_baseline'].get('two_class_waf')}), trained {fit['train_seconds']:.0f}s"
            )
    if config.final_fit:
        run.final = fit_judge(config, pairs, out / "model")
        run.model_dir = str(out / "model")
    report = {
        "recipe": "judge",
        "n_pairs": len(pairs),
        "folds": run.folds,
        "final": run.final,
        "model_dir": run.model_dir,
    }
    if run.folds:
        summary = aggregate(run.folds)
        report["cv_summary"] = summary
        report["markdown"] = markdown_table(summary, title=f"{config.cv_folds}-fold cross-validation (trained judge)")
    atomic_write_json(out / "report.json", report)
    if report.get("markdown"):
        (out / "report.md").write_text(report["markdown"] + "\n", encoding="utf-8")
    return report


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
