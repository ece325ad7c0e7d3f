"""The main job: cross-validate, fit and evaluate an emotion reward model on preference pairs.

`run_training(config)` is the single code path behind `emoreward train` and `scripts/train_reward.py`:

1. load and validate the pairs (`config.train_file`);
2. stratified k-fold cross-validation: per fold, fit on k-1 folds, calibrate the tie threshold on them,
   judge the held-out fold in normal and swapped order, compute the metrics beside the length and random
   baselines;
3. fit on all pairs, calibrate, save the adapter + value head (and a model card);
4. optionally evaluate on `config.eval_file`;
5. write `report.json`, `report.md` and `confusion.png` to the output directory and return the report.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.model_selection import StratifiedKFold
from transformers import set_seed

from emoreward.data import PreferencePair, load_pairs
from emoreward.evaluation.harness import evaluate_judgements, run_judge
from emoreward.evaluation.judge import RewardModelJudge
from emoreward.evaluation.metrics import calibrate_tie_threshold
from emoreward.evaluation.report import aggregate, headline, markdown_table, plot_confusion, write_json
from emoreward.models import EmoRewardModel
from emoreward.training.config import EmoRewardConfig
from emoreward.training.length import fit_length_penalty
from emoreward.training.preprocess import ExclusionReport, build_reward_dataset
from emoreward.training.trainer import EmoRewardTrainer


logger = logging.getLogger(__name__)

# written last into a fold or model directory: the work there is complete (an interrupted run skips it)
FINISHED_FILE = "finished.json"


@dataclass
class FitResult:
    """One fitted reward model and what happened while fitting it."""

    model: EmoRewardModel
    exclusions: ExclusionReport
    train_seconds: float
    log_history: list[dict]
    tie_threshold: float


def wandb_enabled(config: EmoRewardConfig) -> bool:
    return "wandb" in (config.report_to or [])


def configure_wandb(config: EmoRewardConfig) -> str | None:
    """Prepare W&B from the environment, never from the recipe: with no API key (neither `WANDB_API_KEY` nor
    a `wandb login` entry) the run logs offline instead of failing. `WANDB_*` variables set by the user win.

    Returns the W&B mode in effect, or None when W&B is not in `report_to`.
    """
    if not wandb_enabled(config):
        return None
    os.environ.setdefault("WANDB_PROJECT", config.wandb_project)
    os.environ.setdefault("WANDB_DIR", str(Path(config.output_dir).resolve()))
    Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
    if "WANDB_MODE" not in os.environ and not _has_wandb_key():
        os.environ["WANDB_MODE"] = "offline"
        logger.warning(
            "no W&B API key found: logging offline to %s (sync later with `wandb sync`)", os.environ["WANDB_DIR"]
        )
    os.environ.setdefault("WANDB_LOG_MODEL", "false")
    return os.environ.get("WANDB_MODE", "online")


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def _lora_config(config: EmoRewardConfig):
    from peft import LoraConfig

    return LoraConfig(
        task_type="SEQ_CLS",  # puts the value head (`score` / `classifier`) in modules_to_save
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
    )


def fit_reward_model(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    *,
    output_dir: str | Path,
    run_name: str,
    save: bool,
    eval_pairs: list[PreferencePair] | None = None,
) -> FitResult:
    """Train one reward model on `pairs` with TRL (through `EmoRewardTrainer`), then calibrate its tie
    threshold on the same pairs. With `save`, the trainer's checkpoints go to `output_dir` and an interrupted
    run resumes from the last one. With `eval_pairs` and `eval_strategy` set, the trainer evaluates on them
    (eval reward accuracy) and `load_best_model_at_end` keeps the best checkpoint; without `eval_pairs`
    evaluation during training is off."""
    set_seed(config.seed)
    dtype = torch.float32  # master weights; `bf16: true` in the recipe turns on autocast for the compute
    model = EmoRewardModel.from_backbone(
        config.model_name_or_path,
        gguf_file=config.gguf_file,
        lora_config=_lora_config(config) if config.use_peft else None,
        instruction=config.instruction,
        max_length=config.max_length,
        dtype=dtype,
        trust_remote_code=config.trust_remote_code,
        model_kwargs=config.model_init_kwargs if isinstance(config.model_init_kwargs, dict) else None,
        train_head_bias=config.center_rewards_coefficient is not None,
        num_heads=2 if config.length_debias == "disentangled" else 1,
    )
    dataset, exclusions = build_reward_dataset(pairs, model, ties=config.ties, truncation=config.truncation)
    logger.info("%s: %s", run_name, exclusions.summary())
    changes = {"output_dir": str(output_dir), "run_name": run_name, "save_strategy": config.save_strategy}
    if not save:
        changes.update(save_strategy="no", load_best_model_at_end=False)
    eval_dataset = None
    if eval_pairs and config.eval_strategy != "no":
        eval_dataset, _ = build_reward_dataset(eval_pairs, model, ties=config.ties, truncation=config.truncation)
    else:  # no held-out pairs (e.g. a cross-validation fold: its test fold must not pick the checkpoint)
        changes.update(eval_strategy="no", load_best_model_at_end=False)
    args = _replace(config, **changes)
    trainer = _DistributedSafeTrainer(
        model=model.model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=model.tokenizer,
    )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=_last_checkpoint(output_dir) if save else None)
    seconds = time.perf_counter() - start
    model.model = trainer.model
    model.model.eval()
    if config.length_debias == "penalty":
        model.settings.length_penalty = fit_length_penalty(model, pairs, batch_size=config.score_batch_size)
    threshold = 0.0
    if config.calibrate_tie_threshold:
        judge = RewardModelJudge(model, tie_threshold=0.0, batch_size=config.score_batch_size)
        r1, r2 = judge.pair_rewards(pairs)
        threshold = calibrate_tie_threshold(r1 - r2, [p.label for p in pairs])
    model.settings.tie_threshold = threshold
    return FitResult(model, exclusions, seconds, list(trainer.state.log_history), threshold)


class _DistributedSafeTrainer(EmoRewardTrainer):
    """`EmoRewardTrainer` whose saves under DeepSpeed ZeRO-3 + LoRA write whole tensors.

    transformers gathers only the trainable parameters of a peft model under ZeRO-3
    (`exclude_frozen_parameters=True`), but the value head is a peft `modules_to_save` module whose bias is frozen
    (it gets no gradient from a pairwise loss), and peft needs every tensor of that module to save it
    (`KeyError: 'modules_to_save.default.bias'`). Here the adapter and value-head parameters, frozen or not, are
    gathered from their shards (on every process) and the main process writes them.
    """

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not (self.is_deepspeed_enabled and _zero3_enabled() and hasattr(self.model, "peft_config")):
            return super().save_model(output_dir, _internal_call)
        state_dict = _gather_adapter_state_dict(self.model)
        if self.args.should_save:
            self._save(output_dir or self.args.output_dir, state_dict=state_dict)


def _zero3_enabled() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def _adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """What a peft save writes: trainable parameters (LoRA) and the whole value head (`modules_to_save`)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad or "modules_to_save" in n}


def _gather_adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole CPU copies of the adapter and value-head parameters, gathered from their ZeRO-3 shards.
    Every process must call it (the gather is collective)."""
    import deepspeed

    out = {}
    for name, param in _adapter_parameters(model).items():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            out[name] = param.detach().cpu().clone()
    return out


def _save_final_model(model: EmoRewardModel, directory: Path, config: EmoRewardConfig, model_card: str) -> None:
    """Save on the main process only. Under ZeRO-3 every process first gathers the adapter and value head from
    their shards (all weights for full fine-tuning), so each saved tensor is whole."""
    if _zero3_enabled():
        import deepspeed

        peft = hasattr(model.model, "peft_config")
        params = list(_adapter_parameters(model.model).values() if peft else model.model.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if config.process_index == 0:
                model.save_pretrained(directory, model_card=model_card)
    elif config.process_index == 0:
        model.save_pretrained(directory, model_card=model_card)
    _wait_for_everyone(config)


def _wait_for_everyone(config: EmoRewardConfig) -> None:
    if config.world_size > 1:
        config.distributed_state.wait_for_everyone()


def _replace(config: EmoRewardConfig, **changes) -> EmoRewardConfig:
    import copy

    new = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(new, key, value)
    return new


def _last_checkpoint(output_dir: str | Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None


def evaluate_model(
    model: EmoRewardModel, pairs: list[PreferencePair], *, tie_policy: str = "wrong", batch_size: int = 32
) -> dict:
    """Judge labelled pairs with a reward model in normal and swapped order and compute every metric."""
    judge = RewardModelJudge(model, batch_size=batch_size)
    start = time.perf_counter()
    result = run_judge(judge, pairs, swap=True)
    seconds = time.perf_counter() - start
    evaluation = evaluate_judgements(result, tie_policy=tie_policy)
    evaluation["tie_threshold"] = judge.tie_threshold
    evaluation["n_descriptions_scored"] = judge.n_scored
    evaluation["n_truncated_at_scoring"] = model.count_truncated(
        [p.description_1 for p in pairs] + [p.description_2 for p in pairs],
        [p.media.subtitle for p in pairs] * 2,
    )
    evaluation["scoring_seconds"] = seconds
    first = result.normal[0]
    # per-pair rewards in the normal order: the reward histogram, and checks that a saved model scores the same
    evaluation["pair_rewards"] = {
        "sample_id": [p.sample_id for p in pairs],
        "reward_1": [j.reward_1 for j in first],
        "reward_2": [j.reward_2 for j in first],
    }
    return evaluation


def stratified_folds(pairs: list[PreferencePair], k: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Stratified k-fold split of pair indices by label (scikit-learn `StratifiedKFold`, shuffled, seeded)."""
    labels = [p.label for p in pairs]
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(list(tr), list(te)) for tr, te in splitter.split(np.zeros(len(labels)), labels)]


def _log_to_wandb(
    evaluation: dict,
    prefix: str = "harness",
    *,
    config: EmoRewardConfig | None = None,
    kind: str = "",
    title: str = "",
) -> None:
    """Log one harness evaluation to the active W&B run (the main process's; other processes have none): the
    headline metrics as scalars and as a table (judge beside the baselines), the three-class confusion matrix
    and the reward histogram as images, and tags naming the run's kind and setup (added to `WANDB_TAGS`)."""
    import tempfile

    import wandb

    if wandb.run is None:
        return
    rows = headline(evaluation)
    flat = {f"{prefix}/{column}/{k}": v for column, row in rows.items() for k, v in row.items() if v is not None}
    metrics = list(dict.fromkeys(k for row in rows.values() for k in row))
    table = wandb.Table(columns=["metric", *rows], data=[[m, *(rows[c].get(m) for c in rows)] for m in metrics])
    media = {f"{prefix}/metrics": table}
    with tempfile.TemporaryDirectory() as tmp:
        three = evaluation["judge"]["three_class"]
        cm_path = plot_confusion(
            three["confusion"], three["labels"], three["pred_labels"], Path(tmp) / "confusion.png", title=title
        )
        media[f"{prefix}/confusion_matrix"] = wandb.Image(str(cm_path))
        if "pair_rewards" in evaluation:
            hist_path = _plot_reward_histogram(evaluation["pair_rewards"], Path(tmp) / "rewards.png", title=title)
            media[f"{prefix}/reward_histogram"] = wandb.Image(str(hist_path))
        wandb.log({**flat, **media})
    wandb.run.summary.update(flat)
    if config is not None:
        wandb.run.tags = tuple(dict.fromkeys([*(wandb.run.tags or ()), *_wandb_tags(config, kind)]))


def _wandb_tags(config: EmoRewardConfig, kind: str) -> list[str]:
    """Tags of a run: the project, the run's kind, backbone, tie handling and how it was distributed."""
    backbone = Path(config.model_name_or_path).name[:48]
    tags = ["emoreward", f"backbone:{backbone}", f"ties:{config.ties}", f"world_size:{config.world_size}"]
    if config.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        tags.append("deepspeed")
    return tags + ([kind] if kind else [])


def _plot_reward_histogram(pair_rewards: dict, path: Path, title: str = "") -> Path:
    """Histogram of the rewards of both descriptions of every pair, and of the differences r1 - r2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r1, r2 = np.asarray(pair_rewards["reward_1"]), np.asarray(pair_rewards["reward_2"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
    ax1.hist(np.concatenate([r1, r2]), bins=30)
    ax1.set_xlabel("reward r(description)")
    ax2.hist(r1 - r2, bins=30)
    ax2.set_xlabel("r1 - r2")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()


def _num(value: float | None) -> str:
    """A metric for a log line: two decimals, or "n/a" when undefined (e.g. no length-counter pair)."""
    return "n/a" if value is None else f"{value:.2f}"


def run_cross_validation(
    config: EmoRewardConfig,
    pairs: list[PreferencePair],
    *,
    fit: Callable[[list[PreferencePair], Path, str], FitResult],
    evaluate: Callable[[object, list[PreferencePair]], dict],
    log=print,
) -> tuple[dict, str]:
    """Stratified k-fold cross-validation (`config.cv_folds` folds, `config.seed`) of any reward model.

    Per fold: `fit(train_pairs, fold_dir, run_name)` trains on k-1 folds (nothing saved) and calibrates the tie
    threshold on them; `evaluate(model, test_pairs)` judges the held-out fold with the shared harness;
    `<output_dir>/cv/fold<k>/finished.json` is written last, so a rerun of the same recipe and data reuses a
    finished fold and redoes an interrupted one. Only the main process writes files; every process trains.

    Returns:
        (`{"k", "seed", "summary": mean ± std over folds, "folds": [evaluation, ...]}`, Markdown table). Also
        writes `<output_dir>/confusion.png` (three-class confusion summed over the held-out folds).
    """
    out = Path(config.output_dir)
    is_main = config.process_index == 0
    fold_reports = []
    for k, (train_idx, test_idx) in enumerate(stratified_folds(pairs, config.cv_folds, config.seed)):
        fold_dir = out / "cv" / f"fold{k}"
        fingerprint = _fold_fingerprint(config, pairs, train_idx, test_idx)
        evaluation = _load_finished(fold_dir, fingerprint)
        if evaluation is not None:
            log(f"fold {k + 1}/{config.cv_folds}: finished earlier, reusing {fold_dir / FINISHED_FILE}")
            fold_reports.append(evaluation)
            continue
        train = [pairs[i] for i in train_idx]
        test = [pairs[i] for i in test_idx]
        result = fit(train, fold_dir, f"{config.run_name or 'emoreward'}-fold{k}")
        evaluation = evaluate(result.model, test)
        evaluation.update(
            fold=k, train_seconds=result.train_seconds, exclusions=result.exclusions.to_dict(), n_train=len(train)
        )
        if wandb_enabled(config):
            _log_to_wandb(evaluation, config=config, kind="cv-fold", title=f"fold {k}, held-out pairs")
            _finish_wandb()
        if is_main:
            write_json({"fingerprint": fingerprint, "evaluation": evaluation}, fold_dir / FINISHED_FILE)
        fold_reports.append(evaluation)
        train_seconds, summary = result.train_seconds, result.exclusions.summary()
        del result  # free this fold's model and optimizer before the next fold builds its own
        gc.collect()
        h = headline(evaluation)
        log(
            f"fold {k + 1}/{config.cv_folds}: 2-class WAF {_num(h['judge']['two_class_waf'])} "
            f"(length baseline {_num(h['length_baseline']['two_class_waf'])}), "
            f"length-debiased ACC {_num(h['judge']['length_debiased_acc'])}, trained {train_seconds:.0f}s; "
            f"{summary}"
        )
    summary = aggregate(fold_reports)
    cross_validation = {"k": config.cv_folds, "seed": config.seed, "summary": summary, "folds": fold_reports}
    if is_main:
        cm = np.sum([f["judge"]["three_class"]["confusion"] for f in fold_reports], axis=0)
        plot_confusion(
            cm,
            ["1", "2", "tie"],
            fold_reports[0]["judge"]["three_class"]["pred_labels"],
            out / "confusion.png",
            title=f"{config.cv_folds}-fold CV, held-out pairs",
        )
    markdown = markdown_table(
        summary,
        f"{config.cv_folds}-fold cross-validation on {len(pairs)} pairs (mean ± std over folds, held-out folds)",
    )
    return cross_validation, markdown


def start_job(config: EmoRewardConfig, log=print) -> tuple[Path, bool, Callable, list[PreferencePair], dict]:
    """The common start of a main job (text or multimodal): create the output folder, configure W&B, load the
    pairs and open the report. Under `accelerate launch` every process runs the job; only the main one logs and
    writes files, so other processes get a silent `log`.

    Returns:
        `(output_dir, is_main, log, pairs, report)`.
    """
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    is_main = config.process_index == 0
    if not is_main:
        log = _silent
    wandb_mode = configure_wandb(config)
    pairs = load_pairs(config.train_file)
    log(f"loaded {len(pairs)} pairs from {config.train_file}")
    report: dict = {
        "recipe": _public_config(config),
        "train_file": str(config.train_file),
        "n_pairs": len(pairs),
        "wandb_mode": wandb_mode,
    }
    return out, is_main, log, pairs, report


def run_training(config: EmoRewardConfig, *, log=print) -> dict:
    """Run the main job (cross-validation, final fit, evaluation, reports); see the module docstring.

    Returns:
        the report dict also written to `<output_dir>/report.json`.
    """
    out, is_main, log, pairs, report = start_job(config, log)
    if config.cv_folds > 1:
        report["cross_validation"], report["markdown"] = run_cross_validation(
            config,
            pairs,
            fit=lambda train, fold_dir, name: fit_reward_model(
                config, train, output_dir=fold_dir, run_name=name, save=False
            ),
            evaluate=lambda model, test: evaluate_model(
                model, test, tie_policy=config.two_class_tie_policy, batch_size=config.score_batch_size
            ),
            log=log,
        )
    if config.final_fit:
        model_dir = out / "model"
        all_idx = list(range(len(pairs)))
        fingerprint = _fold_fingerprint(config, pairs, all_idx, [])
        final = _load_finished(model_dir, fingerprint)
        if final is not None:
            log(f"final model: finished earlier, reusing {model_dir}")
            fit = FitResult(
                EmoRewardModel.from_pretrained(model_dir), None, final["train_seconds"], [], final["tie_threshold"]
            )  # type: ignore[arg-type]
            report["final"] = final
        else:
            fit = fit_reward_model(
                config,
                pairs,
                output_dir=out / "checkpoints",
                run_name=config.run_name or "emoreward-final",
                save=True,
                eval_pairs=load_pairs(config.eval_file) if config.eval_file else None,
            )
            _save_final_model(fit.model, model_dir, config, model_card(config, report, fit))
            report["final"] = {
                "model_dir": str(model_dir),
                "train_seconds": fit.train_seconds,
                "tie_threshold": fit.tie_threshold,
                "exclusions": fit.exclusions.to_dict(),
                "train_log": fit.log_history,
            }
            # written last: its presence means the model directory is complete
            if is_main:
                write_json({"fingerprint": fingerprint, "evaluation": report["final"]}, model_dir / FINISHED_FILE)
            log(f"final model (all {len(pairs)} pairs) saved to {model_dir}; {fit.exclusions.summary()}")
        if config.eval_file:
            eval_pairs = load_pairs(config.eval_file)
            evaluation = evaluate_model(
                fit.model, eval_pairs, tie_policy=config.two_class_tie_policy, batch_size=config.score_batch_size
            )
            report["eval_file"] = {"path": str(config.eval_file), "evaluation": evaluation}
            report["markdown"] = (
                report.get("markdown", "")
                + "\n"
                + markdown_table(headline(evaluation), f"held-out file {config.eval_file}")
            )
            if wandb_enabled(config):
                _log_to_wandb(
                    evaluation, prefix="eval_file", config=config, kind="final-fit", title=f"{config.eval_file}"
                )
        if wandb_enabled(config):
            _finish_wandb()
    if is_main:
        write_json(report, out / "report.json")
        (out / "report.md").write_text(report.get("markdown", ""))
    _wait_for_everyone(config)
    return report


def _silent(*_args, **_kwargs) -> None:
    return None


def _fold_fingerprint(config: EmoRewardConfig, pairs: list[PreferencePair], train_idx, test_idx) -> str:
    """Identifies a fold's work: the recipe (minus where it is written and logged), the data and the split."""
    import hashlib
    import json

    recipe = {k: v for k, v in _public_config(config).items() if k not in _NOT_FINGERPRINTED}
    data = [(p.sample_id, p.description_1, p.description_2, p.label) for p in pairs]
    blob = json.dumps([recipe, data, list(map(int, train_idx)), list(map(int, test_idx))], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


_NOT_FINGERPRINTED = {"output_dir", "run_name", "logging_dir", "report_to", "logging_steps", "disable_tqdm"}


def _load_finished(directory: Path, fingerprint: str) -> dict | None:
    """The saved evaluation of a fold finished by an earlier, interrupted run of the same recipe and data."""
    import json

    path = directory / FINISHED_FILE
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    return saved["evaluation"] if saved.get("fingerprint") == fingerprint else None


def _public_config(config: EmoRewardConfig) -> dict:
    """The resolved recipe without secrets (hub tokens and the like are masked by transformers' `to_dict`)."""
    data = config.to_dict()
    return {k: v for k, v in data.items() if "token" not in k.lower() or k in ("pad_token", "eos_token")}


def model_card(config: EmoRewardConfig, report: dict, fit: FitResult) -> str:
    """README.md for a saved model directory: backbone, data, metrics with baselines, intended use."""
    cv = report.get("cross_validation")
    metrics = cv and markdown_table(cv["summary"], f"{cv['k']}-fold cross-validation (held-out folds)")
    return f"""---
library_name: peft
tags: [emoreward, reward-model, emotion, preference]
---
# emoreward reward model ({config.model_name_or_path})

A scalar reward r(description | context) for emotion descriptions, trained with LoRA and TRL's RewardTrainer
on human preference pairs. Load it with `EmoRewardModel.from_pretrained(path)`.

- Backbone: `{config.model_name_or_path}`{f" (GGUF `{fit.model.settings.gguf_file}`)" if fit.model.settings.gguf_file else ""}; LoRA r={config.lora_r}, alpha={config.lora_alpha}; value head in the adapter.
- Data: `{config.train_file}` ({report["n_pairs"]} pairs; {fit.exclusions.summary()}). Ties: `{config.ties}`.
- Input: text only (descriptions{", with subtitles when present" if True else ""}); max length {config.max_length} tokens.
- Tie threshold (three-class verdicts): {fit.tie_threshold:.4g}, calibrated on the training pairs.

{metrics or "No cross-validation was run for this model."}

**Read the numbers beside the length baseline.** On EmoPrefer-Data "prefer the longer description" is right on
about 80% of two-class pairs; a reward model that tracks length can match it without understanding emotion.
The length-debiased accuracy (mean of accuracy on length-aligned and length-counter pairs) is 50 for that
heuristic.

Intended use: research on emotion-preference evaluation (DMER). The training data (EmoPrefer-Data) is CC BY-NC 4.0:
non-commercial research use only.
"""
